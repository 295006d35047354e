/// An IPv4 address: four bytes in network order.
public struct IPv4Address: Sendable, Hashable, CustomStringConvertible, Comparable {
    public var value: UInt32

    public init(_ value: UInt32) { self.value = value }
    public init(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) {
        value = UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d)
    }

    /// Parses dotted-quad text ("10.0.2.15"); nil for anything else.
    public init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var v: UInt32 = 0
        for p in parts {
            guard !p.isEmpty, p.count <= 3, p.allSatisfy(\.isASCII), let octet = UInt8(p) else { return nil }
            v = v << 8 | UInt32(octet)
        }
        value = v
    }

    public static let any = IPv4Address(0)

    public var bytes: [UInt8] { BigEndian.bytes(value) }
    public var description: String { bytes.map(String.init).joined(separator: ".") }
    public static func < (a: IPv4Address, b: IPv4Address) -> Bool { a.value < b.value }
}
