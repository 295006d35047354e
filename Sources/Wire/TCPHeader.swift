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

    /// Appends the option's bytes to `b`, whole or not at all: one that would run past the
    /// header's 40 bytes is left out, never sent cut short.
    func append(to b: inout TCPOptionBytes) {
        guard b.count + length <= TCPOptionBytes.capacity else { return }
        switch self {
        case .noOperation: b.append(1)
        case let .maximumSegmentSize(m):
            b.append(2, 4)
            b.append(UInt8(m >> 8), UInt8(m & 0xFF))
        case let .windowScale(s):
            b.append(3, 3)
            b.append(s)
        case .sackPermitted:
            b.append(4, 2)
        case let .sack(blocks):
            b.append(5, UInt8(clamping: 2 + 8 * blocks.count))
            for (left, right) in blocks {
                b.append(word: left.rawValue)
                b.append(word: right.rawValue)
            }
        case let .timestamps(v, e):
            b.append(8, 10)
            b.append(word: v)
            b.append(word: e)
        case let .other(kind, data):
            b.append(kind, UInt8(clamping: 2 + data.count))
            for d in data.prefix(253) { b.append(d) }
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
    /// The options as on the wire, held in the header itself: reading a timestamp or writing
    /// one allocates nothing (every segment of a timestamped connection carries one).
    public var optionBytes = TCPOptionBytes()
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
        // Checked here once (RFC 9293 §3.2: kinds 0 and 1 are one byte, every other has a length
        // of at least 2 that stays inside the header), kept as bytes up to an end-of-list.
        var i = 20
        while i < offset {
            let kind = b[i]
            if kind == 0 { break }
            if kind == 1 {
                i += 1
                continue
            }
            guard i + 1 < offset else { throw .malformed("TCP option \(kind) without length") }
            let length = Int(b[i + 1])
            guard length >= 2, i + length <= offset else { throw .malformed("TCP option \(kind) length \(length) runs past the header") }
            i += length
        }
        optionBytes = TCPOptionBytes(UnsafeRawBufferPointer(rebasing: b[20..<i]))
    }

    /// The options, one value each (`optionBytes` read into a list). For printing and
    /// rewriting; the stack reads the fields it needs (`timestamps`, `sackPermitted`, …).
    public var options: [TCPOption] {
        get {
            var list: [TCPOption] = []
            optionBytes.forEach { kind, data in
                switch (kind, data.count) {
                case (1, _): list.append(.noOperation)
                case (2, 2): list.append(.maximumSegmentSize(BigEndian.uint16(data, 0)))
                case (3, 1): list.append(.windowScale(data[0]))
                case (4, 0): list.append(.sackPermitted)
                case (5, _) where data.count % 8 == 0:
                    list.append(.sack(stride(from: 0, to: data.count, by: 8).map { (SequenceNumber(BigEndian.uint32(data, $0)), SequenceNumber(BigEndian.uint32(data, $0 + 4))) }))
                case (8, 8): list.append(.timestamps(value: BigEndian.uint32(data, 0), echoReply: BigEndian.uint32(data, 4)))
                default: list.append(.other(kind: kind, data: Array(data)))
                }
            }
            return list
        }
        set {
            optionBytes = TCPOptionBytes()
            for o in newValue { o.append(to: &optionBytes) }
        }
    }

    /// The last timestamps option (RFC 7323 §3), as the stack reads them.
    public var timestamps: (value: UInt32, echoReply: UInt32)? {
        var found: (UInt32, UInt32)?
        optionBytes.forEach { kind, data in
            if kind == 8 && data.count == 8 { found = (BigEndian.uint32(data, 0), BigEndian.uint32(data, 4)) }
        }
        return found
    }

    /// Calls `body` with each SACK block (RFC 2018 §3) in the order the options give them,
    /// read where they lie: a peer's SACKs during loss allocate nothing.
    public func forEachSACKBlock(_ body: (SequenceNumber, SequenceNumber) -> Void) {
        optionBytes.forEach { kind, data in
            guard kind == 5, data.count % 8 == 0 else { return }
            var i = 0
            while i + 8 <= data.count {
                body(SequenceNumber(BigEndian.uint32(data, i)), SequenceNumber(BigEndian.uint32(data, i + 4)))
                i += 8
            }
        }
    }

    /// Whether some option of `kind` is present.
    public func hasOption(_ kind: UInt8) -> Bool {
        var found = false
        optionBytes.forEach { k, _ in if k == kind { found = true } }
        return found
    }

    /// Appends two no-operations and a timestamps option (RFC 7323 Appendix A's layout).
    public mutating func appendTimestamps(value: UInt32, echoReply: UInt32) {
        TCPOption.noOperation.append(to: &optionBytes)
        TCPOption.noOperation.append(to: &optionBytes)
        TCPOption.timestamps(value: value, echoReply: echoReply).append(to: &optionBytes)
    }

    /// Appends an option.
    public mutating func append(_ option: TCPOption) { option.append(to: &optionBytes) }

    /// Appends two no-operations and a SACK option (RFC 2018 §3) of `count` blocks, block `k`
    /// being `block(k)`, written straight into the option bytes: an ACK sent during loss
    /// allocates nothing. The same bytes as `append(.sack(…))` after two `.noOperation`s, and
    /// like it left out whole when it would not fit.
    public mutating func appendSACK(count: Int, _ block: (Int) -> (SequenceNumber, SequenceNumber)) {
        TCPOption.noOperation.append(to: &optionBytes)
        TCPOption.noOperation.append(to: &optionBytes)
        let length = 2 + 8 * count
        guard count >= 0, optionBytes.count + length <= TCPOptionBytes.capacity else { return }
        optionBytes.append(5, UInt8(length))
        for k in 0..<count {
            let (left, right) = block(k)
            optionBytes.append(word: left.rawValue)
            optionBytes.append(word: right.rawValue)
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
    public var emittedLength: Int { (20 + optionBytes.count + 3) / 4 * 4 }

    /// Adds what follows the TCP header in `packet` (its payload, appended after `emit(into:)`
    /// was given none) into the checksum `emit` wrote: the pseudo-header's length and the
    /// payload's sum (RFC 1071's sum is associative, so it is completed, not recomputed).
    public static func addPayloadToChecksum(in packet: inout [UInt8], headerAt start: Int, headerLength: Int) {
        let payloadStart = start + headerLength
        guard start >= 0, payloadStart <= packet.count, start + 18 <= packet.count else { return }
        let payloadCount = packet.count - payloadStart
        packet.withUnsafeMutableBytes { b in
            // Undo the finish (complement), add the payload's length to the pseudo-header's
            // length field and the payload's words, finish again.
            let old = UInt64(~BigEndian.uint16(UnsafeRawBufferPointer(b), start + 16) & 0xFFFF)
            var sum = old + UInt64(payloadCount)
            // An odd header length never happens (a multiple of 4), so the payload's words align.
            sum = InternetChecksum.sum(UnsafeRawBufferPointer(rebasing: b[payloadStart...]), into: sum)
            let c = InternetChecksum.finish(sum)
            b[start + 16] = UInt8(c >> 8)
            b[start + 17] = UInt8(c & 0xFF)
        }
    }

    /// Appends the header bytes (as `emit` returns them, its checksum over `payload` too) to
    /// `b`: the options are written in place, with no array for each.
    public func emit(into b: inout [UInt8], source: IPv4Address, destination: IPv4Address, payload: [UInt8]) {
        let length = emittedLength
        // Written into fixed storage and appended once (see `IPv4Header.emit(into:)`).
        var header = HeaderBytes()
        header.withBytes { h in
            HeaderBytes.put(sourcePort, h, 0)
            HeaderBytes.put(destinationPort, h, 2)
            HeaderBytes.put(sequenceNumber.rawValue, h, 4)
            HeaderBytes.put(acknowledgmentNumber.rawValue, h, 8)
            h[12] = UInt8(truncatingIfNeeded: length / 4) << 4
            h[13] = flags.rawValue
            HeaderBytes.put(window, h, 14)
            HeaderBytes.put(urgentPointer, h, 18)
            optionBytes.withUnsafeBytes { o in
                for i in 0..<o.count { h[20 + i] = o[i] }
            }
            let pseudo = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.tcp, length: length + payload.count)
            let headerSum = InternetChecksum.sum(UnsafeRawBufferPointer(rebasing: h[0..<length]), into: pseudo)
            let c = payload.withUnsafeBytes { InternetChecksum.finish(InternetChecksum.sum($0, into: headerSum)) }
            HeaderBytes.put(c, h, 16)
            b.append(contentsOf: UnsafeRawBufferPointer(rebasing: h[0..<length]))
        }
    }

}

/// A TCP header's options as on the wire: at most 40 bytes (RFC 9293 §3.1's data offset of at
/// most 15 words), held inline. Appends past 40 bytes are dropped: a list that long could not
/// be sent.
public struct TCPOptionBytes: Sendable, Equatable {
    public static let capacity = 40
    private var words: (UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0)
    public private(set) var count = 0

    public init() {}

    /// The first 40 bytes of `bytes`.
    public init(_ bytes: UnsafeRawBufferPointer) {
        let n = Swift.min(bytes.count, TCPOptionBytes.capacity)
        guard n > 0, let base = bytes.baseAddress else { return }
        withUnsafeMutableBytes(of: &words) { $0.baseAddress!.copyMemory(from: base, byteCount: n) }
        count = n
    }

    public static func == (a: TCPOptionBytes, b: TCPOptionBytes) -> Bool {
        a.count == b.count && a.withUnsafeBytes { x in b.withUnsafeBytes { y in x.elementsEqual(y) } }
    }

    public var isEmpty: Bool { count == 0 }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try Swift.withUnsafeBytes(of: words) { try body(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
    }

    public mutating func append(_ byte: UInt8) {
        guard count < TCPOptionBytes.capacity else { return }
        let i = count
        withUnsafeMutableBytes(of: &words) { $0[i] = byte }
        count += 1
    }

    mutating func append(_ a: UInt8, _ b: UInt8) {
        append(a)
        append(b)
    }

    mutating func append(word value: UInt32) {
        append(UInt8(value >> 24), UInt8((value >> 16) & 0xFF))
        append(UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF))
    }

    /// Calls `body` with each option's kind and data (what follows its length byte; nothing for
    /// a no-operation). Stops at an end-of-list, or at an option whose length does not fit.
    public func forEach(_ body: (UInt8, UnsafeRawBufferPointer) -> Void) {
        withUnsafeBytes { b in
            var i = 0
            while i < b.count {
                let kind = b[i]
                if kind == 0 { return }
                if kind == 1 {
                    body(1, UnsafeRawBufferPointer(rebasing: b[i..<i]))
                    i += 1
                    continue
                }
                guard i + 1 < b.count else { return }
                let length = Int(b[i + 1])
                guard length >= 2, i + length <= b.count else { return }
                body(kind, UnsafeRawBufferPointer(rebasing: b[(i + 2)..<(i + length)]))
                i += length
            }
        }
    }
}
