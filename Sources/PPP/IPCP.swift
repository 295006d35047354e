import Wire

/// IPCP settings (RFC 1332, RFC 1877), pppd's names in the comments.
public struct IPCPConfiguration: Sendable, Equatable {
    /// Our address; nil asks the peer to assign one (`noipdefault`).
    public var localAddress: IPv4Address?
    /// The address the peer gets; nil accepts whatever it proposes.
    public var peerAddress: IPv4Address?
    /// Take an address the peer Naks us with instead of ours (`ipcp-accept-local`).
    public var acceptLocal = false
    /// Let the peer keep an address it proposes instead of `peerAddress` (`ipcp-accept-remote`).
    public var acceptRemote = false
    /// DNS servers given to a peer that asks (`ms-dns`, at most two).
    public var dnsServers: [IPv4Address] = []
    /// With no `dnsServers`, give a peer that asks for a primary DNS server our own address (a
    /// DNS relay answers there): the one we are asking for at the time, so the address the peer
    /// Naks us with when `acceptLocal` lets it choose ours (RFC 1877 §1.1).
    public var localAddressAsDNS = false
    /// Ask the peer for DNS servers (`usepeerdns`).
    public var requestDNS = false
    /// Reported to the channel's users as the submask; a point-to-point link is /32.
    public var netmask = IPv4Address(255, 255, 255, 255)
    /// VJ header compression we ask to receive and let the peer ask for (pppd's default: 16
    /// slots, slot-id compression); nil refuses it both ways (`novj`).
    public var vj: VJParameters? = VJParameters()

    public init() {}
}

/// What IPCP settled.
public struct IPCPResult: Sendable, Equatable {
    public var localAddress: IPv4Address
    public var peerAddress: IPv4Address
    public var dnsServers: [IPv4Address]
    public var netmask: IPv4Address
    /// VJ compression for what we send (the peer asked for it) and what we receive (we asked).
    public var transmitVJ: VJParameters?
    public var receiveVJ: VJParameters?

    public init(localAddress: IPv4Address, peerAddress: IPv4Address, dnsServers: [IPv4Address], netmask: IPv4Address,
                transmitVJ: VJParameters? = nil, receiveVJ: VJParameters? = nil) {
        self.localAddress = localAddress
        self.peerAddress = peerAddress
        self.dnsServers = dnsServers
        self.netmask = netmask
        self.transmitVJ = transmitVJ
        self.receiveVJ = receiveVJ
    }
}

/// Both ends insisted on addresses the other would not take (RFC 1332 §3.3): what each side
/// wanted for itself and for the other. pppd ends such a link too ("Refused our IP address");
/// opening it would leave each side with addresses the other never agreed to.
public struct AddressConflict: Sendable, Equatable, CustomStringConvertible {
    /// Our address and the peer's, as configured.
    public var local: IPv4Address?
    public var peer: IPv4Address?
    /// The address the peer kept asking for itself, and the one it kept telling us to take;
    /// nil where it did not insist.
    public var peerLocal: IPv4Address?
    public var peerAssigned: IPv4Address?

    public init(local: IPv4Address?, peer: IPv4Address?, peerLocal: IPv4Address?, peerAssigned: IPv4Address?) {
        self.local = local
        self.peer = peer
        self.peerLocal = peerLocal
        self.peerAssigned = peerAssigned
    }

    public var description: String {
        func show(_ a: IPv4Address?) -> String { a.map { "\($0)" } ?? "any" }
        return "IP addresses refused: we insisted on \(show(local)) for us and \(show(peer)) for the peer; "
            + "the peer insisted on \(show(peerLocal)) for itself and \(show(peerAssigned)) for us"
    }
}

/// IPCP's option policy for the shared automaton: addresses, DNS (RFC 1877) and VJ header
/// compression (RFC 1332 §3.2).
public struct IPCPPolicy: NegotiationPolicy {
    public var configuration: IPCPConfiguration
    /// Why IPCP cannot succeed (no address for us); the link closes with this reason.
    public private(set) var failure: String?
    /// Set when the peer insists on addresses we may not take; the link closes with it.
    public private(set) var conflict: AddressConflict?
    /// Configure-Naks of our address, with one we may not take, before the peer counts as
    /// insisting (pppd's default max-failure: after that many it would reject instead).
    public static let insistenceLimit = 10

