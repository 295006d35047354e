import ChannelTestSupport
import Foundation
import Glibc
import NetStack
import Testing
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
    private static func channel(_ device: String, loop: EventLoop = .shared) -> Channel {
        var c = ChannelConfiguration(line: .device(device))
        c.link.negotiation.restartInterval = .seconds(1)
        c.relayDNS = false
        c.socks = nil
        return Channel(configuration: c, loop: loop)
    }

    private static func opened(_ channel: Channel) async -> ChannelCloseReason? {
        do {
            _ = try await channel.open()
            return nil
        } catch let ChannelError.closed(reason) {
            return reason
        } catch {
            return .lineFailed("\(error)")
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
        for _ in 0..<200 where !server.done.value { try await Task.sleep(for: .milliseconds(50)) }
        #expect(server.done.value)
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
        #expect(server.received.value > 0, "our Configure-Requests reached the server")
        print("hostile device server (silent): \(String(describing: reason)) after \(server.received.value) bytes sent")
        await channel.close()
    }

    /// A port nobody listens on: the open fails and says why.
    @Test func aRefusedConnectionIsALineFailureThatSaysSo() async throws {
        let port = Host.freePort()
        let channel = Self.channel("tcp:127.0.0.1:\(port)")
        let reason = await Self.opened(channel)
        let text = reason?.description ?? ""
        #expect(reason == .lineHangUp || text.contains("Connection refused"), "\(text)")
        // A malformed name never reaches the network.
        let bad = Self.channel("rfc2217:example.com:2001")
        let badReason = await Self.opened(bad)
        #expect(badReason?.description.contains("the host must be a numeric IPv4 address") == true, "\(String(describing: badReason))")
    }

    /// A flood of line bytes (no telnet in it, no PPP either): read to the loop's budget, the
    /// loop stays free for another channel, and the link ends when the server does.
    @Test func aFloodingServerDoesNotHoldTheLoop() async throws {
        let server = try HostileDeviceServer { c, _ in
            let chunk = Host.random(65536, seed: 3)
            let end = monotonicNow() + .seconds(3)
            while monotonicNow() < end { guard Host.sendAll(c, chunk) else { return } }
        }
        defer { server.stop() }
        let channel = Self.channel("tcp:127.0.0.1:\(server.port)")
        let outcome = Task { await Self.opened(channel) }
        // The loop answers while the flood is read: a call through it returns every time.
        var answered = 0
        for _ in 0..<20 {
            _ = await EventLoop.shared.perform { channel.status.lineBytesIn }
            answered += 1
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(answered == 20)
        let reason = await outcome.value
        #expect(reason == .lineHangUp, "\(String(describing: reason))")
        let status = channel.status
        #expect(status.lineBytesIn > 1 << 20, "read \(status.lineBytesIn) bytes of the flood")
        print("hostile device server (flood): read \(status.lineBytesIn) bytes; \(String(describing: reason))")
        await channel.close()
    }
}
