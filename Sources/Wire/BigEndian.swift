/// Network byte order (RFC 1700 "big-endian"), for every header field this project reads or writes.
public enum BigEndian {
    @inlinable
    public static func uint16<C: Collection<UInt8>>(_ b: C, _ i: Int) -> UInt16 where C.Index == Int {
        UInt16(b[i]) << 8 | UInt16(b[i + 1])
    }

    @inlinable
    public static func uint32<C: Collection<UInt8>>(_ b: C, _ i: Int) -> UInt32 where C.Index == Int {
        UInt32(uint16(b, i)) << 16 | UInt32(uint16(b, i + 2))
    }

    @inlinable
    public static func bytes(_ v: UInt16) -> [UInt8] { [UInt8(v >> 8), UInt8(v & 0xFF)] }

    @inlinable
    public static func bytes(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)] }

    /// Stores `v` at `i` in `h`.
    @inlinable
    public static func put(_ v: UInt16, into h: inout [UInt8], at i: Int) {
        h[i] = UInt8(v >> 8)
        h[i + 1] = UInt8(v & 0xFF)
    }

    @inlinable
    public static func put(_ v: UInt32, into h: inout [UInt8], at i: Int) {
        put(UInt16(v >> 16), into: &h, at: i)
        put(UInt16(v & 0xFFFF), into: &h, at: i + 2)
    }
}
