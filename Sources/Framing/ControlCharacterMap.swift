/// Which byte values are sent escaped, or dropped on receipt.
///
/// RFC 1662 §7.1: the Async-Control-Character-Map is a 32-bit map of the values 0x00–0x1F.
/// 0x7D and 0x7E are always escaped. pppd's `escape` option extends the set to any value,
/// so the full set is a 256-bit map.
public struct EscapeSet: Sendable, Equatable {
    /// Bit i of word i / 64 is set when value i is escaped.
    public private(set) var words: (UInt64, UInt64, UInt64, UInt64)

    /// The transmit set for an ACCM plus the always-escaped flag and escape values,
    /// plus any extra values (pppd's `escape`); values that cannot be escaped are left out.
    public init(accm: UInt32, extra: [UInt8] = []) {
        words = (UInt64(accm), 0, 0, 0)
        insert(HDLC.flag)
        insert(HDLC.escape)
        for b in extra { insert(b) }
    }

    /// The RFC 1662 default before LCP negotiates anything: every control character escaped.
    public static let allControlCharacters = EscapeSet(accm: 0xFFFF_FFFF)

    /// False for values whose escaped form would itself be special: 0x5D and 0x5E turn into
    /// 0x7D and 0x7E, and 0x20–0x3F into control characters a receiver's ACCM may drop
    /// (pppd's `escape` refuses the same values).
    public static func isEscapable(_ value: UInt8) -> Bool {
        !(0x20...0x3F).contains(value) && value != 0x5D && value != 0x5E
    }

    /// Adds `value` to the set; returns false (and adds nothing) when it cannot be escaped.
    @discardableResult
    public mutating func insert(_ value: UInt8) -> Bool {
        guard EscapeSet.isEscapable(value) else { return false }
        let bit = UInt64(1) << UInt64(value & 63)
        switch value >> 6 {
        case 0: words.0 |= bit
        case 1: words.1 |= bit
        case 2: words.2 |= bit
        default: words.3 |= bit
        }
        return true
    }

    public func contains(_ value: UInt8) -> Bool {
        let w: UInt64
        switch value >> 6 {
        case 0: w = words.0
        case 1: w = words.1
        case 2: w = words.2
        default: w = words.3
        }
        return (w >> UInt64(value & 63)) & 1 != 0
    }

    /// The same set with every control character in it (RFC 1662 §7.1: LCP negotiation
    /// packets ignore the ACCM, but not the extra values).
    public var withAllControlCharacters: EscapeSet {
        var s = self
        s.words.0 |= 0xFFFF_FFFF
        return s
    }

    /// The low 32 bits: the ACCM part.
    public var accm: UInt32 { UInt32(truncatingIfNeeded: words.0) }

    public static func == (a: EscapeSet, b: EscapeSet) -> Bool {
        a.words.0 == b.words.0 && a.words.1 == b.words.1 && a.words.2 == b.words.2 && a.words.3 == b.words.3
    }

    /// Escapes only 0x7D and 0x7E beside the control characters of the ACCM (no extended set).
    var isACCMOnly: Bool { words.1 == UInt64(1) << (0x7D - 64) | UInt64(1) << (0x7E - 64) && words.2 == 0 && words.3 == 0 }
}

/// Constants of RFC 1662 async HDLC-like framing.
public enum HDLC {
    public static let flag: UInt8 = 0x7E
    public static let escape: UInt8 = 0x7D
    /// Escaped bytes are sent as 0x7D, then the byte XOR 0x20 (RFC 1662 §4.2).
    public static let escapeXOR: UInt8 = 0x20
    public static let allStationsAddress: UInt8 = 0xFF
    public static let unnumberedInformation: UInt8 = 0x03
}
