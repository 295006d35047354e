import Wire

/// The receiver's segments beyond a hole (RFC 9293 §3.10.7.4, "seventh"), sorted and
/// disjoint, with what SACK reports of them (RFC 2018 §4). Their bytes lie inside the
/// advertised window, so the receive buffer bounds them; their count is capped separately.
struct TCPReassembler: Sendable {
    struct Segment: Sendable, Equatable {
        var start: SequenceNumber
        var data: [UInt8]
        var fin: Bool
        var end: SequenceNumber { start + data.count }
    }

    private(set) var segments: [Segment] = []
    /// The run of held segments the latest arrival joined: the first SACK block.
    private var latest: SequenceRange?
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    var isEmpty: Bool { segments.isEmpty }
    var count: Int { segments.count }
    var bytes: Int { segments.reduce(0) { $0 + $1.data.count } }

    /// Holds `segment`, trimmed against what is already held (the earlier copy wins). False
    /// when it was dropped because `capacity` segments are held already.
    @discardableResult
    mutating func insert(_ segment: Segment) -> Bool {
        var s = segment
        var index = 0
        while index < segments.count && segments[index].end <= s.start { index += 1 }
        if index < segments.count, segments[index].start <= s.start {
            let overlap = segments[index].end - s.start
            if overlap >= s.data.count {
                if s.fin && segments[index].end == s.end { segments[index].fin = true }
                latest = run(around: index)
                return true
            }
            s.data.removeFirst(overlap)
            s.start = segments[index].end
            index += 1
        }
        if index < segments.count, segments[index].start < s.end {
            s.data.removeLast(s.end - segments[index].start)
            s.fin = false
        }
        guard segments.count < capacity else { return false }
        segments.insert(s, at: index)
        latest = run(around: index)
        return true
    }

    /// The first held segment if it starts at or before `next` (the hole before it is filled).
    mutating func popFilled(upTo next: SequenceNumber) -> Segment? {
        guard let first = segments.first, first.start <= next else { return nil }
        return segments.removeFirst()
    }

    mutating func removeAll() {
        segments.removeAll()
        latest = nil
    }

    /// At most `limit` SACK blocks: the one holding the latest segment first, then the others
    /// in sequence order (RFC 2018 §4).
    func sackBlocks(limit: Int) -> [SequenceRange] {
        var blocks: [SequenceRange] = []
        forEachSACKBlock(limit: limit) { blocks.append($0) }
        return blocks
    }

    /// The blocks of `sackBlocks`, handed to `body` in that order without building a list: an
    /// ACK during loss allocates nothing for them.
    func forEachSACKBlock(limit: Int, _ body: (SequenceRange) -> Void) {
        guard limit > 0 else { return }
        // The run holding the latest arrival first (a run's span is its segments' spans).
        var first: SequenceRange?
        if let latest, let at = segments.firstIndex(where: { $0.start <= latest.start && latest.start < $0.end }) {
            first = run(around: at)
        }
        var given = 0
        if let first {
            body(first)
            given = 1
        }
        var i = 0
        while i < segments.count && given < limit {
            var r = SequenceRange(start: segments[i].start, end: segments[i].end)
            while i + 1 < segments.count && segments[i + 1].start == r.end {
                i += 1
                r.end = segments[i].end
            }
            i += 1
            if r != first {
                body(r)
                given += 1
            }
        }
    }

    /// The contiguous run of held segments around `index`.
    private func run(around index: Int) -> SequenceRange {
        var lo = index, hi = index
        while lo > 0 && segments[lo - 1].end == segments[lo].start { lo -= 1 }
        while hi + 1 < segments.count && segments[hi].end == segments[hi + 1].start { hi += 1 }
        return SequenceRange(start: segments[lo].start, end: segments[hi].end)
    }
}

/// Up to four SACK blocks, held inline (the most a TCP header's options can carry).
struct SACKBlockList {
    private var blocks = (SequenceRange.empty, SequenceRange.empty, SequenceRange.empty, SequenceRange.empty)
    private(set) var count = 0

    /// Keeps `block` when fewer than four are held.
    mutating func append(_ block: SequenceRange) {
        switch count {
        case 0: blocks.0 = block
        case 1: blocks.1 = block
        case 2: blocks.2 = block
        case 3: blocks.3 = block
        default: return
        }
        count += 1
    }

    subscript(_ k: Int) -> SequenceRange {
        switch k {
        case 0: blocks.0
        case 1: blocks.1
        case 2: blocks.2
        default: blocks.3
        }
    }
}
