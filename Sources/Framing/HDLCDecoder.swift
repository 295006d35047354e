/// What the decoder dropped or noticed, by cause. Malformed input is counted, never thrown.
public struct DecoderCounters: Sendable, Equatable {
    /// Frames delivered.
    public var frames = 0
    /// Frames whose FCS did not check (RFC 1662 §4.3).
    public var badFCS = 0
    /// Frames too short to hold a protocol and an FCS.
    public var runts = 0
    /// Frames longer than the MRU allows; their bytes were not kept.
    public var tooLong = 0
    /// Frames ended by the abort sequence 0x7D 0x7E (RFC 1662 §4.4.2).
    public var aborted = 0
    /// Frames whose address, control or protocol field is not one a PPP sender produces.
    public var badHeader = 0
    /// Flags with nothing between them (`7E 7E`, or only ignored bytes). Normal on a line; not an error.
    public var emptyFrames = 0
    /// Control characters received unescaped that the receive ACCM says to ignore (RFC 1662 §7.1).
    public var ignoredControlBytes = 0
    /// Bytes before the first flag, or after an error until the next flag.
    public var discardedBytes = 0

    public init() {}

    /// Frames dropped for any reason.
    public var droppedFrames: Int { badFCS + runts + tooLong + aborted + badHeader }
}

/// A frame handed out by `HDLCDecoder.decode`. Its buffers are borrowed from the decoder and
/// valid only inside the callback; copy what must outlive it (`PPPFrame(packet:)` does).
public struct DecodedFrame {
    public let header: PPPHeader
    /// The packet: header and information, FCS removed.
    public let packet: UnsafeRawBufferPointer
    /// The decoder's count of dropped frames when this one was delivered: a caller can tell
    /// a damaged frame came before it in the same call (RFC 1144 §3.3.4's VJ toss) before it
    /// acts on this one.
    public let droppedBefore: Int

    public var `protocol`: ProtocolNumber { header.protocol }
    public var information: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: packet[header.length...]) }
    public var frame: PPPFrame { PPPFrame(packet: packet)! }
}

/// A stream decoder for RFC 1662 async HDLC-like framing. Feed it chunks as they arrive:
/// a frame may be split at any byte and one chunk may carry many frames. It never buffers
/// more than one maximum-size frame; after garbage it resynchronises on the next flag.
public struct HDLCDecoder: Sendable {
    public var fcs: FCSKind
    /// Largest information field accepted (the MRU we announced, RFC 1661 §6.1).
    public private(set) var mru: Int
    /// Control characters the peer may insert and we must drop (our receive ACCM).
    public var receiveACCM: UInt32 {
        didSet { rebuildTable() }
    }
    public private(set) var counters = DecoderCounters()

    /// Byte classes: 0 data, 1 flag, 2 escape, 3 ignored control character.
    private var classes: ByteClassTable
    private var scanMode: ScanMode
    private var buffer: [UInt8]
    private var length = 0
    private var escaped = false
    private var overflowed = false
    private var hunting = true

    /// - Parameter receiveACCM: control characters to drop. 0 keeps every byte, which is what
    ///   a trace reader wants; a live link uses what LCP negotiated (RFC 1662 §7.1).
    public init(fcs: FCSKind = .fcs16, mru: Int = 1500, receiveACCM: UInt32 = 0) {
        self.fcs = fcs
        self.mru = mru
        self.receiveACCM = receiveACCM
        self.classes = HDLCDecoder.makeClasses(receiveACCM)
        self.scanMode = ScanMode(accm: receiveACCM, accmOnly: true)
        self.buffer = [UInt8](repeating: 0, count: HDLCDecoder.capacity(mru: mru) + HDLCDecoder.blockSlack)
    }

    /// Header (FF 03 and two protocol bytes), information and the longest FCS.
    private static func capacity(mru: Int) -> Int { 4 + mru + 4 }

    /// Room after the frame's own, where the fast path stores a whole 16-byte block of which
    /// only the plain bytes are counted.
    private static let blockSlack = 16

