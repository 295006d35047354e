/// Byte arrays kept for reuse on the data path: a packet's array, once its bytes are on the
/// line or in a receive buffer, is handed back here and serves the next packet, so a steady
/// stream does not allocate one per packet. Arrays are values, so a buffer that is still
/// shared elsewhere when it is reused is copied on write: reuse is never unsafe, only useless.
///
/// Bounded both ways: at most `limit` buffers, each of at most `largest` bytes of capacity
/// (what a peer's large packet grew is let go rather than kept); what is refused is counted.
public struct BufferPool: Sendable {
    private var buffers: [[UInt8]] = []
    public let limit: Int
    public let largest: Int
    /// Buffers handed back and let go: the pool was full, or they were too large.
    public private(set) var refused = 0

    public init(limit: Int = 64, largest: Int = 16384) {
        self.limit = limit
        self.largest = largest
    }

    public var count: Int { buffers.count }

    /// An empty array with room for at least `capacity` bytes: a kept one when there is one.
    public mutating func take(capacity: Int) -> [UInt8] {
        var b = buffers.popLast() ?? []
        b.removeAll(keepingCapacity: true)
        b.reserveCapacity(capacity)
        return b
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
