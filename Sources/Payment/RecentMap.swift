/// A map whose keys a peer chooses (service IDs, transaction IDs, host IDs, session tokens),
/// holding at most `capacity` of them: a new key beyond that evicts the oldest, and the
/// evictions are counted. Forgetting the oldest is the lesser harm: a peer that keeps inventing
/// keys would otherwise fill the memory, and refusing new keys would let it lock out everyone.
public struct RecentMap<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    public let capacity: Int
    private var values: [Key: Value] = [:]
    /// Insertion order, oldest first.
    private var order: [Key] = []
    /// Keys forgotten to make room.
    public private(set) var evicted = 0

    public init(capacity: Int) { self.capacity = max(1, capacity) }

    public var count: Int { values.count }
    public var isEmpty: Bool { values.isEmpty }
    public func contains(_ key: Key) -> Bool { values[key] != nil }

    public subscript(key: Key) -> Value? { values[key] }

    /// Sets `key` (a known key keeps its age; a new one is the newest).
    public mutating func insert(_ key: Key, _ value: Value) {
        if values.updateValue(value, forKey: key) == nil {
            order.append(key)
            if order.count > capacity {
                values[order.removeFirst()] = nil
                evicted += 1
            }
        }
    }

    /// The oldest entry that satisfies `predicate`.
    public func first(where predicate: (Key, Value) -> Bool) -> (key: Key, value: Value)? {
        for key in order { if let value = values[key], predicate(key, value) { return (key, value) } }
        return nil
    }

    public mutating func remove(where shouldRemove: (Key, Value) -> Bool) {
        var kept: [Key] = []
        for key in order {
            if let value = values[key], shouldRemove(key, value) { values[key] = nil } else { kept.append(key) }
        }
        order = kept
    }

    public mutating func removeAll() {
        values = [:]
        order = []
    }
}

extension RecentMap where Value == Bool {
    /// Adds `key` as a member (the set use: seen identifiers).
    public mutating func insert(_ key: Key) { insert(key, true) }
}