    /// Changes the MRU (after LCP negotiates it). A frame in progress is kept when it fits.
    public mutating func setMRU(_ newValue: Int) {
        mru = newValue
        var resized = [UInt8](repeating: 0, count: HDLCDecoder.capacity(mru: newValue) + HDLCDecoder.blockSlack)
        if length <= HDLCDecoder.capacity(mru: newValue) {
            resized.replaceSubrange(0..<length, with: buffer[0..<length])
        } else {
            overflowed = true
            length = 0
        }
        buffer = resized
    }

    public mutating func resetCounters() { counters = DecoderCounters() }

    /// Whether bytes have come since the last flag that no flag has ended yet (a frame cut
    /// off, or one that never ends): a file's reader says so at its end.
    public var isInsideFrame: Bool { !hunting && (length > 0 || overflowed || escaped) }

    private static func makeClasses(_ accm: UInt32) -> ByteClassTable {
        ByteClassTable { b in
            if b == HDLC.flag { return 1 }
            if b == HDLC.escape { return 2 }
            if b < 0x20 && (accm >> UInt32(b)) & 1 == 1 { return 3 }
            return 0
        }
    }

    private mutating func rebuildTable() {
        classes = HDLCDecoder.makeClasses(receiveACCM)
        scanMode = ScanMode(accm: receiveACCM, accmOnly: true)
    }

    /// Decodes `chunk`, calling `deliver` for each complete, checked frame in order, and
    /// returns the bytes consumed: all of them, unless `stopAfterFrame` asks to return right
    /// after the first frame delivered, so the caller can change settings (the receive ACCM
    /// once LCP opens) before the next frame is read.
    @discardableResult
    public mutating func decode(_ chunk: UnsafeRawBufferPointer, stopAfterFrame: Bool = false,
                                _ deliver: (DecodedFrame) -> Void) -> Int {
        guard let p = chunk.baseAddress, !chunk.isEmpty else { return 0 }
        let n = chunk.count
        var storage: [UInt8] = []
        swap(&storage, &buffer)
        defer { swap(&storage, &buffer) }
        let cls = classes.pointer
        let mode = scanMode
        return storage.withUnsafeMutableBufferPointer { bufferPointer -> Int in
            let buf = bufferPointer.baseAddress!
            let capacity = bufferPointer.count - HDLCDecoder.blockSlack
            var i = 0
            while i < n {
                // Fast path, inside a frame. Escape pairs are taken one after another as they
                // come (a peer may escape every byte); a run of plain bytes is scanned 32 bytes
                // at a time up to its first special byte (`plainRunEnd`; 16 near the chunk's
                // end, the last bytes one by one), then copied: a run of at most sixteen as
                // its one block, stored whole (into the buffer's slack) and counted up to the
                // run. Whatever else needs the state machine (a flag, an ignored byte, an escape
                // split across chunks or followed by a special byte) leaves it. `length <=
                // capacity` holds throughout, so a block always fits.
                fast: while !hunting && !escaped && !overflowed && i < n {
                    while i + 1 < n && p.load(fromByteOffset: i, as: UInt8.self) == HDLC.escape {
                        let value = p.load(fromByteOffset: i + 1, as: UInt8.self)
                        guard cls[Int(value)] == 0 else { break fast }
                        guard length < capacity else {
                            overflowed = true
                            length = 0
                            break fast
                        }
                        buf[length] = value ^ HDLC.escapeXOR
                        length += 1
                        i += 2
                    }
                    if case .table = mode {} else {
                        let j = switch mode {
                        case .controlsFlagAndEscape: Self.plainRunEnd(p, from: i, count: n, scanning: .controlsFlagAndEscape)
                        default: Self.plainRunEnd(p, from: i, count: n, scanning: .flagAndEscape)
                        }
                        let run = j - i
                        if run > 0 {
                            guard length + run <= capacity else {
                                overflowed = true
                                length = 0
                                break fast
                            }
                            if run <= 16 {
                                // Short: its whole block, into the slack; counted up to the run.
                                let block = p.loadUnaligned(fromByteOffset: i, as: SIMD16<UInt8>.self)
                                UnsafeMutableRawPointer(buf + length).storeBytes(of: block, as: SIMD16<UInt8>.self)
                            } else {
                                (buf + length).update(from: (p + i).assumingMemoryBound(to: UInt8.self), count: run)
                            }
                            length += run
                            i = j
                        }
                    }
                    while i < n && cls[Int(p.load(fromByteOffset: i, as: UInt8.self))] == 0 {
                        guard length < capacity else {
                            overflowed = true
                            length = 0
                            break fast
                        }
                        buf[length] = p.load(fromByteOffset: i, as: UInt8.self)
                        length += 1
                        i += 1
                    }
                    guard i + 1 < n, p.load(fromByteOffset: i, as: UInt8.self) == HDLC.escape else { break fast }
                }
                if i >= n { break }
                let b = p.load(fromByteOffset: i, as: UInt8.self)
                i += 1
                switch cls[Int(b)] {
                case 1:
                    if hunting {
                        hunting = false
                    } else if endFrame(buf, deliver) && stopAfterFrame {
                        return i
                    }
                case 3:
                    // Dropped wherever it appears, even after an escape (as Linux ppp_async does).
                    counters.ignoredControlBytes += 1
                case 2:
                    if hunting { counters.discardedBytes += 1 } else { escaped = true }
                default:
                    if hunting || overflowed {
                        counters.discardedBytes += hunting ? 1 : 0
                        escaped = false
                        continue
                    }
                    let value = escaped ? b ^ HDLC.escapeXOR : b
                    escaped = false
                    if length < capacity {
                        buf[length] = value
                        length += 1
                    } else {
                        overflowed = true
                        length = 0
                    }
                }
            }
            return n
        }
    }

