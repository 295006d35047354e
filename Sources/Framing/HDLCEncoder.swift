/// Frames PPP packets for an asynchronous line (RFC 1662 §4): flag, escaped content, FCS, flag.
///
/// Settings are plain values: LCP negotiates them and the link applies them at the moment
/// RFC 1661 says (ACCM and compression take effect once LCP is Opened).
public struct HDLCEncoder: Sendable {
    public var fcs: FCSKind
    /// Address and control field compression (RFC 1661 §6.6), when the peer accepted it.
    public var compressAddressControl: Bool
    /// Protocol field compression (RFC 1661 §6.5), when the peer accepted it.
    public var compressProtocol: Bool

    /// The set of values sent escaped: the peer's ACCM plus 0x7D, 0x7E and any extra values.
    public var escapes: EscapeSet {
        didSet { rebuildTables() }
    }

    private var escapeTable: EscapeTable
    private var scanMode: ScanMode
    /// For LCP codes 1–7: every control character escaped, plus the extra values.
    private var lcpTable: EscapeTable
    private var lcpScanMode: ScanMode

    public init(fcs: FCSKind = .fcs16, escapes: EscapeSet = .allControlCharacters,
                compressAddressControl: Bool = false, compressProtocol: Bool = false) {
        self.fcs = fcs
        self.escapes = escapes
        self.compressAddressControl = compressAddressControl
        self.compressProtocol = compressProtocol
        self.escapeTable = EscapeTable(escapes)
        self.scanMode = ScanMode(accm: escapes.accm, accmOnly: escapes.isACCMOnly)
        let lcp = escapes.withAllControlCharacters
        self.lcpTable = EscapeTable(lcp)
        self.lcpScanMode = ScanMode(accm: lcp.accm, accmOnly: lcp.isACCMOnly)
    }

    private mutating func rebuildTables() {
        escapeTable = EscapeTable(escapes)
        scanMode = ScanMode(accm: escapes.accm, accmOnly: escapes.isACCMOnly)
        let lcp = escapes.withAllControlCharacters
        lcpTable = EscapeTable(lcp)
        lcpScanMode = ScanMode(accm: lcp.accm, accmOnly: lcp.isACCMOnly)
    }

    /// Frames are escaped into this many bytes on the stack (the most a temporary allocation
    /// is always given there): a frame whose worst case fits in one go, a larger one in pieces.
    private static let scratchLimit = 1024

    /// The most bytes `encode` appends for an information field of `count` bytes.
    public static func maximumEncodedLength(informationCount count: Int, fcs: FCSKind) -> Int {
        // Opening and closing flag, then header, information and FCS, each possibly escaped.
        2 + 2 * (4 + count + fcs.byteCount)
    }

