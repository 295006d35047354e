import Foundation
import Glibc
import NetStack
import Testing
@testable import Channel
import ChannelTestSupport

/// The DNS relay against a resolver on loopback: what its queries look like upstream.
@Suite(.serialized, .timeLimit(.minutes(10)))
struct DNSRelayTests {
    /// A UDP socket on a free loopback port; the caller closes it.
    func resolverSocket() -> (fd: Int32, port: UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        // Port 0: the kernel's choice, which cannot be taken already.
        var a = Host.address(TCPEndpoint(IPv4Address(127, 0, 0, 1), 0))
        let bound = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        precondition(bound == 0, "a loopback UDP socket could not be bound")
        // The resolver waits as long as the suite may: in the full run the link can take
        // minutes to come up while the VM suites hold the runner's threads.
        Host.setTimeout(fd, seconds: 600)
        return (fd, Host.localPort(fd))
    }

    /// example.test A? with the terminal's id 0x1234.
    let query: [UInt8] = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7] + Array("example".utf8) + [4] + Array("test".utf8) + [0, 0, 1, 0, 1]

    @Test func eachQueryLeavesFromItsOwnPortWithItsOwnIDAndOnlyTheMatchingAnswerCounts() async throws {
        let (fd, port) = resolverSocket()
        defer { close(fd) }
        let seen = Locked<[(port: UInt16, id: UInt16)]>([])
        // Answers each query twice: first a forgery with another id (6.6.6.6), then the answer.
        let resolver = Thread {
            var buffer = [UInt8](repeating: 0, count: 512)
            for _ in 0..<3 {
                var from = sockaddr_in()
                var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                let n = withUnsafeMutablePointer(to: &from) { p in
                    p.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(fd, &buffer, buffer.count, 0, $0, &length) }
                }
                guard n >= 12 else { return }
                let id = UInt16(buffer[0]) << 8 | UInt16(buffer[1])
                seen.mutate { $0.append((UInt16(bigEndian: from.sin_port), id)) }
                var answer = Array(buffer[0..<n])
                answer[2] = 0x81; answer[3] = 0x80; answer[7] = 1
                var forged = answer
                forged[0] ^= 0x01
                forged += [0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 6, 6, 6, 6]
                answer += [0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 9, 8, 7]
                for reply in [forged, answer] {
                    _ = withUnsafePointer(to: &from) { p in
                        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, reply, reply.count, 0, $0, length) }
                    }
                }
            }
        }
        resolver.start()
        let rig = try PtyRig {
            $0.relayDNS = true
            $0.dnsUpstream = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        }
        let addresses = try await rig.open()
        let dns = try #require(addresses.dns)
        for _ in 0..<3 {
            let reply = try #require(await rig.terminal.exchangeDatagram(to: TCPEndpoint(dns, 53), payload: query, timeout: .seconds(60)))
            #expect(reply.prefix(2) == [0x12, 0x34])
            #expect(reply.suffix(4) == [10, 9, 8, 7])
        }
        let upstream = seen.value
        #expect(upstream.count == 3)
        // One socket for every query would show one port; three random ones coincide once in
        // hundreds of millions.
        #expect(Set(upstream.map(\.port)).count > 1, "\(upstream)")
        #expect(upstream.allSatisfy { DNSRelay.ephemeralPorts().contains($0.port) }, "\(upstream)")
        #expect(Set(upstream.map(\.id)).count > 1, "\(upstream)")
        let line = rig.channel.report().first { $0.hasPrefix("dns relay") } ?? ""
        #expect(line.contains("3 queries, 3 answers") && line.contains("3 with a wrong id"), "\(line)")
        await rig.cleanUp()
    }

    @Test func queriesBeyondTheInFlightCapAreDroppedAndCounted() async throws {
        // A resolver that never answers: every query stays in flight.
        let (fd, port) = resolverSocket()
        defer { close(fd) }
        let rig = try PtyRig {
            $0.relayDNS = true
            $0.dnsUpstream = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        }
        let addresses = try await rig.open()
        let dns = try #require(addresses.dns)
        let extra = 6
        await withTaskGroup(of: Void.self) { group in
            for i in 0..<(DNSRelay.maximumInFlight + extra) {
                group.addTask {
                    _ = await rig.terminal.exchangeDatagram(to: TCPEndpoint(dns, 53), localPort: UInt16(6000 + i), payload: query, timeout: .seconds(1))
                }
            }
        }
        let line = rig.channel.report().first { $0.hasPrefix("dns relay") } ?? ""
        #expect(line.contains("\(DNSRelay.maximumInFlight) queries, 0 answers") && line.contains("\(extra) dropped"), "\(line)")
        await rig.cleanUp()
    }
}
