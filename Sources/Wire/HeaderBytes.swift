/// Sixty zeroed bytes on the stack, the longest IPv4 or TCP header (RFC 791 §3.1, RFC 9293
/// §3.1): a header is written here field by field and appended to its packet in one piece.
struct HeaderBytes {
    private var words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)

    mutating func withBytes<R>(_ body: (UnsafeMutableRawBufferPointer) -> R) -> R {
        withUnsafeMutableBytes(of: &words) { body(UnsafeMutableRawBufferPointer(rebasing: $0[0..<60])) }
    }

    @inline(__always) static func put(_ v: UInt16, _ h: UnsafeMutableRawBufferPointer, _ i: Int) {
        h[i] = UInt8(v >> 8)
        h[i + 1] = UInt8(v & 0xFF)
    }

    @inline(__always) static func put(_ v: UInt32, _ h: UnsafeMutableRawBufferPointer, _ i: Int) {
        put(UInt16(v >> 16), h, i)
        put(UInt16(v & 0xFFFF), h, i + 2)
    }
}
