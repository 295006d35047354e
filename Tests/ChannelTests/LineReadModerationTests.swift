import Channel
import ChannelTestSupport
import Foundation
import Glibc
import NetStack
import PPP
import Testing
import Wire

@Suite struct LineReadModerationTests {
    static let start = Instant(nanoseconds: 1_000_000_000)
    static func at(_ d: Duration) -> Instant { start + d }

    /// Reads on arrival of `frames` frames of `size` bytes each, every `every`, `count` times
    /// from `from`.
    static func arrivals(_ m: inout LineReadModeration, frames: Int = 1, size: Int, every: Duration, count: Int, from: Duration = .zero) {
        for i in 0..<count { m.readOnArrival(bytes: frames * size, frames: frames, now: at(from + every * i)) }
    }

    @Test func aSerialLineNeverLeavesArrivals() {
        // 4 Mbit/s, the fastest serial line (500 kB/s): small frames back to back (a
        // VJ-compressed ACK and a flag, 15 bytes, 33,000 a second), and full ones.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 15, every: .microseconds(30), count: 50_000)
        Self.arrivals(&m, size: 1500, every: .microseconds(3000), count: 1000, from: .seconds(10))
        #expect(!m.onClock)
        #expect(m.busyPeriods == 0)
    }

    @Test func aLineFasterThanTheBandStaysOnArrivals() {
        // Two full frames a read, back to back at 100 MB/s: the kernel's buffers batch them
        // already. And ACKs at 35,000 a second, the other way.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, frames: 2, size: 1500, every: .microseconds(30), count: 5_000)
        Self.arrivals(&m, size: 20, every: .microseconds(28), count: 5_000, from: .seconds(1))
        #expect(!m.onClock)
        #expect(m.busyPeriods == 0)
    }

    @Test func aSteadyLineInTheBandGoesOnTheClockAfterAWholeWindow() throws {
        // 2 MB/s: a 1.5 KiB frame every 750 µs.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1500, every: .microseconds(750), count: 6)
        // The first window (4 ms) is not over yet.
        #expect(!m.onClock)
        Self.arrivals(&m, size: 1500, every: .microseconds(750), count: 2, from: .microseconds(4500))
        #expect(m.onClock)
        #expect(m.busyPeriods == 1)
        let due = try #require(m.nextRead)
        // The window closed with the read at 4.5 ms.
        #expect(due == Self.at(.microseconds(4500) + .milliseconds(2)))
        // Reads on the clock that gather two milliseconds' worth keep it going.
        var now = due
        for _ in 0..<10 {
            m.readOnClock(bytes: 4000, frames: 3, now: now)
            #expect(m.nextRead == now + .milliseconds(2))
            now = now + .milliseconds(2)
        }
        #expect(m.clockedReads == 10)
        #expect(m.busyPeriods == 1)
        #expect(m.arrivalReads == 8)
        #expect(m.endedSparse + m.endedOverBand + m.endedPaused == 0)
    }

    @Test func aFlowOfACKsStaysOnArrivals() {
        // A 5 MB/s download seen from the sender: a 13-byte ACK every 580 µs. What wakes the
        // sender is its source and the line; gathering the ACKs would only delay them.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 13, every: .microseconds(580), count: 2000)
        #expect(!m.onClock)
    }

    @Test func aBurstThenSilenceIsNotABusyLine() {
        // Eight frames (8 KB) within 100 µs, nothing, then one 6 ms later: in the band by
        // count, but no steady rate.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, frames: 4, size: 1000, every: .microseconds(100), count: 2)
        m.readOnArrival(bytes: 1000, frames: 1, now: Self.at(.milliseconds(6)))
        #expect(!m.onClock)
        // Reads of nothing (a hang-up, a spurious wakeup) do not make a rate either.
        for i in 0..<100 { m.readOnArrival(bytes: 0, frames: 0, now: Self.at(.milliseconds(10) + .microseconds(100) * i)) }
        #expect(!m.onClock)
    }

