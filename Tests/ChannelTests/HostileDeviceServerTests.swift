import ChannelTestSupport
import Foundation
import Glibc
import NetStack
import Testing
import TestSupport
@testable import Channel

/// A device server is a peer like any other: what it sends on a `tcp:` or `rfc2217:` line may
/// be crafted. One accepted connection on loopback, driven by `behave` on a thread of its own;
/// it counts what we sent it.
private final class HostileDeviceServer: @unchecked Sendable {
    let port = Host.freePort()
    private let listener: Int32
    let received = Locked<Int>(0)
    let done = Locked<Bool>(false)
    /// Our side closed the connection (the reader saw its end).
    let peerClosed = Locked<Bool>(false)

    init(behave: @escaping @Sendable (Int32, Locked<Bool>) -> Void) throws {
        listener = try Host.listener(port: port)
        let l = listener
        let received = received, done = done, peerClosed = peerClosed
        Thread.detachNewThread {
            let c = accept(l, nil, nil)
            guard c >= 0 else { return }
            // Whatever we send is read and counted, on a thread beside the behaviour.
            Thread.detachNewThread {
                var buffer = [UInt8](repeating: 0, count: 65536)
                while true {
                    let n = read(c, &buffer, buffer.count)
                    if n <= 0 { break }
                    received.mutate { $0 += n }
                }
                peerClosed.mutate { $0 = true }
            }
            behave(c, peerClosed)
            shutdown(c, Int32(SHUT_RDWR))
            usleep(100_000)
            close(c)
            done.mutate { $0 = true }
        }
    }

    func stop() { close(listener) }
}

