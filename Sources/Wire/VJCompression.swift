/// What one direction of VJ compression uses (RFC 1332 §3.2: IP-Compression-Protocol 0x002D).
public struct VJParameters: Sendable, Equatable {
    /// Slots 0...maxSlotID hold connection state.
    public var maxSlotID: UInt8
    /// The slot id may be left out when it repeats.
    public var compressSlotID: Bool

    public init(maxSlotID: UInt8 = 15, compressSlotID: Bool = true) {
        self.maxSlotID = maxSlotID
        self.compressSlotID = compressSlotID
    }
}

/// The change mask of a compressed header (RFC 1144 §3.2.2).
private enum VJBits {
    static let urgent: UInt8 = 0x01
    static let window: UInt8 = 0x02
    static let ack: UInt8 = 0x04
    static let sequence: UInt8 = 0x08
    static let ipID: UInt8 = 0x20
    static let connection: UInt8 = 0x40
    static let push: UInt8 = 0x10
    static let specialsMask: UInt8 = 0x0F
    /// S, W, U together: echoed interactive traffic, sequence and ack advance by the last data length.
    static let specialI: UInt8 = 0x0B
    /// S, W, A, U together: unidirectional data, the sequence advances by the last data length.
    static let specialD: UInt8 = 0x0F
}

/// A TCP/IP header view shared by both directions: offsets into saved header bytes.
private struct HeaderLayout {
    var ipLength: Int
    var tcpLength: Int
    var total: Int { ipLength + tcpLength }

    /// Nil unless `p` is a whole IPv4/TCP packet whose headers fit.
    init?(_ p: [UInt8]) {
        guard p.count >= 40, p[0] >> 4 == 4 else { return nil }
        ipLength = Int(p[0] & 0x0F) * 4
        guard ipLength >= 20, p.count >= ipLength + 20 else { return nil }
        tcpLength = Int(p[ipLength + 12] >> 4) * 4
        guard tcpLength >= 20, p.count >= ipLength + tcpLength else { return nil }
    }
}

/// A compressed header being built (RFC 1144 §3.2.2): at most 19 bytes (the change mask,
/// the slot, the checksum and five deltas of up to three bytes), kept in fixed storage.
private struct CompressedHeader {
    private var bytes: (UInt64, UInt64, UInt64) = (0, 0, 0)
    var count = 0

    mutating func append(_ b: UInt8) {
        let i = count
        withUnsafeMutableBytes(of: &bytes) { $0[i] = b }
        count = i + 1
    }

    /// RFC 1144 §3.2.3: a delta is one byte 1–255, or 0 followed by two bytes.
    mutating func appendDelta(_ n: UInt16) {
        if n == 0 || n >= 256 {
            append(0)
            append(UInt8(n >> 8))
            append(UInt8(n & 0xFF))
        } else {
            append(UInt8(n))
        }
    }

    mutating func setFirst(_ b: UInt8) {
        withUnsafeMutableBytes(of: &bytes) { $0[0] = b }
    }

    func write(into packet: inout [UInt8], at start: Int) {
        let count = count
        withUnsafeBytes(of: bytes) { b in
            packet.withUnsafeMutableBytes { p in
                UnsafeMutableRawBufferPointer(rebasing: p[start..<(start + count)]).copyMemory(from: UnsafeRawBufferPointer(rebasing: b[0..<count]))
            }
        }
    }
}

/// Whether `count` bytes of `a` from `i` equal those of `b` from `j` (both ranges inside
/// their arrays, which the callers' layouts checked): eight at a time, without slices.
@inline(__always)
private func sameBytes(_ a: [UInt8], _ i: Int, _ b: [UInt8], _ j: Int, _ count: Int) -> Bool {
    guard count > 0 else { return count == 0 }
    guard i >= 0, j >= 0, i <= a.count - count, j <= b.count - count else { return false }
    return a.withUnsafeBytes { x in
        b.withUnsafeBytes { y in
            var k = 0
            while k + 8 <= count {
                if x.loadUnaligned(fromByteOffset: i + k, as: UInt64.self) != y.loadUnaligned(fromByteOffset: j + k, as: UInt64.self) { return false }
                k += 8
            }
            while k < count {
                if x[i + k] != y[j + k] { return false }
                k += 1
            }
            return true
        }
    }
}

