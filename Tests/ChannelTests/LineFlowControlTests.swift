@testable import Channel
import Testing
import Wire

/// The line's flow policy on virtual time: the queue's limit, the control frames' reserve, the
/// read pause and its end, and how they meet the read clock.
@Suite struct LineFlowControlTests {
    static let start = Instant(nanoseconds: 1_000_000_000)
    static func at(_ d: Duration) -> Instant { start + d }

    /// A flag-delimited frame of `count` bytes.
    static func frame(_ count: Int) -> [UInt8] { [0x7E] + [UInt8](repeating: 0x21, count: max(0, count - 2)) + [0x7E] }

    /// Queues `size`-byte IP packets while the policy admits them, as `LinkSession.drain` does
    /// with what its sources hand over; returns how many were admitted.
    @discardableResult
    static func offer(_ flow: inout LineFlowControl, packets: Int, size: Int) -> Int {
        var room = flow.room
        var admitted = 0
        for _ in 0..<packets {
            guard flow.admitPacket(size: size, room: room) else { continue }
            flow.queue.append(dataFrame: frame(size))
            room -= size
            admitted += 1
        }
        flow.queuedMore()
        return admitted
    }

    @Test func theLimitIsTwoSecondsOfLineTimeAndKeptInItsRange() {
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 115_200) == 23040)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 9600) == 8192)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: nil) == LineFlowControl.unpacedLimit)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: .max) == LineFlowControl.maximumLimit)
        var flow = LineFlowControl(limit: 1)
        #expect(flow.limit == LineFlowControl.minimumLimit)
        flow.limit = .max
        #expect(flow.limit == LineFlowControl.maximumLimit)
        flow.limit = -5
        #expect(flow.limit == LineFlowControl.minimumLimit)
    }

    @Test func aQueueThatMerelyReachesTheLimitDoesNotPauseTheLine() {
        // Our own sources fill the queue to the brim while the line is busy: no drop, no pause.
        var flow = LineFlowControl(limit: 16 * 1024, readModeration: .off)
        #expect(Self.offer(&flow, packets: 10, size: 1500) == 10)
        #expect(flow.queued >= 15000)
        let reading = flow.decideReading(now: Self.at(.zero))
        #expect(reading)
        #expect(!flow.readPaused)
        #expect(flow.counters.droppedPackets == 0 && flow.counters.readPauses == 0)
        #expect(flow.sourceMayRead(largestPacket: 1500) == false)
    }

    @Test func aPacketThatDoesNotFitIsDroppedAndPausesReadingUntilHalfHasDrained() throws {
        var flow = LineFlowControl(limit: 8192, readModeration: .off)
        #expect(Self.offer(&flow, packets: 8, size: 1500) == 5)
        #expect(flow.counters.droppedPackets == 3)
        #expect(flow.counters.peak == flow.queued)
        // Full: the line is not read.
        var reading = flow.decideReading(now: Self.at(.zero))
        #expect(!reading)
        #expect(flow.readPaused && flow.counters.readPauses == 1)
        #expect(flow.pollAt == Self.at(LineFlowControl.maximumReadPause))
        // Still above half after some went out: still paused, and the same pause.
        flow.queue.written(1000)
        reading = flow.decideReading(now: Self.at(.milliseconds(50)))
        #expect(!reading)
        #expect(flow.counters.readPauses == 1)
        // At half the limit or below, reading resumes and nothing is due for the pause.
        flow.queue.written(flow.queued - 4096)
        reading = flow.decideReading(now: Self.at(.milliseconds(80)))
        #expect(reading)
        #expect(!flow.readPaused)
        #expect(flow.pollAt == nil)
    }

    @Test func aPauseEndsByItselfAfterTheLongestPauseWithOneReadThenBeginsAgain() {
        // A peer that floods and never reads (or another of us, paused in turn): nothing drains.
        var flow = LineFlowControl(limit: 8192, readModeration: .off)
        Self.offer(&flow, packets: 8, size: 1500)
        var reading = flow.decideReading(now: Self.at(.zero))
        #expect(!reading)
        reading = flow.decideReading(now: Self.at(.milliseconds(199)))
        #expect(!reading)
        // Time is up: one turn reads.
        reading = flow.decideReading(now: Self.at(.milliseconds(200)))
        #expect(reading)
        // What that read made us answer is dropped at the full queue: a new pause.
        Self.offer(&flow, packets: 1, size: 1500)
        reading = flow.decideReading(now: Self.at(.milliseconds(201)))
        #expect(!reading)
        #expect(flow.counters.readPauses == 2)
        #expect(flow.pollAt == Self.at(.milliseconds(401)))
    }

    @Test func aPacketLargerThanTheLimitStillGoesWhenNoDataIsQueued() {
        // A peer MRU of 16384 against the smallest limit: full-size segments are never refused
        // for good, one at a time.
        var flow = LineFlowControl(limit: LineFlowControl.minimumLimit, readModeration: .off)
        var admitted = flow.admitPacket(size: 16384, room: flow.room)
        #expect(admitted)
        flow.queue.append(dataFrame: Self.frame(16384))
        admitted = flow.admitPacket(size: 16384, room: flow.room)
        #expect(!admitted)
        #expect(flow.counters.droppedPackets == 1)
        // A source may not read with no room at all (a level-triggered descriptor would spin).
        #expect(!flow.sourceMayRead(largestPacket: 1500))
    }

    @Test func controlFramesHaveTheirReserveBeyondTheLimitAndNoMore() {
        var flow = LineFlowControl(limit: 8192, readModeration: .off)
        Self.offer(&flow, packets: 5, size: 1500)
        // LCP and an Echo-Reply go past the limit, into the reserve.
        var admitted = flow.admitControl(bytes: 1000)
        #expect(admitted)
        flow.queue.append(control: Self.frame(1000))
        admitted = flow.admitControl(bytes: LineFlowControl.controlReserve - 2000)
        #expect(admitted)
        flow.queue.append(control: Self.frame(LineFlowControl.controlReserve - 2000))
        // Past the reserve they are dropped too, counted in bytes, and the queue counts as full.
        admitted = flow.admitControl(bytes: 2000)
        #expect(!admitted)
        #expect(flow.counters.droppedControlBytes == 2000)
        let reading = flow.decideReading(now: Self.at(.zero))
        #expect(!reading)
        #expect(flow.counters.readPauses == 1)
    }

    @Test func aPauseTakesTheLineOffTheClockAndTheClockWaitsForItsEnd() throws {
        // A line busy in the read clock's band: 2 MB/s, a 1.5 KiB frame every 750 µs.
        var flow = LineFlowControl(limit: 8192)
        for i in 0..<8 { flow.moderation.readOnArrival(bytes: 1500, frames: 1, now: Self.at(.microseconds(750) * i)) }
        #expect(flow.moderation.onClock)
        // On the clock the line is not watched for arrivals, and a read is due on the clock.
        var reading = flow.decideReading(now: Self.at(.microseconds(5250)))
        #expect(!reading)
        let due = try #require(flow.moderation.nextRead)
        #expect(flow.pollAt == due)
        #expect(flow.clockReadDue(now: due))
        // The queue overflows: a pause, which takes the line off the clock; no clock read is due.
        Self.offer(&flow, packets: 8, size: 1500)
        reading = flow.decideReading(now: Self.at(.microseconds(5500)))
        #expect(!reading)
        #expect(flow.readPaused && !flow.moderation.onClock)
        #expect(!flow.clockReadDue(now: due))
        #expect(flow.pollAt == Self.at(.microseconds(5500)) + LineFlowControl.maximumReadPause)
        #expect(flow.counters.clockEndedPaused == 1)
    }
}
