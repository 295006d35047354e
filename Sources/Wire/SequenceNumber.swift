/// A TCP sequence number: 32-bit arithmetic modulo 2^32 with the comparisons of
/// RFC 9293 §3.4 (a < b when b lies less than 2^31 ahead of a).
/// A literal is a number as written in a trace or a script (`seq 1000`).
public struct SequenceNumber: Sendable, Hashable, Comparable, CustomStringConvertible, ExpressibleByIntegerLiteral {
    public var rawValue: UInt32

    public init(_ rawValue: UInt32) { self.rawValue = rawValue }
    public init(integerLiteral value: UInt32) { self.rawValue = value }

    public static func + (a: SequenceNumber, n: Int) -> SequenceNumber {
        SequenceNumber(a.rawValue &+ UInt32(truncatingIfNeeded: n))
    }

    public static func - (a: SequenceNumber, n: Int) -> SequenceNumber {
        SequenceNumber(a.rawValue &- UInt32(truncatingIfNeeded: n))
    }

    public static func += (a: inout SequenceNumber, n: Int) { a = a + n }

    /// The signed distance from `b` to `a`.
    public static func - (a: SequenceNumber, b: SequenceNumber) -> Int {
        Int(Int32(bitPattern: a.rawValue &- b.rawValue))
    }

    public static func < (a: SequenceNumber, b: SequenceNumber) -> Bool { a - b < 0 }

    /// How far this number lies ahead of `base` counting forward only (0 ..< 2^32): the offset
    /// into a stream whose numbering starts at `base`, however far round the space it is.
    public func offset(from base: SequenceNumber) -> Int { Int(rawValue &- base.rawValue) }

    public static func max(_ a: SequenceNumber, _ b: SequenceNumber) -> SequenceNumber { a < b ? b : a }
    public static func min(_ a: SequenceNumber, _ b: SequenceNumber) -> SequenceNumber { a < b ? a : b }

    public var description: String { String(rawValue) }
}
