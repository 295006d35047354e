import COpenSSL

/// Message digests through OpenSSL 3's EVP interface (libcrypto), never hand-written.
public enum Digest {
    public enum Algorithm: String, Sendable {
        case sha256 = "SHA256"
        case sha1 = "SHA1"
        case md5 = "MD5"
    }

    /// The digest of `bytes`; nil only if OpenSSL lacks the algorithm.
    public static func hash(_ algorithm: Algorithm, _ bytes: [UInt8]) -> [UInt8]? {
        guard let md = EVP_MD_fetch(nil, algorithm.rawValue, nil) else { return nil }
        defer { EVP_MD_free(md) }
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBytes { input in
            out.withUnsafeMutableBufferPointer { o in
                EVP_Digest(input.baseAddress, input.count, o.baseAddress, &length, md, nil)
            }
        }
        guard ok == 1 else { return nil }
        return Array(out[0..<Int(length)])
    }

    /// Lower-case hex, as sha256sum prints.
    public static func hex(_ bytes: [UInt8]) -> String {
        Hex.encode(bytes).lowercased()
    }
}
