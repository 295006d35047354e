/// PPP protocol numbers (RFC 1661 §2, IANA "PPP DLL Protocol Numbers") that this project
/// names. Any other number is carried as is and printed in hex.
public enum ProtocolNumber {
    public static let ipv4: UInt16 = 0x0021
    public static let vjCompressedTCP: UInt16 = 0x002D
    public static let vjUncompressedTCP: UInt16 = 0x002F
    public static let ipv6: UInt16 = 0x0057
    public static let mpls: UInt16 = 0x0281
    public static let compressedDatagram: UInt16 = 0x00FD
    public static let ipcp: UInt16 = 0x8021
    public static let ipv6cp: UInt16 = 0x8057
    public static let ccp: UInt16 = 0x80FD
    public static let lcp: UInt16 = 0xC021
    public static let pap: UInt16 = 0xC023
    public static let lqr: UInt16 = 0xC025
    public static let chap: UInt16 = 0xC223
    public static let eap: UInt16 = 0xC227

    /// The name pppd's debug log uses, where it has one.
    public static func name(_ proto: UInt16) -> String? {
        switch proto {
        case ipv4: return "IP"
        case vjCompressedTCP: return "VJC"
        case vjUncompressedTCP: return "VJUC"
        case ipv6: return "IPV6"
        case mpls: return "MPLS"
        case compressedDatagram: return "Comp"
        case ipcp: return "IPCP"
        case ipv6cp: return "IPV6CP"
        case ccp: return "CCP"
        case 0x8281: return "MPLSCP"
        case lcp: return "LCP"
        case pap: return "PAP"
        case lqr: return "LQR"
        case chap: return "CHAP"
        case eap: return "EAP"
        default: return nil
        }
    }

    /// Control protocols (RFC 1661 §2: values 0x8000–0xBFFF are NCPs, 0xC000–0xFFFF link-layer control).
    public static func isControl(_ proto: UInt16) -> Bool { proto >= 0x8000 }

    /// IPv4 and its VJ forms: the data path's frames.
    public static func isIPData(_ proto: UInt16) -> Bool {
        proto == ipv4 || proto == vjCompressedTCP || proto == vjUncompressedTCP
    }
}