    @Test func aReadOnTheClockMustBringHalfAsManyFramesAgainAsAnArrival() throws {
        // Three frames a read: a read on the clock must bring five (4.5, rounded up).
        for (frames, stays) in [(4, false), (5, true)] {
            var m = LineReadModeration(settings: .standard)
            Self.arrivals(&m, frames: 3, size: 500, every: .milliseconds(1), count: 6)
            let due = try #require(m.nextRead)
            m.readOnClock(bytes: 3000, frames: frames, now: due)
            #expect(m.onClock == stays, "\(frames) frames")
        }
    }

    @Test func arrivalsThatStopBeforeTheWindowEndsOrComeAnIntervalApartAreNotBusy() {
        // Eight frames in the window's first 3.5 ms, then a gap of 2.5 ms: no steady rate.
        var gap = LineReadModeration(settings: .standard)
        Self.arrivals(&gap, size: 1000, every: .microseconds(500), count: 8)
        gap.readOnArrival(bytes: 1000, frames: 1, now: Self.at(.milliseconds(6)))
        #expect(!gap.onClock)
        // Ten frames a read every 2 ms (2.5 MB/s): a read on the clock every 2 ms could not
        // gather more than an arrival does.
        var sparse = LineReadModeration(settings: .standard)
        Self.arrivals(&sparse, frames: 10, size: 500, every: .milliseconds(2), count: 100)
        #expect(!sparse.onClock)
        #expect(sparse.busyPeriods == 0)
    }

