import NetStack
import Testing
import Channel
import ChannelTestSupport

/// The DNS server the host role hands the terminal when its relay runs.
@Suite(.timeLimit(.minutes(10)))
struct HostRoleDNSTests {
    @Test func aHostWithoutChosenAddressesGivesTheTerminalItsPPPAddressAsDNS() async throws {
        // `pppbridge run` without --local-ip and --terminal-ip; no query is sent upstream.
        let rig = try PtyRig {
            $0.relayDNS = true
            $0.dnsUpstream = TCPEndpoint(IPv4Address(127, 0, 0, 1), 9)
            $0.link.ipcp.acceptLocal = true
            $0.link.ipcp.acceptRemote = true
        }
        let addresses = try await rig.channel.open()
        let terminal = try #require(await rig.terminal.waitUntilUp())
        print("terminal's DNS: \(terminal.dnsServers), host's address: \(addresses.ip)")
        #expect(terminal.dnsServers == [addresses.ip])
        #expect(addresses.dns == addresses.ip)
        await rig.cleanUp()
    }
}
