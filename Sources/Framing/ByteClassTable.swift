import CVectorScan

/// A 256-entry byte table with a stable address, for the framing loops.
/// Immutable after initialisation, so it can be shared between encoders and decoders.
final class ByteClassTable: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<UInt8>

    init(_ classOf: (UInt8) -> UInt8) {
        pointer = .allocate(capacity: 256)
        for i in 0..<256 { pointer[i] = classOf(UInt8(i)) }
    }

    deinit { pointer.deallocate() }
}

/// For each byte value, what the encoder writes: the low 16 bits hold the output bytes
/// (the value itself, or 0x7D then the value XOR 0x20) and the high 16 bits their count.
final class EscapeTable: @unchecked Sendable {
    let entries: UnsafeMutablePointer<UInt32>

    init(_ set: EscapeSet) {
        entries = .allocate(capacity: 256)
        for i in 0..<256 {
            let b = UInt8(i)
            if set.contains(b) {
                entries[i] = 2 << 16 | UInt32(b ^ HDLC.escapeXOR) << 8 | UInt32(HDLC.escape)
            } else {
                entries[i] = 1 << 16 | UInt32(b)
            }
        }
    }

    deinit { entries.deallocate() }
}

/// Eight-bytes-at-a-time tests ("SWAR") for the byte sets framing cares about.
enum WordScan {
    static let ones: UInt64 = 0x0101_0101_0101_0101
    static let highs: UInt64 = 0x8080_8080_8080_8080

    /// Non-zero when some byte of `x` is zero (exact as a zero/non-zero test).
    @inline(__always) static func hasZeroByte(_ x: UInt64) -> UInt64 {
        (x &- ones) & ~x & highs
    }

    /// Non-zero when some byte of `x` is 0x7D or 0x7E.
    @inline(__always) static func hasFlagOrEscape(_ x: UInt64) -> UInt64 {
        hasZeroByte(x ^ (ones &* 0x7E)) | hasZeroByte(x ^ (ones &* 0x7D))
    }

    /// Non-zero when some byte of `x` is below 0x20, or 0x7D or 0x7E.
    @inline(__always) static func hasControlFlagOrEscape(_ x: UInt64) -> UInt64 {
        ((x &- ones &* 0x20) & ~x & highs) | hasFlagOrEscape(x)
    }
}

/// How the loops look for special bytes: eight at a time when the set is one of the two
/// sets every real link uses (ACCM 0, or ACCM 0xFFFFFFFF), else through the table.
enum ScanMode: Sendable {
    case flagAndEscape
    case controlsFlagAndEscape
    case table

    init(accm: UInt32, accmOnly: Bool) {
        if !accmOnly { self = .table } else if accm == 0 { self = .flagAndEscape } else if accm == 0xFFFF_FFFF {
            self = .controlsFlagAndEscape
        } else { self = .table }
    }

    /// The vector compare of `block` against the set, as two words whose bytes are 0xFF where
    /// a byte is in the set; nil for `.table`. Sixteen at a time with vector compares (SSE2 on
    /// x86-64, NEON on ARM), written vector against vector and reduced through the lanes' bits:
    /// the forms taking a scalar, and `any`, are not always made vector code.
    @inline(__always) private func specialLanes(_ block: SIMD16<UInt8>) -> SIMD2<UInt64>? {
        let flag = SIMD16<UInt8>(repeating: HDLC.flag), escape = SIMD16<UInt8>(repeating: HDLC.escape)
        let special: SIMDMask<SIMD16<Int8>>
        switch self {
        case .flagAndEscape:
            special = (block .== flag) .| (block .== escape)
        case .controlsFlagAndEscape:
            // Below 0x20: the top three bits clear.
            special = ((block & SIMD16<UInt8>(repeating: 0xE0)) .== SIMD16<UInt8>()) .| (block .== flag) .| (block .== escape)
        case .table:
            return nil
        }
        return unsafeBitCast(special, to: SIMD2<UInt64>.self)
    }

    /// How many of the sixteen bytes of `block` come before the first one in the set (16 when
    /// none is): exact, from the lanes of the compare. 0 for `.table`.
    @inline(__always) func plainPrefix(_ block: SIMD16<UInt8>) -> Int {
        guard let lanes = specialLanes(block) else { return 0 }
        if lanes[0] != 0 { return lanes[0].trailingZeroBitCount >> 3 }
        return 8 + (lanes[1].trailingZeroBitCount >> 3)
    }

    /// How many of the sixteen bytes at `p` come before the first one in the set: 16 when none
    /// is, 0 for `.table`. On x86-64 one SSE2 compare per value and a move of the lanes' mask
    /// (`CVectorScan`); elsewhere the portable vector form above.
    @inline(__always) func plainPrefix16(_ p: UnsafeRawPointer) -> Int {
        #if arch(x86_64)
        switch self {
        case .flagAndEscape: return Int(pb_plain_prefix16(p, 0))
        case .controlsFlagAndEscape: return Int(pb_plain_prefix16(p, 1))
        case .table: return 0
        }
        #else
        return plainPrefix(p.loadUnaligned(as: SIMD16<UInt8>.self))
        #endif
    }

    /// The same over thirty-two bytes at `p`: 32 when none is in the set, 0 for `.table`.
    @inline(__always) func plainPrefix32(_ p: UnsafeRawPointer) -> Int {
        #if arch(x86_64)
        switch self {
        case .flagAndEscape: return Int(pb_plain_prefix32(p, 0))
        case .controlsFlagAndEscape: return Int(pb_plain_prefix32(p, 1))
        case .table: return 0
        }
        #else
        let first = plainPrefix16(p)
        return first < 16 ? first : 16 + plainPrefix16(p + 16)
        #endif
    }

    @inline(__always) func mayContainSpecial(_ x: UInt64) -> Bool {
        switch self {
        case .flagAndEscape: return WordScan.hasFlagOrEscape(x) != 0
        case .controlsFlagAndEscape: return WordScan.hasControlFlagOrEscape(x) != 0
        case .table: return true
        }
    }
}
