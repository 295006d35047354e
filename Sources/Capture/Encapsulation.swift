import Framing
import NetStack
import PPP

/// A PPP frame found inside a capture record, with how it was carried.
public struct CarriedFrame: Sendable, Equatable {
    public var frame: PPPFrame
    public var direction: Direction?
    /// Outer layers, outermost first, e.g. ["PPPoE 0x0011"] or ["PPPoE 0x3b1a", "L2TP 18994/54110"].
    public var via: [String]
}

/// What one capture record holds.
public struct RecordContents: Sendable, Equatable {
    public var frames: [CarriedFrame] = []
    /// Records that carry no PPP frame but are part of the PPP story (PPPoE discovery).
    public var notes: [String] = []
    /// A PPP header that could not be read.
    public var problems: [String] = []
}

/// Finds the PPP frames in capture records: directly (link types 9, 50, 204), in PPPoE
/// sessions and PPTP's enhanced GRE (link type 1), and inside L2TP carried by any of these.
public enum Encapsulation {
    /// How deep tunnels may nest before we stop looking.
    static let maximumDepth = 4

    public static func contents(linkType: Int32, record: [UInt8]) -> RecordContents {
        var out = RecordContents()
        switch LinkType(rawValue: linkType) {
        case .ppp:
            addPPP(record[...], direction: nil, via: [], depth: 0, to: &out)
        case .pppHDLC:
            // 0x0F / 0x8F start Cisco HDLC, which is not PPP.
            if record.first == HDLC.allStationsAddress { addPPP(record[...], direction: nil, via: [], depth: 0, to: &out) }
        case .pppWithDirection:
            guard let d = record.first else { out.problems.append("empty PPP_WITH_DIR record"); break }
            addPPP(record.dropFirst(), direction: d == 0 ? .received : .sent, via: [], depth: 0, to: &out)
        case .ethernet:
            ethernet(record, to: &out)
        case nil:
            break
        }
        return out
    }

    static func addPPP(_ bytes: ArraySlice<UInt8>, direction: Direction?, via: [String], depth: Int, to out: inout RecordContents) {
        guard let frame = PPPFrame(packet: Array(bytes)) else {
            out.problems.append("unreadable PPP header" + (via.isEmpty ? "" : " in " + via.joined(separator: "/")))
            return
        }
        out.frames.append(CarriedFrame(frame: frame, direction: direction, via: via))
        if frame.protocol == ProtocolNumber.ipv4 && depth < maximumDepth {
            ipv4(frame.information[...], via: via, depth: depth + 1, to: &out)
        }
    }

    static func ethernet(_ r: [UInt8], to out: inout RecordContents) {
        guard r.count >= 14 else { return }
        var offset = 12
        var etherType = UInt16(r[12]) << 8 | UInt16(r[13])
        while (etherType == 0x8100 || etherType == 0x88A8) && r.count >= offset + 6 {
            offset += 4
            etherType = UInt16(r[offset]) << 8 | UInt16(r[offset + 1])
        }
        let payload = r[(offset + 2)...]
        switch etherType {
        case 0x8864: pppoeSession(payload, to: &out)
        case 0x8863: pppoeDiscovery(payload, to: &out)
        case 0x0800: ipv4(payload, via: [], depth: 0, to: &out)
        default: break
        }
    }

    /// RFC 2516 §4: version/type, code, session id, length, then the PPP protocol field.
    static func pppoeSession(_ p: ArraySlice<UInt8>, to out: inout RecordContents) {
        guard p.count >= 6 else { out.problems.append("truncated PPPoE header"); return }
        let s = p.startIndex
        let session = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        let length = Int(p[s + 4]) << 8 | Int(p[s + 5])
        guard length <= p.count - 6 else {
            out.problems.append("PPPoE length \(length) exceeds the \(p.count - 6) bytes present")
            return
        }
        addPPP(p[(s + 6)..<(s + 6 + length)], direction: nil, via: ["PPPoE 0x" + hex4(session)], depth: 0, to: &out)
    }

    static func pppoeDiscovery(_ p: ArraySlice<UInt8>, to out: inout RecordContents) {
        guard p.count >= 6 else { out.problems.append("truncated PPPoE discovery header"); return }
        let s = p.startIndex
        let names: [UInt8: String] = [0x09: "PADI", 0x07: "PADO", 0x19: "PADR", 0x65: "PADS", 0xA7: "PADT"]
        let session = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        out.notes.append("PPPoE \(names[p[s + 1]] ?? "code=0x" + String(p[s + 1], radix: 16)) session=0x\(hex4(session))")
    }