private func setIPChecksum(_ h: inout [UInt8], ipLength: Int) {
    h[10] = 0
    h[11] = 0
    let c = InternetChecksum.checksum(h[0..<ipLength])
    h[10] = UInt8(c >> 8)
    h[11] = UInt8(c & 0xFF)
}

/// Van Jacobson TCP/IP header compression, sending side (RFC 1144 §3.2, in the shape of its
/// appendix's `sl_compress_tcp`, as Linux's slhc does it).
public struct VJCompressor: Sendable {
    public let parameters: VJParameters
    /// Saved headers (IP and TCP, options included) per slot.
    private var slots: [[UInt8]?]
    /// Slot numbers, most recently used first.
    private var recency: [Int]
    private var lastSlot: Int?
    public private(set) var compressed = 0
    public private(set) var uncompressed = 0
    public private(set) var plain = 0

    public init(parameters: VJParameters) {
        self.parameters = parameters
        let n = Int(parameters.maxSlotID) + 1
        slots = Array(repeating: nil, count: n)
        recency = Array((0..<n).reversed())
    }

    /// The PPP protocol and information field for `packet`: 0x0021 (unchanged), 0x002F
    /// (uncompressed TCP, the protocol byte carrying the slot) or 0x002D (compressed).
    public mutating func compress(_ packet: [UInt8]) -> (protocol: UInt16, bytes: [UInt8]) {
        var p = packet
        let (proto, start) = compress(&p)
        return (proto, start == 0 ? p : Array(p[start...]))
    }

