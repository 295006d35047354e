import COpenSSL

extension Digest {
    /// MD5, as CHAP (RFC 1994 §4.1) requires; not for anything else.
    public static func md5(_ parts: [UInt8]...) -> [UInt8] {
        // OpenSSL 3 keeps MD5 in the default provider; its absence would be a broken install.
        hash(.md5, parts.flatMap { $0 })!
    }

    /// Compares in time independent of the contents (OpenSSL's CRYPTO_memcmp).
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBytes { x in b.withUnsafeBytes { y in CRYPTO_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 } }
    }
}
