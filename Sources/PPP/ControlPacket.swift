import Wire

/// The packet format shared by LCP, the NCPs, PAP and CHAP (RFC 1661 §5): code, identifier,
/// a 16-bit length that covers the header, then data.
public struct ControlPacket: Sendable, Equatable {
    public var code: ControlCode
    public var identifier: UInt8
    public var data: [UInt8]

    public static let headerLength = 4
    /// The 16-bit Length field covers the header too (RFC 1661 §5).
    public static let maximumLength = Int(UInt16.max)

    public init(code: ControlCode, identifier: UInt8, data: [UInt8] = []) {
        self.code = code
        self.identifier = identifier
        self.data = data
    }

    /// Reads a packet from an information field. RFC 1661 §5: octets past the length are
    /// padding and are ignored; a length beyond the field, or below 4, makes the packet invalid.
    public init<C: Collection>(parsing bytes: C) throws(WireError) where C.Element == UInt8, C.Index == Int {
        guard bytes.count >= ControlPacket.headerLength else {
            throw .truncated(what: "control packet", needed: ControlPacket.headerLength, available: bytes.count)
        }
        let s = bytes.startIndex
        let length = Int(bytes[s + 2]) << 8 | Int(bytes[s + 3])
        guard length >= ControlPacket.headerLength else { throw .lengthTooSmall(length: length) }
        guard length <= bytes.count else { throw .lengthExceedsFrame(length: length, available: bytes.count) }
        self.init(code: ControlCode(bytes[s]), identifier: bytes[s + 1], data: Array(bytes[(s + 4)..<(s + length)]))
    }

    public var length: Int { ControlPacket.headerLength + data.count }

    /// The packet's bytes; a packet whose length does not fit the 16-bit Length field is
    /// refused, never truncated into a different packet.
    public func emit() throws(WireError) -> [UInt8] {
        guard let field = UInt16(exactly: length) else {
            throw .tooLong(length: length, maximum: ControlPacket.maximumLength)
        }
        return [code.rawValue, identifier] + BigEndian.bytes(field) + data
    }
}

/// One type-length-value configuration option (RFC 1661 §6).
public struct ConfigurationOption: Sendable, Equatable {
    public var type: UInt8
    public var value: [UInt8]

    public init(type: UInt8, value: [UInt8] = []) {
        self.type = type
        self.value = value
    }

    /// An option of a protocol's kind (`LCPOption.Kind`, `IPCPOption.Kind`).
    public init<Kind: RawRepresentable>(kind: Kind, value: [UInt8] = []) where Kind.RawValue == UInt8 {
        self.init(type: kind.rawValue, value: value)
    }

    /// Whether the option is of `kind`.
    public func isKind<Kind: RawRepresentable>(_ kind: Kind) -> Bool where Kind.RawValue == UInt8 { type == kind.rawValue }

    /// Reads a whole option list. A length below 2 or past the end makes the list invalid.
    public static func parseList(_ bytes: [UInt8]) throws(WireError) -> [ConfigurationOption] {
        var options: [ConfigurationOption] = []
        var i = 0
        while i < bytes.count {
            guard i + 2 <= bytes.count else {
                throw .badOptionLength(type: bytes[i], length: -1, remaining: bytes.count - i)
            }
            let length = Int(bytes[i + 1])
            guard length >= 2, i + length <= bytes.count else {
                throw .badOptionLength(type: bytes[i], length: length, remaining: bytes.count - i)
            }
            options.append(ConfigurationOption(type: bytes[i], value: Array(bytes[(i + 2)..<(i + length)])))
            i += length
        }
        return options
    }

    /// The largest value: the Length octet covers type and length too (RFC 1661 §6).
    public static let maximumValueLength = Int(UInt8.max) - 2

    /// The options' bytes; an option whose value does not fit its Length octet is refused.
    public static func emitList(_ options: [ConfigurationOption]) throws(WireError) -> [UInt8] {
        var out: [UInt8] = []
        for o in options { out += try o.emit() }
        return out
    }

    /// The options that fit in `room` bytes, in order: what an answer cut to the peer's MRU
    /// carries (each option whole, never a piece of one).
    public static func prefix(_ options: [ConfigurationOption], fitting room: Int) -> [ConfigurationOption] {
        var used = 0
        var kept: [ConfigurationOption] = []
        for o in options {
            used += 2 + o.value.count
            guard used <= room else { break }
            kept.append(o)
        }
        return kept
    }

    public func emit() throws(WireError) -> [UInt8] {
        guard let length = UInt8(exactly: 2 + value.count) else {
            throw .tooLong(length: 2 + value.count, maximum: Int(UInt8.max))
        }
        return [type, length] + value
    }
}

/// A control packet's code: RFC 1661 §5 (1–11) and RFC 1570 (12–13) by name; any other value
/// is kept as it came (a peer's unknown code is answered with Code-Reject, RFC 1661 §5.6).
public struct ControlCode: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public init(_ rawValue: UInt8) { self.rawValue = rawValue }

    public static let configureRequest = ControlCode(1)
    public static let configureAck = ControlCode(2)
    public static let configureNak = ControlCode(3)
    public static let configureReject = ControlCode(4)
    public static let terminateRequest = ControlCode(5)
    public static let terminateAck = ControlCode(6)
    public static let codeReject = ControlCode(7)
    public static let protocolReject = ControlCode(8)
    public static let echoRequest = ControlCode(9)
    public static let echoReply = ControlCode(10)
    public static let discardRequest = ControlCode(11)
    public static let identification = ControlCode(12)
    public static let timeRemaining = ControlCode(13)

    private static let names = ["ConfReq", "ConfAck", "ConfNak", "ConfRej", "TermReq", "TermAck", "CodeRej", "ProtRej",
                                "EchoReq", "EchoRep", "DiscReq", "Ident", "TimeRem"]

    /// pppd's short name, for the codes it names.
    public var name: String? {
        let i = Int(rawValue) - 1
        return Self.names.indices.contains(i) ? Self.names[i] : nil
    }

    /// The name, or the number in hex as pppd prints an unknown code.
    public var description: String { name ?? "code=0x\(String(rawValue, radix: 16))" }

    /// Codes that carry a configuration option list.
    public var carriesOptions: Bool { (1...4).contains(rawValue) }

    /// In the order of their numbers (LCP's own codes are a range, RFC 1661 §5).
    public static func < (a: ControlCode, b: ControlCode) -> Bool { a.rawValue < b.rawValue }
}
