import Wire

/// A TCP segment in an IPv4 packet, read for a replay: the headers parsed, the payload kept.
/// Fragments and anything not TCP read as nil.
struct TCPView {
    var ip: IPv4Header
    var header: TCPHeader
    var payload: [UInt8]

    init?(_ packet: [UInt8]) {
        let parsed: (IPv4Header, TCPHeader, [UInt8])? = packet.withUnsafeBytes { raw in
            guard let ip = try? IPv4Header(parsing: raw), ip.protocol == IPProtocol.tcp, !ip.isFragment else { return nil }
            let body = UnsafeRawBufferPointer(rebasing: raw[ip.headerLength..<ip.totalLength])
            guard let tcp = try? TCPHeader(parsing: body), tcp.headerLength <= body.count else { return nil }
            return (ip, tcp, Array(body[tcp.headerLength...]))
        }
        guard let parsed else { return nil }
        (ip, header, payload) = parsed
    }

    var flags: TCPHeader.Flags { header.flags }
    var sourcePort: UInt16 { header.sourcePort }
    var destinationPort: UInt16 { header.destinationPort }
    /// Sequence space the segment takes: its bytes, and one each for SYN and FIN (RFC 9293 §3.4).
    var sequenceLength: Int { payload.count + (flags.contains(.syn) ? 1 : 0) + (flags.contains(.fin) ? 1 : 0) }

    /// The segment's latest timestamp value (RFC 7323 §3.2), if it carries one.
    var timestampValue: UInt32? {
        for o in header.options { if case let .timestamps(value, _) = o { return value } }
        return nil
    }

    /// The packet again, from `source` to `destination`, both checksums computed afresh.
    func emit(source: IPv4Address, destination: IPv4Address) -> [UInt8] {
        // `emit` writes the header, its checksum covering the payload; the payload follows.
        let segment = header.emit(source: source, destination: destination, payload: payload) + payload
        var h = ip
        h.source = source
        h.destination = destination
        h.payloadLength = segment.count
        return h.emit() + segment
    }
}

/// A datagram's or ICMP message's IPv4 packet with new addresses (checksums fixed): what the
/// peer would have sent to the addresses our link settled on.
func readdressed(_ packet: [UInt8], source: IPv4Address, destination: IPv4Address) -> [UInt8]? {
    packet.withUnsafeBytes { raw -> [UInt8]? in
        guard let ip = try? IPv4Header(parsing: raw) else { return nil }
        var body = Array(raw[ip.headerLength..<ip.totalLength])
        if ip.protocol == IPProtocol.tcp && !ip.isFragment && body.count >= 20 {
            // RFC 9293 §3.1: the TCP checksum covers the addresses too.
            body[16] = 0
            body[17] = 0
            var sum = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.tcp, length: body.count)
            sum = InternetChecksum.sum(body, into: sum)
            let c = InternetChecksum.finish(sum)
            body[16] = UInt8(c >> 8)
            body[17] = UInt8(c & 0xFF)
        } else if ip.protocol == IPProtocol.udp && !ip.isFragment && body.count >= 8 {
            // RFC 768: the checksum covers a pseudo-header with the addresses; 0 means none.
            let had = body[6] != 0 || body[7] != 0
            body[6] = 0
            body[7] = 0
            if had {
                var sum = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.udp, length: body.count)
                sum = InternetChecksum.sum(body, into: sum)
                var c = InternetChecksum.finish(sum)
                if c == 0 { c = 0xFFFF }
                body[6] = UInt8(c >> 8)
                body[7] = UInt8(c & 0xFF)
            }
        }
        var h = ip
        h.source = source
        h.destination = destination
        return h.emit() + body
    }
}
