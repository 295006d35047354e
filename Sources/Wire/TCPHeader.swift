/// TCP options this stack reads and writes (RFC 9293 §3.2, RFC 7323, RFC 2018).
public enum TCPOption: Sendable, Equatable {
    case noOperation
    case maximumSegmentSize(UInt16)
    case windowScale(UInt8)
    case sackPermitted
    case sack([(SequenceNumber, SequenceNumber)])
    case timestamps(value: UInt32, echoReply: UInt32)
    case other(kind: UInt8, data: [UInt8])

    public static func == (a: TCPOption, b: TCPOption) -> Bool {
        switch (a, b) {
        case (.noOperation, .noOperation), (.sackPermitted, .sackPermitted): return true
        case let (.maximumSegmentSize(x), .maximumSegmentSize(y)): return x == y
        case let (.windowScale(x), .windowScale(y)): return x == y
        case let (.sack(x), .sack(y)): return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case let (.timestamps(v1, e1), .timestamps(v2, e2)): return v1 == v2 && e1 == e2
        case let (.other(k1, d1), .other(k2, d2)): return k1 == k2 && d1 == d2
        default: return false
        }
    }

    /// tcpdump's rendering.
    public var description: String {
        switch self {
        case .noOperation: return "nop"
        case let .maximumSegmentSize(m): return "mss \(m)"
        case let .windowScale(s): return "wscale \(s)"
        case .sackPermitted: return "sackOK"
        case let .sack(blocks): return "sack \(blocks.count) " + blocks.map { "{\($0.0):\($0.1)}" }.joined()
        case let .timestamps(v, e): return "TS val \(v) ecr \(e)"
        case let .other(kind, data): return "opt-\(kind):" + data.map { String($0, radix: 16) }.joined()
        }
    }

    /// How many bytes `append` writes.
    var length: Int {
        switch self {
        case .noOperation: return 1
        case .maximumSegmentSize: return 4
        case .windowScale: return 3
        case .sackPermitted: return 2
        case let .sack(blocks): return 2 + 8 * blocks.count
        case .timestamps: return 10
        case let .other(_, data): return 2 + min(data.count, 253)
        }
    }

    /// Appends what `bytes` holds to `b`, without building it.
    func append(to b: inout [UInt8]) {
        switch self {
        case .noOperation: b.append(1)
        case let .maximumSegmentSize(m):
            b.append(2)
            b.append(4)
            BigEndian.append(m, to: &b)
        case let .windowScale(s):
            b.append(3)
            b.append(3)
            b.append(s)
        case .sackPermitted:
            b.append(4)
            b.append(2)
        case let .sack(blocks):
            b.append(5)
            b.append(UInt8(clamping: 2 + 8 * blocks.count))
            for (left, right) in blocks {
                BigEndian.append(left.rawValue, to: &b)
                BigEndian.append(right.rawValue, to: &b)
            }
        case let .timestamps(v, e):
            b.append(8)
            b.append(10)
            BigEndian.append(v, to: &b)
            BigEndian.append(e, to: &b)
        case let .other(kind, data):
            b.append(kind)
            b.append(UInt8(clamping: 2 + data.count))
            b.append(contentsOf: data.prefix(253))
        }
    }

    var bytes: [UInt8] {
        switch self {
        case .noOperation: return [1]
        case let .maximumSegmentSize(m): return [2, 4] + BigEndian.bytes(m)
        case let .windowScale(s): return [3, 3, s]
        case .sackPermitted: return [4, 2]
        case let .sack(blocks): return [5, UInt8(clamping: 2 + 8 * blocks.count)] + blocks.flatMap { BigEndian.bytes($0.0.rawValue) + BigEndian.bytes($0.1.rawValue) }
        case let .timestamps(v, e): return [8, 10] + BigEndian.bytes(v) + BigEndian.bytes(e)
        case let .other(kind, data): return [kind, UInt8(clamping: 2 + data.count)] + data.prefix(253)
        }
    }
}

/// A TCP header (RFC 9293 §3.1).
public struct TCPHeader: Sendable, Equatable {
    public var sourcePort: UInt16
    public var destinationPort: UInt16
    public var sequenceNumber: SequenceNumber
    public var acknowledgmentNumber = SequenceNumber(0)
    public var flags: Flags
    public var window: UInt16
    /// As received; `emit` computes a fresh one.
    public var checksum: UInt16 = 0
    public var urgentPointer: UInt16 = 0
    public var options: [TCPOption] = []
    /// Header length as received (20 plus options and padding).
    public private(set) var headerLength: Int = 20

    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let fin = Flags(rawValue: 0x01)
        public static let syn = Flags(rawValue: 0x02)
        public static let rst = Flags(rawValue: 0x04)
        public static let psh = Flags(rawValue: 0x08)
        public static let ack = Flags(rawValue: 0x10)
        public static let urg = Flags(rawValue: 0x20)
        public static let ece = Flags(rawValue: 0x40)
        public static let cwr = Flags(rawValue: 0x80)

