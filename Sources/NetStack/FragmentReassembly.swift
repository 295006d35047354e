/// IPv4 fragment reassembly (RFC 791 §3.2) by the hole list of RFC 815, bounded against a
/// hostile sender: bytes held across all datagrams, datagrams pending in total and per source,
/// and a timeout per datagram. Overlapping fragments are refused (RFC 5722's advice, carried
/// over to IPv4): the datagram is dropped. Every drop is counted by its reason.
public struct FragmentReassembly: Sendable {
    public struct Key: Hashable, Sendable {
        var source: IPv4Address
        var destination: IPv4Address
        var proto: IPProtocol
        var identification: UInt16
    }

    public struct Limits: Sendable, Equatable {
        /// Memory held across every pending datagram: each piece's payload and
        /// `pieceOverhead` for its bookkeeping, so 8-byte fragments cannot hold nine times
        /// what they say.
        public var memory: Int
        /// Datagrams pending at once, and from one source address.
        public var datagrams: Int
        public var datagramsPerSource: Int
        public var timeout: Duration

        public init(memory: Int = 64 * 1024, datagrams: Int = 64, datagramsPerSource: Int = 16, timeout: Duration = .seconds(30)) {
            self.memory = max(memory, 0)
            self.datagrams = max(datagrams, 1)
            self.datagramsPerSource = max(datagramsPerSource, 1)
            self.timeout = timeout
        }
    }

    /// What was dropped, by reason.
    public struct Drops: Sendable, Equatable {
        /// A fragment past the datagram's end (its last fragment says where that is), or a
        /// second last fragment naming another end.
        public var beyondEnd = 0
        /// A fragment overlapping another one with other bytes.
        public var overlapping = 0
        /// A datagram that would exceed 65535 bytes with its first fragment's header.
        public var tooLarge = 0
        /// A non-final fragment with no data, or one whose length is not a multiple of 8.
        public var malformed = 0
        /// Datagrams given up to make room (memory, total or per-source cap).
        public var evicted = 0

        public var total: Int { beyondEnd + overlapping + tooLarge + malformed + evicted }
    }

    /// What one held piece costs besides its payload (its array slot and buffer header).
    public static let pieceOverhead = 64

    struct Piece: Sendable {
        var offset: Int
        var bytes: [UInt8]
        var end: Int { offset + bytes.count }
    }

    struct Pending: Sendable {
        /// The header of the fragment at offset 0, once it arrived (RFC 791: the datagram
        /// keeps the first fragment's header and options).
        var first: IPv4Header?
        /// Sorted by offset, never overlapping.
        var pieces: [Piece] = []
        var totalLength: Int?
        var bytesHeld = 0
        var deadline: Instant
        /// Its place in `order`.
        var serial: UInt64
    }

    public let limits: Limits
    private var pending: [Key: Pending] = [:]
    /// Pending datagrams in arrival order, which is deadline order (a fixed timeout from a
    /// monotonic clock): the oldest is at `orderHead`. Entries of datagrams already gone stay
    /// until they reach the head or a compaction removes them.
    private var order: [(key: Key, serial: UInt64)] = []
    private var orderHead = 0
    private var nextSerial: UInt64 = 0
    /// The datagram `add` has taken out of `pending` while it changes: still alive for the
    /// bookkeeping of `order`.
    private var takenOut: (key: Key, serial: UInt64)?
    private var perSource: [IPv4Address: Int] = [:]
    /// Payload bytes held.
    public private(set) var bytesHeld = 0
    /// Payload plus `pieceOverhead` per piece: what `limits.memory` bounds.
    public private(set) var memoryHeld = 0
    public private(set) var reassembled = 0
    public private(set) var timedOut = 0
    public private(set) var drops = Drops()

    /// Every datagram or fragment given up (all reasons; timeouts are counted apart).
    public var dropped: Int { drops.total }

    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    public init(memoryLimit: Int, timeout: Duration = .seconds(30)) {
        self.init(limits: Limits(memory: memoryLimit, timeout: timeout))
    }

