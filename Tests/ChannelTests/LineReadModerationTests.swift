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

    /// Reads on arrival of `size` bytes every `every`, for `count` reads from `from`.
    static func arrivals(_ m: inout LineReadModeration, size: Int, every: Duration, count: Int, from: Duration = .zero) {
        for i in 0..<count { m.readOnArrival(size, now: at(from + every * i)) }
    }

    @Test func aSerialLineNeverLeavesArrivals() {
        // 4 Mbit/s, the fastest serial line: 500 kB/s, 64 bytes every 128 µs.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 64, every: .microseconds(128), count: 20_000)
        #expect(!m.onClock)
        #expect(m.busyPeriods == 0)
    }

    @Test func aLineFasterThanTheBandStaysOnArrivals() {
        // 4 KiB reads back to back at 100 MB/s: the kernel's buffers batch them already.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 4096, every: .microseconds(41), count: 5_000)
        #expect(!m.onClock)
        #expect(m.busyPeriods == 0)
    }

    @Test func aSteadyLineInTheBandGoesOnTheClockAfterAWholeWindow() throws {
        // 2 MB/s: 1.5 KiB frames every 750 µs.
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1500, every: .microseconds(750), count: 6)
        // The first window (4 ms) is not over yet.
        #expect(!m.onClock)
        Self.arrivals(&m, size: 1500, every: .microseconds(750), count: 2, from: .microseconds(4500))
        #expect(m.onClock)
        #expect(m.busyPeriods == 1)
        let due = try #require(m.nextRead)
        #expect(due == Self.at(.microseconds(4500) + .milliseconds(2)))
        // Reads on the clock that gather two milliseconds' worth keep it going.
        var now = due
        for _ in 0..<10 {
            m.readOnClock(4000, now: now)
            #expect(m.nextRead == now + .milliseconds(2))
            now = now + .milliseconds(2)
        }
        #expect(m.clockedReads == 10)
        #expect(m.busyPeriods == 1)
    }

    @Test func aReadOnTheClockThatGathersOneArrivalsWorthGoesBackAndHoldsOff() throws {
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 1000, every: .microseconds(500), count: 10)
        let due = try #require(m.nextRead)
        // The average arrival was 1000 bytes; a read on the clock must bring half again.
        m.readOnClock(1400, now: due)
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
        var m = LineReadModeration(settings: .standard)
        Self.arrivals(&m, size: 2000, every: .microseconds(500), count: 10)
        let due = try #require(m.nextRead)
        // 64 KiB in 2 ms is 32 MB/s: the clock would hold that sender back.
        m.readOnClock(40_000, now: due)
        #expect(!m.onClock)
    }

    @Test func requestAndResponseWaitForTheClockAtMostOnceAHoldOff() {
        // 200-byte round trips back to back, 150 µs each (1.3 MB/s on the line): the peer sends
        // the next request only once it has the answer, so a read on the clock finds one.
        var m = LineReadModeration(settings: .standard)
        var now = Self.start
        var delayed = 0
        let end = Self.start + .seconds(1)
        while now < end {
            if let due = m.nextRead {
                // The request waits for the clock.
                delayed += 1
                now = due
                m.readOnClock(213, now: now)
            } else {
                m.readOnArrival(213, now: now)
            }
            now = now + .microseconds(150)
        }
        // One second holds ten hold-offs of 100 ms: at most one delayed request in each.
        #expect(delayed >= 1)
        #expect(delayed <= 10)
    }

    @Test func aZeroIntervalReadsOnEveryArrivalAndSettingsAreBounded() {
        var off = LineReadModeration(settings: .off)
        Self.arrivals(&off, size: 1500, every: .microseconds(750), count: 1000)
        #expect(!off.onClock)
        #expect(off.busyPeriods == 0)
        var wild = LineReadModeration.Settings(interval: .seconds(3600), enterBytes: -5, maximumBytes: Int.min,
                                               window: .seconds(-1), holdOff: .seconds(-1))
        wild.interval = .seconds(Int64.max)
        let m = LineReadModeration(settings: wild)
        #expect(m.settings.interval == LineReadModeration.Settings.maximumInterval)
        #expect(m.settings.enterBytes >= 1)
        #expect(m.settings.maximumBytes >= m.settings.enterBytes)
        #expect(m.settings.window > .zero)
        #expect(m.settings.holdOff == .zero)
    }

    /// The session on a real pty: a peer writing steadily at 4 MB/s is read on the clock, every
    /// byte arrives, and with the clock off it is read on every arrival.
    @Test(arguments: [true, false])
    func aSessionReadsABusyPtyOnTheClockAndLosesNothing(moderated: Bool) async throws {
        let line = try SerialLine(ptyLinkedAt: nil)
        defer { line.close() }
        let path = try #require(line.peerPath)
        let peer = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC)
        try #require(peer >= 0)
        defer { close(peer) }
        var t = termios()
        tcgetattr(peer, &t)
        cfmakeraw(&t)
        tcsetattr(peer, TCSANOW, &t)
        let loop = try EventLoop()
        loop.startThread()
        defer { loop.stop() }
        let session = LinkSession(line: line, link: PPPLink(configuration: .terminal(), random: SplitMix64(seed: 1))) { _ in }
        session.readModeration = moderated ? .standard : .off

        struct Outcome { var started: String?; var written = 0; var read = 0; var counters = LineQueueCounters() }
        // Blocking work (the loop's `sync`, the paced writer) stays off the test runner's pool.
        let r = await offThePool { () -> Outcome in
            var o = Outcome()
            o.started = loop.sync { () -> String? in
                do { try session.start(on: loop); return nil } catch { return "\(error)" }
            }
            guard o.started == nil else { return o }
            defer { loop.sync { session.forceDown() } }
            // Bytes that are never a frame (no flag): the HDLC decoder drops them after the MRU.
            let chunk = [UInt8](repeating: 0x55, count: 16 * 1024)
            let rate = 4_000_000.0
            let begin = monotonicNow()
            while true {
                let elapsed = Double((monotonicNow() - begin).nanoseconds) / 1e9
                if elapsed >= 0.3 { break }
                // Paced by the clock, so a late wakeup catches up instead of slowing the rate.
                let due = min(Int(rate * elapsed) - o.written, chunk.count)
                if due > 0 {
                    let n = chunk.withUnsafeBytes { write(peer, $0.baseAddress, due) }
                    if n > 0 { o.written += n }
                }
                usleep(500)
            }
            let deadline = monotonicNow() + .seconds(10)
            while monotonicNow() < deadline {
                o.read = loop.sync { session.lineBytesIn }
                if o.read == o.written { break }
                usleep(10_000)
            }
            o.counters = loop.sync { session.lineQueue }
            return o
        }
        #expect(r.started == nil)
        #expect(r.written > 1_000_000)
        #expect(r.read == r.written)
        if moderated {
            #expect(r.counters.busyPeriods >= 1, "\(r.counters)")
            #expect(r.counters.clockedReads >= r.counters.busyPeriods, "\(r.counters)")
        } else {
            #expect(r.counters.busyPeriods == 0)
            #expect(r.counters.clockedReads == 0)
        }
    }
}
