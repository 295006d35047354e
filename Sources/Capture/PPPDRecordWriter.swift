import Framing

/// Writes pppd's `record` format (see `PPPDRecord`): the raw line bytes both ways with time
/// steps, so `pppdump`, tshark and `pppbridge decode` can read a live session back.
///
/// The file is a `CaptureFile` (no links followed, mode 0600; a write error or the size limit
/// stops the recording, says so once and stops nothing else). With `masking`, each direction's
/// bytes are held back from a flag to the next (at most `HeldFrame.limit` of them), so that a
/// frame carrying a password can be written with the password masked and its FCS made right
/// again; everything else is written byte for byte as it crossed the line.
public final class PPPDRecordWriter {
    private let file: CaptureFile
    private var tenthsWritten: Int64 = 0
    private var closed = false
    private var masker: SecretMasker?
    private var sentFrame = HeldFrame()
    private var receivedFrame = HeldFrame()

    /// - Parameters:
    ///   - startTime: Unix seconds of the start of the recording.
    ///   - masking: what hides the passwords in the frames written; nil records them as they were.
    ///   - onStop: told once if writing stops early (an error, or `limit` bytes reached).
    public init(path: String, startTime: Int64, masking: SecretMasker? = SecretMasker(),
                limit: Int = CaptureFile.defaultLimit, onStop: ((String) -> Void)? = nil) throws(CaptureError) {
        file = try CaptureFile(path: path, limit: limit, replaces: .pppdRecord)
        file.onStop = onStop
        masker = masking
        let t = UInt32(truncatingIfNeeded: startTime)
        file.write([0x07, UInt8(t >> 24), UInt8((t >> 16) & 0xFF), UInt8((t >> 8) & 0xFF), UInt8(t & 0xFF)])
    }

    /// Why writing stopped, if it did.
    public var stopReason: String? { file.stopReason }

    /// Records `bytes` that went `direction`, `elapsedTenths` tenths of a second after the start.
    public func record(_ direction: Direction, _ bytes: [UInt8], elapsedTenths: Int64) {
        guard !closed, !bytes.isEmpty, file.isWriting else { return }
        var out = bytes
        if masker != nil {
            if direction == .sent {
                out = sentFrame.pass(bytes, direction: direction, masker: &masker!)
            } else {
                out = receivedFrame.pass(bytes, direction: direction, masker: &masker!)
            }
        }
        write(direction, out, elapsedTenths: elapsedTenths)
    }

    /// Ends both directions (entries 3 and 4) and closes the file. Idempotent.
    public func close() {
        guard !closed else { return }
        if masker != nil {
            write(.sent, sentFrame.finish(direction: .sent, masker: &masker!), elapsedTenths: tenthsWritten)
            write(.received, receivedFrame.finish(direction: .received, masker: &masker!), elapsedTenths: tenthsWritten)
        }
        file.write([0x03, 0x04])
        closed = true
        file.close()
    }

    private func write(_ direction: Direction, _ bytes: [UInt8], elapsedTenths: Int64) {
        guard !bytes.isEmpty else { return }
        let step = elapsedTenths - tenthsWritten
        if step > 0 {
            if step < 256 {
                file.write([0x06, UInt8(step)])
            } else {
                let s = UInt32(truncatingIfNeeded: step)
                file.write([0x05, UInt8(s >> 24), UInt8((s >> 16) & 0xFF), UInt8((s >> 8) & 0xFF), UInt8(s & 0xFF)])
            }
            tenthsWritten = elapsedTenths
        }
        var offset = 0
        while offset < bytes.count {
            let n = min(0xFFFF, bytes.count - offset)
            guard file.write([direction == .sent ? 0x01 : 0x02, UInt8(n >> 8), UInt8(n & 0xFF)] + bytes[offset..<(offset + n)]) else { return }
            offset += n
        }
    }

    deinit { close() }
}

/// The bytes of one direction since its last flag (RFC 1662 §4), held until the frame ends so
/// its secrets can be masked. A frame longer than `limit` cannot be one that carries a password
/// (PAP's is at most 520 bytes, a SOCKS5 authentication segment at most 573 plus headers): its
/// bytes pass as they come until the next flag.
struct HeldFrame {
    /// Twice the largest MRU we negotiate (every byte escaped), with room for header and FCS.
    static let limit = 2 * 16384 + 16
    private var held: [UInt8] = []
    private var passing = false

