import CCarrylessMultiply

/// Frame Check Sequences of RFC 1662 §C.2 (16-bit) and §C.3 (32-bit), as selected by the
/// RFC 1570 FCS-Alternatives option.
///
/// Both are reflected CRCs. They are computed slicing-by-8: eight 256-entry tables let the
/// loop fold eight input bytes per step instead of one, which breaks the one-byte dependency
/// chain of the classic table loop (the loop RFC 1662 prints, and our C baseline). Runs of 64
/// bytes and more are first folded to 16 with carry-less multiplication where the CPU has it
/// (`CCarrylessMultiply`): several times faster on a full-size frame, with the same result.
public enum FCSKind: Sendable, Equatable, CustomStringConvertible {
    /// RFC 1570 "Null FCS": no check sequence at all.
    case none
    case fcs16
    case fcs32

    /// Bytes the FCS occupies at the end of a frame.
    public var byteCount: Int {
        switch self {
        case .none: return 0
        case .fcs16: return 2
        case .fcs32: return 4
        }
    }

    public var description: String {
        switch self {
        case .none: return "none"
        case .fcs16: return "fcs16"
        case .fcs32: return "fcs32"
        }
    }
}

/// A reflected CRC table set for slicing-by-8. `Word` is the CRC's register type.
@usableFromInline
final class SlicingTables<Word: FixedWidthInteger & UnsignedInteger & Sendable>: Sendable {
    /// 8 × 256 entries; table k (k = 0…7) is at offset k × 256.
    @usableFromInline let entries: [Word]
    /// x^575, x^511, x^191 and x^127 modulo the polynomial, reflected into 64-bit words, for
    /// `pb_reflected_crc_fold`; nil when the CPU cannot multiply without carries.
    @usableFromInline let foldConstants: [UInt64]?
    /// Shorter runs go through the tables alone (the fold needs 64 bytes).
    @usableFromInline static var foldThreshold: Int { 64 }

    init(reflectedPolynomial poly: Word, carrylessMultiply: Bool = pb_carryless_multiply_available() != 0) {
        var t = [Word](repeating: 0, count: 8 * 256)
        for i in 0..<256 {
            var c = Word(i)
            for _ in 0..<8 { c = (c & 1) != 0 ? (c >> 1) ^ poly : c >> 1 }
            t[i] = c
        }
        for k in 1..<8 {
            for i in 0..<256 {
                let previous = t[(k - 1) * 256 + i]
                t[k * 256 + i] = (previous >> 8) ^ t[Int(truncatingIfNeeded: previous & 0xFF)]
            }
        }
        entries = t
        // Asked for only where the CPU has it: the fold would be an illegal instruction.
        precondition(!carrylessMultiply || pb_carryless_multiply_available() != 0, "no carry-less multiply on this CPU")
        precondition(Word.bitWidth <= 32, "the fold's constants hold CRCs of up to 32 bits")
        foldConstants = carrylessMultiply ? [575, 511, 191, 127].map { Self.reflectedPower(of: $0, modulo: poly) } : nil
    }

    /// x^`exponent` modulo the CRC polynomial (given reflected, its x^width term implied), with
    /// the coefficient of x^j at bit 63 - j.
    static func reflectedPower(of exponent: Int, modulo reflectedPolynomial: Word) -> UInt64 {
        let width = Word.bitWidth
        // The polynomial's low terms in normal order: x^j is bit width-1-j of the reflected form.
        var low: UInt64 = 0
        for j in 0..<width where (reflectedPolynomial >> (width - 1 - j)) & 1 != 0 { low |= 1 << j }
        var r: UInt64 = 1
        for _ in 0..<exponent {
            let carry = (r >> (width - 1)) & 1
            r = (r << 1) & ((1 << width) - 1)
            if carry != 0 { r ^= low }
        }
        var k: UInt64 = 0
        for j in 0..<width where (r >> j) & 1 != 0 { k |= 1 << (63 - j) }
        return k
    }

    /// Runs the CRC register `crc` over `bytes`. No initial or final inversion here.
    @inlinable
    func update(_ crc: Word, _ bytes: UnsafeRawBufferPointer) -> Word {
        if bytes.count >= Self.foldThreshold, foldConstants != nil { return foldedUpdate(crc, bytes) }
        return tableUpdate(crc, bytes)
    }

    /// `update` for a run of 64 bytes or more: folded to 16 bytes, which the tables finish
    /// together with the bytes the fold left (fewer than 16).
    /// (Its checks repeat `update`'s and the fold's own on purpose: each stands alone.)
    @inlinable
    func foldedUpdate(_ crc: Word, _ bytes: UnsafeRawBufferPointer) -> Word {
        guard let constants = foldConstants else { return tableUpdate(crc, bytes) }
        var folded: (UInt64, UInt64) = (0, 0)
        let consumed = carrylessFold(UInt32(truncatingIfNeeded: crc), bytes, constants, into: &folded)
        // Consumed whole blocks, never more than given; anything else is a fold we cannot trust.
        guard consumed >= Self.foldThreshold, consumed <= bytes.count else { return tableUpdate(crc, bytes) }
        let register = withUnsafeBytes(of: &folded) { tableUpdate(0, $0) }
        return tableUpdate(register, UnsafeRawBufferPointer(rebasing: bytes[consumed...]))
    }

