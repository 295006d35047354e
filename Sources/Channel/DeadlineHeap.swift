import NetStack

/// Deadlines by key in a binary min-heap with an index, so that the earliest is read in O(1)
/// and setting, moving or removing one costs O(log n): what lets a loop turn cost the same with
/// 1 or 1,000 idle timers and clients. Keys are unique; setting a key again moves it. Ties are
/// broken by the order keys were first set (`sequence`), so timers due together run in the
/// order they were scheduled.
public struct DeadlineHeap<Key: Hashable> {
    private struct Entry {
        var at: Instant
        var sequence: UInt64
        var key: Key
    }

    private var entries: [Entry] = []
    private var positions: [Key: Int] = [:]
    private var nextSequence: UInt64 = 0

    public init() {}

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }

    /// The earliest deadline, if any.
    public var earliest: Instant? { entries.first?.at }

    /// Sets (or moves) `key`'s deadline; nil removes it.
    public mutating func set(_ key: Key, at: Instant?) {
        guard let at else {
            remove(key)
            return
        }
        if let i = positions[key] {
            let old = entries[i].at
            entries[i].at = at
            if at < old { siftUp(i) } else if old < at { siftDown(i) }
            return
        }
        nextSequence &+= 1
        entries.append(Entry(at: at, sequence: nextSequence, key: key))
        positions[key] = entries.count - 1
        siftUp(entries.count - 1)
    }

    /// Removes `key`; false when it had no deadline.
    @discardableResult
    public mutating func remove(_ key: Key) -> Bool {
        guard let i = positions.removeValue(forKey: key) else { return false }
        let last = entries.count - 1
        if i != last {
            entries.swapAt(i, last)
            positions[entries[i].key] = i
        }
        entries.removeLast()
        if i < entries.count {
            siftDown(i)
            siftUp(i)
        }
        return true
    }

    /// Removes and returns the key with the earliest deadline if that is at or before `now`.
    public mutating func popDue(now: Instant) -> Key? {
        guard let first = entries.first, first.at <= now else { return nil }
        remove(first.key)
        return first.key
    }

    public mutating func removeAll() {
        entries.removeAll()
        positions.removeAll()
    }

    private func before(_ a: Int, _ b: Int) -> Bool {
        let x = entries[a], y = entries[b]
        return x.at < y.at || (x.at == y.at && x.sequence < y.sequence)
    }

    private mutating func exchange(_ a: Int, _ b: Int) {
        entries.swapAt(a, b)
        positions[entries[a].key] = a
        positions[entries[b].key] = b
    }

    private mutating func siftUp(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            guard before(i, parent) else { return }
            exchange(i, parent)
            i = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var i = start
        while true {
            let left = 2 * i + 1, right = left + 1
            var smallest = i
            if left < entries.count && before(left, smallest) { smallest = left }
            if right < entries.count && before(right, smallest) { smallest = right }
            guard smallest != i else { return }
            exchange(i, smallest)
            i = smallest
        }
    }
}
