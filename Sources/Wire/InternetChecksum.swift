/// The Internet checksum (RFC 1071): the ones' complement of the ones' complement sum of
/// 16-bit words. Sums are kept in 64 bits and folded once at the end.
public enum InternetChecksum {
    /// Adds `bytes` to a running sum. An odd final byte is padded with zero (RFC 1071 §4.1).
    /// Chunks fed in order must all have even length except the last.
    public static func sum(_ bytes: UnsafeRawBufferPointer, into initial: UInt64 = 0) -> UInt64 {
        var s = initial
        var i = 0
        let n = bytes.count
        guard let p = bytes.baseAddress else { return s }
        while i + 8 <= n {
            let w = UInt64(bigEndian: p.loadUnaligned(fromByteOffset: i, as: UInt64.self))
            s &+= (w >> 32) &+ (w & 0xFFFF_FFFF)
            i += 8
        }
        while i + 2 <= n {
            s &+= UInt64(p.load(fromByteOffset: i, as: UInt8.self)) << 8 | UInt64(p.load(fromByteOffset: i + 1, as: UInt8.self))
            i += 2
        }
        if i < n { s &+= UInt64(p.load(fromByteOffset: i, as: UInt8.self)) << 8 }
        return s
    }

    public static func sum<C: Collection>(_ bytes: C, into initial: UInt64 = 0) -> UInt64 where C.Element == UInt8 {
        if let r = bytes.withContiguousStorageIfAvailable({ sum(UnsafeRawBufferPointer($0), into: initial) }) { return r }
        return Array(bytes).withUnsafeBytes { sum($0, into: initial) }
    }

    /// Folds a sum to 16 bits and complements it.
    public static func finish(_ s: UInt64) -> UInt16 {
        var x = s
        while x >> 16 != 0 { x = (x & 0xFFFF) &+ (x >> 16) }
        return ~UInt16(x)
    }

    public static func checksum<C: Collection>(_ bytes: C) -> UInt16 where C.Element == UInt8 { finish(sum(bytes)) }

    /// The pseudo-header sum for TCP and UDP (RFC 9293 §3.1, RFC 768).
    public static func pseudoHeaderSum(source: IPv4Address, destination: IPv4Address, protocol proto: UInt8, length: Int) -> UInt64 {
        UInt64(source.value >> 16) + UInt64(source.value & 0xFFFF) + UInt64(destination.value >> 16)
            + UInt64(destination.value & 0xFFFF) + UInt64(proto) + UInt64(length)
    }
}
