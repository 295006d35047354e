import Framing
import Wire

/// IPCP configuration options (RFC 1332, RFC 1877).
public enum IPCPOption: Sendable, Equatable {
    /// Deprecated IP-Addresses option (RFC 1172): source and destination.
    case ipAddresses(IPv4Address, IPv4Address)
    /// IP-Compression-Protocol: protocol (0x002D for VJ) and its data (max-slot-id, comp-slot-id).
    case compression(protocol: ProtocolNumber, data: [UInt8])
    case ipAddress(IPv4Address)
    case primaryDNS(IPv4Address)
    case primaryNBNS(IPv4Address)
    case secondaryDNS(IPv4Address)
    case secondaryNBNS(IPv4Address)
    case other(ConfigurationOption)

    /// An IPCP option's type (RFC 1332 §3, RFC 1877 §1). Any other type is kept as it came.
    public struct Kind: RawRepresentable, Hashable, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public init(_ rawValue: UInt8) { self.rawValue = rawValue }

        public static let ipAddresses = Kind(1)
        public static let compression = Kind(2)
        public static let ipAddress = Kind(3)
        public static let primaryDNS = Kind(129)
        public static let primaryNBNS = Kind(130)
        public static let secondaryDNS = Kind(131)
        public static let secondaryNBNS = Kind(132)
    }

    public init(_ o: ConfigurationOption) {
        let v = o.value
        func address(_ at: Int) -> IPv4Address { IPv4Address(v[at], v[at + 1], v[at + 2], v[at + 3]) }
        switch (Kind(o.type), v.count) {
        case (Kind.ipAddresses, 8): self = .ipAddresses(address(0), address(4))
        case (Kind.compression, 2...): self = .compression(protocol: ProtocolNumber(BigEndian.uint16(v, 0)), data: Array(v[2...]))
        case (Kind.ipAddress, 4): self = .ipAddress(address(0))
        case (Kind.primaryDNS, 4): self = .primaryDNS(address(0))
        case (Kind.primaryNBNS, 4): self = .primaryNBNS(address(0))
        case (Kind.secondaryDNS, 4): self = .secondaryDNS(address(0))
        case (Kind.secondaryNBNS, 4): self = .secondaryNBNS(address(0))
        default: self = .other(o)
        }
    }

    public var option: ConfigurationOption {
        switch self {
        case let .ipAddresses(a, b): return ConfigurationOption(kind: Kind.ipAddresses, value: a.bytes + b.bytes)
        case let .compression(p, data): return ConfigurationOption(kind: Kind.compression, value: BigEndian.bytes(p.rawValue) + data)
        case let .ipAddress(a): return ConfigurationOption(kind: Kind.ipAddress, value: a.bytes)
        case let .primaryDNS(a): return ConfigurationOption(kind: Kind.primaryDNS, value: a.bytes)
        case let .primaryNBNS(a): return ConfigurationOption(kind: Kind.primaryNBNS, value: a.bytes)
        case let .secondaryDNS(a): return ConfigurationOption(kind: Kind.secondaryDNS, value: a.bytes)
        case let .secondaryNBNS(a): return ConfigurationOption(kind: Kind.secondaryNBNS, value: a.bytes)
        case let .other(o): return o
        }
    }

    /// pppd's rendering inside `<...>` (ipcp_printpkt).
    public var description: String {
        switch self {
        case let .ipAddresses(a, b): return "addrs \(a) \(b)"
        case let .compression(p, data):
            let name: String
            switch p {
            case ProtocolNumber.vjCompressedTCP: name = "VJ"
            case ProtocolNumber(0x0037): name = "old-VJ"
            default: name = "0x\(String(p.rawValue, radix: 16))"
            }
            return "compress \(name)" + PppdHex.spaced(data)
        case let .ipAddress(a): return "addr \(a)"
        case let .primaryDNS(a): return "ms-dns1 \(a)"
        case let .secondaryDNS(a): return "ms-dns2 \(a)"
        case let .primaryNBNS(a), let .secondaryNBNS(a): return "ms-wins \(a)"
        case let .other(o): return PppdHex.option(o)
        }
    }
}