    static func ipv4(_ p: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        let bytes = Array(p)
        guard let ip = bytes.withUnsafeBytes({ try? IPv4Header(parsing: $0) }), ip.fragmentOffset == 0, !ip.moreFragments else { return }
        let payload = bytes[ip.headerLength..<ip.totalLength]
        switch ip.protocol {
        case IPProtocol.gre: gre(payload, via: via, depth: depth, to: &out)
        case IPProtocol.udp: udp(payload, via: via, depth: depth, to: &out)
        default: break
        }
    }

    /// RFC 2637 §4.1 enhanced GRE (version 1) and RFC 2784/2890 GRE (version 0) carrying PPP (0x880B).
    static func gre(_ p: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        guard p.count >= 4 else { return }
        let s = p.startIndex
        let flags0 = p[s], flags1 = p[s + 1]
        let protocolType = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        guard protocolType == 0x880B else { return }
        let version = flags1 & 0x07
        var offset = s + 4
        var callID: UInt16?
        var payloadLength: Int?
        if flags0 & 0x80 != 0 { offset += 4 } // checksum and reserved (version 0)
        if flags0 & 0x20 != 0 {               // key: payload length and call id in version 1
            guard p.endIndex >= offset + 4 else { out.problems.append("truncated GRE key"); return }
            if version == 1 {
                payloadLength = Int(p[offset]) << 8 | Int(p[offset + 1])
                callID = UInt16(p[offset + 2]) << 8 | UInt16(p[offset + 3])
            }
            offset += 4
        }
        if flags0 & 0x10 != 0 { offset += 4 } // sequence number
        if version == 1 && flags1 & 0x80 != 0 { offset += 4 } // acknowledgment number
        guard offset <= p.endIndex else { out.problems.append("truncated GRE header"); return }
        var end = p.endIndex
        if let length = payloadLength {
            guard offset + length <= p.endIndex else {
                out.problems.append("GRE payload length \(length) exceeds the \(p.endIndex - offset) bytes present")
                return
            }
            end = offset + length
        }
        guard offset < end else { return } // an acknowledgment without payload
        let layer = "GRE" + (callID.map { " call " + String($0) } ?? "")
        addPPP(p[offset..<end], direction: nil, via: via + [layer], depth: depth, to: &out)
    }

    /// RFC 2661 §3.1 L2TP data messages on UDP port 1701.
    static func udp(_ p: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        guard p.count >= 8 else { return }
        let s = p.startIndex
        let sport = UInt16(p[s]) << 8 | UInt16(p[s + 1])
        let dport = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        guard sport == 1701 || dport == 1701 else { return }
        let l2tp = p[(s + 8)...]
        guard l2tp.count >= 6 else { return }
        let b = l2tp.startIndex
        let flags = UInt16(l2tp[b]) << 8 | UInt16(l2tp[b + 1])
        guard flags & 0x000F == 2, flags & 0x8000 == 0 else { return } // version 2 data messages only
        var offset = b + 2
        if flags & 0x4000 != 0 { offset += 2 }
        guard l2tp.endIndex >= offset + 4 else { out.problems.append("truncated L2TP header"); return }
        let tunnel = UInt16(l2tp[offset]) << 8 | UInt16(l2tp[offset + 1])
        let session = UInt16(l2tp[offset + 2]) << 8 | UInt16(l2tp[offset + 3])
        offset += 4
        if flags & 0x0800 != 0 { offset += 4 }
        if flags & 0x0200 != 0 {
            guard l2tp.endIndex >= offset + 2 else { out.problems.append("truncated L2TP offset"); return }
            offset += 2 + (Int(l2tp[offset]) << 8 | Int(l2tp[offset + 1]))
        }
        guard offset < l2tp.endIndex else { out.problems.append("L2TP header runs past the datagram"); return }
        addPPP(l2tp[offset...], direction: nil, via: via + ["L2TP \(tunnel)/\(session)"], depth: depth, to: &out)
    }

    static func hex4(_ v: UInt16) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: 4 - s.count) + s
    }
}