    /// Runs the CRC register `crc` over `bytes` with the tables alone.
    @inlinable
    func tableUpdate(_ crc: Word, _ bytes: UnsafeRawBufferPointer) -> Word {
        guard var p = bytes.baseAddress, !bytes.isEmpty else { return crc }
        var remaining = bytes.count
        var c = UInt64(truncatingIfNeeded: crc)
        return entries.withUnsafeBufferPointer { table -> Word in
            let t = table.baseAddress!
            while remaining >= 8 {
                let x = UInt64(littleEndian: p.loadUnaligned(as: UInt64.self)) ^ c
                let a = t[0x700 + Int(x & 0xFF)] ^ t[0x600 + Int((x >> 8) & 0xFF)]
                let b = t[0x500 + Int((x >> 16) & 0xFF)] ^ t[0x400 + Int((x >> 24) & 0xFF)]
                let d = t[0x300 + Int((x >> 32) & 0xFF)] ^ t[0x200 + Int((x >> 40) & 0xFF)]
                let e = t[0x100 + Int((x >> 48) & 0xFF)] ^ t[Int(x >> 56)]
                c = UInt64(truncatingIfNeeded: (a ^ b) ^ (d ^ e))
                p += 8
                remaining -= 8
            }
            var w = Word(truncatingIfNeeded: c)
            while remaining > 0 {
                let byte = p.load(as: UInt8.self)
                w = (w >> 8) ^ t[Int(truncatingIfNeeded: (w ^ Word(byte)) & 0xFF)]
                p += 1
                remaining -= 1
            }
            return w
        }
    }
}

/// `pb_reflected_crc_fold` over `bytes` into `folded`: how many bytes it consumed (0 for fewer
/// than 64). Not generic, so the tables' generic code around it is specialized where inlined.
@usableFromInline
func carrylessFold(_ register: UInt32, _ bytes: UnsafeRawBufferPointer, _ constants: [UInt64], into folded: inout (UInt64, UInt64)) -> Int {
    guard let base = bytes.baseAddress, bytes.count >= 64, constants.count == 4 else { return 0 }
    return constants.withUnsafeBufferPointer { k in
        withUnsafeMutableBytes(of: &folded) { f in
            pb_reflected_crc_fold(register, base.assumingMemoryBound(to: UInt8.self), bytes.count,
                                  k.baseAddress, f.baseAddress?.assumingMemoryBound(to: UInt8.self))
        }
    }
}

/// The 16-bit FCS (CRC-16/X.25 as RFC 1662 §C.2 defines it).
public enum FCS16 {
    public static let initial: UInt16 = 0xFFFF
    /// The register after running over a frame including its correct FCS (RFC 1662 §C.2).
    public static let goodResidue: UInt16 = 0xF0B8

    @usableFromInline static let tables = SlicingTables<UInt16>(reflectedPolynomial: 0x8408)

    /// Continues the register over `bytes`.
    @inlinable
    public static func update(_ fcs: UInt16, _ bytes: UnsafeRawBufferPointer) -> UInt16 {
        tables.update(fcs, bytes)
    }

    @inlinable
    public static func update<C: Collection>(_ fcs: UInt16, _ bytes: C) -> UInt16 where C.Element == UInt8 {
        if let r = bytes.withContiguousStorageIfAvailable({ update(fcs, UnsafeRawBufferPointer($0)) }) { return r }
        return Array(bytes).withUnsafeBytes { update(fcs, $0) }
    }

    /// The FCS to transmit for `bytes` (complemented register), in host order.
    /// It goes on the wire least significant byte first.
    public static func checksum<C: Collection>(_ bytes: C) -> UInt16 where C.Element == UInt8 {
        ~update(initial, bytes)
    }
}

/// The 32-bit FCS (CRC-32 as RFC 1662 §C.3 defines it).
public enum FCS32 {
    public static let initial: UInt32 = 0xFFFF_FFFF
    /// The register after running over a frame including its correct FCS (RFC 1662 §C.3).
    public static let goodResidue: UInt32 = 0xDEBB_20E3

    @usableFromInline static let tables = SlicingTables<UInt32>(reflectedPolynomial: 0xEDB8_8320)

    @inlinable
    public static func update(_ fcs: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        tables.update(fcs, bytes)
    }

    @inlinable
    public static func update<C: Collection>(_ fcs: UInt32, _ bytes: C) -> UInt32 where C.Element == UInt8 {
        if let r = bytes.withContiguousStorageIfAvailable({ update(fcs, UnsafeRawBufferPointer($0)) }) { return r }
        return Array(bytes).withUnsafeBytes { update(fcs, $0) }
    }

    /// The FCS to transmit for `bytes` (complemented register), least significant byte first on the wire.
    public static func checksum<C: Collection>(_ bytes: C) -> UInt32 where C.Element == UInt8 {
        ~update(initial, bytes)
    }
}

extension FCSKind {
    /// True when `frame` (its bytes between flags, de-escaped, FCS included) checks.
    public func verifies(_ frame: UnsafeRawBufferPointer) -> Bool {
        switch self {
        case .none: return true
        case .fcs16: return FCS16.update(FCS16.initial, frame) == FCS16.goodResidue
        case .fcs32: return FCS32.update(FCS32.initial, frame) == FCS32.goodResidue
        }
    }

    /// The FCS bytes for `frame`, in wire order.
    public func trailer(for frame: UnsafeRawBufferPointer) -> (count: Int, bytes: UInt32) {
        switch self {
        case .none: return (0, 0)
        case .fcs16: return (2, UInt32(~FCS16.update(FCS16.initial, frame)))
        case .fcs32: return (4, ~FCS32.update(FCS32.initial, frame))
        }
    }
}
