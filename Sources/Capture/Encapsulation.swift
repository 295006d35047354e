import Framing
import Wire
import PPP

/// A PPP frame found inside a capture record, with how it was carried.
public struct CarriedFrame: Sendable, Equatable {
    public var frame: PPPFrame
    public var direction: Direction?
    /// Outer layers, outermost first, e.g. ["PPPoE 0x0011"] or ["PPPoE 0x3b1a", "L2TP 18994/54110"].
    public var via: [String]
    /// Who put the frame on the wire, where the carrier says and no direction does: the
    /// Ethernet source of a PPPoE session frame ("cc:05:0e:88:00:00").
    public var sender: String? = nil
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
/// Ethernet frames may carry 802.1Q / 802.1ad VLAN tags (stacked), and the IP under a tunnel may
/// be IPv4 or IPv6 (with extension headers), itself inside IPv4 or IPv6 (IP-in-IP). Every length
/// is the file's word, checked against the bytes present; nesting and header chains are bounded.
public enum Encapsulation {
    /// How deep tunnels (IP inside PPP or IP) may nest before we stop looking.
    static let maximumDepth = 4
    /// VLAN tags read in front of the EtherType (802.1ad allows two; a few more are tolerated).
    static let maximumVLANTags = 8
    /// IPv6 extension headers walked before the upper-layer header (RFC 8200 §4.1 orders at most
    /// seven, one of them twice).
    static let maximumExtensionHeaders = 8

    enum EtherType {
        static let ipv4: UInt16 = 0x0800
        static let ipv6: UInt16 = 0x86DD
        static let pppoeDiscovery: UInt16 = 0x8863
        static let pppoeSession: UInt16 = 0x8864
        /// 802.1Q customer tag, 802.1ad service tag, and the pre-standard 0x9100 service tag.
        static let vlanTags: Set<UInt16> = [0x8100, 0x88A8, 0x9100]
    }

    /// IP protocol numbers of the headers this walk follows.
    enum Next {
        static let ipv4InIP = IPProtocol(4)
        static let ipv6InIP = IPProtocol(41)
        static let hopByHop = IPProtocol(0)
        static let routing = IPProtocol(43)
        static let fragment = IPProtocol(44)
        static let authentication = IPProtocol(51)
        static let destinationOptions = IPProtocol(60)
    }

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
        guard depth < maximumDepth else { return }
        if frame.protocol == ProtocolNumber.ipv4 {
            ipv4(frame.information[...], via: via, depth: depth + 1, to: &out)
        } else if frame.protocol == ProtocolNumber.ipv6 {
            ipv6(frame.information[...], via: via, depth: depth + 1, to: &out)
        }
    }

    static func ethernet(_ r: [UInt8], to out: inout RecordContents) {
        guard r.count >= 14 else { return }
        var offset = 12
        var etherType = BigEndian.uint16(r, 12)
        var via: [String] = []
        // IEEE 802.1Q §9.6: a tag is the TPID (read as the EtherType) and two bytes of TCI whose
        // low 12 bits are the VLAN id; the real EtherType follows the last tag.
        while EtherType.vlanTags.contains(etherType) && via.count < maximumVLANTags && r.count >= offset + 6 {
            via.append("VLAN \(BigEndian.uint16(r, offset + 2) & 0x0FFF)")
            offset += 4
            etherType = BigEndian.uint16(r, offset)
        }
        let payload = r[(offset + 2)...]
        switch etherType {
        case EtherType.pppoeSession:
            let before = out.frames.count
            pppoeSession(payload, via: via, to: &out)
            let source = r[6..<12].map { String($0, radix: 16).leftPadded(to: 2) }.joined(separator: ":")
            for i in before..<out.frames.count where out.frames[i].sender == nil { out.frames[i].sender = source }
        case EtherType.pppoeDiscovery: pppoeDiscovery(payload, to: &out)
        case EtherType.ipv4: ipv4(payload, via: via, depth: 0, to: &out)
        case EtherType.ipv6: ipv6(payload, via: via, depth: 0, to: &out)
        default: break
        }
    }

