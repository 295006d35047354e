/// One-line renderings of IPv4 packets for logs and `pppbridge decode`, e.g.
/// `IP 10.0.2.15 > 10.0.2.2 TCP 1024 > 80 S seq=3162442153 win=64240 <mss 1460> len=0`.
public enum IPPacketPrinter {
    public struct Line: Sendable, Equatable {
        public var text: String
        /// What could not be read, when the packet is malformed.
        public var problem: WireError?
    }

    public static func describe(_ packet: [UInt8]) -> Line {
        packet.withUnsafeBytes { describe($0) }
    }

    public static func describe(_ packet: UnsafeRawBufferPointer) -> Line {
        let ip: IPv4Header
        do {
            ip = try IPv4Header(parsing: packet)
        } catch {
            return Line(text: "IP malformed: \(error)", problem: error)
        }
        var text = "IP \(ip.source) > \(ip.destination)"
        if !IPv4Header.checksumValid(UnsafeRawBufferPointer(rebasing: packet[0..<ip.headerLength])) { text += " bad-ip-cksum" }
        let payload = UnsafeRawBufferPointer(rebasing: packet[ip.headerLength..<ip.totalLength])
        if ip.isFragment {
            // The transport header is read after reassembly, not from one fragment.
            text += " \(ip.protocol.description) frag id=\(ip.identification) off=\(ip.fragmentOffset)"
                + (ip.moreFragments ? "+" : "") + " len=\(payload.count)"
            return Line(text: text)
        }
        do {
            switch ip.protocol {
            case IPProtocol.tcp:
                let tcp = try TCPHeader(parsing: payload)
                let dataLength = payload.count - tcp.headerLength
                text += " TCP "
                text += "\(tcp.sourcePort) > \(tcp.destinationPort) \(tcp.flags.letters) seq=\(tcp.sequenceNumber)"
                if tcp.flags.contains(.ack) { text += " ack=\(tcp.acknowledgmentNumber)" }
                text += " win=\(tcp.window)"
                if !tcp.options.isEmpty { text += " <" + tcp.options.map(\.description).joined(separator: ",") + ">" }
                text += " len=\(dataLength)"
                if !transportChecksumValid(ip, payload) { text += " bad-cksum" }
            case IPProtocol.udp:
                let udp = try UDPHeader(parsing: payload)
                text += " UDP "
                text += "\(udp.sourcePort) > \(udp.destinationPort) len=\(udp.length - 8)"
                if udp.checksum != 0 && !transportChecksumValid(ip, payload) { text += " bad-cksum" }
            case IPProtocol.icmp:
                let icmp = try ICMPHeader(parsing: payload)
                let names: [UInt8: String] = [0: "echo reply", 3: "unreachable", 8: "echo request", 11: "time exceeded"]
                text += " ICMP " + (names[icmp.type] ?? "type=\(icmp.type)")
                if icmp.type == ICMPHeader.echoRequest || icmp.type == ICMPHeader.echoReply {
                    text += " id=0x\(String(icmp.identifier, radix: 16)) seq=\(icmp.sequence)"
                } else {
                    text += " code=\(icmp.code)"
                }
                text += " len=\(payload.count - 8)"
                if InternetChecksum.finish(InternetChecksum.sum(payload)) != 0 { text += " bad-cksum" }
            default:
                text += " \(ip.protocol.description) len=\(payload.count)"
            }
        } catch {
            return Line(text: text + " malformed: \(error)", problem: error)
        }
        return Line(text: text)
    }

    /// Verifies a TCP or UDP checksum with its pseudo-header.
    public static func transportChecksumValid(_ ip: IPv4Header, _ segment: UnsafeRawBufferPointer) -> Bool {
        let pseudo = InternetChecksum.pseudoHeaderSum(source: ip.source, destination: ip.destination, protocol: ip.protocol, length: segment.count)
        return InternetChecksum.finish(InternetChecksum.sum(segment, into: pseudo)) == 0
    }
}
