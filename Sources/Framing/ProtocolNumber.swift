/// A PPP protocol number (RFC 1661 §2, IANA "PPP DLL Protocol Numbers"): the numbers this
/// project names, and any other kept as it came (a peer's unknown protocol is answered with
/// Protocol-Reject, RFC 1661 §5.7) and printed in hex.
public struct ProtocolNumber: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }
    public init(_ rawValue: UInt16) { self.rawValue = rawValue }

    public static let ipv4 = ProtocolNumber(0x0021)
    public static let vjCompressedTCP = ProtocolNumber(0x002D)
    public static let vjUncompressedTCP = ProtocolNumber(0x002F)
    public static let ipv6 = ProtocolNumber(0x0057)
    public static let mpls = ProtocolNumber(0x0281)
    public static let compressedDatagram = ProtocolNumber(0x00FD)
    public static let ipcp = ProtocolNumber(0x8021)
    public static let ipv6cp = ProtocolNumber(0x8057)
    public static let ccp = ProtocolNumber(0x80FD)
    public static let mplscp = ProtocolNumber(0x8281)
    public static let lcp = ProtocolNumber(0xC021)
    public static let pap = ProtocolNumber(0xC023)
    public static let lqr = ProtocolNumber(0xC025)
    public static let chap = ProtocolNumber(0xC223)
    public static let eap = ProtocolNumber(0xC227)

    /// The name pppd's debug log uses, where it has one.
    public var name: String? {
        switch self {
        case .ipv4: return "IP"
        case .vjCompressedTCP: return "VJC"
        case .vjUncompressedTCP: return "VJUC"
        case .ipv6: return "IPV6"
        case .mpls: return "MPLS"
        case .compressedDatagram: return "Comp"
        case .ipcp: return "IPCP"
        case .ipv6cp: return "IPV6CP"
        case .ccp: return "CCP"
        case .mplscp: return "MPLSCP"
        case .lcp: return "LCP"
        case .pap: return "PAP"
        case .lqr: return "LQR"
        case .chap: return "CHAP"
        case .eap: return "EAP"
        default: return nil
        }
    }

    /// The name, or the number in hex.
    public var description: String { name ?? "0x" + String(rawValue, radix: 16) }

    /// Control protocols (RFC 1661 §2: values 0x8000–0xBFFF are NCPs, 0xC000–0xFFFF link-layer control).
    public var isControl: Bool { rawValue >= 0x8000 }

    /// In the order of their numbers (a stable order for reports).
    public static func < (a: ProtocolNumber, b: ProtocolNumber) -> Bool { a.rawValue < b.rawValue }

    /// IPv4 and its VJ forms: the data path's frames.
    public var isIPData: Bool { self == .ipv4 || self == .vjCompressedTCP || self == .vjUncompressedTCP }
}
