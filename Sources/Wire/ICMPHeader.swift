/// An ICMP header (RFC 792): type, code, checksum and the 4-byte rest-of-header.
public struct ICMPHeader: Sendable, Equatable {
    public var type: UInt8
    public var code: UInt8
    public var checksum: UInt16 = 0
    /// Identifier and sequence for echo messages; other uses for other types.
    public var restOfHeader: UInt32

    public static let echoReply: UInt8 = 0
    public static let destinationUnreachable: UInt8 = 3
    public static let echoRequest: UInt8 = 8
    public static let timeExceeded: UInt8 = 11

    public init(type: UInt8, code: UInt8, restOfHeader: UInt32) {
        self.type = type
        self.code = code
        self.restOfHeader = restOfHeader
    }

    public init(parsing b: UnsafeRawBufferPointer) throws(WireError) {
        guard b.count >= 8 else { throw .truncated(what: "ICMP header", needed: 8, available: b.count) }
        type = b[0]
        code = b[1]
        checksum = BigEndian.uint16(b, 2)
        restOfHeader = BigEndian.uint32(b, 4)
    }

    public var identifier: UInt16 { UInt16(restOfHeader >> 16) }
    public var sequence: UInt16 { UInt16(restOfHeader & 0xFFFF) }

    public func emit(payload: [UInt8]) -> [UInt8] {
        var h = [type, code, 0, 0] + BigEndian.bytes(restOfHeader)
        let c = InternetChecksum.finish(InternetChecksum.sum(payload, into: InternetChecksum.sum(h)))
        BigEndian.put(c, into: &h, at: 2)
        return h
    }
}
