import NetStack
import PPP
import Testing

/// Which addresses a host that lets the peer choose (no `--local-ip`/`--terminal-ip`) takes,
/// and the DNS server it hands the terminal.
@Suite struct AddressAcceptanceTests {
    let defaultLocal = IPv4Address(192, 168, 53, 1), defaultTerminal = IPv4Address(192, 168, 53, 2)
    let pppdLocal = IPv4Address(10, 0, 2, 15), pppdRemote = IPv4Address(10, 0, 2, 2)
    /// One of each range no host on a point-to-point link may have.
    static let unassignable = [
        IPv4Address(0, 1, 2, 3), IPv4Address(127, 0, 0, 1), IPv4Address(127, 53, 0, 1), IPv4Address(224, 0, 0, 1),
        IPv4Address(239, 255, 255, 250), IPv4Address(240, 0, 0, 1), IPv4Address(255, 255, 255, 255),
    ]

    /// What `pppbridge run` does in the host role without --local-ip and --terminal-ip.
    var choosingHost: LinkConfiguration {
        var c = LinkConfiguration.host(local: defaultLocal, terminal: defaultTerminal)
        c.ipcp.acceptLocal = true
        c.ipcp.acceptRemote = true
        return c
    }

    /// Our own code in the place of pppd run as `local:remote` without ipcp-accept-local or
    /// -remote: it keeps asking for `local` and Naks us with `remote`.
    func insisting(local: IPv4Address, remote: IPv4Address) -> LinkConfiguration {
        var c = LinkConfiguration.host(local: local, terminal: remote)
        c.ipcp.vj = nil
        c.negotiation.maxFailure = 10
        return c
    }

