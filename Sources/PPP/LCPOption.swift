import Framing
import Wire

/// LCP configuration options (RFC 1661 §6, RFC 1570, RFC 1990), parsed into values that can
/// emit themselves byte for byte. Options this project does not interpret stay `.other`.
public enum LCPOption: Sendable, Equatable {
    case maximumReceiveUnit(UInt16)
    case asyncControlCharacterMap(UInt32)
    /// Authentication-Protocol with its protocol-specific data (CHAP's algorithm byte).
    case authenticationProtocol(ProtocolNumber, data: [UInt8])
    case qualityProtocol(ProtocolNumber, data: [UInt8])
    case magicNumber(UInt32)
    case protocolFieldCompression
    case addressControlFieldCompression
    /// RFC 1570 FCS-Alternatives: bit 0 null, bit 1 CCITT-16, bit 2 CCITT-32.
    case fcsAlternatives(UInt8)
    /// RFC 1570 Callback: operation and message.
    case callback(operation: UInt8, message: [UInt8])
    /// RFC 1990 Multilink MRRU.
    case multilinkMRRU(UInt16)
    /// RFC 1990 Endpoint Discriminator: class and address.
    case endpointDiscriminator(class: UInt8, address: [UInt8])
    case other(ConfigurationOption)

    /// An LCP option's type (RFC 1661 §6, RFC 1570, RFC 1990). Any other type is kept as it came.
    public struct Kind: RawRepresentable, Hashable, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public init(_ rawValue: UInt8) { self.rawValue = rawValue }

