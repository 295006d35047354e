import ChannelTestSupport
import Glibc
import Testing

@Suite struct HostSupportTests {
    @Test func freePortsAreDistinctBindableAndOutsideTheEphemeralRange() throws {
        let range = try String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)
            .split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        try #require(range.count == 2)
        // A machine whose ephemeral range leaves no room (1024–65535) gets the kernel's choice.
        let roomOutside = range[0] > 12000 || range[1] < 63000
        var seen = Set<UInt16>()
        for _ in 0..<200 {
            let port = Host.freePort()
            if roomOutside {
                #expect(!(range[0]...range[1]).contains(Int(port)), "port \(port) is in the ephemeral range")
                #expect(seen.insert(port).inserted, "port \(port) handed out twice")
            }
        }
        let (server, port) = try LoopbackServer.onFreePort(mode: .echo)
        #expect(!roomOutside || !(range[0]...range[1]).contains(Int(port)))
        server.stop()
    }
}