    @Test func onlyAddressesOneHostMayHaveAreAssignable() {
        for a in AddressAcceptanceTests.unassignable + [.any] { #expect(!IPCPPolicy.isAssignable(a), "\(a)") }
        for a in [defaultLocal, pppdLocal, IPv4Address(172, 16, 0, 1), IPv4Address(100, 64, 0, 1), IPv4Address(169, 254, 1, 1),
                  IPv4Address(8, 8, 8, 8), IPv4Address(223, 255, 255, 254)] {
            #expect(IPCPPolicy.isAssignable(a), "\(a)")
        }
    }

    @Test(arguments: AddressAcceptanceTests.unassignable)
    func aPeerInsistingOnAnUnassignableAddressForItselfEndsTheLinkUnopened(_ bad: IPv4Address) {
        var p = LinkPair(choosingHost, insisting(local: bad, remote: pppdRemote))
        p.start()
        p.run(for: .seconds(60)) { $0.downA != nil || $0.ipcpA != nil }
        #expect(p.ipcpA == nil, "IPCP opened with the peer at \(p.ipcpA.map { "\($0.peerAddress)" } ?? "?")")
        guard case let .addressConflict(c)? = p.downA else {
            Issue.record("host went down with \(String(describing: p.downA))")
            return
        }
        #expect(c.peerLocal == bad)
        print(c)
    }

    @Test(arguments: AddressAcceptanceTests.unassignable)
    func aPeerInsistingWeTakeAnUnassignableAddressEndsTheLinkUnopened(_ bad: IPv4Address) {
        for ours in [choosingHost, LinkConfiguration.terminal()] {
            var p = LinkPair(ours, insisting(local: pppdLocal, remote: bad))
            p.start()
            p.run(for: .seconds(60)) { $0.downA != nil || $0.ipcpA != nil }
            #expect(p.ipcpA == nil, "IPCP opened with our address \(p.ipcpA.map { "\($0.localAddress)" } ?? "?")")
            #expect(p.downA != nil)
            if case let .addressConflict(c)? = p.downA { #expect(c.peerAssigned == bad) }
        }
    }

    @Test func aPeerGivingBothEndsOneAddressEndsTheLinkUnopened() {
        var p = LinkPair(choosingHost, insisting(local: pppdLocal, remote: pppdLocal))
        p.start()
        p.run(for: .seconds(60)) { $0.downA != nil || $0.ipcpA != nil }
        #expect(p.ipcpA == nil, "IPCP opened at \(p.ipcpA.map { "\($0.localAddress) and \($0.peerAddress)" } ?? "?")")
        #expect(p.downA != nil)
        print(p.downA?.description ?? "")
    }

    @Test func theAddressOnePeerTookIsNotTheOtherEndsInEitherOrder() {
        let assign = IPCPOption.ipAddress(pppdLocal).option
        // Told to take X first, then asked for X: the peer is Nakked with the address it gets.
        var first = IPCPPolicy(configuration: choosingHost.ipcp)
        _ = first.peerRefused([assign], rejected: false)
        #expect(first.requestOptions().contains(assign))
        let firstVerdict = first.judge([assign], mayNak: true)
        #expect(firstVerdict == .nak([IPCPOption.ipAddress(defaultTerminal).option]))
        // Asked for X first, then told to take X: we keep our own.
        var second = IPCPPolicy(configuration: choosingHost.ipcp)
        let secondVerdict = second.judge([assign], mayNak: true)
        #expect(secondVerdict == .ack)
        _ = second.peerRefused([assign], rejected: false)
        #expect(second.requestOptions().contains(IPCPOption.ipAddress(defaultLocal).option))
        // Nor the address we are to give the peer.
        var third = IPCPPolicy(configuration: choosingHost.ipcp)
        _ = third.peerRefused([IPCPOption.ipAddress(defaultTerminal).option], rejected: false)
        #expect(third.requestOptions().contains(IPCPOption.ipAddress(defaultLocal).option))
    }

    @Test func aTerminalWithNoAddressToOfferRejectsAnUnassignableOneTheHostAsksFor() {
        for bad in AddressAcceptanceTests.unassignable {
            var policy = IPCPPolicy(configuration: LinkConfiguration.terminal().ipcp)
            let asked = IPCPOption.ipAddress(bad).option
            let verdict = policy.judge([asked], mayNak: true)
            #expect(verdict == .reject([asked]), "\(bad)")
        }
    }

    @Test func pppdsChoiceOfOrdinaryAddressesIsStillTaken() {
        var p = LinkPair(choosingHost, insisting(local: pppdLocal, remote: pppdRemote))
        p.start()
        p.run(for: .seconds(30)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpA?.localAddress == pppdRemote && p.ipcpA?.peerAddress == pppdLocal)
    }

    // MARK: DNS from a host that relays it on its own address

    /// A host without chosen addresses whose DNS relay runs (what the channel sets).
    var relayingHost: LinkConfiguration {
        var c = choosingHost
        c.ipcp.localAddressAsDNS = true
        return c
    }

    @Test func aTerminalAskingForDNSGetsTheHostsPPPAddress() {
        var p = LinkPair(relayingHost, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpB?.dnsServers == [defaultLocal])
        #expect(p.ipcpA?.dnsServers == [defaultLocal])
    }

    @Test func aTerminalThatChoseTheHostsAddressGetsThatAddressAsDNS() {
        // A terminal that assigns the host its address and asks for DNS.
        var t = LinkConfiguration.terminal()
        t.ipcp.peerAddress = pppdRemote
        t.ipcp.acceptRemote = false
        var p = LinkPair(relayingHost, t)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpA?.localAddress == pppdRemote)
        #expect(p.ipcpB?.dnsServers == [pppdRemote], "\(String(describing: p.ipcpB?.dnsServers))")
        #expect(p.ipcpA?.dnsServers == [pppdRemote])
    }

    @Test func configuredDNSServersComeBeforeOurOwnAddress() {
        var h = relayingHost
        h.ipcp.dnsServers = [IPv4Address(10, 0, 2, 3)]
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpB?.dnsServers == [IPv4Address(10, 0, 2, 3)])
    }
}
