/// IPv4 fragment reassembly (RFC 791 §3.2, RFC 815 hole list), with bounded memory: a cap
/// on bytes held across all datagrams and a timeout per datagram. Overlapping fragments are
/// refused (RFC 5722's advice, carried over to IPv4): the datagram is dropped.
public struct FragmentReassembly: Sendable {
    public struct Key: Hashable, Sendable {
        var source: IPv4Address
        var destination: IPv4Address
        var proto: UInt8
        var identification: UInt16
    }

    struct Pending: Sendable {
        var header: IPv4Header
        var pieces: [(offset: Int, bytes: [UInt8])] = []
        var totalLength: Int?
        var bytesHeld = 0
        var deadline: Instant
    }

    public let memoryLimit: Int
    public let timeout: Duration
    private var pending: [Key: Pending] = [:]
    public private(set) var bytesHeld = 0
    public private(set) var reassembled = 0
    public private(set) var timedOut = 0
    public private(set) var dropped = 0

    public init(memoryLimit: Int = 64 * 1024, timeout: Duration = .seconds(30)) {
        self.memoryLimit = memoryLimit
        self.timeout = timeout
    }

    public var datagramsPending: Int { pending.count }

    /// Adds one fragment; returns the whole datagram (header with offset 0 and MF clear,
    /// and payload) when this fragment completes it.
    public mutating func add(header: IPv4Header, payload: [UInt8], now: Instant) -> (IPv4Header, [UInt8])? {
        let key = Key(source: header.source, destination: header.destination, proto: header.protocol, identification: header.identification)
        let offset = header.fragmentOffset
        guard offset + payload.count <= 65535 - header.headerLength, header.moreFragments == false || payload.count % 8 == 0 else {
            drop(key)
            dropped += 1
            return nil
        }
        var entry = pending[key] ?? Pending(header: header, deadline: now + timeout)
        let end = offset + payload.count
        if !header.moreFragments {
            if let t = entry.totalLength, t != end {
                drop(key)
                dropped += 1
                return nil
            }
            entry.totalLength = end
        }
        if let t = entry.totalLength, end > t {
            drop(key)
            dropped += 1
            return nil
        }
        for piece in entry.pieces where offset < piece.offset + piece.bytes.count && piece.offset < end {
            // An exact duplicate is harmless; any other overlap poisons the datagram.
            if piece.offset == offset && piece.bytes == payload { return nil }
            drop(key)
            dropped += 1
            return nil
        }
        // Make room: the oldest datagrams go first.
        while bytesHeld + payload.count > memoryLimit, let oldest = pending.min(by: { $0.value.deadline < $1.value.deadline })?.key, oldest != key {
            drop(oldest)
            dropped += 1
        }
        guard bytesHeld + payload.count <= memoryLimit else {
            drop(key)
            dropped += 1
            return nil
        }
        if offset == 0 { entry.header = header }
        entry.pieces.append((offset, payload))
        entry.bytesHeld += payload.count
        bytesHeld += payload.count
        pending[key] = entry

        guard let total = entry.totalLength, entry.bytesHeld == total else { return nil }
        drop(key)
        reassembled += 1
        var whole = [UInt8](repeating: 0, count: total)
        for piece in entry.pieces { whole.replaceSubrange(piece.offset..<(piece.offset + piece.bytes.count), with: piece.bytes) }
        var h = entry.header
        h.fragmentOffset = 0
        h.moreFragments = false
        h.payloadLength = total
        return (h, whole)
    }

    private mutating func drop(_ key: Key) {
        if let e = pending.removeValue(forKey: key) { bytesHeld -= e.bytesHeld }
    }

    public var pollAt: Instant? { pending.values.map(\.deadline).min() }

    /// Drops datagrams whose time ran out; returns the first fragment's header and first
    /// bytes of each whose first fragment had arrived (for ICMP time exceeded, RFC 792).
    public mutating func expire(now: Instant) -> [(IPv4Header, [UInt8])] {
        var expired: [(IPv4Header, [UInt8])] = []
        for (key, e) in pending where e.deadline <= now {
            if let first = e.pieces.first(where: { $0.offset == 0 }) { expired.append((e.header, Array(first.bytes.prefix(8)))) }
            drop(key)
            timedOut += 1
        }
        return expired
    }
}
