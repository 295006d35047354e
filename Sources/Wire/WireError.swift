/// Why bytes from the wire could not be read as a packet, header or option, at any layer (PPP's
/// control packets, IPv4, ICMP, UDP, TCP, VJ headers). Malformed input is a value, never a trap.
public enum WireError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Fewer bytes than `what` needs.
    case truncated(what: String, needed: Int, available: Int)
    /// The packet's length field says more than the frame holds.
    case lengthExceedsFrame(length: Int, available: Int)
    /// A length field smaller than its own header.
    case lengthTooSmall(length: Int)
    /// A configuration option whose length is below 2 or runs past the packet's end.
    case badOptionLength(type: UInt8, length: Int, remaining: Int)
    /// A packet or option to be sent whose length does not fit its length field.
    case tooLong(length: Int, maximum: Int)
    /// Anything else specific to one protocol.
    case malformed(String)

    public var description: String {
        switch self {
        case let .truncated(what, needed, available): return "\(what) truncated: needs \(needed) bytes, has \(available)"
        case let .lengthExceedsFrame(length, available): return "length \(length) exceeds the \(available) bytes present"
        case let .lengthTooSmall(length): return "length \(length) is too small"
        case let .badOptionLength(type, length, remaining):
            return "option \(type) has length \(length) with \(remaining) bytes left"
        case let .tooLong(length, maximum): return "length \(length) exceeds the maximum \(maximum)"
        case let .malformed(what): return what
        }
    }
}
