/// Which part of the IPv4 space an address is in, as far as a proxy acting for someone else must
/// care: everything but `.global` reaches the host itself, its local networks or no single host
/// at all, and is opened to a peer only when configured (the special-purpose registry of
/// RFC 6890 §2.2.2, with the ranges it lists for each case).
public enum IPv4AddressScope: Sendable, Equatable, CaseIterable, CustomStringConvertible {
    /// 0.0.0.0/8, "this host on this network" (RFC 1122 §3.2.1.3): Linux connects 0.0.0.0 to
    /// the host itself.
    case thisNetwork
    /// 127.0.0.0/8 (RFC 1122 §3.2.1.3).
    case loopback
    /// 169.254.0.0/16 (RFC 3927), where cloud metadata services live.
    case linkLocal
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 (RFC 1918 §3).
    case privateUse
    /// 100.64.0.0/10, carrier-grade NAT (RFC 6598 §7).
    case sharedAddressSpace
    /// 192.0.0.0/24, IETF protocol assignments (RFC 6890 §2.1): the whole block, although two
    /// of its /32s are globally reachable, as no terminal needs those.
    case protocolAssignments
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, for examples (RFC 5737 §3): no host on
    /// the internet has them, so one that answers is local to the host or its networks.
    case documentation
    /// 198.18.0.0/15, for benchmarking between devices on a lab network (RFC 2544 Appendix C.2.2).
    case benchmarking
    /// 224.0.0.0/4 (RFC 5771): not one host, and TCP cannot use it.
    case multicast
    /// 240.0.0.0/4 except the broadcast address (RFC 1112 §4).
    case reserved
    /// 255.255.255.255 (RFC 919 §7).
    case limitedBroadcast
    /// Anything else.
    case global

    public init(_ address: IPv4Address) {
        let v = address.value
        func within(_ network: UInt32, _ prefix: UInt32) -> Bool { v >> (32 - prefix) == network >> (32 - prefix) }
        if v == 0xFFFF_FFFF {
            self = .limitedBroadcast
        } else if within(0x0000_0000, 8) {
            self = .thisNetwork
        } else if within(0x7F00_0000, 8) {
            self = .loopback
        } else if within(0xA9FE_0000, 16) {
            self = .linkLocal
        } else if within(0x0A00_0000, 8) || within(0xAC10_0000, 12) || within(0xC0A8_0000, 16) {
            self = .privateUse
        } else if within(0x6440_0000, 10) {
            self = .sharedAddressSpace
        } else if within(0xC000_0000, 24) {
            self = .protocolAssignments
        } else if within(0xC000_0200, 24) || within(0xC633_6400, 24) || within(0xCB00_7100, 24) {
            self = .documentation
        } else if within(0xC612_0000, 15) {
            self = .benchmarking
        } else if within(0xE000_0000, 4) {
            self = .multicast
        } else if within(0xF000_0000, 4) {
            self = .reserved
        } else {
            self = .global
        }
    }

    public var description: String {
        switch self {
        case .thisNetwork: return "this-network (0/8)"
        case .loopback: return "loopback"
        case .linkLocal: return "link-local"
        case .privateUse: return "private (RFC 1918)"
        case .sharedAddressSpace: return "shared address space (100.64/10)"
        case .protocolAssignments: return "IETF protocol assignments (192.0.0/24)"
        case .documentation: return "documentation (RFC 5737)"
        case .benchmarking: return "benchmarking (198.18/15)"
        case .multicast: return "multicast"
        case .reserved: return "reserved (240/4)"
        case .limitedBroadcast: return "broadcast"
        case .global: return "global"
        }
    }
}