    @Test func aDataFlowThatDwindlesToACKsLeavesTheClock() throws {
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1500, every: .microseconds(500), count: 10)
        var due = try #require(m.nextRead)
        m.readOnClock(bytes: 6000, frames: 4, now: due)
        due = try #require(m.nextRead)
        // Four 15-byte ACKs in 2 ms: frames enough, bytes far below the band.
        m.readOnClock(bytes: 60, frames: 4, now: due)
        #expect(!m.onClock)
        #expect(m.endedSparse == 1 && m.endedOverBand == 0 && m.endedPaused == 0)
    }

    @Test func aReadOnTheClockThatGathersOneArrivalsWorthGoesBackAndHoldsOff() throws {
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1000, every: .microseconds(500), count: 10)
        let due = try #require(m.nextRead)
        // One frame an arrival; a read on the clock must bring two.
        m.readOnClock(bytes: 1000, frames: 1, now: due)
        #expect(!m.onClock)
        // For the hold-off (100 ms) the same traffic stays on arrivals.
        Self.arrivals(&m, size: 1000, every: .microseconds(500), count: 180, from: due - Self.start + .microseconds(500))
        #expect(!m.onClock)
        #expect(m.busyPeriods == 1)
        // After it, a steady window goes back on the clock.
        Self.arrivals(&m, size: 1000, every: .microseconds(500), count: 20, from: due - Self.start + .milliseconds(101))
        #expect(m.onClock)
        #expect(m.busyPeriods == 2)
    }

    @Test func aReadOnTheClockBeyondTheBandGoesBack() throws {
        for (bytes, frames) in [(40_000, 20), (3000, 30), (Int.max, 10)] {
            var m = LineReadModeration(settings: .standard)
            Self.arrivals(&m, size: 1500, every: .microseconds(500), count: 10)
            let due = try #require(m.nextRead)
            // 32 KiB or 20 frames in 2 ms is the band's top (16 MB/s, 10,000 frames a second);
            // a buffer filled to the brim (`.max`) is beyond any.
            m.readOnClock(bytes: bytes, frames: frames, now: due)
            #expect(!m.onClock, "\(bytes) B, \(frames) frames")
            #expect(m.endedOverBand == 1 && m.endedSparse == 0, "\(bytes) B, \(frames) frames")
        }
    }

    @Test func aPauseEndsTheClock() throws {
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1500, every: .microseconds(500), count: 10)
        let due = try #require(m.nextRead)
        m.leaveClock(now: due)
        #expect(!m.onClock)
        #expect(m.endedPaused == 1 && m.endedSparse == 0)
        // Off the clock, leaving it again counts nothing.
        m.leaveClock(now: due)
        #expect(m.endedPaused == 1)
        Self.arrivals(&m, size: 1500, every: .microseconds(500), count: 20, from: due - Self.start)
        #expect(!m.onClock, "held off")
    }

    @Test func requestAndResponseWaitForTheClockAtMostOnceAHoldOff() {
        // 200-byte round trips, each request sent 150 µs after the answer to the last: the
        // peer sends nothing more until answered, so a read on the clock finds one request.
        var m = LineReadModeration(settings: .standard)
        var now = Self.start
        var delayed = 0
        let end = Self.start + .seconds(1)
        while now < end {
            if let due = m.nextRead {
                // The request waits for the clock; the next comes 150 µs after its answer.
                delayed += 1
                now = due
                m.readOnClock(bytes: 213, frames: 1, now: now)
            } else {
                m.readOnArrival(bytes: 213, frames: 1, now: now)
            }
            now = now + .microseconds(150)
        }
        // Hold-offs of 0.1, 0.2 and 0.4 s, then 0.8: three or four delayed requests in a second.
        #expect(delayed >= 3)
        #expect(delayed <= 4)
    }

    @Test func theHoldOffDoublesWhileTheClockGivesUpAtOnceAndResetsWhenItGathers() throws {
        var m = LineReadModeration(settings: .standard)
        var t: Duration = .zero
        /// Arrivals until the clock takes over; returns how long that took.
        func busy() throws -> Duration {
            let from = t
            while m.nextRead == nil {
                m.readOnArrival(bytes: 1000, frames: 1, now: Self.at(t))
                t += .microseconds(500)
                try #require(t - from < .seconds(10))
            }
            return t - from
        }
        var waits: [Duration] = []
        for _ in 0..<7 {
            waits.append(try busy())
            // A read on the clock that finds one message: the clock gives up at once.
            m.readOnClock(bytes: 1000, frames: 1, now: try #require(m.nextRead))
        }
        // Each wait is the hold-off (and a window): 0.1, 0.2, 0.4, 0.8, 1.6, 1.6 s.
        let holdOffs = waits.dropFirst().map { Int(($0 / .milliseconds(100)).rounded(.down)) }
        #expect(holdOffs == [1, 2, 4, 8, 16, 16], "\(waits)")
        // A read that gathers brings it back to 100 ms.
        _ = try busy()
        let due = try #require(m.nextRead)
        m.readOnClock(bytes: 5000, frames: 5, now: due)
        m.readOnClock(bytes: 1000, frames: 1, now: try #require(m.nextRead))
        let wait = try busy()
        #expect(wait < .milliseconds(200), "\(wait)")
    }

    @Test func aZeroIntervalReadsOnEveryArrivalAndSettingsAreBounded() {
        var off = LineReadModeration(settings: .off)
        Self.arrivals(&off, size: 1500, every: .microseconds(750), count: 1000)
        #expect(!off.onClock)
        #expect(off.busyPeriods == 0)
        // Under 100 µs the clock would only spin: off as well.
        var tiny = LineReadModeration(settings: .init(interval: .nanoseconds(1)))
        Self.arrivals(&tiny, size: 1500, every: .microseconds(750), count: 1000)
        #expect(!tiny.onClock)
        let m = LineReadModeration(settings: .init(interval: .seconds(Int64.max), enterFrames: -5, enterBytes: Int.min,
                                                   maximumFrames: Int.min, maximumBytes: Int.min, window: .seconds(Int64.max),
                                                   holdOff: .seconds(-1)))
        #expect(m.settings.interval == LineReadModeration.Settings.maximumInterval)
        #expect(m.settings.enterFrames >= 1)
        #expect(m.settings.maximumFrames >= m.settings.enterFrames)
        #expect(m.settings.enterBytes >= 1)
        #expect(m.settings.maximumBytes >= m.settings.enterBytes)
        #expect(m.settings.window <= .seconds(1))
        #expect(m.settings.holdOff == .zero)
    }

    /// The session on a real pty and a loop on virtual time: a peer writing steadily at
    /// 3 MB/s is read on the clock, every byte arrives, and with the clock off it is read on
    /// every arrival. With a simulated loss of 90% of the frames (`--frame-loss`), the frames it
    /// took out still count: the clock sees the line as busy as it is (it counted only the 10%
    /// left, under its band, before). Time moves only between the peer's writes, after the
    /// kernel has put each on the line, so every arrival is where the writer put it.
    @Test(arguments: [(true, 0.0), (false, 0.0), (true, 0.9)])
    func aSessionReadsABusyPtyOnTheClockAndLosesNothing(moderated: Bool, frameLoss: Double) async throws {
        let line = try SerialLine(ptyLinkedAt: nil)
        defer { line.close() }
        let path = try #require(line.peerPath)
        let peer = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK)
        try #require(peer >= 0)
        defer { close(peer) }
        var t = termios()
        tcgetattr(peer, &t)
        cfmakeraw(&t)
        tcsetattr(peer, TCSANOW, &t)
        // No thread runs this loop: the test's own (off the runner's pool) owns it and moves
        // its time.
        let loop = try EventLoop(clock: VirtualClock())
        let session = LinkSession(line: line, link: PPPLink(configuration: .terminal(), random: SplitMix64(seed: 1)), frameLoss: frameLoss) { _ in }
        session.readModeration = moderated ? .standard : .off

        struct Outcome { var started: String?; var written = 0; var read = 0; var counters = LineQueueCounters() }
        let r = await offThePool { () -> Outcome in
            var o = Outcome()
            do { try session.start(on: loop) } catch { o.started = "\(error)"; return o }
            defer {
                session.forceDown()
                loop.advance(by: .seconds(10))
            }
            // 1000-byte frames that never check out (their FCS is wrong), one every 333 µs
            // (3 MB/s): the decoder counts each, and drops it.
            var frame = [UInt8](repeating: 0x55, count: 1000)
            frame[0] = 0x7E
            var pending: [UInt8] = []
            /// The peer writes what it has (and `more`), the kernel puts it on the line (a real
            /// pty's transfer is not instant: waited for, it is the kernel's, not ours), then
            /// the loop's time moves one frame's worth.
            func step(_ more: [UInt8]) {
                pending += more
                if !pending.isEmpty {
                    let n = pending.withUnsafeBytes { write(peer, $0.baseAddress, $0.count) }
                    if n > 0 {
                        o.written += n
                        pending.removeFirst(n)
                        var ready = pollfd(fd: line.descriptor.rawValue, events: Int16(POLLIN), revents: 0)
                        _ = poll(&ready, 1, 2_000)
                    }
                }
                loop.advance(by: .microseconds(333))
            }
            // Half a second of writing: more than the clock's window (4 ms) many times over.
            for _ in 0..<1_500 { step(frame) }
            for _ in 0..<20_000 {
                o.read = session.lineBytesIn
                if pending.isEmpty && o.read == o.written { break }
                step([])
            }
            // A read on the clock the last arrival may have scheduled (2 ms) is made.
            loop.advance(by: .milliseconds(50))
            o.read = session.lineBytesIn
            o.counters = session.lineQueue
            return o
        }
        #expect(r.started == nil)
        #expect(r.written == 1_500_000)
        #expect(r.read == r.written)
        if moderated {
            #expect(r.counters.busyPeriods >= 1, "\(r.counters)")
            #expect(r.counters.clockedReads > r.counters.busyPeriods, "\(r.counters)")
            // A line this busy stays on the clock once it took it: a read every 2 ms for most of
            // the half second.
            #expect(r.counters.clockedReads >= 150, "\(r.counters)")
        } else {
            #expect(r.counters.busyPeriods == 0)
            #expect(r.counters.clockedReads == 0)
        }
    }
}