@Suite(.serialized, .timeLimit(.minutes(3))) struct HostileDeviceServerTests {
    private static func channel(_ device: String, loop: EventLoop = .shared, restart: Duration = .seconds(1)) -> Channel {
        var c = ChannelConfiguration(line: .device(device))
        c.link.negotiation.restartInterval = restart
        c.relayDNS = false
        c.socks = nil
        return Channel(configuration: c, loop: loop)
    }

    private static func opened(_ channel: Channel) async -> ChannelCloseReason? {
        do {
            _ = try await channel.open()
            return nil
        } catch {
            // `open` throws only ChannelError, whose one case is the close.
            switch error { case let .closed(reason): return reason }
        }
    }

    /// Endless option requests, subnegotiations that never end, unknown commands and line noise
    /// for two seconds, then the connection closed: we answer within the per-option budget, keep
    /// nothing of the long subnegotiations, and the link ends as a hang-up.
    @Test func endlessAndMalformedTelnetEndsAsAHangUpWithBoundedAnswers() async throws {
        let server = try HostileDeviceServer { c, _ in
            var seed: UInt64 = 7
            let end = monotonicNow() + .seconds(2)
            while monotonicNow() < end {
                var burst: [UInt8] = []
                for _ in 0..<200 {
                    seed = seed &* 6364136223846793005 &+ 1442695040888963407
                    let option = UInt8(truncatingIfNeeded: seed >> 33)
                    burst += [255, [251, 252, 253, 254][Int(seed >> 40 & 3)], option]
                }
                // A COM-PORT subnegotiation that runs on, and an unknown command.
                burst += [255, 250, 44, 101] + [UInt8](repeating: 0x41, count: 4096) + [255, 17]
                burst += Host.random(512, seed: seed)
                guard Host.sendAll(c, burst) else { return }
            }
        }
        defer { server.stop() }
        let channel = Self.channel("rfc2217:127.0.0.1:\(server.port)")
        let reason = await Self.opened(channel)
        #expect(reason == .lineHangUp, "\(String(describing: reason))")
        #expect(await eventually(within: .seconds(10)) { server.done.value })
        // What we wrote: the opening requests, LCP's Configure-Requests, and at most the
        // per-option budget of answers (256 options, 8 answers of 3 bytes each).
        let sent = server.received.value
        #expect(sent > 0 && sent < 256 * 8 * 3 + 4096, "we sent \(sent) bytes")
        print("hostile device server (telnet): we sent \(sent) bytes; closed: \(String(describing: reason))")
        await channel.close()
    }

    /// A server that accepts and never says a word: LCP gives up on its Configure-Requests
    /// (RFC 1661's Max-Configure) and says so; time moved on by the test.
    @Test func aServerThatNeverAnswersEndsTheOpenWithNoResponse() async throws {
        let server = try HostileDeviceServer { _, peerClosed in
            // Not a word until we close (a minute at most).
            for _ in 0..<1200 where !peerClosed.value { usleep(50_000) }
        }
        defer { server.stop() }
        let clock = LeapingClock()
        let loop = try EventLoop(clock: clock)
        try loop.startThread()
        let channel = Self.channel("tcp:127.0.0.1:\(server.port)", loop: loop)
        let outcome = Task { await Self.opened(channel) }
        for _ in 0..<40 {
            clock.leap(by: .seconds(1))
            await loop.fullTurn()
            if await loop.perform({ channel.status.state }) == .closed { break }
        }
        let reason = await outcome.value
        #expect(reason != nil && reason != .lineHangUp, "\(String(describing: reason))")
        // The server's thread counts what it reads on its own time: the open may be over first.
        #expect(await eventually(within: .seconds(10)) { server.received.value > 0 }, "our Configure-Requests reached the server")
        print("hostile device server (silent): \(String(describing: reason)) after \(server.received.value) bytes sent")
        await channel.close()
    }

    /// FLOWCONTROL-SUSPEND (RFC 2217 §3): our data waits, the loop does not spin on a
    /// writable socket meanwhile, and RESUME lets it go.
    @Test func aSuspendHoldsOurDataWithoutSpinningAndResumeReleasesIt() async throws {
        let resume = Locked<Bool>(false)
        let server = try HostileDeviceServer { c, peerClosed in
            let sb: (UInt8) -> [UInt8] = { [255, 250, 44, $0, 255, 240] }
            // ser2net's greeting, then suspend at once.
            _ = Host.sendAll(c, [255, 251, 3, 255, 253, 3, 255, 253, 0, 255, 251, 0, 255, 253, 44] + sb(108))
            for _ in 0..<1200 where !resume.value && !peerClosed.value { usleep(10_000) }
            _ = Host.sendAll(c, sb(109))
            for _ in 0..<1200 where !peerClosed.value { usleep(50_000) }
        }
        defer { server.stop() }
        let loop = try EventLoop()
        try loop.startThread()
        let channel = Self.channel("rfc2217:127.0.0.1:\(server.port)", loop: loop)
        let outcome = Task { await Self.opened(channel) }
        // The opening and the settings go out (telnet is not held); then nothing more.
        // Within the 12 s after which the server lifts its suspension by itself.
        #expect(await eventually(within: .seconds(10)) { server.received.value >= 40 })
        try await Task.sleep(for: .milliseconds(300))
        let held = server.received.value
        let turnsBefore = await loop.perform { loop.turns }
        try await Task.sleep(for: .milliseconds(500))
        let turns = await loop.perform { loop.turns } - turnsBefore
        // Idle but for LCP's restart timer (a second): a handful of turns, not a spin.
        #expect(turns < 1_000, "\(turns) turns in half a second while suspended")
        #expect(server.received.value == held, "written while suspended")
        resume.mutate { $0 = true }
        #expect(await eventually(within: .seconds(20)) { server.received.value > held }, "nothing written after RESUME")
        print("suspended: \(turns) loop turns in 0.5 s, \(held) bytes before, \(server.received.value) after RESUME")
        await channel.close()
        outcome.cancel()
    }

    /// A port nobody listens on: the open fails and says why.
    @Test func aRefusedConnectionIsALineFailureThatSaysSo() async throws {
        let port = Host.freePort()
        let channel = Self.channel("tcp:127.0.0.1:\(port)")
        let logs = Locked<[String]>([])
        channel.observe { if case let .log(l) = $0 { logs.mutate { $0.append(l) } } }
        let reason = await Self.opened(channel)
        let text = reason?.description ?? ""
        // Refused at once (the connect call says so) or as the connection's first event.
        #expect(text.contains("Connection refused") || (reason == .lineHangUp && logs.value.contains { $0.contains("tcp:127.0.0.1:\(port): Connection refused") }),
                "\(text) \(logs.value)")
        // A malformed name never reaches the network.
        let bad = Self.channel("rfc2217:example.com:2001")
        let badReason = await Self.opened(bad)
        #expect(badReason?.description.contains("the host must be a numeric IPv4 address") == true, "\(String(describing: badReason))")
    }

    /// A flood of line bytes (no telnet in it, no PPP either): read to the loop's budget, the
    /// loop stays free for another channel, and the link ends when the server does.
    @Test func aFloodingServerDoesNotHoldTheLoop() async throws {
        // The flood goes on until the neighbour below is served (a minute at most), and LCP's
        // Configure-Requests (5 s apart) outlast that: if the flood held the loop, the
        // neighbour would be served only once the flood is over.
        let stop = Locked<Bool>(false)
        let server = try HostileDeviceServer { c, _ in
            let chunk = Host.random(65536, seed: 3)
            let end = monotonicNow() + .seconds(60)
            while monotonicNow() < end && !stop.value { guard Host.sendAll(c, chunk) else { return } }
        }
        defer { server.stop() }
        let channel = Self.channel("tcp:127.0.0.1:\(server.port)", restart: .seconds(5))
        let outcome = Task { await Self.opened(channel) }
        // Another link on the same loop comes up and carries data while the flood is read: the
        // flooded line is read to its budget per turn, and the rest wait their turn.
        #expect(await eventually(within: .seconds(20)) { channel.status.lineBytesIn >= 1 << 20 })
        let echoPort = Host.freePort()
        let neighbour = try PtyRig(echoPorts: [echoPort])
        _ = try await neighbour.open()
        try neighbour.channel.addBridge(.hostToTerminalLocal, port: echoPort)
        let echoed = await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), echoPort), Host.random(100_000, seed: 6))
        #expect(echoed?.bytes.count == 100_000)
        #expect(!server.done.value, "the flood was over before the neighbour was served")
        stop.mutate { $0 = true }
        await neighbour.cleanUp()
        let reason = await outcome.value
        #expect(reason == .lineHangUp, "\(String(describing: reason))")
        let status = channel.status
        #expect(status.lineBytesIn > 1 << 20, "read \(status.lineBytesIn) bytes of the flood")
        print("hostile device server (flood): read \(status.lineBytesIn) bytes; \(String(describing: reason))")
        await channel.close()
    }
}