    /// RFC 2516 §4: version/type, code, session id, length, then the PPP protocol field.
    static func pppoeSession(_ p: ArraySlice<UInt8>, via: [String], to out: inout RecordContents) {
        guard p.count >= 6 else { out.problems.append("truncated PPPoE header"); return }
        let s = p.startIndex
        let session = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        let length = Int(p[s + 4]) << 8 | Int(p[s + 5])
        guard length <= p.count - 6 else {
            out.problems.append("PPPoE length \(length) exceeds the \(p.count - 6) bytes present")
            return
        }
        addPPP(p[(s + 6)..<(s + 6 + length)], direction: nil, via: via + ["PPPoE 0x" + hex4(session)], depth: 0, to: &out)
    }

    static func pppoeDiscovery(_ p: ArraySlice<UInt8>, to out: inout RecordContents) {
        guard p.count >= 6 else { out.problems.append("truncated PPPoE discovery header"); return }
        let s = p.startIndex
        let names: [UInt8: String] = [0x09: "PADI", 0x07: "PADO", 0x19: "PADR", 0x65: "PADS", 0xA7: "PADT"]
        let session = UInt16(p[s + 2]) << 8 | UInt16(p[s + 3])
        out.notes.append("PPPoE \(names[p[s + 1]] ?? "code=0x" + String(p[s + 1], radix: 16)) session=0x\(hex4(session))")
    }

    static func ipv4(_ p: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        guard depth <= maximumDepth else { return }
        let bytes = Array(p)
        guard let ip = bytes.withUnsafeBytes({ try? IPv4Header(parsing: $0) }), !ip.isFragment else { return }
        let before = out.frames.count
        ipPayload(ip.protocol, bytes[ip.headerLength..<ip.totalLength], via: via, depth: depth, to: &out)
        // PPP in GRE or L2TP: the tunnel endpoint that sent the packet sent the frame.
        for i in before..<out.frames.count where out.frames[i].sender == nil { out.frames[i].sender = "\(ip.source)" }
    }

    /// RFC 8200 §3: a 40-byte header, then extension headers (§4) up to the upper-layer one.
    /// A fragment other than a whole packet's only one is not reassembled here.
    static func ipv6(_ p: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        guard depth <= maximumDepth, p.count >= 40 else { return }
        let s = p.startIndex
        guard p[s] >> 4 == 6 else { return }
        let payloadLength = Int(BigEndian.uint16(p, s + 4))
        // A payload length of 0 announces a jumbogram (RFC 2675), which no PPP link carries.
        guard payloadLength > 0, payloadLength <= p.count - 40 else { return }
        let end = s + 40 + payloadLength
        var next = IPProtocol(p[s + 6])
        var offset = s + 40
        for _ in 0..<maximumExtensionHeaders {
            let length: Int
            switch next {
            case Next.hopByHop, Next.routing, Next.destinationOptions:
                // §4.3–4.6: Hdr Ext Len counts 8-octet units beyond the first 8.
                guard end - offset >= 2 else { return }
                length = (Int(p[offset + 1]) + 1) * 8
            case Next.authentication:
                // RFC 4302 §2.2: Payload Len counts 4-octet units, minus 2.
                guard end - offset >= 2 else { return }
                length = (Int(p[offset + 1]) + 2) * 4
            case Next.fragment:
                // §4.5: offset (13 bits, in 8-octet units) and the M flag; only an atomic
                // fragment (offset 0, M clear) holds the whole upper-layer packet.
                guard end - offset >= 8, BigEndian.uint16(p, offset + 2) & 0xFFF9 == 0 else { return }
                length = 8
            default:
                ipPayload(next, p[offset..<end], via: via, depth: depth, to: &out)
                return
            }
            guard length <= end - offset else { return }
            next = IPProtocol(p[offset])
            offset += length
        }
    }

    /// What an IP header (either version) carries, by its protocol / next header number.
    static func ipPayload(_ proto: IPProtocol, _ payload: ArraySlice<UInt8>, via: [String], depth: Int, to out: inout RecordContents) {
        switch proto {
        case IPProtocol.gre: gre(payload, via: via, depth: depth, to: &out)
        case IPProtocol.udp: udp(payload, via: via, depth: depth, to: &out)
        // RFC 2003 (IPv4 in IP) and RFC 2473 / RFC 4213 (IPv6 in IP): one more layer.
        case Next.ipv4InIP: ipv4(payload, via: via, depth: depth + 1, to: &out)
        case Next.ipv6InIP: ipv6(payload, via: via, depth: depth + 1, to: &out)
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

private extension String {
    func leftPadded(to width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
