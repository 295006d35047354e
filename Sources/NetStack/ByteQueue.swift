/// A FIFO of bytes over one contiguous array: appends at the tail, consumes from the head,
/// and compacts only when the consumed prefix is large, so steady streaming costs one copy
/// per byte in and one out.
public struct ByteQueue: Sendable {
    private var storage: [UInt8] = []
    private var head = 0

    public init() {}

    public var count: Int { storage.count - head }
    public var isEmpty: Bool { count == 0 }

    public mutating func append<C: Collection<UInt8>>(contentsOf bytes: C) {
        storage.append(contentsOf: bytes)
    }

    /// Drops `n` bytes (at most `count`) from the head.
    public mutating func removeFirst(_ n: Int) {
        head += Swift.min(n, count)
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 65536 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
    }

    /// Copies `length` bytes starting `offset` bytes after the head.
    public func copy(offset: Int, length: Int) -> [UInt8] {
        precondition(offset >= 0 && length >= 0 && offset + length <= count)
        return Array(storage[(head + offset)..<(head + offset + length)])
    }

    /// `copy` onto the end of `out`.
    public func copy(offset: Int, length: Int, appendingTo out: inout [UInt8]) {
        precondition(offset >= 0 && length >= 0 && offset + length <= count)
        out.append(contentsOf: storage[(head + offset)..<(head + offset + length)])
    }

    /// Removes and returns up to `maximum` bytes from the head.
    public mutating func take(_ maximum: Int) -> [UInt8] {
        let n = Swift.min(maximum, count)
        // All of it, from the start of the buffer: the buffer itself is handed over. (A copy of
        // the whole would share it anyway, and emptying the queue would then allocate anew.)
        if n == storage.count && head == 0 && n > 0 {
            defer { storage = [] }
            return storage
        }
        let bytes = copy(offset: 0, length: n)
        removeFirst(n)
        return bytes
    }

    /// Moves up to `maximum` bytes from the head onto the end of `out` and returns how many:
    /// both keep their storage, so a reader with a buffer of its own allocates nothing.
    @discardableResult
    public mutating func take(_ maximum: Int, appendingTo out: inout [UInt8]) -> Int {
        let n = Swift.min(maximum, count)
        guard n > 0 else { return 0 }
        out.append(contentsOf: storage[head..<(head + n)])
        removeFirst(n)
        return n
    }

    public mutating func removeAll() {
        storage.removeAll()
        head = 0
    }
}
