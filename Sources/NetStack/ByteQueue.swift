/// A FIFO of bytes in a ring: appends at the tail, consumes from the head, and never moves
/// what it holds except to grow. A TCP send buffer is consumed a segment's worth at a time
/// by the ACKs while the application keeps appending; a ring costs one copy per byte in and
/// one out, and nothing per ACK.
///
/// The storage grows by doubling when an append does not fit (what is held is then laid out
/// again from the start) and is kept when the queue empties; `removeAll` lets it go.
public struct ByteQueue: Sendable {
    /// As long as the ring's capacity; `count` bytes from `head` on, wrapping at the end.
    private var storage: [UInt8] = []
    private var head = 0
    public private(set) var count = 0

    public init() {}

    public var isEmpty: Bool { count == 0 }

    /// What the ring holds before it must grow.
    public var capacity: Int { storage.count }

    public mutating func append<C: Collection<UInt8>>(contentsOf bytes: C) {
        if bytes.withContiguousStorageIfAvailable({ append(UnsafeRawBufferPointer($0)) }) == nil {
            Array(bytes).withUnsafeBytes { append($0) }
        }
    }

    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        let n = bytes.count
        guard n > 0, let source = bytes.baseAddress else { return }
        if count + n > storage.count { grow(toHold: count + n) }
        // Onto the free space after the tail, wrapping like the bytes held do.
        let (first, second) = pieces(offset: count, length: n)
        storage.withUnsafeMutableBytes { ring in
            (ring.baseAddress! + first.lowerBound).copyMemory(from: source, byteCount: first.count)
            if !second.isEmpty { ring.baseAddress!.copyMemory(from: source + first.count, byteCount: second.count) }
        }
        count += n
    }

    /// Lets `fill` write up to `maximum` bytes straight into the free space after the tail and
    /// keeps the count it returns (at most what it was offered; nothing for 0 or less). It is
    /// offered one contiguous piece, fewer bytes than `maximum` where the free space wraps or
    /// is short: the ring grows (as `append` would) only when less than 4 KiB of it is free.
    /// For a reader that fills the queue from a descriptor with no buffer between them.
    @discardableResult
    public mutating func append(upTo maximum: Int, _ fill: (UnsafeMutableRawBufferPointer) -> Int) -> Int {
        guard maximum > 0 else { return 0 }
        let wanted = min(maximum, 4096)
        if storage.count - count < wanted { grow(toHold: count + wanted) }
        let (first, _) = pieces(offset: count, length: min(maximum, storage.count - count))
        let n = storage.withUnsafeMutableBytes { ring in fill(UnsafeMutableRawBufferPointer(rebasing: ring[first])) }
        let kept = min(max(n, 0), first.count)
        count += kept
        return kept
    }

    /// Calls `body` with up to `maximum` bytes from the head (one contiguous piece: fewer where
    /// they wrap) and drops as many as it returns (at most what it was given). For a writer
    /// that sends the queue to a descriptor with no buffer between them.
    @discardableResult
    public mutating func removeFirst(upTo maximum: Int, _ body: (UnsafeRawBufferPointer) -> Int) -> Int {
        guard maximum > 0, count > 0 else { return 0 }
        let (first, _) = pieces(offset: 0, length: min(maximum, count))
        let n = storage.withUnsafeBytes { ring in body(UnsafeRawBufferPointer(rebasing: ring[first])) }
        let taken = min(max(n, 0), first.count)
        removeFirst(taken)
        return taken
    }

    /// Lays the bytes held out again from the start of a ring at least twice as large.
    private mutating func grow(toHold needed: Int) {
        var capacity = max(storage.count, 4096)
        while capacity < needed { capacity *= 2 }
        var larger = [UInt8](repeating: 0, count: capacity)
        larger.withUnsafeMutableBytes { copyOut(offset: 0, length: count, to: $0.baseAddress!) }
        storage = larger
        head = 0
    }

    /// Drops `n` bytes (at most `count`) from the head.
    public mutating func removeFirst(_ n: Int) {
        let k = min(max(n, 0), count)
        head += k
        if head >= storage.count { head -= storage.count }
        count -= k
        if count == 0 { head = 0 }
    }

    /// Copies `length` bytes starting `offset` bytes after the head.
    public func copy(offset: Int, length: Int) -> [UInt8] {
        var out: [UInt8] = []
        copy(offset: offset, length: length, appendingTo: &out)
        return out
    }

    /// `copy` onto the end of `out`.
    public func copy(offset: Int, length: Int, appendingTo out: inout [UInt8]) {
        precondition(offset >= 0 && length >= 0 && offset <= count - length)
        guard length > 0 else { return }
        let (first, second) = pieces(offset: offset, length: length)
        out.reserveCapacity(out.count + length)
        out.append(contentsOf: storage[first])
        if !second.isEmpty { out.append(contentsOf: storage[second]) }
    }

    /// Where the `length` bytes from `offset` after the head lie in `storage` (held bytes, or
    /// free space past the tail): one range, then a second (empty unless they wrap) from its
    /// start. `offset + length` is at most the capacity.
    private func pieces(offset: Int, length: Int) -> (Range<Int>, Range<Int>) {
        var start = head + offset
        if start >= storage.count { start -= storage.count }
        let first = min(length, storage.count - start)
        return (start..<(start + first), 0..<(length - first))
    }

    /// The `length` bytes from `offset` after the head, in at most two pieces, to `destination`.
    private func copyOut(offset: Int, length: Int, to destination: UnsafeMutableRawPointer) {
        guard length > 0 else { return }
        let (first, second) = pieces(offset: offset, length: length)
        storage.withUnsafeBytes { ring in
            destination.copyMemory(from: ring.baseAddress! + first.lowerBound, byteCount: first.count)
            if !second.isEmpty { (destination + first.count).copyMemory(from: ring.baseAddress!, byteCount: second.count) }
        }
    }

    /// Removes and returns up to `maximum` bytes from the head.
    public mutating func take(_ maximum: Int) -> [UInt8] {
        let n = min(max(maximum, 0), count)
        let bytes = copy(offset: 0, length: n)
        removeFirst(n)
        return bytes
    }

    /// Moves up to `maximum` bytes from the head onto the end of `out` and returns how many:
    /// both keep their storage, so a reader with a buffer of its own allocates nothing.
    @discardableResult
    public mutating func take(_ maximum: Int, appendingTo out: inout [UInt8]) -> Int {
        let n = min(max(maximum, 0), count)
        guard n > 0 else { return 0 }
        copy(offset: 0, length: n, appendingTo: &out)
        removeFirst(n)
        return n
    }

    public mutating func removeAll() {
        storage = []
        head = 0
        count = 0
    }
}
