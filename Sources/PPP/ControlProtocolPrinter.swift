import Framing
import Wire

/// A one-line rendering of a packet, and whether it was malformed.
public struct PacketText: Sendable, Equatable {
    public var text: String
    /// Set when the packet could not be read in full; `text` then says what was read.
    public var error: WireError?

    public init(_ text: String, error: WireError? = nil) {
        self.text = text
        self.error = error
    }
}

/// Renders LCP, the NCPs, PAP and CHAP in pppd's debug-log form, e.g.
/// `LCP ConfReq id=0x1 <asyncmap 0x0> <magic 0xa9bfc625> <pcomp> <accomp>`.
public enum ControlProtocolPrinter {
    /// nil when `proto` is not a control protocol this printer knows.
    public static func describe(protocol proto: ProtocolNumber, information: [UInt8], showPassword: Bool = false) -> PacketText? {
        let optionPrinter: ((ConfigurationOption) -> String)?
        switch proto {
        case ProtocolNumber.lcp: optionPrinter = { LCPOption($0).description }
        case ProtocolNumber.ipcp: optionPrinter = { IPCPOption($0).description }
        case ProtocolNumber.ccp: optionPrinter = CCPOption.describe
        case ProtocolNumber.ipv6cp: optionPrinter = IPV6CPOption.describe
        case ProtocolNumber.pap, ProtocolNumber.chap: optionPrinter = nil
        default:
            guard proto.isControl else { return nil }
            optionPrinter = PppdHex.option
        }
        let name = proto.description
        let packet: ControlPacket
        do {
            packet = try ControlPacket(parsing: information)
        } catch {
            var text = name
            if information.count >= 2 {
                text += " " + codeName(proto, ControlCode(information[0])) + " id=0x\(String(information[1], radix: 16))"
            }
            return PacketText(text + " malformed: \(error)", error: error)
        }
        switch proto {
        case ProtocolNumber.pap:
            do {
                return PacketText("PAP " + (try PAPPacket(packet)).describe(showPassword: showPassword))
            } catch {
                return PacketText("PAP \(codeName(proto, packet.code)) id=0x\(String(packet.identifier, radix: 16)) malformed: \(error)", error: error)
            }
        case ProtocolNumber.chap:
            do {
                return PacketText("CHAP " + (try CHAPPacket(packet)).description)
            } catch {
                return PacketText("CHAP \(codeName(proto, packet.code)) id=0x\(String(packet.identifier, radix: 16)) malformed: \(error)", error: error)
            }
        default:
            return negotiation(name: name, proto: proto, packet: packet, options: optionPrinter ?? PppdHex.option)
        }
    }

    static func codeName(_ proto: ProtocolNumber, _ code: ControlCode) -> String {
        let number = "code=0x\(String(code.rawValue, radix: 16))"
        switch proto {
        case ProtocolNumber.pap: return ["AuthReq", "AuthAck", "AuthNak"].element(Int(code.rawValue) - 1) ?? number
        case ProtocolNumber.chap: return ["Challenge", "Response", "Success", "Failure"].element(Int(code.rawValue) - 1) ?? number
        default:
            // Codes 8–13 exist in LCP only (RFC 1661 §5, RFC 1570); an NCP's code 9 is unknown.
            if proto != ProtocolNumber.lcp && code > ControlCode.codeReject { return number }
            return code.description
        }
    }

    private static func negotiation(name: String, proto: ProtocolNumber, packet p: ControlPacket,
                                    options: (ConfigurationOption) -> String) -> PacketText {
        var text = "\(name) \(codeName(proto, p.code)) id=0x\(String(p.identifier, radix: 16))"
        var rest = p.data[...]
        var error: WireError?
        switch p.code {
        case let code where code.carriesOptions:
            do {
                for o in try ConfigurationOption.parseList(p.data) { text += " <" + options(o) + ">" }
                rest = []
            } catch let e {
                error = e
                text += " malformed: \(e)"
            }
        case ControlCode.terminateRequest, ControlCode.terminateAck:
            if let first = p.data.first, (0x20..<0x7F).contains(first) {
                text += " " + PrintableString.quoted(p.data)
                rest = []
            }
        case ControlCode.echoRequest...ControlCode.timeRemaining where proto == ProtocolNumber.lcp:
            if rest.count >= 4 {
                text += " magic=0x" + String(be32(rest), radix: 16)
                rest = rest.dropFirst(4)
            }
            if p.code == ControlCode.timeRemaining && rest.count >= 4 {
                text += " seconds=\(be32(rest))"
                rest = rest.dropFirst(4)
            }
            if p.code >= ControlCode.identification && !rest.isEmpty {
                text += " " + PrintableString.quoted(Array(rest))
                rest = []
            }
        default:
            break
        }
        // pppd prints what is left, at most 32 bytes.
        text += PppdHex.spaced(Array(rest.prefix(32))) + (rest.count > 32 ? " ..." : "")
        return PacketText(text, error: error)
    }

    private static func be32(_ s: ArraySlice<UInt8>) -> UInt32 { BigEndian.uint32(s, s.startIndex) }
}

extension Array {
    func element(_ i: Int) -> Element? { indices.contains(i) ? self[i] : nil }
}