    /// Appends the framed packet to `out`. The opening flag is left out when `out` already
    /// ends in a flag, so back-to-back frames share one (RFC 1662 §4.1).
    public func encode(protocol: ProtocolNumber, information: UnsafeRawBufferPointer, into out: inout [UInt8]) {
        // RFC 1661 §6.5/§6.6 and RFC 1662 §7.1: LCP is never header-compressed, and its
        // negotiation and termination packets (codes 1–7) escape every control character.
        let proto = `protocol`.rawValue
        let isLCP = `protocol` == .lcp
        let lcpNegotiation = isLCP && information.count > 0 && (1...7).contains(information[0])
        var header: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        var headerCount = 0
        withUnsafeMutableBytes(of: &header) { h in
            if !compressAddressControl || isLCP {
                h[0] = HDLC.allStationsAddress
                h[1] = HDLC.unnumberedInformation
                headerCount = 2
            }
            if compressProtocol && proto < 0x100 && !isLCP {
                h[headerCount] = UInt8(proto)
                headerCount += 1
            } else {
                h[headerCount] = UInt8(proto >> 8)
                h[headerCount + 1] = UInt8(proto & 0xFF)
                headerCount += 2
            }
        }
        // Constants from here on: the nested functions below then read them without the
        // run-time exclusivity check a captured variable costs.
        let headerBytes = header
        let headerLength = headerCount
        let table = lcpNegotiation ? lcpTable : escapeTable
        let mode = lcpNegotiation ? lcpScanMode : scanMode
        let needsOpeningFlag = out.last != HDLC.flag
        let worst = HDLCEncoder.maximumEncodedLength(informationCount: information.count, fcs: fcs) + 8
        var fcsTrailer: (UInt32, Int) = (0, 0)
        withUnsafeBytes(of: headerBytes) { h in
            let headerView = UnsafeRawBufferPointer(rebasing: h[0..<headerLength])
            switch fcs {
            case .none: break
            case .fcs16: fcsTrailer = (UInt32(~FCS16.update(FCS16.update(FCS16.initial, headerView), information)), 2)
            case .fcs32: fcsTrailer = (~FCS32.update(FCS32.update(FCS32.initial, headerView), information), 4)
            }
        }
        let trailer = fcsTrailer
        let entries = table.entries
        /// Writes the opening flag (when due) and the header at `dst`; returns the bytes written
        /// (at most 9).
        func head(_ dst: UnsafeMutablePointer<UInt8>) -> Int {
            var n = 0
            if needsOpeningFlag { dst[0] = HDLC.flag; n = 1 }
            withUnsafeBytes(of: headerBytes) { h in
                n += Self.escapeShort(UnsafeRawBufferPointer(rebasing: h[0..<headerLength]), table: entries, to: dst + n)
            }
            return n
        }
        /// Writes the FCS and the closing flag at `dst`; returns the bytes written (at most 9).
        func tail(_ dst: UnsafeMutablePointer<UInt8>) -> Int {
            var n = 0
            withUnsafeBytes(of: trailer.0.littleEndian) { t in
                n = Self.escapeShort(UnsafeRawBufferPointer(rebasing: t[0..<trailer.1]), table: entries, to: dst)
            }
            dst[n] = HDLC.flag
            return n + 1
        }
        let limit = HDLCEncoder.scratchLimit
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: limit) { scratch in
            let dst = scratch.baseAddress!
            var n = head(dst)
            if worst <= limit {
                // A small frame is escaped on the stack and appended in one copy of what it
                // came to.
                n += Self.escape(information, table: entries, mode: mode, to: dst + n)
            } else {
                // A larger one in pieces whose worst case fits what is left of the scratch,
                // appended each time it is half full: no room for the worst case is zeroed
                // in `out` and cut back. At the top of the loop `n < limit / 2`, so a piece is
                // at least 248 bytes, and `n + 2 * piece + 16 <= limit`.
                var offset = 0
                while offset < information.count {
                    let piece = min(information.count - offset, (limit - n - 16) / 2)
                    n += Self.escape(UnsafeRawBufferPointer(rebasing: information[offset..<(offset + piece)]), table: entries, mode: mode, to: dst + n)
                    offset += piece
                    if n >= limit / 2 {
                        out.append(contentsOf: UnsafeBufferPointer(rebasing: scratch[0..<n]))
                        n = 0
                    }
                }
            }
            n += tail(dst + n)
            out.append(contentsOf: UnsafeBufferPointer(rebasing: scratch[0..<n]))
        }
    }

    public func encode(protocol: ProtocolNumber, information: [UInt8], into out: inout [UInt8]) {
        information.withUnsafeBytes { encode(protocol: `protocol`, information: $0, into: &out) }
    }

    /// One framed packet, opening and closing flags included.
    public func encode(protocol: ProtocolNumber, information: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        encode(protocol: `protocol`, information: information, into: &out)
        return out
    }

    /// Escapes `src` into `dst` (which has room for twice its length plus 8) and returns the
    /// bytes written. A run that needs no escape is found 32 bytes at a time and copied as
    /// blocks; a special byte right at the scan sends the next eight through the table. Each
    /// byte through the table costs one load: the entry holds the one or two output bytes and
    /// their count, and the loop always stores two bytes and advances by the count, without
    /// branching.
    static func escape(_ src: UnsafeRawBufferPointer, table: UnsafePointer<UInt32>, mode: ScanMode,
                       to dst: UnsafeMutablePointer<UInt8>) -> Int {
        // One loop per mode, each with its mode a constant: the tests the scan makes are then
        // decided once here, not once per block.
        switch mode {
        case .flagAndEscape: return escape(src, table: table, scanning: .flagAndEscape, to: dst)
        case .controlsFlagAndEscape: return escape(src, table: table, scanning: .controlsFlagAndEscape, to: dst)
        case .table: return escape(src, table: table, scanning: .table, to: dst)
        }
    }

    /// Escapes a header or an FCS (at most four bytes) through the table alone.
    @inline(__always)
    static func escapeShort(_ src: UnsafeRawBufferPointer, table: UnsafePointer<UInt32>, to dst: UnsafeMutablePointer<UInt8>) -> Int {
        let raw = UnsafeMutableRawPointer(dst)
        var j = 0
        for b in src {
            let entry = table[Int(b)]
            raw.storeBytes(of: UInt16(truncatingIfNeeded: entry), toByteOffset: j, as: UInt16.self)
            j &+= Int(entry >> 16)
        }
        return j
    }

    @inline(__always)
    private static func escape(_ src: UnsafeRawBufferPointer, table: UnsafePointer<UInt32>, scanning mode: ScanMode,
                               to dst: UnsafeMutablePointer<UInt8>) -> Int {
        guard let s = src.baseAddress else { return 0 }
        let count = src.count
        let raw = UnsafeMutableRawPointer(dst)
        var i = 0
        var j = 0
        @inline(__always) func put(_ b: UInt8) {
            let entry = table[Int(b)]
            raw.storeBytes(of: UInt16(truncatingIfNeeded: entry), toByteOffset: j, as: UInt16.self)
            j &+= Int(entry >> 16)
        }
        if case .table = mode {} else {
            while i &+ 16 <= count {
                // A plain run, scanned and copied 32 bytes a turn while it lasts (16 near the
                // end). Each block is copied whole and counted up to the run; the bytes after
                // it are written over. In bounds: `j <= 2 * i` and a block ends at most at
                // `count`, so a store ends before `2 * count`.
                var plain: Int
                var width: Int
                repeat {
                    if i &+ 32 <= count {
                        width = 32
                        plain = mode.plainPrefix32(s + i)
                        raw.storeBytes(of: s.loadUnaligned(fromByteOffset: i, as: SIMD16<UInt8>.self), toByteOffset: j, as: SIMD16<UInt8>.self)
                        raw.storeBytes(of: s.loadUnaligned(fromByteOffset: i &+ 16, as: SIMD16<UInt8>.self), toByteOffset: j &+ 16, as: SIMD16<UInt8>.self)
                    } else {
                        width = 16
                        plain = mode.plainPrefix16(s + i)
                        raw.storeBytes(of: s.loadUnaligned(fromByteOffset: i, as: SIMD16<UInt8>.self), toByteOffset: j, as: SIMD16<UInt8>.self)
                    }
                    i &+= plain
                    j &+= plain
                } while plain == width && i &+ 16 <= count
                // The run reached the last bytes, which the loops below take.
                guard plain < width else { break }
                if plain == 0 {
                    // A special byte at once, as in a run a peer made all escapes: eight bytes
                    // through the table, with no scan between them.
                    var w = UInt64(littleEndian: s.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                    for _ in 0..<8 {
                        put(UInt8(truncatingIfNeeded: w))
                        w >>= 8
                    }
                    i &+= 8
                } else {
                    // The special byte that ended the run.
                    put(s.load(fromByteOffset: i, as: UInt8.self))
                    i &+= 1
                }
            }
            while i + 8 <= count {
                let word = s.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                if mode.mayContainSpecial(word) {
                    var w = UInt64(littleEndian: word)
                    for _ in 0..<8 {
                        put(UInt8(truncatingIfNeeded: w))
                        w >>= 8
                    }
                } else {
                    raw.storeBytes(of: word, toByteOffset: j, as: UInt64.self)
                    j += 8
                }
                i += 8
            }
        }
        while i < count {
            put(s.load(fromByteOffset: i, as: UInt8.self))
            i += 1
        }
        return j
    }
}