    public var datagramsPending: Int { pending.count }

    /// Adds one fragment; returns the whole datagram (the first fragment's header with offset 0
    /// and MF clear, and the payload) when this fragment fills its last hole.
    public mutating func add(header: IPv4Header, payload: [UInt8], now: Instant) -> (IPv4Header, [UInt8])? {
        let key = Key(source: header.source, destination: header.destination, proto: header.protocol, identification: header.identification)
        let offset = header.fragmentOffset
        let end = offset + payload.count
        // RFC 791: every fragment but the last carries a positive multiple of 8 bytes. An empty
        // one fills no hole and would only hold an entry.
        if header.moreFragments && (payload.isEmpty || payload.count % 8 != 0) {
            drops.malformed += 1
            return nil
        }
        // No header is shorter than 20 bytes, so no datagram can reach past this.
        guard end <= 65535 - 20 else {
            drop(key)
            drops.tooLarge += 1
            return nil
        }
        // The entry is taken out of the table while it changes, so its pieces are changed in
        // place rather than copied for every fragment.
        let existing = pending.removeValue(forKey: key)
        takenOut = existing.map { (key, $0.serial) }
        defer { takenOut = nil }
        var entry: Pending
        if let existing {
            entry = existing
        } else {
            makeRoomForDatagram(from: header.source)
            entry = Pending(deadline: now + limits.timeout, serial: nextSerial)
            nextSerial &+= 1
        }

        if !header.moreFragments {
            if let t = entry.totalLength, t != end {
                release(entry, key, wasHeld: existing != nil)
                drops.beyondEnd += 1
                return nil
            }
            entry.totalLength = end
        }
        // Once the end is known, nothing may lie beyond it: this piece, nor one held before.
        if let t = entry.totalLength, end > t || (entry.pieces.last?.end ?? 0) > t {
            release(entry, key, wasHeld: existing != nil)
            drops.beyondEnd += 1
            return nil
        }
        if offset == 0 { entry.first = header }
        let headerLength = entry.first?.headerLength ?? 20
        if headerLength + max(end, entry.pieces.last?.end ?? 0) > 65535 {
            release(entry, key, wasHeld: existing != nil)
            drops.tooLarge += 1
            return nil
        }

        // Sorted insertion; an exact duplicate is harmless, any other overlap poisons the datagram.
        let index = entry.pieces.firstIndex { $0.offset >= offset } ?? entry.pieces.count
        if index < entry.pieces.count, entry.pieces[index].offset == offset, entry.pieces[index].bytes == payload {
            keep(entry, key, isNew: existing == nil)
            return nil
        }
        let overlapsBefore = index > 0 && entry.pieces[index - 1].end > offset
        let overlapsAfter = index < entry.pieces.count && entry.pieces[index].offset < end
        // Zero-length pieces overlap nothing but still sit at one point: two at one offset clash.
        let samePoint = index < entry.pieces.count && entry.pieces[index].offset == offset
        if overlapsBefore || overlapsAfter || samePoint {
            release(entry, key, wasHeld: existing != nil)
            drops.overlapping += 1
            return nil
        }

        // Make room in memory: the oldest datagrams go first (this one is out of the table).
        let cost = payload.count + Self.pieceOverhead
        while memoryHeld + cost > limits.memory, let oldest = oldestKey(excluding: key) {
            drop(oldest)
            drops.evicted += 1
        }
        guard memoryHeld + cost <= limits.memory else {
            release(entry, key, wasHeld: existing != nil)
            drops.evicted += 1
            return nil
        }

        entry.pieces.insert(Piece(offset: offset, bytes: payload), at: index)
        entry.bytesHeld += payload.count
        bytesHeld += payload.count
        memoryHeld += cost

        guard let total = entry.totalLength, let first = entry.first, Self.holesFilled(entry.pieces, total: total) else {
            keep(entry, key, isNew: existing == nil)
            return nil
        }
        release(entry, key, wasHeld: existing != nil)
        reassembled += 1
        var whole = [UInt8]()
        whole.reserveCapacity(total)
        for piece in entry.pieces { whole += piece.bytes }
        var h = first
        h.fragmentOffset = 0
        h.moreFragments = false
        h.payloadLength = total
        return (h, whole)
    }