    mutating func pass(_ chunk: [UInt8], direction: Direction, masker: inout SecretMasker) -> [UInt8] {
        var out: [UInt8] = []
        var rest = chunk[...]
        while let flag = rest.firstIndex(of: HDLC.flag) {
            take(rest[..<flag], into: &out)
            if passing {
                passing = false
            } else {
                out += HeldFrame.masked(held, direction: direction, masker: &masker)
            }
            held.removeAll(keepingCapacity: true)
            out.append(HDLC.flag)
            rest = rest[(flag + 1)...]
        }
        take(rest, into: &out)
        return out
    }

    /// What is still held, masked as far as it goes (a frame the line ended inside).
    mutating func finish(direction: Direction, masker: inout SecretMasker) -> [UInt8] {
        defer { held.removeAll() }
        return HeldFrame.masked(held, direction: direction, masker: &masker)
    }

    private mutating func take(_ bytes: ArraySlice<UInt8>, into out: inout [UInt8]) {
        if passing {
            out += bytes
            return
        }
        held += bytes
        if held.count > HeldFrame.limit {
            out += held
            held.removeAll(keepingCapacity: true)
            passing = true
        }
    }

    /// `raw` (the bytes between two flags, escaped) with its secrets masked. Unchanged bytes keep
    /// their escaping; a changed one is escaped when it was or when it must be (a flag, an
    /// escape or a control character: RFC 1662 §4.2 lets a sender escape any of them). The FCS
    /// is recomputed when it was right, and left as it was when it was not.
    static func masked(_ raw: [UInt8], direction: Direction, masker: inout SecretMasker) -> [UInt8] {
        var plain: [UInt8] = []
        var wasEscaped: [Bool] = []
        plain.reserveCapacity(raw.count)
        wasEscaped.reserveCapacity(raw.count)
        var i = 0
        while i < raw.count {
            if raw[i] == HDLC.escape && i + 1 < raw.count {
                plain.append(raw[i + 1] ^ HDLC.escapeXOR)
                wasEscaped.append(true)
                i += 2
            } else {
                plain.append(raw[i])
                wasEscaped.append(false)
                i += 1
            }
        }
        var fcsLength = 2
        var fcsValid = false
        if plain.count >= 4 && FCS16.update(FCS16.initial, plain) == FCS16.goodResidue {
            fcsValid = true
        } else if plain.count >= 6 && FCS32.update(FCS32.initial, plain) == FCS32.goodResidue {
            fcsLength = 4
            fcsValid = true
        }
        // A frame without a valid FCS (the line ended inside it, or it was damaged) is masked
        // whole: its last bytes may be password bytes, not an FCS.
        if !fcsValid { fcsLength = 0 }
        let body = Array(plain.dropLast(fcsLength))
        guard let header = body.withUnsafeBytes({ PPPHeader.parse($0) }),
              let info = masker.masked(protocol: header.protocol, information: Array(body[header.length...]), direction: direction)
        else { return raw }
        var changed = Array(body[..<header.length]) + info
        if fcsValid && fcsLength == 2 {
            let c = FCS16.checksum(changed)
            changed += [UInt8(c & 0xFF), UInt8(c >> 8)]
        } else if fcsValid {
            let c = FCS32.checksum(changed)
            changed += [UInt8(c & 0xFF), UInt8((c >> 8) & 0xFF), UInt8((c >> 16) & 0xFF), UInt8(c >> 24)]
        } else {
            changed += plain.suffix(fcsLength)
        }
        var out: [UInt8] = []
        out.reserveCapacity(raw.count + 8)
        for (index, b) in changed.enumerated() {
            let same = b == plain[index]
            if (same && wasEscaped[index]) || (!same && (wasEscaped[index] || b < 0x20 || b == HDLC.flag || b == HDLC.escape)) {
                out += [HDLC.escape, b ^ HDLC.escapeXOR]
            } else {
                out.append(b)
            }
        }
        return out
    }
}