    private var local: IPv4Address?
    private var askAddress = true
    private var dns: [IPv4Address?] = []
    private var acceptedPeerAddress: IPv4Address?
    /// The address the peer's latest Configure-Request asked for itself, had we acked it (this
    /// negotiation's): we do not take it for ours.
    private var peerCandidate: IPv4Address?
    private var acknowledgedLocal: IPv4Address?
    private var acknowledgedDNS: [IPv4Address] = []
    /// We told a peer that left out IP-Address which address it gets (once per negotiation).
    private var hintedAddress = false
    /// What the peer asked for itself and told us to take, when we could not follow it.
    private var refusedPeerLocal: IPv4Address?
    private var refusedAssignment: IPv4Address?
    private var refusedAssignments = 0
    /// What we ask to receive, until the peer refuses it.
    private var requestVJ: VJParameters?
    private var acknowledgedVJ: VJParameters?
    private var peerVJ: VJParameters?

    public init(configuration: IPCPConfiguration) {
        self.configuration = configuration
        resetNegotiation()
    }

    public var result: IPCPResult {
        let local = acknowledgedLocal ?? configuration.localAddress ?? .any
        let peer = acceptedPeerAddress ?? configuration.peerAddress ?? .any
        // The terminal learns DNS from the host; the host hands out its own.
        let dns = configuration.requestDNS ? acknowledgedDNS : offeredDNS(local: local)
        return IPCPResult(localAddress: local, peerAddress: peer, dnsServers: dns, netmask: configuration.netmask,
                          transmitVJ: peerVJ, receiveVJ: acknowledgedVJ)
    }

    public func handlesExtendedCode(_ code: ControlCode) -> Bool { false }

    public mutating func resetNegotiation() {
        local = configuration.localAddress
        askAddress = true
        dns = configuration.requestDNS ? [.any, .any] : []
        hintedAddress = false
        peerCandidate = nil
        requestVJ = configuration.vj
        failure = nil
        conflict = nil
        refusedPeerLocal = nil
        refusedAssignment = nil
        refusedAssignments = 0
    }

    private mutating func insisted() {
        guard conflict == nil else { return }
        conflict = AddressConflict(local: configuration.localAddress, peer: configuration.peerAddress,
                                   peerLocal: refusedPeerLocal, peerAssigned: refusedAssignment)
    }

    /// Whether a peer may have `address` on the link, for itself or for us: not 0.0.0.0/8,
    /// loopback, multicast, class E or the limited broadcast address, none of which names one
    /// host on a point-to-point link (RFC 1122 §3.2.1.3, RFC 5771, RFC 1112 §4). pppd refuses
    /// the same (`bad_ip_adrs`). An address we were configured with is not judged.
    public static func isAssignable(_ address: IPv4Address) -> Bool {
        switch IPv4AddressScope(address) {
        case .thisNetwork, .loopback, .multicast, .reserved, .limitedBroadcast: return false
        // Private and other special-purpose unicast ranges are what links are numbered from.
        default: return true
        }
    }

    /// The DNS servers we give a peer that asks (RFC 1877), `local` being our address as it
    /// stands.
    private func offeredDNS(local: IPv4Address?) -> [IPv4Address] {
        guard configuration.dnsServers.isEmpty, configuration.localAddressAsDNS else { return configuration.dnsServers }
        guard let local, local != .any else { return [] }
        return [local]
    }

    public func requestOptions() -> [ConfigurationOption] {
        var o: [IPCPOption] = []
        if let vj = requestVJ { o.append(.compression(protocol: .vjCompressedTCP, data: [vj.maxSlotID, vj.compressSlotID ? 1 : 0])) }
        if askAddress { o.append(.ipAddress(local ?? .any)) }
        if dns.count > 0, let primary = dns[0] { o.append(.primaryDNS(primary)) }
        if dns.count > 1, let secondary = dns[1] { o.append(.secondaryDNS(secondary)) }
        return o.map(\.option)
    }