        /// tcpdump's letters: S F R P U E W, then "." for ACK.
        public var letters: String {
            var s = ""
            for (f, c) in [(Flags.syn, "S"), (.fin, "F"), (.rst, "R"), (.psh, "P"), (.urg, "U"), (.ece, "E"), (.cwr, "W")] where contains(f) {
                s += c
            }
            if contains(.ack) { s += "." }
            return s.isEmpty ? "none" : s
        }
    }

    public init(sourcePort: UInt16, destinationPort: UInt16, sequenceNumber: SequenceNumber, flags: Flags, window: UInt16) {
        self.sourcePort = sourcePort
        self.destinationPort = destinationPort
        self.sequenceNumber = sequenceNumber
        self.flags = flags
        self.window = window
    }

    public init(parsing b: UnsafeRawBufferPointer) throws(WireError) {
        guard b.count >= 20 else { throw .truncated(what: "TCP header", needed: 20, available: b.count) }
        sourcePort = BigEndian.uint16(b, 0)
        destinationPort = BigEndian.uint16(b, 2)
        sequenceNumber = SequenceNumber(BigEndian.uint32(b, 4))
        acknowledgmentNumber = SequenceNumber(BigEndian.uint32(b, 8))
        let offset = Int(b[12] >> 4) * 4
        guard offset >= 20 else { throw .malformed("TCP data offset \(offset)") }
        guard offset <= b.count else { throw .truncated(what: "TCP header", needed: offset, available: b.count) }
        headerLength = offset
        flags = Flags(rawValue: b[13])
        window = BigEndian.uint16(b, 14)
        checksum = BigEndian.uint16(b, 16)
        urgentPointer = BigEndian.uint16(b, 18)
        var i = 20
        while i < offset {
            let kind = b[i]
            if kind == 0 { break }
            if kind == 1 {
                options.append(.noOperation)
                i += 1
                continue
            }
            guard i + 1 < offset else { throw .malformed("TCP option \(kind) without length") }
            let length = Int(b[i + 1])
            guard length >= 2, i + length <= offset else { throw .malformed("TCP option \(kind) length \(length) runs past the header") }
            let data = Array(b[(i + 2)..<(i + length)])
            switch (kind, length) {
            case (2, 4): options.append(.maximumSegmentSize(BigEndian.uint16(b, i + 2)))
            case (3, 3): options.append(.windowScale(data[0]))
            case (4, 2): options.append(.sackPermitted)
            case (5, _) where (length - 2) % 8 == 0:
                options.append(.sack(stride(from: i + 2, to: i + length, by: 8).map { (SequenceNumber(BigEndian.uint32(b, $0)), SequenceNumber(BigEndian.uint32(b, $0 + 4))) }))
            case (8, 10): options.append(.timestamps(value: BigEndian.uint32(b, i + 2), echoReply: BigEndian.uint32(b, i + 6)))
            default: options.append(.other(kind: kind, data: data))
            }
            i += length
        }
    }

    /// The header bytes with the checksum over the pseudo-header, header and `payload`.
    public func emit(source: IPv4Address, destination: IPv4Address, payload: [UInt8]) -> [UInt8] {
        var h: [UInt8] = []
        h.reserveCapacity(60)
        emit(into: &h, source: source, destination: destination, payload: payload)
        return h
    }

    /// The length `emit` writes: 20 and the options, padded to 4 bytes.
    public var emittedLength: Int {
        var n = 20
        for o in options { n += o.length }
        return (n + 3) / 4 * 4
    }

    /// Appends the header bytes (as `emit` returns them, its checksum over `payload` too) to
    /// `b`: the options are written in place, with no array for each.
    public func emit(into b: inout [UInt8], source: IPv4Address, destination: IPv4Address, payload: [UInt8]) {
        let start = b.count
        BigEndian.append(sourcePort, to: &b)
        BigEndian.append(destinationPort, to: &b)
        BigEndian.append(sequenceNumber.rawValue, to: &b)
        BigEndian.append(acknowledgmentNumber.rawValue, to: &b)
        b.append(0)
        b.append(flags.rawValue)
        BigEndian.append(window, to: &b)
        b.append(0)
        b.append(0)
        BigEndian.append(urgentPointer, to: &b)
        for o in options { o.append(to: &b) }
        while (b.count - start) % 4 != 0 { b.append(0) }
        let length = b.count - start
        b[start + 12] = UInt8(truncatingIfNeeded: length / 4) << 4
        let pseudo = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.tcp, length: length + payload.count)
        let c = InternetChecksum.finish(InternetChecksum.sum(payload, into: InternetChecksum.sum(b[start..<(start + length)], into: pseudo)))
        b[start + 16] = UInt8(c >> 8)
        b[start + 17] = UInt8(c & 0xFF)
    }

}
