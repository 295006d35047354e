/// SipHash-2-4 (Aumasson and Bernstein), the keyed pseudo-random function behind our
/// initial sequence numbers (RFC 6528 §3 asks for a PRF keyed with a secret).
public struct SipHash24: Sendable {
    public let key0: UInt64
    public let key1: UInt64

    public init(key0: UInt64, key1: UInt64) {
        self.key0 = key0
        self.key1 = key1
    }

    public func hash(_ bytes: [UInt8]) -> UInt64 {
        var v0: UInt64 = 0x736f6d6570736575 ^ key0
        var v1: UInt64 = 0x646f72616e646f6d ^ key1
        var v2: UInt64 = 0x6c7967656e657261 ^ key0
        var v3: UInt64 = 0x7465646279746573 ^ key1

        func round() {
            v0 = v0 &+ v1; v1 = (v1 << 13) | (v1 >> 51); v1 ^= v0; v0 = (v0 << 32) | (v0 >> 32)
            v2 = v2 &+ v3; v3 = (v3 << 16) | (v3 >> 48); v3 ^= v2
            v0 = v0 &+ v3; v3 = (v3 << 21) | (v3 >> 43); v3 ^= v0
            v2 = v2 &+ v1; v1 = (v1 << 17) | (v1 >> 47); v1 ^= v2; v2 = (v2 << 32) | (v2 >> 32)
        }

        let whole = bytes.count / 8 * 8
        var i = 0
        while i < whole {
            var m: UInt64 = 0
            for j in 0..<8 { m |= UInt64(bytes[i + j]) << (8 * UInt64(j)) }
            v3 ^= m
            round(); round()
            v0 ^= m
            i += 8
        }
        var last = UInt64(bytes.count & 0xFF) << 56
        for j in 0..<(bytes.count - whole) { last |= UInt64(bytes[whole + j]) << (8 * UInt64(j)) }
        v3 ^= last
        round(); round()
        v0 ^= last
        v2 ^= 0xFF
        round(); round(); round(); round()
        return v0 ^ v1 ^ v2 ^ v3
    }
}