    /// Compresses `packet` in place: the information field is `packet[start...]`. A compressed
    /// header (at most 19 bytes) is written over the end of the 40 or more it replaces, and an
    /// uncompressed one changes only the protocol byte, so nothing is allocated or copied
    /// beyond the header; the slot's saved header is overwritten in its own storage.
    public mutating func compress(_ packet: inout [UInt8]) -> (protocol: UInt16, start: Int) {
        guard let layout = HeaderLayout(packet), packet[9] == IPProtocol.tcp.rawValue,
              BigEndian.uint16(packet, 6) & 0x3FFF == 0 else {
            plain += 1
            return (0x0021, 0)
        }
        let tcp = layout.ipLength
        let flags = packet[tcp + 13]
        // SYN, FIN, RST or no ACK: sent as plain IP (RFC 1144 §3.2.3).
        guard flags & 0x07 == 0, flags & 0x10 != 0 else {
            plain += 1
            return (0x0021, 0)
        }
        // The connection's slot, looked up in place (a copy of the slots held here would make
        // the store below copy all of them).
        var found: Int?
        for candidate in recency {
            guard let h = slots[candidate] else { continue }
            let ht = Int(h[0] & 0x0F) * 4
            if sameBytes(h, 12, packet, 12, 8) && sameBytes(h, ht, packet, tcp, 4) {
                found = candidate
                break
            }
        }
        guard let slot = found else {
            return sendUncompressed(&packet, layout: layout, slot: recency.last!)
        }
        touch(slot)
        // Taken out of its slot, so that it is the only reference and is overwritten in place
        // at the end (every way out below stores the slot again).
        var old = slots[slot]!
        slots[slot] = nil
        let oldLayout = HeaderLayout(old)!
        // Anything but the fields VJ encodes must be unchanged (§3.2.3): the IP version, TOS,
        // flags, TTL and options; the TCP offset and reserved bits, the flags other than PSH and
        // URG (ECN's ECE and CWR included), and the TCP options.
        guard old[0] == packet[0], old[1] == packet[1], old[6] == packet[6], old[8] == packet[8],
              oldLayout.tcpLength == layout.tcpLength,
              old[oldLayout.ipLength + 12] == packet[tcp + 12],
              old[oldLayout.ipLength + 13] & ~0x28 == flags & ~0x28,
              oldLayout.ipLength == layout.ipLength,
              sameBytes(old, 20, packet, 20, layout.ipLength - 20),
              sameBytes(old, oldLayout.ipLength + 20, packet, tcp + 20, layout.tcpLength - 20) else {
            return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old)
        }
        let ot = oldLayout.ipLength
        var changes: UInt8 = 0
        // The compressed header is built here (the change mask filled in at the end, the slot
        // when it is said, the TCP checksum, the deltas), then written over the packet's own.
        let saysSlot = !parameters.compressSlotID || lastSlot != slot
        var out = CompressedHeader()
        out.append(0)
        if saysSlot { out.append(UInt8(slot)) }
        out.append(packet[tcp + 16])
        out.append(packet[tcp + 17])
        let deltasStart = out.count
        if flags & 0x20 != 0 {
            out.appendDelta(BigEndian.uint16(packet, tcp + 18))
            changes |= VJBits.urgent
        } else if BigEndian.uint16(packet, tcp + 18) != BigEndian.uint16(old, ot + 18) || old[ot + 13] & 0x20 != 0 {
            // URG clears only through the explicit encoding, and the special codes (SPECIAL_I,
            // SPECIAL_D) leave the saved header's URG set at the decompressor (RFC 1144 §A.3):
            // a segment that drops URG goes uncompressed, so the saved header forgets it.
            return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old)
        }
        let window = BigEndian.uint16(packet, tcp + 14) &- BigEndian.uint16(old, ot + 14)
        if window != 0 {
            out.appendDelta(window)
            changes |= VJBits.window
        }
        let ack = BigEndian.uint32(packet, tcp + 8) &- BigEndian.uint32(old, ot + 8)
        if ack != 0 {
            guard ack <= 0xFFFF else { return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old) }
            out.appendDelta(UInt16(ack))
            changes |= VJBits.ack
        }
        let seq = BigEndian.uint32(packet, tcp + 4) &- BigEndian.uint32(old, ot + 4)
        if seq != 0 {
            guard seq <= 0xFFFF else { return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old) }
            out.appendDelta(UInt16(seq))
            changes |= VJBits.sequence
        }
        let oldTotal = Int(BigEndian.uint16(old, 2))
        let lastData = UInt32(oldTotal - oldLayout.total)
        switch changes {
        case 0:
            // Nothing changed: data after a bare ACK compresses; anything else may be a
            // retransmission or a duplicate ACK and goes uncompressed.
            guard BigEndian.uint16(packet, 2) != BigEndian.uint16(old, 2) && oldTotal == oldLayout.total else {
                return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old)
            }
        case VJBits.specialI, VJBits.specialD:
            // The real changes look like a special case: ambiguous, so uncompressed.
            return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &old)
        case VJBits.sequence | VJBits.ack where seq == ack && seq == lastData:
            changes = VJBits.specialI
            out.count = deltasStart
        case VJBits.sequence where seq == lastData:
            changes = VJBits.specialD
            out.count = deltasStart
        default:
            break
        }
        let id = BigEndian.uint16(packet, 4) &- BigEndian.uint16(old, 4)
        if id != 1 {
            out.appendDelta(id)
            changes |= VJBits.ipID
        }
        if flags & 0x08 != 0 { changes |= VJBits.push }
        save(packet, layout: layout, into: &old, slot: slot)
        if saysSlot {
            out.setFirst(changes | VJBits.connection)
            lastSlot = slot
        } else {
            out.setFirst(changes)
        }
        let start = layout.total - out.count
        out.write(into: &packet, at: start)
        compressed += 1
        return (0x002D, start)
    }

    private mutating func sendUncompressed(_ packet: inout [UInt8], layout: HeaderLayout, slot: Int) -> (protocol: UInt16, start: Int) {
        var buffer = slots[slot] ?? []
        slots[slot] = nil
        return sendUncompressed(&packet, layout: layout, slot: slot, reusing: &buffer)
    }

    private mutating func sendUncompressed(_ packet: inout [UInt8], layout: HeaderLayout, slot: Int, reusing buffer: inout [UInt8]) -> (protocol: UInt16, start: Int) {
        touch(slot)
        save(packet, layout: layout, into: &buffer, slot: slot)
        lastSlot = slot
        uncompressed += 1
        packet[9] = UInt8(slot)
        return (0x002F, 0)
    }

    /// The slot's saved header becomes `packet`'s, written into `buffer` (the slot's old one,
    /// taken out and so not shared) without allocating when it has the room.
    private mutating func save(_ packet: [UInt8], layout: HeaderLayout, into buffer: inout [UInt8], slot: Int) {
        buffer.removeAll(keepingCapacity: true)
        buffer.append(contentsOf: packet[0..<layout.total])
        slots[slot] = buffer
    }

    private mutating func touch(_ slot: Int) {
        // The common case, one connection sending on: already the most recent.
        if recency.first == slot { return }
        recency.removeAll { $0 == slot }
        recency.insert(slot, at: 0)
    }
}

