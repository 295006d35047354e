/// The stack's TCP connections by id, kept in an array so that a connection is read and
/// changed where it lies. A `Dictionary`'s subscript getter returns a copy of its value (for a
/// connection: a retain and a release of every buffer it holds), and the stack asks its
/// connections something many times on every turn of the loop (`writableBytes`, `pollAt`,
/// `state`). Here a change happens where the connection lies (`modify`), and so does a query
/// (`inspect`): both take the connection `inout`, because a non-mutating read copies it.
///
/// The slots are not optional: the optimizer does not reach an optional's payload in place,
/// however the unwrapping is written, so `&slots[i]!` copied the whole connection out (every
/// buffer retained, its bytes moved) and back on every access. A free slot holds
/// `TCPConnection.vacant` instead, and `ids` says which slots are in use.
///
/// Freed slots are reused, so the array is as long as the most connections held at once
/// (`IPStackConfiguration.maximumConnections` bounds that).
struct ConnectionTable: Sendable {
    private var slots: [TCPConnection] = []
    private var ids: [ConnectionID?] = []
    private var slotOf: [ConnectionID: Int] = [:]
    private var free: [Int] = []
    /// The connection last found by id, and where: the channel asks several things of one
    /// connection in a row (its state, its room, a read), and a lookup hashes the id.
    private var lastFound: (id: ConnectionID, slot: Int)?

    /// Set by every change through `modify` and `insert`; cleared by the stack once it has
    /// collected what every connection had to send and say (`collectSegments`). Until it is set
    /// again no connection can have anything new, and the stack, asked for its events several
    /// times a turn, skips walking them. Queries go through `inspect`, which leaves it alone.
    private(set) var changedSinceCollected = true

    mutating func markCollected() { changedSinceCollected = false }

    var count: Int { slotOf.count }
    var isEmpty: Bool { slotOf.isEmpty }
    var keys: Dictionary<ConnectionID, Int>.Keys { slotOf.keys }

    /// `body` on the connection `id` where it lies; nil when there is none. (A closure rather
    /// than `_read`/`_modify` accessors: a coroutine's frame is allocated on the heap when it
    /// is not inlined, once per access.)
    mutating func modify<R>(_ id: ConnectionID, _ body: (inout TCPConnection) -> R) -> R? {
        guard let i = slot(of: id) else { return nil }
        changedSinceCollected = true
        return inPlace(i, body)
    }

    /// `modify` for a query: `body` reads the connection where it lies and must change nothing
    /// (not marked as a change). In place because a non-mutating read copies it (see above).
    mutating func inspect<R>(_ id: ConnectionID, _ body: (inout TCPConnection) -> R) -> R? {
        guard let i = slot(of: id) else { return nil }
        return inPlace(i, body)
    }

    private mutating func slot(of id: ConnectionID) -> Int? {
        if let last = lastFound, last.id == id { return last.slot }
        guard let i = slotOf[id] else { return nil }
        lastFound = (id, i)
        return i
    }

    func contains(_ id: ConnectionID) -> Bool { slotOf[id] != nil }

    /// The connection `id`, copied (for callers outside the stack).
    func copy(_ id: ConnectionID) -> TCPConnection? { slotOf[id].map { slots[$0] } }

    mutating func insert(_ c: TCPConnection, id: ConnectionID) {
        changedSinceCollected = true
        if let i = slotOf[id] {
            slots[i] = c
        } else if let i = free.popLast() {
            slots[i] = c
            ids[i] = id
            slotOf[id] = i
        } else {
            slotOf[id] = slots.count
            slots.append(c)
            ids.append(id)
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: ConnectionID) -> TCPConnection? {
        guard let i = slotOf[id] else { return nil }
        let c = slots[i]
        release(i, id)
        return c
    }

    // MARK: Walking every connection in place

    /// Slot positions: those holding a connection have an `id(at:)`.
    var positions: Range<Int> { slots.indices }

    func id(at position: Int) -> ConnectionID? { ids[position] }

    func read<R>(position: Int, _ body: (borrowing TCPConnection) -> R) -> R? {
        guard ids.indices.contains(position), ids[position] != nil else { return nil }
        precondition(position < slots.count)
        return slots.withUnsafeBufferPointer { body($0[position]) }
    }

    mutating func modify<R>(position: Int, _ body: (inout TCPConnection) -> R) -> R? {
        guard ids[position] != nil else { return nil }
        changedSinceCollected = true
        return inPlace(position, body)
    }

    /// `inspect` by position.
    mutating func inspect<R>(position: Int, _ body: (inout TCPConnection) -> R) -> R? {
        guard ids[position] != nil else { return nil }
        return inPlace(position, body)
    }

    /// `body` on the connection in slot `i`, through the array's buffer: `body(&slots[i])`
    /// compiles to a copy of the whole connection (some 940 bytes) into a temporary when
    /// `body` only reads it. `i` is a slot in use (`ids[i]` was checked, and `ids` and
    /// `slots` are as long as each other), so the unchecked subscript stays in bounds.
    private mutating func inPlace<R>(_ i: Int, _ body: (inout TCPConnection) -> R) -> R {
        precondition(i >= 0 && i < slots.count)
        return slots.withUnsafeMutableBufferPointer { body(&$0[i]) }
    }

    // MARK: Bookkeeping

    private mutating func release(_ i: Int, _ id: ConnectionID) {
        if lastFound?.id == id { lastFound = nil }
        slots[i] = .vacant
        ids[i] = nil
        slotOf[id] = nil
        // Trailing free slots go, so the array shrinks back as connections end.
        if i == slots.count - 1 {
            slots.removeLast()
            ids.removeLast()
            while let last = ids.last, last == nil {
                slots.removeLast()
                ids.removeLast()
            }
            free.removeAll { $0 >= slots.count }
        } else {
            free.append(i)
        }
    }
}