    public mutating func judge(_ options: [ConfigurationOption], mayNak: Bool) -> RequestVerdict {
        var naks: [ConfigurationOption] = []
        var rejects: [ConfigurationOption] = []
        var peerAddress: IPv4Address?
        var sawAddress = false
        var vj: VJParameters?
        func nak(_ o: IPCPOption, else raw: ConfigurationOption) {
            if mayNak { naks.append(o.option) } else { rejects.append(raw) }
        }
        for raw in options {
            switch IPCPOption(raw) {
            case let .ipAddress(a):
                sawAddress = true
                // What the peer chooses for itself is taken only if a host may have it and it
                // is not the address we ask for: with a TUN the kernel routes to it.
                let choosable = a != .any && IPCPPolicy.isAssignable(a) && a != local
                if let assigned = configuration.peerAddress {
                    if a == assigned || (choosable && configuration.acceptRemote) {
                        peerAddress = a
                    } else {
                        if a != .any { refusedPeerLocal = a }
                        // After Max-Failure Naks the peer still wants its own address: a Reject
                        // would open the link on an address it never agreed to (RFC 1332 §3.3).
                        if !mayNak && a != .any { insisted() }
                        nak(.ipAddress(assigned), else: raw)
                    }
                } else if !choosable {
                    // RFC 1332 §3.3: we have nothing to give instead (pppd rejects 0.0.0.0 too).
                    rejects.append(raw)
                } else {
                    peerAddress = a
                }
            case let .primaryDNS(a), let .secondaryDNS(a):
                let index = raw.isKind(IPCPOption.Kind.primaryDNS) ? 0 : 1
                let servers = offeredDNS(local: local)
                guard index < servers.count else {
                    rejects.append(raw)
                    continue
                }
                let ours = servers[index]
                if a != ours { nak(index == 0 ? .primaryDNS(ours) : .secondaryDNS(ours), else: raw) }
            case let .compression(proto, data):
                // The peer asks to receive VJ-compressed packets from us; any slot count is fine.
                guard let ours = configuration.vj else {
                    rejects.append(raw)
                    continue
                }
                if proto == .vjCompressedTCP && data.count == 2 && data[1] <= 1 && data[0] >= 1 {
                    vj = VJParameters(maxSlotID: data[0], compressSlotID: data[1] == 1)
                } else {
                    nak(.compression(protocol: .vjCompressedTCP, data: [ours.maxSlotID, ours.compressSlotID ? 1 : 0]), else: raw)
                }
            default:
                // IP-Addresses (deprecated), NBNS, unknown.
                rejects.append(raw)
            }
        }
        peerCandidate = peerAddress
        if !rejects.isEmpty { return .reject(rejects) }
        // RFC 1332 §3.3: a peer that does not ask for an address is told the one it gets,
        // once (pppd does the same); after that its silence is accepted.
        if !sawAddress, let assigned = configuration.peerAddress, mayNak, !hintedAddress {
            hintedAddress = true
            naks.append(IPCPOption.ipAddress(assigned).option)
        }
        if !naks.isEmpty { return .nak(naks) }
        acceptedPeerAddress = peerAddress
        peerVJ = vj
        return .ack
    }

    public mutating func acknowledged(_ options: [ConfigurationOption]) {
        acknowledgedLocal = askAddress ? local : configuration.localAddress
        acknowledgedDNS = dns.compactMap { $0 }.filter { $0 != .any }
        acknowledgedVJ = requestVJ
        if (acknowledgedLocal ?? .any) == .any { failure = "could not determine the local IP address" }
    }

    public mutating func peerRefused(_ options: [ConfigurationOption], rejected: Bool) -> Bool {
        // RFC 1661 §5.4: a Reject names only options we sent, unchanged.
        if rejected && !options.allSatisfy(requestOptions().contains) { return false }
        for raw in options {
            switch IPCPOption(raw) {
            case let .ipAddress(a):
                if rejected {
                    askAddress = false
                    if local == nil { failure = "peer refused to assign an IP address" }
                    // A peer that told us to take another address and now rejects ours has
                    // not agreed to it.
                    if refusedAssignment != nil { insisted() }
                } else if (local == nil || configuration.acceptLocal) && IPCPPolicy.isAssignable(a)
                            && a != peerCandidate && a != configuration.peerAddress {
                    // Never the address the peer asks for itself or is to get: one address at
                    // both ends routes to neither.
                    local = a
                } else if a != .any && a != local {
                    refusedAssignment = a
                    refusedAssignments += 1
                    if refusedAssignments >= IPCPPolicy.insistenceLimit { insisted() }
                }
            case let .primaryDNS(a):
                if dns.count > 0 { dns[0] = rejected ? nil : a }
            case let .secondaryDNS(a):
                if dns.count > 1 { dns[1] = rejected ? nil : a }
            case let .compression(proto, data):
                // A Nak proposing other VJ parameters is taken; anything else stops us asking.
                if !rejected && proto == .vjCompressedTCP && data.count == 2 && data[1] <= 1 && data[0] >= 1 {
                    requestVJ = VJParameters(maxSlotID: data[0], compressSlotID: data[1] == 1)
                } else {
                    requestVJ = nil
                }
            default:
                break
            }
        }
        return true
    }
}
