import ChannelTestSupport
import Glibc
import Testing

@Suite struct HostSupportTests {
    @Test func freePortsAreDistinctBindableAndOutsideTheEphemeralRange() throws {
        let range = try String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)
            .split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        try #require(range.count == 2)
        var seen = Set<UInt16>()
        for _ in 0..<200 {
            let port = Host.freePort()
            #expect(!(range[0]...range[1]).contains(Int(port)), "port \(port) is in the ephemeral range")
            #expect(seen.insert(port).inserted, "port \(port) handed out twice")
        }
        let (server, port) = try LoopbackServer.onFreePort(mode: .echo)
        #expect(!(range[0]...range[1]).contains(Int(port)))
        server.stop()
    }
}
