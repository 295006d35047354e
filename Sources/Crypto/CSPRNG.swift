import COpenSSL

/// OpenSSL's CSPRNG (`RAND_bytes`) as a `RandomNumberGenerator`: what the sans-IO cores take as
/// their random source in production (LCP magic numbers, CHAP challenges, TCP ISN keys and
/// ephemeral ports, DNS relay query IDs and ports). Tests hand the cores a seeded generator
/// instead (`SplitMix64`), as they hand them virtual time.
///
/// Each call is an independent draw: knowing one value says nothing of another. Should OpenSSL
/// ever fail to give bytes, the kernel's generator (`getrandom`, also cryptographically secure)
/// answers instead: a predictable value is never returned.
public struct CSPRNG: RandomNumberGenerator, Sendable {
    public init() {}

    public mutating func next() -> UInt64 {
        var value: UInt64 = 0
        let ok = withUnsafeMutableBytes(of: &value) { RAND_bytes($0.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32($0.count)) == 1 }
        if ok { return value }
        var kernel = SystemRandomNumberGenerator()
        return kernel.next()
    }
}
