import Channel
import Foundation
import Glibc
import NetStack
import Testing
@testable import Service

/// The supervisor's rules on virtual time: no device, no loop, no clock but the instants given.
@Suite struct TerminalSupervisorTests {
    let t0 = Instant.seconds(100)

    @Test func aMissingDeviceIsWaitedForAndOpenedWhenItAppears() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        #expect(s.handle(.start, device: .missing, now: t0) == [.announceWaiting(holder: nil)])
        #expect(s.state == .waiting)
        // Unrelated changes while it is still missing: nothing, and no second announcement.
        #expect(s.handle(.deviceChanged(appeared: true), device: .missing, now: t0).isEmpty)
        #expect(s.handle(.deviceChanged(appeared: true), device: .present, now: t0) == [.openLink])
        #expect(s.state == .opening)
        #expect(s.handle(.linkOpened, device: .present, now: t0).isEmpty)
        #expect(s.state == .open && s.pollAt == nil)
    }

    /// persist and holdoff: a link that ends opens again after the holdoff, not before.
    @Test func aLinkThatEndsOpensAgainAfterTheHoldoff() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = s.handle(.start, device: .present, now: t0)
        _ = s.handle(.linkOpened, device: .present, now: t0)
        #expect(s.handle(.linkClosed, device: .present, now: t0 + .seconds(60)).isEmpty)
        #expect(s.state == .holdoff(until: t0 + .seconds(65)))
        #expect(s.pollAt == t0 + .seconds(65))
        #expect(s.handle(.tick, device: .present, now: t0 + .seconds(64)).isEmpty)
        #expect(s.handle(.tick, device: .present, now: t0 + .seconds(65)) == [.openLink])
        #expect(s.failures == 0)
    }

    /// An open that never reached IPCP counts toward maxfail and waits at least a second, even
    /// with a holdoff of 0; maxfail of them in a row give up.
    @Test func failedOpensCountTowardMaxfailAndPauseASecond() {
        var s = TerminalSupervisor(holdoff: .zero, maxfail: 3)
        var now = t0
        _ = s.handle(.start, device: .present, now: now)
        for n in 1...2 {
            #expect(s.handle(.linkClosed, device: .present, now: now).isEmpty)
            #expect(s.failures == n)
            #expect(s.pollAt == now + .seconds(1))
            now = now + .seconds(1)
            #expect(s.handle(.tick, device: .present, now: now) == [.openLink])
        }
        #expect(s.handle(.linkClosed, device: .present, now: now) == [.announceGaveUp(failures: 3)])
        #expect(s.state == .gaveUp(failures: 3) && s.pollAt == nil)
        // Given up: changes at the path that are not the device appearing anew do nothing.
        #expect(s.handle(.deviceChanged(appeared: false), device: .present, now: now).isEmpty)
        #expect(s.handle(.tick, device: .present, now: now + .seconds(3_600)).isEmpty)
        // The device appearing anew is a new line: maxfail counts from zero.
        #expect(s.handle(.deviceChanged(appeared: true), device: .present, now: now) == [.openLink])
        #expect(s.failures == 0)
    }

    @Test func openingAgainByRequestAfterGivingUpCountsFromZero() {
        var s = TerminalSupervisor(holdoff: .zero, maxfail: 1)
        _ = s.handle(.start, device: .present, now: t0)
        #expect(s.handle(.linkClosed, device: .present, now: t0) == [.announceGaveUp(failures: 1)])
        #expect(s.handle(.start, device: .present, now: t0) == [.openLink])
        #expect(s.failures == 0 && s.state == .opening)
    }

    /// maxfail 0 never gives up.
    @Test func maxfailZeroNeverGivesUp() {
        var s = TerminalSupervisor(holdoff: .zero, maxfail: 0)
        var now = t0
        _ = s.handle(.start, device: .present, now: now)
        for _ in 0..<100 {
            _ = s.handle(.linkClosed, device: .present, now: now)
            now = now + .seconds(1)
            #expect(s.handle(.tick, device: .present, now: now) == [.openLink])
        }
        #expect(s.failures == 100)
    }

    /// A device that goes away while the link is down (a USB unplug) is waited for, not
    /// retried on the holdoff.
    @Test func aDeviceThatWentIsWaitedFor() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = s.handle(.start, device: .present, now: t0)
        _ = s.handle(.linkOpened, device: .present, now: t0)
        #expect(s.handle(.linkClosed, device: .missing, now: t0) == [.announceWaiting(holder: nil)])
        #expect(s.pollAt == nil)
        // It comes back: opened at once, no holdoff (a new device).
        #expect(s.handle(.deviceChanged(appeared: true), device: .present, now: t0 + .seconds(1)) == [.openLink])
        // Gone during the holdoff: the tick finds it missing and waits.
        _ = s.handle(.linkClosed, device: .present, now: t0 + .seconds(2))
        #expect(s.handle(.tick, device: .missing, now: t0 + .seconds(8)) == [.announceWaiting(holder: nil)])
    }

    /// `ctl close` then `ctl open` while the link is still going down: it opens again once
    /// it is down.
    @Test func openedAgainWhileClosingReopensOnceDown() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = s.handle(.start, device: .present, now: t0)
        _ = s.handle(.linkOpened, device: .present, now: t0)
        #expect(s.handle(.stop, device: .present, now: t0) == [.closeLink])
        #expect(s.handle(.start, device: .present, now: t0).isEmpty)
        #expect(s.state == .closing(after: .reopen))
        #expect(s.handle(.linkClosed, device: .present, now: t0 + .seconds(1)) == [.openLink])
        // And closed again before it is down: it stays closed.
        _ = s.handle(.linkOpened, device: .present, now: t0 + .seconds(2))
        _ = s.handle(.stop, device: .present, now: t0 + .seconds(3))
        _ = s.handle(.start, device: .present, now: t0 + .seconds(3))
        _ = s.handle(.stop, device: .present, now: t0 + .seconds(3))
        #expect(s.handle(.linkClosed, device: .present, now: t0 + .seconds(4)).isEmpty)
        #expect(s.state == .closed)
    }

    /// Given up, its device path appearing anew but leading to a line another terminal holds:
    /// it waits for that line.
    @Test func aGivenUpTerminalWhoseDeviceIsAnothersWaits() {
        var s = TerminalSupervisor(holdoff: .zero, maxfail: 1)
        _ = s.handle(.start, device: .present, now: t0)
        _ = s.handle(.linkClosed, device: .present, now: t0)
        #expect(s.handle(.deviceChanged(appeared: true), device: .heldBy("b"), now: t0) == [.announceWaiting(holder: "b")])
        #expect(s.state == .waiting)
    }

    @Test func aLineAnotherTerminalHoldsIsWaitedFor() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        #expect(s.handle(.start, device: .heldBy("a"), now: t0) == [.announceWaiting(holder: "a")])
        #expect(s.handle(.deviceChanged(appeared: false), device: .heldBy("a"), now: t0).isEmpty)
        #expect(s.handle(.deviceChanged(appeared: false), device: .present, now: t0) == [.openLink])
    }

    /// Closed by request it stays closed: no holdoff, no reopen, until started again.
    @Test func stoppedStaysClosed() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = s.handle(.start, device: .present, now: t0)
        _ = s.handle(.linkOpened, device: .present, now: t0)
        #expect(s.handle(.stop, device: .present, now: t0) == [.closeLink])
        #expect(s.state == .closing(after: .stayClosed))
        #expect(s.handle(.stop, device: .present, now: t0).isEmpty, "one Terminate, not two")
        #expect(s.handle(.linkClosed, device: .present, now: t0 + .seconds(1)).isEmpty)
        #expect(s.state == .closed && s.pollAt == nil)
        #expect(s.handle(.deviceChanged(appeared: true), device: .present, now: t0 + .seconds(2)).isEmpty)
        #expect(s.handle(.start, device: .present, now: t0 + .seconds(3)) == [.openLink])
        // Stopped during the holdoff: the timer is gone with it.
        _ = s.handle(.linkClosed, device: .present, now: t0 + .seconds(4))
        #expect(s.pollAt != nil)
        #expect(s.handle(.stop, device: .present, now: t0 + .seconds(5)).isEmpty)
        #expect(s.pollAt == nil && s.state == .closed)
    }

    /// Retired: the link is let go once, and it says when; nothing brings it back.
    @Test func retiringLetsGoOnceAndForGood() {
        var s = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = s.handle(.start, device: .present, now: t0)
        #expect(s.handle(.retire, device: .present, now: t0) == [.closeLink])
        #expect(s.handle(.start, device: .present, now: t0).isEmpty)
        #expect(s.handle(.retire, device: .present, now: t0).isEmpty)
        #expect(s.handle(.linkClosed, device: .present, now: t0) == [.retired])
        #expect(s.state == .retired)
        for e: TerminalSupervisor.Event in [.start, .stop, .deviceChanged(appeared: true), .linkOpened, .linkClosed, .tick] {
            #expect(s.handle(e, device: .present, now: t0 + .seconds(10)).isEmpty)
        }
        // Retired while nothing held the line: at once.
        var idle = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = idle.handle(.start, device: .missing, now: t0)
        #expect(idle.handle(.retire, device: .missing, now: t0) == [.retired])
        // Retired while a stop was closing the link: the second close stops waiting for the
        // terminal's goodbye, as pppd's second signal does.
        var closing = TerminalSupervisor(holdoff: .seconds(5), maxfail: 10)
        _ = closing.handle(.start, device: .present, now: t0)
        _ = closing.handle(.stop, device: .present, now: t0)
        #expect(closing.handle(.retire, device: .present, now: t0) == [.closeLink])
        #expect(closing.handle(.linkClosed, device: .present, now: t0) == [.retired])
        // Asked to retire again once retired (a second stop of the service): said at once.
        #expect(closing.handle(.retire, device: .present, now: t0) == [.retired])
    }

    /// A long run of random events never reaches a state the rules do not allow: a timer only
    /// in holdoff, the line held only while opening, open or closing, nothing after retired.
    @Test func randomEventsKeepTheInvariants() {
        var random = SplitMix64(seed: 30)
        let events: [TerminalSupervisor.Event] = [.start, .stop, .deviceChanged(appeared: true), .deviceChanged(appeared: false), .linkOpened, .linkClosed, .tick]
        let devices: [TerminalSupervisor.Device] = [.present, .missing, .heldBy("x")]
        for _ in 0..<200 {
            var s = TerminalSupervisor(holdoff: .seconds(Int64(random.next() % 4)), maxfail: Int(random.next() % 4))
            var now = t0
            for _ in 0..<200 {
                now = now + .milliseconds(Int64(random.next() % 3_000))
                let e = random.next() % 50 == 0 ? TerminalSupervisor.Event.retire : events[Int(random.next() % UInt64(events.count))]
                let before = s.state
                let actions = s.handle(e, device: devices[Int(random.next() % 3)], now: now)
                if case .holdoff = s.state { #expect(s.pollAt != nil) } else { #expect(s.pollAt == nil) }
                if actions.contains(.openLink) { #expect(s.state == .opening) }
                if before == .retired { #expect(s.state == .retired && actions.allSatisfy { $0 == .retired }) }
                if actions.contains(.retired) { #expect(s.state == .retired) }
                #expect(actions.filter { $0 == .openLink || $0 == .closeLink }.count <= 1)
            }
        }
    }
}

/// The library face of the service on a loop of virtual time: typed requests in, JSON out, and
/// the events as a stream.
@Suite struct TerminalServiceTests {
    @Test func requestsAndEventsOnVirtualTime() async throws {
        let scratch = try ServiceScratch()
        try "device \(scratch.path)/missing\nholdoff 2\n".write(toFile: scratch.path + "/t1.conf", atomically: true, encoding: .utf8)
        chmod(scratch.path + "/t1.conf", 0o600)
        let loop = try EventLoop(clock: VirtualClock())
        let service = try TerminalService(directory: scratch.path, loop: loop)
        var seen: [String] = []
        service.observe { seen.append($0.json) }
        let stream = service.events()
        service.start()
        loop.advance(by: .seconds(1))
        #expect(service.terminalNames == ["t1"])
        #expect(service.request(.list).contains(#""state":"waiting""#))
        #expect(service.request(.status(terminal: "nobody")).contains(#""code":-6"#))
        #expect(service.request(.close(terminal: "t1")).contains(#""state":"closed""#))
        #expect(seen.contains(#"{"event":"terminal-added","terminal":"t1"}"#), "\(seen)")
        #expect(seen.contains { $0.contains(#""event":"waiting""#) }, "\(seen)")
        var iterator = stream.makeAsyncIterator()
        let first = await iterator.next()
        #expect(first?.json == #"{"event":"terminal-added","terminal":"t1"}"#)
        // No link is up: every terminal is let go at once (no thread runs this loop, so the
        // call is served where it is made).
        await service.stop()
        #expect(service.terminalNames.isEmpty)
    }
}

/// A terminal on a device server is never given up on: refused connections are failed opens,
/// tried again after every holdoff however many there were (a local device would be left
/// closed after maxfail). On virtual time, against a loopback port nobody listens on.
@Suite struct NetworkLineServiceTests {
    @Test func aRefusingDeviceServerIsTriedAgainPastMaxfail() async throws {
        let scratch = try ServiceScratch()
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        // A port bound and never listened on: connections to it are refused, and nobody else
        // takes it meanwhile.
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) } }
        defer { close(listener) }
        let port = UInt16(bigEndian: address.sin_port)
        try "device tcp:127.0.0.1:\(port)\nholdoff 1\nmaxfail 2\n".write(toFile: scratch.path + "/t1.conf", atomically: true, encoding: .utf8)
        chmod(scratch.path + "/t1.conf", 0o600)
        let loop = try EventLoop(clock: VirtualClock())
        let service = try TerminalService(directory: scratch.path, loop: loop)
        var seen: [String] = []
        service.observe { seen.append($0.json) }
        service.start()
        for _ in 0..<30 { loop.advance(by: .seconds(1)) }
        let closes = seen.filter { $0.contains(#""event":"closed""#) }.count
        #expect(closes >= 5, "\(seen)")
        #expect(!seen.contains { $0.contains("gave-up") }, "\(seen)")
        #expect(!service.request(.list).contains(#""state":"gave-up""#))
        await service.stop()
    }
}