/// Van Jacobson TCP/IP header decompression, receiving side (RFC 1144 §3.3). After a damaged
/// frame (`toss`), compressed packets without a slot id are dropped until one with a slot id or
/// an uncompressed one resynchronises (§3.3.4).
public struct VJDecompressor: Sendable {
    public let parameters: VJParameters
    private var slots: [[UInt8]?]
    private var lastSlot = 0
    public private(set) var tossing = true
    public private(set) var compressedIn = 0
    public private(set) var uncompressedIn = 0
    public private(set) var tossed = 0
    public private(set) var errors = 0

    public init(parameters: VJParameters) {
        self.parameters = parameters
        slots = Array(repeating: nil, count: Int(parameters.maxSlotID) + 1)
    }

    /// The framer saw a damaged frame: what follows cannot be trusted to apply to our state.
    public mutating func toss() { tossing = true }

    /// Protocol 0x002F: a whole packet whose IP protocol byte holds the slot id.
    public mutating func uncompressed(_ bytes: [UInt8]) -> [UInt8]? {
        var packet = bytes
        return uncompressed(&packet) ? packet : nil
    }

    /// `uncompressed` in place: `packet` becomes the IP packet (cut to its total length, the
    /// protocol and checksum restored), and the slot keeps its header in the array it had.
    /// False, and `packet` left as it was, for one that cannot be taken.
    public mutating func uncompressed(_ packet: inout [UInt8]) -> Bool {
        guard let layout = HeaderLayout(packet), Int(packet[9]) < slots.count,
              Int(BigEndian.uint16(packet, 2)) <= packet.count, Int(BigEndian.uint16(packet, 2)) >= layout.total else {
            errors += 1
            tossing = true
            return false
        }
        packet.removeLast(packet.count - Int(BigEndian.uint16(packet, 2)))
        let slot = Int(packet[9])
        packet[9] = IPProtocol.tcp.rawValue
        setIPChecksum(&packet, ipLength: layout.ipLength)
        var saved = slots[slot] ?? []
        slots[slot] = nil
        saved.removeAll(keepingCapacity: true)
        saved.append(contentsOf: packet[0..<layout.total])
        slots[slot] = saved
        lastSlot = slot
        tossing = false
        uncompressedIn += 1
        return true
    }

    /// Protocol 0x002D: rebuilds the packet from the slot's saved header and the deltas.
    public mutating func compressed(_ bytes: [UInt8]) -> [UInt8]? {
        var packet: [UInt8] = []
        return compressed(bytes, into: &packet) ? packet : nil
    }

    /// `compressed` into the caller's array (emptied first, its storage kept): false, and
    /// `packet` left empty, for a packet that cannot be rebuilt.
    public mutating func compressed(_ bytes: [UInt8], into packet: inout [UInt8]) -> Bool {
        bytes.withUnsafeBytes { compressed($0, into: &packet) }
    }