    /// Puts an entry (back) in the table.
    private mutating func keep(_ entry: Pending, _ key: Key, isNew: Bool) {
        pending[key] = entry
        if isNew {
            perSource[key.source, default: 0] += 1
            order.append((key, entry.serial))
        }
    }

    /// RFC 815: the datagram is whole when no hole is left between 0 and its end.
    static func holesFilled(_ pieces: [Piece], total: Int) -> Bool {
        var covered = 0
        for piece in pieces {
            guard piece.offset == covered else { return false }
            covered = piece.end
        }
        return covered == total
    }

    /// A new datagram needs a place: within the total and per-source caps, the oldest goes.
    private mutating func makeRoomForDatagram(from source: IPv4Address) {
        if perSource[source, default: 0] >= limits.datagramsPerSource,
           let oldest = pending.filter({ $0.key.source == source }).min(by: { $0.value.serial < $1.value.serial })?.key {
            drop(oldest)
            drops.evicted += 1
        }
        while pending.count >= limits.datagrams, let oldest = oldestKey(excluding: nil) {
            drop(oldest)
            drops.evicted += 1
        }
    }

    private func oldestKey(excluding excluded: Key?) -> Key? {
        var i = orderHead
        while i < order.count {
            let (key, serial) = order[i]
            if key != excluded, pending[key]?.serial == serial { return key }
            i += 1
        }
        return nil
    }

    private func isLive(_ key: Key, _ serial: UInt64) -> Bool {
        pending[key]?.serial == serial || (takenOut?.key == key && takenOut?.serial == serial)
    }

    private mutating func drop(_ key: Key) {
        guard let e = pending.removeValue(forKey: key) else { return }
        release(e, key, wasHeld: true)
    }

    /// Forgets an entry already out of the table: its bytes, its place under its source's cap
    /// (when it was held), and its place in `order`.
    private mutating func release(_ e: Pending, _ key: Key, wasHeld: Bool) {
        if takenOut?.key == key && takenOut?.serial == e.serial { takenOut = nil }
        bytesHeld -= e.bytesHeld
        memoryHeld -= e.bytesHeld + e.pieces.count * Self.pieceOverhead
        if wasHeld {
            if let n = perSource[key.source], n > 1 { perSource[key.source] = n - 1 } else { perSource[key.source] = nil }
        }
        // Keep the head live, so `pollAt` reads one entry, and compact when the dead outnumber
        // the living (amortised: each entry is moved a bounded number of times).
        while orderHead < order.count, !isLive(order[orderHead].key, order[orderHead].serial) { orderHead += 1 }
        if orderHead == order.count {
            order.removeAll(keepingCapacity: true)
            orderHead = 0
        } else if order.count > 64 && order.count > 4 * pending.count {
            order = order[orderHead...].filter { isLive($0.key, $0.serial) }
            orderHead = 0
        }
    }

    /// The oldest datagram's deadline.
    public var pollAt: Instant? {
        guard orderHead < order.count else { return nil }
        return pending[order[orderHead].key]?.deadline
    }

    /// Drops datagrams whose time ran out; returns the first fragment's header and first
    /// bytes of each whose first fragment had arrived (for ICMP time exceeded, RFC 792).
    public mutating func expire(now: Instant) -> [(IPv4Header, [UInt8])] {
        var expired: [(IPv4Header, [UInt8])] = []
        while orderHead < order.count, let e = pending[order[orderHead].key], e.serial == order[orderHead].serial, e.deadline <= now {
            if let first = e.first, let piece = e.pieces.first, piece.offset == 0 { expired.append((first, Array(piece.bytes.prefix(8)))) }
            drop(order[orderHead].key)
            timedOut += 1
        }
        return expired
    }
}
