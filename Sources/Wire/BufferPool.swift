/// Byte arrays kept for reuse on the data path: a packet's array, once its bytes are on the
/// line or in a receive buffer, is handed back here and serves the next packet, so a steady
/// stream does not allocate one per packet. Arrays are values, so a buffer that is still
/// shared elsewhere when it is reused is copied on write: reuse is never unsafe, only useless.
///
/// Bounded both ways: at most `limit` buffers, each of at most `largest` bytes of capacity
/// (what a peer's large packet grew is let go rather than kept); what is refused is counted.
/// Every array it hands out has room for `smallest` bytes at least, so that one kept from a
/// bare ACK serves a full segment next without growing.
public struct BufferPool: Sendable {
    private var buffers: [[UInt8]] = []
    public let limit: Int
    public let largest: Int
    public let smallest: Int
    /// Buffers handed back and let go: the pool was full, or they were too large.
    public private(set) var refused = 0

    /// `largest` is compared with an array's capacity, which the allocator rounds up: give
    /// it some slack over the largest packet meant to be kept.
    public init(limit: Int = 64, largest: Int = 16384 + 1024, smallest: Int = 0) {
        self.limit = limit
        self.largest = largest
        self.smallest = smallest
    }

    public var count: Int { buffers.count }

    /// An empty array with room for at least `capacity` bytes: a kept one when there is one.
    public mutating func take(capacity: Int) -> [UInt8] {
        var b = buffers.popLast() ?? []
        b.removeAll(keepingCapacity: true)
        b.reserveCapacity(Swift.max(capacity, smallest))
        return b
    }

    /// Lets kept buffers go, all but `count` of them (their owner has gone idle). The pool's
    /// own list keeps its storage: an owner that goes idle on every exchange (request and
    /// response) would otherwise allocate it again, and its first buffer, every time.
    public mutating func trim(keeping count: Int) {
        while buffers.count > Swift.max(0, count) { buffers.removeLast() }
    }

    /// Keeps `buffer` for a later `take`.
    public mutating func give(_ buffer: consuming [UInt8]) {
        guard buffer.capacity > 0 else { return }
        guard buffers.count < limit, buffer.capacity <= largest else {
            refused &+= 1
            return
        }
        buffers.append(buffer)
    }

    /// Keeps every array in `list` and leaves it empty (its own storage kept).
    public mutating func give(all list: inout [[UInt8]]) {
        while let b = list.popLast() { give(b) }
    }
}
