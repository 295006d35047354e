/// The header of a VJ-compressed TCP/IP packet (RFC 1144 §3.2.3, PPP protocol 0x002D): a change
/// mask, an optional connection number, the TCP checksum and the deltas the mask announces.
/// Reading it needs no connection state; rebuilding the packet does (that is the decompressor's).
public struct VJCompressedHeader: Sendable, Equatable {
    public struct Changes: OptionSet, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let urgent = Changes(rawValue: 0x01)
        public static let window = Changes(rawValue: 0x02)
        public static let ack = Changes(rawValue: 0x04)
        public static let sequence = Changes(rawValue: 0x08)
        public static let push = Changes(rawValue: 0x10)
        public static let ipID = Changes(rawValue: 0x20)
        public static let connection = Changes(rawValue: 0x40)
    }

    public var changes: Changes
    public var connection: UInt8?
    public var tcpChecksum: UInt16
    public var urgentPointer: UInt32?
    public var windowDelta: Int32?
    public var ackDelta: UInt32?
    public var sequenceDelta: UInt32?
    public var ipIDDelta: UInt32?
    /// Special cases of §3.2.3: echoed interactive traffic (S, W, U set together) and
    /// unidirectional data (S, A, W, U set together); the deltas are implied.
    public var special: String?
    public var headerLength: Int

    public init(parsing b: UnsafeRawBufferPointer) throws(WireError) {
        var i = 0
        func byte() throws(WireError) -> UInt8 {
            guard i < b.count else { throw .truncated(what: "VJ compressed header", needed: i + 1, available: b.count) }
            defer { i += 1 }
            return b[i]
        }
        // §3.2.3: a delta is one byte 1–255, or 0 followed by two bytes.
        func delta() throws(WireError) -> UInt32 {
            let first = try byte()
            if first != 0 { return UInt32(first) }
            let high = try byte()
            return UInt32(high) << 8 | UInt32(try byte())
        }
        changes = Changes(rawValue: try byte())
        guard changes.rawValue & 0x80 == 0 else { throw .malformed("VJ change mask 0x\(String(changes.rawValue, radix: 16)) has bit 7 set") }
        connection = changes.contains(.connection) ? try byte() : nil
        let high = try byte()
        tcpChecksum = UInt16(high) << 8 | UInt16(try byte())
        let low = changes.rawValue & 0x0F
        if low == 0x0B {
            special = "echo"
        } else if low == 0x0F {
            special = "data"
        } else {
            if changes.contains(.urgent) { urgentPointer = try delta() }
            if changes.contains(.window) { windowDelta = Int32(Int16(truncatingIfNeeded: try delta())) }
            if changes.contains(.ack) { ackDelta = try delta() }
            if changes.contains(.sequence) { sequenceDelta = try delta() }
        }
        if changes.contains(.ipID) { ipIDDelta = try delta() }
        headerLength = i
    }

    public var summary: String {
        var parts: [String] = []
        if let c = connection { parts.append("conn=\(c)") }
        if changes.contains(.push) { parts.append("P") }
        if let s = special { parts.append("special=\(s)") }
        if let u = urgentPointer { parts.append("U=\(u)") }
        if let w = windowDelta { parts.append("W=\(w >= 0 ? "+" : "")\(w)") }
        if let a = ackDelta { parts.append("A=+\(a)") }
        if let s = sequenceDelta { parts.append("S=+\(s)") }
        if let d = ipIDDelta { parts.append("I=+\(d)") }
        return parts.joined(separator: " ")
    }
}
