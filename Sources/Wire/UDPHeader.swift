/// A UDP header (RFC 768).
public struct UDPHeader: Sendable, Equatable {
    public var sourcePort: UInt16
    public var destinationPort: UInt16
    /// Header plus payload.
    public var length: Int
    public var checksum: UInt16 = 0

    public init(sourcePort: UInt16, destinationPort: UInt16, payloadLength: Int) {
        self.sourcePort = sourcePort
        self.destinationPort = destinationPort
        self.length = 8 + payloadLength
    }

    public init(parsing b: UnsafeRawBufferPointer) throws(WireError) {
        guard b.count >= 8 else { throw .truncated(what: "UDP header", needed: 8, available: b.count) }
        sourcePort = BigEndian.uint16(b, 0)
        destinationPort = BigEndian.uint16(b, 2)
        length = Int(BigEndian.uint16(b, 4))
        checksum = BigEndian.uint16(b, 6)
        guard length >= 8 else { throw .malformed("UDP length \(length)") }
        guard length <= b.count else { throw .truncated(what: "UDP datagram", needed: length, available: b.count) }
    }

    public func emit(source: IPv4Address, destination: IPv4Address, payload: [UInt8]) -> [UInt8] {
        var h = BigEndian.bytes(sourcePort) + BigEndian.bytes(destinationPort) + BigEndian.bytes(UInt16(clamping: length)) + [0, 0]
        let pseudo = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.udp, length: length)
        var c = InternetChecksum.finish(InternetChecksum.sum(payload, into: InternetChecksum.sum(h, into: pseudo)))
        if c == 0 { c = 0xFFFF } // RFC 768: a computed zero is sent as all ones.
        BigEndian.put(c, into: &h, at: 6)
        return h
    }
}
