/// An IP protocol number (RFC 791 §3.1, IANA "Assigned Internet Protocol Numbers"): the ones
/// this stack names, and any other kept as it came (answered with ICMP Protocol Unreachable).
public struct IPProtocol: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public init(_ rawValue: UInt8) { self.rawValue = rawValue }

    public static let icmp = IPProtocol(1)
    public static let tcp = IPProtocol(6)
    public static let udp = IPProtocol(17)
    public static let gre = IPProtocol(47)

    /// The protocol's name, or `proto=N`.
    public var description: String {
        switch self {
        case .icmp: return "ICMP"
        case .tcp: return "TCP"
        case .udp: return "UDP"
        case .gre: return "GRE"
        default: return "proto=\(rawValue)"
        }
    }
}

/// An IPv4 header (RFC 791 §3.1), parsed from a checked view and able to emit itself.
public struct IPv4Header: Sendable, Equatable {
    public var typeOfService: UInt8 = 0
    /// Bytes after the header; the total length is derived from it.
    public var payloadLength: Int
    public var identification: UInt16 = 0
    public var dontFragment = false
    public var moreFragments = false
    /// In bytes (the field counts 8-byte units).
    public var fragmentOffset = 0
    public var timeToLive: UInt8 = 64
    public var `protocol`: IPProtocol
    /// As received; `emit` computes a fresh one.
    public var checksum: UInt16 = 0
    public var source: IPv4Address
    public var destination: IPv4Address
    /// Options, a multiple of 4 bytes (tolerated, not interpreted).
    public var options: [UInt8] = []

    public var headerLength: Int { 20 + options.count }
    public var totalLength: Int { headerLength + payloadLength }
    public var isFragment: Bool { moreFragments || fragmentOffset != 0 }

    public init(protocol proto: IPProtocol, source: IPv4Address, destination: IPv4Address, payloadLength: Int) {
        self.protocol = proto
        self.source = source
        self.destination = destination
        self.payloadLength = payloadLength
    }

    /// Parses the header of `bytes`. The total length may be less than `bytes.count`
    /// (link padding), never more.
    public init(parsing bytes: UnsafeRawBufferPointer) throws(WireError) {
        guard bytes.count >= 20 else { throw .truncated(what: "IPv4 header", needed: 20, available: bytes.count) }
        let version = bytes[0] >> 4
        guard version == 4 else { throw .malformed("IP version \(version)") }
        let ihl = Int(bytes[0] & 0x0F) * 4
        guard ihl >= 20 else { throw .malformed("IPv4 header length \(ihl)") }
        guard bytes.count >= ihl else { throw .truncated(what: "IPv4 header", needed: ihl, available: bytes.count) }
        let total = Int(BigEndian.uint16(bytes, 2))
        guard total >= ihl else { throw .malformed("IPv4 total length \(total) below header length \(ihl)") }
        guard total <= bytes.count else { throw .truncated(what: "IPv4 packet", needed: total, available: bytes.count) }
        typeOfService = bytes[1]
        payloadLength = total - ihl
        identification = BigEndian.uint16(bytes, 4)
        let flagsFragment = BigEndian.uint16(bytes, 6)
        dontFragment = flagsFragment & 0x4000 != 0
        moreFragments = flagsFragment & 0x2000 != 0
        fragmentOffset = Int(flagsFragment & 0x1FFF) * 8
        timeToLive = bytes[8]
        self.protocol = IPProtocol(bytes[9])
        checksum = BigEndian.uint16(bytes, 10)
        source = IPv4Address(bytes[12], bytes[13], bytes[14], bytes[15])
        destination = IPv4Address(bytes[16], bytes[17], bytes[18], bytes[19])
        options = Array(bytes[20..<ihl])
    }

    /// True when the header's checksum verifies over `headerBytes` (the first `headerLength` bytes).
    public static func checksumValid(_ headerBytes: UnsafeRawBufferPointer) -> Bool {
        InternetChecksum.finish(InternetChecksum.sum(headerBytes)) == 0
    }

    /// The header bytes with a computed checksum. Fields that cannot be represented are
    /// clamped, never trapped on: options beyond the 40 bytes an IHL can say are cut (and
    /// padded to 4 bytes), a total length beyond 65535 says 65535, an offset stops at the 13 bits' largest.
    /// Callers that build packets keep them within these bounds; this only keeps a mistake
    /// from killing the process.
    public func emit() -> [UInt8] {
        var h: [UInt8] = []
        h.reserveCapacity(60)
        emit(into: &h)
        return h
    }

    /// Appends the header bytes (as `emit` returns them) to `b`, so a packet is built in one
    /// buffer: the header, then its payload.
    public func emit(into b: inout [UInt8]) {
        let optionCount = min(options.count, 40)
        let length = 20 + (optionCount + 3) / 4 * 4
        // Written into fixed storage and appended once: a byte at a time, every append checks
        // the array's uniqueness and capacity.
        var header = HeaderBytes()
        header.withBytes { h in
            h[0] = 0x40 | UInt8(truncatingIfNeeded: length / 4)
            h[1] = typeOfService
            HeaderBytes.put(UInt16(clamping: length + max(payloadLength, 0)), h, 2)
            HeaderBytes.put(identification, h, 4)
            let offsetUnits = UInt16(min(max(fragmentOffset, 0) / 8, 0x1FFF))
            HeaderBytes.put((dontFragment ? 0x4000 : 0) | (moreFragments ? 0x2000 : 0) | offsetUnits, h, 6)
            h[8] = timeToLive
            h[9] = self.protocol.rawValue
            HeaderBytes.put(source.value, h, 12)
            HeaderBytes.put(destination.value, h, 16)
            for i in 0..<optionCount { h[20 + i] = options[options.startIndex + i] }
            let c = InternetChecksum.finish(InternetChecksum.sum(UnsafeRawBufferPointer(rebasing: h[0..<length])))
            HeaderBytes.put(c, h, 10)
            b.append(contentsOf: UnsafeRawBufferPointer(rebasing: h[0..<length]))
        }
    }
}