    /// `compressed` from bytes where they lie (a frame in the decoder's buffer), so that the
    /// payload is copied once, into `packet`.
    public mutating func compressed(_ bytes: UnsafeRawBufferPointer, into packet: inout [UInt8]) -> Bool {
        packet.removeAll(keepingCapacity: true)
        var reader = CompressedHeaderReader(bytes: bytes)
        func fail() -> Bool {
            errors += 1
            tossing = true
            return false
        }
        guard let changes = reader.byte(), changes & 0x80 == 0 else { return fail() }
        if changes & VJBits.connection != 0 {
            guard let slot = reader.byte(), Int(slot) < slots.count else { return fail() }
            lastSlot = Int(slot)
            tossing = false
        } else if tossing {
            tossed += 1
            return false
        }
        // Everything is read and checked before the saved header changes: a packet that fails
        // leaves the slot as it was (the one after an explicit connection goes on from it).
        guard let saved = slots[lastSlot], let layout = HeaderLayout(saved) else { return fail() }
        let tcp = layout.ipLength
        guard let c0 = reader.byte(), let c1 = reader.byte() else { return fail() }
        var urgent: UInt16?, window: UInt16 = 0, ack: UInt16 = 0, sequence: UInt16 = 0
        let special = changes & VJBits.specialsMask
        if special != VJBits.specialI && special != VJBits.specialD {
            if changes & VJBits.urgent != 0 {
                guard let u = reader.delta() else { return fail() }
                urgent = u
            }
            if changes & VJBits.window != 0 {
                guard let w = reader.delta() else { return fail() }
                window = w
            }
            if changes & VJBits.ack != 0 {
                guard let a = reader.delta() else { return fail() }
                ack = a
            }
            if changes & VJBits.sequence != 0 {
                guard let d = reader.delta() else { return fail() }
                sequence = d
            }
        }
        var idDelta: UInt16 = 1
        if changes & VJBits.ipID != 0 {
            guard let d = reader.delta() else { return fail() }
            idDelta = d
        }
        let total = layout.total + (bytes.count - reader.offset)
        guard total <= 65535 else { return fail() }
        // Taken out of its slot while it changes, so the change happens in place (a copy
        // shared with the slot would be copied again on the first write).
        var h = saved
        slots[lastSlot] = nil
        h[tcp + 16] = c0
        h[tcp + 17] = c1
        if changes & VJBits.push != 0 { h[tcp + 13] |= 0x08 } else { h[tcp + 13] &= ~0x08 }
        let lastData = Int(BigEndian.uint16(h, 2)) - layout.total
        switch special {
        case VJBits.specialI:
            Self.add(UInt32(truncatingIfNeeded: lastData), toUInt32At: tcp + 8, in: &h)
            Self.add(UInt32(truncatingIfNeeded: lastData), toUInt32At: tcp + 4, in: &h)
        case VJBits.specialD:
            Self.add(UInt32(truncatingIfNeeded: lastData), toUInt32At: tcp + 4, in: &h)
        default:
            if let urgent {
                h[tcp + 13] |= 0x20
                BigEndian.put(urgent, into: &h, at: tcp + 18)
            } else {
                h[tcp + 13] &= ~0x20
            }
            if changes & VJBits.window != 0 { BigEndian.put(BigEndian.uint16(h, tcp + 14) &+ window, into: &h, at: tcp + 14) }
            if changes & VJBits.ack != 0 { Self.add(UInt32(ack), toUInt32At: tcp + 8, in: &h) }
            if changes & VJBits.sequence != 0 { Self.add(UInt32(sequence), toUInt32At: tcp + 4, in: &h) }
        }
        BigEndian.put(BigEndian.uint16(h, 4) &+ idDelta, into: &h, at: 4)
        BigEndian.put(UInt16(total), into: &h, at: 2)
        setIPChecksum(&h, ipLength: layout.ipLength)
        packet.reserveCapacity(total)
        packet += h
        packet.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[reader.offset...]))
        slots[lastSlot] = h
        compressedIn += 1
        return true
    }

    private static func add(_ d: UInt32, toUInt32At at: Int, in h: inout [UInt8]) {
        BigEndian.put(BigEndian.uint32(h, at) &+ d, into: &h, at: at)
    }
}

/// Reads a compressed header's fields in order. A struct, not local functions capturing the
/// position: captured and mutated, the position was checked for exclusive access at run time on
/// every byte.
private struct CompressedHeaderReader {
    let bytes: UnsafeRawBufferPointer
    private(set) var offset = 0

    init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    mutating func byte() -> UInt8? {
        // The one bounds check: an unsafe buffer's subscript checks only in debug builds.
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes.load(fromByteOffset: offset, as: UInt8.self)
    }

    /// RFC 1144 §3.2.3: a delta is one byte 1–255, or 0 followed by two bytes.
    mutating func delta() -> UInt16? {
        guard let first = byte() else { return nil }
        if first != 0 { return UInt16(first) }
        guard let high = byte(), let low = byte() else { return nil }
        return UInt16(high) << 8 | UInt16(low)
    }
}
