/// The Internet checksum (RFC 1071): the ones' complement of the ones' complement sum of
/// 16-bit words. Sums are kept in 64 bits and folded once at the end.
public enum InternetChecksum {
    /// Adds `bytes` to a running sum. An odd final byte is padded with zero (RFC 1071 §4.1).
    /// Chunks fed in order must all have even length except the last.
    ///
    /// Eight bytes at a time are added as native (little-endian) words with end-around carry,
    /// an add and an add-with-carry each. The sum is independent of byte order (RFC 1071
    /// §2(B)): the native sum, folded to 16 bits and byte-swapped, is the big-endian sum.
    public static func sum(_ bytes: UnsafeRawBufferPointer, into initial: UInt64 = 0) -> UInt64 {
        var s = initial
        let n = bytes.count
        guard let p = bytes.baseAddress else { return s }
        var i = 0
        if n >= 8 {
            var native: UInt64 = 0
            var carries: UInt64 = 0
            // Sixty-four bytes a turn: eight adds whose carries are counted, and one test of
            // the index, which otherwise costs as much as the adds.
            @inline(__always) func add(_ offset: Int) {
                let (a, o) = native.addingReportingOverflow(UInt64(littleEndian: p.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
                native = a
                carries &+= o ? 1 : 0
            }
            let blocks = n & ~63
            while i < blocks {
                add(i); add(i &+ 8); add(i &+ 16); add(i &+ 24)
                add(i &+ 32); add(i &+ 40); add(i &+ 48); add(i &+ 56)
                i &+= 64
            }
            while i + 16 <= n {
                add(i); add(i &+ 8)
                i &+= 16
            }
            if i + 8 <= n {
                add(i)
                i &+= 8
            }
            // Each carry out of bit 63 is worth 2^64, which is 1 in ones' complement arithmetic.
            let (folded, o) = native.addingReportingOverflow(carries)
            s &+= UInt64(fold16(folded &+ (o ? 1 : 0)).byteSwapped)
        }
        while i + 2 <= n {
            s &+= UInt64(p.load(fromByteOffset: i, as: UInt8.self)) << 8 | UInt64(p.load(fromByteOffset: i + 1, as: UInt8.self))
            i += 2
        }
        if i < n { s &+= UInt64(p.load(fromByteOffset: i, as: UInt8.self)) << 8 }
        return s
    }

    /// Folds a sum to 16 bits with end-around carry, without complementing it.
    @inline(__always)
    static func fold16(_ s: UInt64) -> UInt16 {
        var x = (s & 0xFFFF_FFFF) &+ (s >> 32)
        x = (x & 0xFFFF) &+ (x >> 16)
        x = (x & 0xFFFF) &+ (x >> 16)
        x = (x & 0xFFFF) &+ (x >> 16)
        return UInt16(truncatingIfNeeded: x)
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
    public static func pseudoHeaderSum(source: IPv4Address, destination: IPv4Address, protocol proto: IPProtocol, length: Int) -> UInt64 {
        UInt64(source.value >> 16) + UInt64(source.value & 0xFFFF) + UInt64(destination.value >> 16)
            + UInt64(destination.value & 0xFFFF) + UInt64(proto.rawValue) + UInt64(length)
    }
}
