import Framing
import Wire
import PPP

/// One line per PPP frame, in pppd's debug-log form where pppd has one:
/// `[LCP ConfReq id=0x1 <asyncmap 0x0> <magic 0xa9bfc625> <pcomp> <accomp>]`, and
/// `[IP 10.0.2.15 > 10.0.2.2 TCP 1024 > 80 S seq=... len=0]` for IP.
public enum FramePrinter {
    public static func describe(_ frame: PPPFrame, showPassword: Bool = false) -> PacketText {
        let info = frame.information
        if let control = ControlProtocolPrinter.describe(protocol: frame.protocol, information: info, showPassword: showPassword) {
            return control
        }
        switch frame.protocol {
        case ProtocolNumber.ipv4:
            let line = IPPacketPrinter.describe(info)
            return PacketText(line.text, error: line.problem.map { .malformed($0.description) })
        case ProtocolNumber.vjUncompressedTCP:
            // RFC 1144 §3.2.2: an IP header whose protocol field holds the connection number.
            guard info.count >= 20 else {
                return PacketText("VJUC malformed: \(info.count) bytes", error: .truncated(what: "VJ uncompressed header", needed: 20, available: info.count))
            }
            var restored = info
            let slot = restored[9]
            restored[9] = IPProtocol.tcp.rawValue
            let line = IPPacketPrinter.describe(restored)
            return PacketText("VJUC conn=\(slot) " + line.text, error: line.problem.map { .malformed($0.description) })
        case ProtocolNumber.vjCompressedTCP:
            do {
                let h = try info.withUnsafeBytes { raw throws(WireError) in try VJCompressedHeader(parsing: raw) }
                let summary = h.summary
                return PacketText("VJC " + (summary.isEmpty ? "" : summary + " ") + "len=\(info.count - h.headerLength)")
            } catch {
                return PacketText("VJC malformed: \(error)", error: .malformed("\(error)"))
            }
        case ProtocolNumber.ipv6:
            guard info.count >= 40 else { return PacketText("IPV6 malformed: \(info.count) bytes", error: .truncated(what: "IPv6 header", needed: 40, available: info.count)) }
            func address(_ at: Int) -> String {
                stride(from: at, to: at + 16, by: 2).map { String(BigEndian.uint16(info, $0), radix: 16) }.joined(separator: ":")
            }
            return PacketText("IPV6 \(address(8)) > \(address(24)) next=\(info[6]) len=\(BigEndian.uint16(info, 4))")
        case ProtocolNumber.mpls:
            return mpls(info)
        default:
            let name = frame.protocol.name ?? "proto=0x" + PppdHex.string(BigEndian.bytes(frame.protocol.rawValue))
            return PacketText("\(name) len=\(info.count)" + PppdHex.spaced(Array(info.prefix(32))) + (info.count > 32 ? " ..." : ""))
        }
    }

    /// RFC 3032 label stack entries, then the IPv4 packet under the bottom of the stack.
    static func mpls(_ info: [UInt8]) -> PacketText {
        var text = "MPLS"
        var i = 0
        while i + 4 <= info.count {
            let entry = BigEndian.uint32(info, i)
            let bottom = entry & 0x100 != 0
            text += " label=\(entry >> 12) tc=\((entry >> 9) & 7)\(bottom ? " S" : "") ttl=\(entry & 0xFF)"
            i += 4
            if bottom {
                if i < info.count && info[i] >> 4 == 4 {
                    let line = IPPacketPrinter.describe(Array(info[i...]))
                    return PacketText(text + " " + line.text, error: line.problem.map { .malformed($0.description) })
                }
                return PacketText(text + " len=\(info.count - i)")
            }
        }
        return PacketText(text + " malformed: label stack without bottom", error: .malformed("MPLS label stack without bottom"))
    }
}
