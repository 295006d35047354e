import NetStack
import PPP
import Testing
@testable import Channel

/// `--ping` runs on our stack's attachment; its timers are part of the session's `pollAt`, so a
/// deadline left in the past makes the event loop spin.
@Suite struct PingDeadlineTests {
    let result = IPCPResult(localAddress: IPv4Address(10, 0, 0, 1), peerAddress: IPv4Address(10, 0, 0, 2), dnsServers: [],
                            netmask: IPv4Address(255, 255, 255, 255))

    /// Serves the attachment's timers up to `end`, as the loop would, throwing away what it sends.
    func serve(_ attachment: StackAttachment, from start: Instant, to end: Instant) -> Instant {
        var now = start
        while let due = attachment.pollAt, due <= end {
            now = max(now, due)
            attachment.poll(now: now)
            _ = attachment.takeOutgoing(now: now)
        }
        return now
    }

    @Test func aRenegotiationAfterThePingsLeavesNoDeadlineInThePast() throws {
        let attachment = StackAttachment(seed: 1) { _ in }
        attachment.ping(result.peerAddress, count: 2, interval: .seconds(1))
        try attachment.linkUp(result, mtu: 1500, now: .zero)
        // Two unanswered pings and ping(8)'s 10 s linger.
        var now = serve(attachment, from: .zero, to: .seconds(30))
        #expect(attachment.finished)
        // LCP renegotiates (the peer restarted it): IPCP goes down and comes up again.
        attachment.linkDown()
        #expect(attachment.pollAt == nil)
        now = now + .seconds(1)
        try attachment.linkUp(result, mtu: 1500, now: now)
        now = now + .seconds(5)
        attachment.poll(now: now)
        if let due = attachment.pollAt {
            #expect(due > now, "a served deadline stays in the past: the loop would spin")
        }
    }

    @Test func pingsStillToSendResumeAfterARenegotiation() throws {
        var lines: [String] = []
        let attachment = StackAttachment(seed: 1) { lines.append($0) }
        attachment.ping(result.peerAddress, count: 3, interval: .seconds(1))
        try attachment.linkUp(result, mtu: 1500, now: .zero)
        var now = serve(attachment, from: .zero, to: .milliseconds(1500))
        attachment.linkDown()
        now = now + .seconds(2)
        try attachment.linkUp(result, mtu: 1500, now: now)
        now = serve(attachment, from: now, to: now + .seconds(30))
        #expect(lines.contains("ping \(result.peerAddress): 3 sent, 0 received"))
        if let due = attachment.pollAt { #expect(due > now) }
    }
}