        public static let mru = Kind(1)
        public static let accm = Kind(2)
        public static let authenticationProtocol = Kind(3)
        public static let qualityProtocol = Kind(4)
        public static let magicNumber = Kind(5)
        public static let pfc = Kind(7)
        public static let acfc = Kind(8)
        public static let fcsAlternatives = Kind(9)
        public static let callback = Kind(13)
        public static let mrru = Kind(17)
        public static let endpointDiscriminator = Kind(19)
    }

    /// Interprets one option. A known type with the wrong length stays `.other`: the
    /// negotiation layer rejects or naks it; a printer shows it in hex.
    public init(_ o: ConfigurationOption) {
        let v = o.value
        func u16() -> UInt16 { BigEndian.uint16(v, 0) }
        func u32() -> UInt32 { BigEndian.uint32(v, 0) }
        switch (Kind(o.type), v.count) {
        case (Kind.mru, 2): self = .maximumReceiveUnit(u16())
        case (Kind.accm, 4): self = .asyncControlCharacterMap(u32())
        case (Kind.authenticationProtocol, 2...): self = .authenticationProtocol(ProtocolNumber(u16()), data: Array(v[2...]))
        case (Kind.qualityProtocol, 2...): self = .qualityProtocol(ProtocolNumber(u16()), data: Array(v[2...]))
        case (Kind.magicNumber, 4): self = .magicNumber(u32())
        case (Kind.pfc, 0): self = .protocolFieldCompression
        case (Kind.acfc, 0): self = .addressControlFieldCompression
        case (Kind.fcsAlternatives, 1): self = .fcsAlternatives(v[0])
        case (Kind.callback, 1...): self = .callback(operation: v[0], message: Array(v[1...]))
        case (Kind.mrru, 2): self = .multilinkMRRU(u16())
        case (Kind.endpointDiscriminator, 1...): self = .endpointDiscriminator(class: v[0], address: Array(v[1...]))
        default: self = .other(o)
        }
    }

    public var option: ConfigurationOption {
        switch self {
        case let .maximumReceiveUnit(m): return ConfigurationOption(kind: Kind.mru, value: BigEndian.bytes(m))
        case let .asyncControlCharacterMap(a): return ConfigurationOption(kind: Kind.accm, value: BigEndian.bytes(a))
        case let .authenticationProtocol(p, data): return ConfigurationOption(kind: Kind.authenticationProtocol, value: BigEndian.bytes(p.rawValue) + data)
        case let .qualityProtocol(p, data): return ConfigurationOption(kind: Kind.qualityProtocol, value: BigEndian.bytes(p.rawValue) + data)
        case let .magicNumber(m): return ConfigurationOption(kind: Kind.magicNumber, value: BigEndian.bytes(m))
        case .protocolFieldCompression: return ConfigurationOption(kind: Kind.pfc)
        case .addressControlFieldCompression: return ConfigurationOption(kind: Kind.acfc)
        case let .fcsAlternatives(bits): return ConfigurationOption(kind: Kind.fcsAlternatives, value: [bits])
        case let .callback(op, message): return ConfigurationOption(kind: Kind.callback, value: [op] + message)
        case let .multilinkMRRU(m): return ConfigurationOption(kind: Kind.mrru, value: BigEndian.bytes(m))
        case let .endpointDiscriminator(c, address): return ConfigurationOption(kind: Kind.endpointDiscriminator, value: [c] + address)
        case let .other(o): return o
        }
    }

    /// pppd's rendering inside `<...>` (lcp_printpkt).
    public var description: String {
        switch self {
        case let .maximumReceiveUnit(m): return "mru \(m)"
        case let .asyncControlCharacterMap(a): return "asyncmap 0x\(String(a, radix: 16))"
        case let .authenticationProtocol(p, data):
            switch p {
            case ProtocolNumber.pap: return "auth pap" + PppdHex.spaced(data)
            case ProtocolNumber.chap:
                guard let algorithm = data.first else { return "auth chap" }
                let names: [UInt8: String] = [5: "MD5", 0x80: "MS", 0x81: "MS-v2"]
                return "auth chap " + (names[algorithm] ?? "0x" + String(algorithm, radix: 16)) + PppdHex.spaced(Array(data.dropFirst()))
            case ProtocolNumber.eap: return "auth eap" + PppdHex.spaced(data)
            default: return "auth 0x\(String(p.rawValue, radix: 16))" + PppdHex.spaced(data)
            }
        case let .qualityProtocol(p, data):
            return (p == ProtocolNumber.lqr ? "quality lqr" : "quality 0x\(String(p.rawValue, radix: 16))") + PppdHex.spaced(data)
        case let .magicNumber(m): return "magic 0x\(String(m, radix: 16))"
        case .protocolFieldCompression: return "pcomp"
        case .addressControlFieldCompression: return "accomp"
        case let .fcsAlternatives(bits): return "fcs 0x\(String(bits, radix: 16))"
        case let .callback(op, message):
            return (op == 6 ? "callback CBCP" : "callback 0x\(String(op, radix: 16))") + PppdHex.spaced(message)
        case let .multilinkMRRU(m): return "mrru \(m)"
        case let .endpointDiscriminator(c, address):
            let classes: [UInt8: String] = [0: "null", 1: "local", 2: "IP", 3: "MAC", 4: "magic", 5: "phone"]
            return "endpoint [\(classes[c] ?? "class\(c)"):\(PppdHex.dotted(address))]"
        case let .other(o): return PppdHex.option(o)
        }
    }
}

/// Hex as pppd's debug log prints it (lower case), for the printers; `Crypto.Hex` is the
/// payment protocols' upper-case text.
public enum PppdHex {
    /// " 0f 01" — a leading space, then each byte (pppd prints trailing option bytes so).
    public static func spaced(_ bytes: [UInt8]) -> String {
        bytes.map { " " + byte($0) }.joined()
    }

    public static func byte(_ b: UInt8) -> String {
        let s = String(b, radix: 16)
        return s.count == 1 ? "0" + s : s
    }

    /// "fc8c01b2" — contiguous.
    public static func string(_ bytes: [UInt8]) -> String { bytes.map(byte).joined() }

    /// "c8.01.0e" — pppd's endpoint rendering.
    public static func dotted(_ bytes: [UInt8]) -> String { bytes.map(byte).joined(separator: ".") }

    /// An option nobody interprets: its type and its bytes.
    public static func option(_ o: ConfigurationOption) -> String {
        "0x\(String(o.type, radix: 16))" + spaced(o.value)
    }
}
