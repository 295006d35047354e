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
        var i = 0
        while i < segments.count {
            var r = SequenceRange(start: segments[i].start, end: segments[i].end)
            while i + 1 < segments.count && segments[i + 1].start == r.end {
                i += 1
                r.end = segments[i].end
            }
            blocks.append(r)
            i += 1
        }
        if let latest, let at = blocks.firstIndex(where: { $0.start <= latest.start && latest.start < $0.end }) {
            blocks.insert(blocks.remove(at: at), at: 0)
        }
        return Array(blocks.prefix(limit))
    }

    /// The contiguous run of held segments around `index`.
    private func run(around index: Int) -> SequenceRange {
        var lo = index, hi = index
        while lo > 0 && segments[lo - 1].end == segments[lo].start { lo -= 1 }
        while hi + 1 < segments.count && segments[hi].end == segments[hi + 1].start { hi += 1 }
        return SequenceRange(start: segments[lo].start, end: segments[hi].end)
    }
}