    /// Where the run of plain bytes from `i` ends: at the first special byte, or within the
    /// last 16 bytes of `count` (which the byte loop takes). Inlined with `mode` a constant, so
    /// the scan's tests are decided once, not once per block.
    @inline(__always)
    private static func plainRunEnd(_ p: UnsafeRawPointer, from i: Int, count n: Int, scanning mode: ScanMode) -> Int {
        var j = i
        while j &+ 32 <= n {
            let plain = mode.plainPrefix32(p + j)
            j &+= plain
            if plain < 32 { return j }
        }
        if j &+ 16 <= n { j &+= mode.plainPrefix16(p + j) }
        return j
    }

    /// Decodes `bytes` and returns the frames, copied out.
    public mutating func decode(_ bytes: [UInt8]) -> [PPPFrame] {
        var frames: [PPPFrame] = []
        _ = bytes.withUnsafeBytes { raw in decode(raw) { frames.append($0.frame) } }
        return frames
    }

    /// Ends the frame in progress; true when it was delivered.
    private mutating func endFrame(_ buf: UnsafeMutablePointer<UInt8>, _ deliver: (DecodedFrame) -> Void) -> Bool {
        defer {
            length = 0
            escaped = false
            overflowed = false
        }
        if escaped {
            counters.aborted += 1
            return false
        }
        if overflowed {
            counters.tooLong += 1
            return false
        }
        if length == 0 {
            counters.emptyFrames += 1
            return false
        }
        let fcsLength = fcs.byteCount
        if length < fcsLength + 2 {
            counters.runts += 1
            return false
        }
        let whole = UnsafeRawBufferPointer(start: buf, count: length)
        guard fcs.verifies(whole) else {
            counters.badFCS += 1
            return false
        }
        let packet = UnsafeRawBufferPointer(start: buf, count: length - fcsLength)
        guard let header = PPPHeader.parse(packet) else {
            counters.badHeader += 1
            return false
        }
        if packet.count - header.length > mru {
            counters.tooLong += 1
            return false
        }
        counters.frames += 1
        deliver(DecodedFrame(header: header, packet: packet, droppedBefore: counters.droppedFrames))
        return true
    }
}
