import COpenSSL
import Glibc

/// Why a cryptographic call failed. OpenSSL's own reason is kept when it gave one.
public struct CryptoError: Error, Equatable, CustomStringConvertible, Sendable {
    public let operation: String
    public let reason: String
    public init(_ operation: String, _ reason: String = CryptoError.openSSLReason()) {
        self.operation = operation
        self.reason = reason
    }
    public var description: String { "\(operation): \(reason)" }

    /// The oldest queued OpenSSL error as text (and clears the queue).
    public static func openSSLReason() -> String {
        let code = ERR_get_error()
        ERR_clear_error()
        guard code != 0 else { return "failed" }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// Block ciphers through OpenSSL 3's EVP interface: AES (ECB/CBC, 128/192/256 by key length) and
/// triple DES (2-key and 3-key ECB/CBC). Single DES, which OpenSSL 3 keeps only in its legacy
/// provider, is triple DES with the key repeated (K‖K‖K), exactly as X9.24-1 needs it.
public enum BlockCipher: Sendable {
    case aes
    case tdes

    public enum Mode: Sendable { case ecb, cbc }

    public var blockSize: Int { self == .aes ? 16 : 8 }

    func evpCipher(keyLength: Int, mode: Mode) throws -> OpaquePointer {
        let cipher: OpaquePointer?
        switch (self, keyLength, mode) {
        case (.aes, 16, .ecb): cipher = EVP_aes_128_ecb()
        case (.aes, 24, .ecb): cipher = EVP_aes_192_ecb()
        case (.aes, 32, .ecb): cipher = EVP_aes_256_ecb()
        case (.aes, 16, .cbc): cipher = EVP_aes_128_cbc()
        case (.aes, 24, .cbc): cipher = EVP_aes_192_cbc()
        case (.aes, 32, .cbc): cipher = EVP_aes_256_cbc()
        case (.tdes, 16, .ecb): cipher = EVP_des_ede_ecb()
        case (.tdes, 24, .ecb): cipher = EVP_des_ede3_ecb()
        case (.tdes, 16, .cbc): cipher = EVP_des_ede_cbc()
        case (.tdes, 24, .cbc): cipher = EVP_des_ede3_cbc()
        default:
            throw CryptoError("\(self) key", "unsupported key length \(keyLength)")
        }
        guard let cipher else { throw CryptoError("\(self) cipher") }
        return cipher
    }

    /// Encrypts `data`. Without padding its length must be a multiple of the block size; with
    /// padding it is PKCS#7-padded.
    public func encrypt(key: [UInt8], _ data: [UInt8], mode: Mode = .ecb, iv: [UInt8]? = nil,
                        padding: Bool = false) throws -> [UInt8] {
        try run(encrypt: true, key: key, data: data, mode: mode, iv: iv, padding: padding)
    }

    /// Decrypts `data`; with padding a wrong PKCS#7 pad (a wrong key, a damaged ciphertext) throws.
    public func decrypt(key: [UInt8], _ data: [UInt8], mode: Mode = .ecb, iv: [UInt8]? = nil,
                        padding: Bool = false) throws -> [UInt8] {
        try run(encrypt: false, key: key, data: data, mode: mode, iv: iv, padding: padding)
    }

    private func run(encrypt: Bool, key: [UInt8], data: [UInt8], mode: Mode, iv: [UInt8]?,
                     padding: Bool) throws -> [UInt8] {
        let cipher = try evpCipher(keyLength: key.count, mode: mode)
        if !padding && data.count % blockSize != 0 {
            throw CryptoError("\(self) \(encrypt ? "encrypt" : "decrypt")",
                              "length \(data.count) is not a multiple of \(blockSize)")
        }
        if mode == .cbc, let iv, iv.count != blockSize {
            throw CryptoError("\(self) iv", "length \(iv.count), expected \(blockSize)")
        }
        let zeroIV = [UInt8](repeating: 0, count: blockSize)
        guard let ctx = EVP_CIPHER_CTX_new() else { throw CryptoError("EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        let ivBytes = mode == .cbc ? (iv ?? zeroIV) : zeroIV
        let initialised = key.withUnsafeBufferPointer { k in
            ivBytes.withUnsafeBufferPointer { v in
                encrypt
                    ? EVP_EncryptInit_ex2(ctx, cipher, k.baseAddress, mode == .cbc ? v.baseAddress : nil, nil)
                    : EVP_DecryptInit_ex2(ctx, cipher, k.baseAddress, mode == .cbc ? v.baseAddress : nil, nil)
            }
        }
        guard initialised == 1 else { throw CryptoError("\(self) init") }
        EVP_CIPHER_CTX_set_padding(ctx, padding ? 1 : 0)
        var out = [UInt8](repeating: 0, count: data.count + blockSize)
        var produced: Int32 = 0
        var final: Int32 = 0
        let updated = data.withUnsafeBufferPointer { d in
            out.withUnsafeMutableBufferPointer { o in
                encrypt
                    ? EVP_EncryptUpdate(ctx, o.baseAddress, &produced, d.baseAddress, Int32(d.count))
                    : EVP_DecryptUpdate(ctx, o.baseAddress, &produced, d.baseAddress, Int32(d.count))
            }
        }
        guard updated == 1 else { throw CryptoError("\(self) update") }
        let finished = out.withUnsafeMutableBufferPointer { o in
            encrypt
                ? EVP_EncryptFinal_ex(ctx, o.baseAddress! + Int(produced), &final)
                : EVP_DecryptFinal_ex(ctx, o.baseAddress! + Int(produced), &final)
        }
        guard finished == 1 else {
            let reason = CryptoError.openSSLReason()
            wipe(&out)
            throw CryptoError("\(self) \(encrypt ? "encrypt" : "decrypt") final", reason)
        }
        let result = Array(out[0..<Int(produced + final)])
        wipe(&out)
        return result
    }

    /// Single DES (ECB), as triple DES under K‖K‖K: OpenSSL 3's default provider has no DES.
    public static func desEncrypt(key: [UInt8], _ block: [UInt8]) throws -> [UInt8] {
        precondition(key.count == 8, "single DES key is 8 bytes")
        return try BlockCipher.tdes.encrypt(key: key + key + key, block)
    }

    public static func desDecrypt(key: [UInt8], _ block: [UInt8]) throws -> [UInt8] {
        precondition(key.count == 8, "single DES key is 8 bytes")
        return try BlockCipher.tdes.decrypt(key: key + key + key, block)
    }
}

/// Message authentication codes through `EVP_MAC` (CMAC, HMAC) and the ANSI X9.19 retail MAC
/// built from OpenSSL's DES.
public enum MessageAuthentication {
    /// AES-CMAC (NIST SP 800-38B) with a 16/24/32-byte key; 16 bytes.
    public static func aesCMAC(key: [UInt8], _ data: [UInt8]) throws -> [UInt8] {
        let cipher: String
        switch key.count {
        case 16: cipher = "AES-128-CBC"
        case 24: cipher = "AES-192-CBC"
        case 32: cipher = "AES-256-CBC"
        default: throw CryptoError("CMAC key", "unsupported key length \(key.count)")
        }
        return try mac("CMAC", parameter: "cipher", value: cipher, key: key, data: data)
    }

    /// TDES-CMAC with a 16- or 24-byte key; 8 bytes.
    public static func tdesCMAC(key: [UInt8], _ data: [UInt8]) throws -> [UInt8] {
        guard key.count == 16 || key.count == 24 else {
            throw CryptoError("CMAC key", "unsupported key length \(key.count)")
        }
        return try mac("CMAC", parameter: "cipher",
                       value: key.count == 16 ? "DES-EDE-CBC" : "DES-EDE3-CBC", key: key, data: data)
    }

    /// HMAC with the given digest (SHA-256 by default).
    public static func hmac(key: [UInt8], _ data: [UInt8], digest: Digest.Algorithm = .sha256) throws -> [UInt8] {
        try mac("HMAC", parameter: "digest", value: digest.rawValue, key: key, data: data)
    }

    /// ANSI X9.19 retail MAC (ISO 9797-1 algorithm 3, padding method 1): single-DES CBC-MAC under
    /// the key's left half over the zero-padded data, the last block then decrypted under the right
    /// half and encrypted under the left. 8 bytes (callers often show the first 4).
    public static func retailMAC(key: [UInt8], _ data: [UInt8]) throws -> [UInt8] {
        guard key.count == 16 else { throw CryptoError("X9.19 key", "expected 16 bytes, got \(key.count)") }
        let left = Array(key[0..<8])
        let right = Array(key[8..<16])
        var padded = data
        if padded.isEmpty || padded.count % 8 != 0 {
            padded += [UInt8](repeating: 0, count: 8 - padded.count % 8)
        }
        let chained = try BlockCipher.tdes.encrypt(key: left + left + left, padded, mode: .cbc)
        let last = Array(chained.suffix(8))
        let stepped = try BlockCipher.desDecrypt(key: right, last)
        return try BlockCipher.desEncrypt(key: left, stepped)
    }

    private static func mac(_ name: String, parameter: String, value: String, key: [UInt8],
                            data: [UInt8]) throws -> [UInt8] {
        guard let algorithm = EVP_MAC_fetch(nil, name, nil) else { throw CryptoError("EVP_MAC_fetch \(name)") }
        defer { EVP_MAC_free(algorithm) }
        guard let ctx = EVP_MAC_CTX_new(algorithm) else { throw CryptoError("EVP_MAC_CTX_new") }
        defer { EVP_MAC_CTX_free(ctx) }
        let keyName = strdup(parameter)!
        let valueCopy = strdup(value)!
        defer { free(keyName); free(valueCopy) }
        var params = [OSSL_PARAM_construct_utf8_string(keyName, valueCopy, 0), OSSL_PARAM_construct_end()]
        let initialised = key.withUnsafeBufferPointer { k in
            params.withUnsafeMutableBufferPointer { p in
                EVP_MAC_init(ctx, k.baseAddress, k.count, p.baseAddress)
            }
        }
        guard initialised == 1 else { throw CryptoError("\(name) init") }
        let updated = data.withUnsafeBufferPointer { EVP_MAC_update(ctx, $0.baseAddress, $0.count) }
        guard updated == 1 else { throw CryptoError("\(name) update") }
        var out = [UInt8](repeating: 0, count: 64)
        var length = 0
        guard EVP_MAC_final(ctx, &out, &length, out.count) == 1 else { throw CryptoError("\(name) final") }
        return Array(out[0..<length])
    }
}

/// Randomness, comparison and erasure through OpenSSL.
public enum SecureBytes {
    /// `count` bytes from OpenSSL's CSPRNG (`RAND_bytes`).
    public static func random(_ count: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        guard count == 0 || RAND_bytes(&out, Int32(count)) == 1 else { throw CryptoError("RAND_bytes") }
        return out
    }

    /// Constant-time equality (`CRYPTO_memcmp`); different lengths are unequal.
    public static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return a.withUnsafeBytes { x in b.withUnsafeBytes { y in CRYPTO_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 } }
    }

    /// Zeroes `bytes` in place (`OPENSSL_cleanse`, which the compiler cannot elide).
    public static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { OPENSSL_cleanse(base, $0.count) } }
    }
}

@inline(__always) func wipe(_ bytes: inout [UInt8]) { SecureBytes.wipe(&bytes) }

/// Ed25519 signatures (RFC 8032) through `EVP_DigestSign`/`EVP_DigestVerify`.
public enum Ed25519 {
    /// The 32-byte public key of a 32-byte private key.
    public static func publicKey(privateKey: [UInt8]) throws -> [UInt8] {
        let pkey = try makePrivate(privateKey)
        defer { EVP_PKEY_free(pkey) }
        var out = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_get_raw_public_key(pkey, &out, &length) == 1, length == 32 else {
            throw CryptoError("Ed25519 public key")
        }
        return out
    }

    public static func sign(privateKey: [UInt8], _ message: [UInt8]) throws -> [UInt8] {
        let pkey = try makePrivate(privateKey)
        defer { EVP_PKEY_free(pkey) }
        guard let md = EVP_MD_CTX_new() else { throw CryptoError("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestSignInit(md, nil, nil, nil, pkey) == 1 else { throw CryptoError("Ed25519 sign init") }
        var signature = [UInt8](repeating: 0, count: 64)
        var length = 64
        // A zero-length message still needs a valid pointer.
        let buffer = message.isEmpty ? [UInt8(0)] : message
        let ok = buffer.withUnsafeBufferPointer { m in
            EVP_DigestSign(md, &signature, &length, m.baseAddress, message.count)
        }
        guard ok == 1, length == 64 else { throw CryptoError("Ed25519 sign") }
        return signature
    }

    /// True only for a valid signature of `message` under `publicKey`.
    public static func verify(publicKey: [UInt8], signature: [UInt8], _ message: [UInt8]) -> Bool {
        guard publicKey.count == 32, signature.count == 64,
              let pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, publicKey, 32) else {
            ERR_clear_error()
            return false
        }
        defer { EVP_PKEY_free(pkey) }
        guard let md = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestVerifyInit(md, nil, nil, nil, pkey) == 1 else { ERR_clear_error(); return false }
        let buffer = message.isEmpty ? [UInt8(0)] : message
        let ok = buffer.withUnsafeBufferPointer { m in
            EVP_DigestVerify(md, signature, 64, m.baseAddress, message.count)
        }
        ERR_clear_error()
        return ok == 1
    }

    private static func makePrivate(_ key: [UInt8]) throws -> OpaquePointer {
        guard key.count == 32 else { throw CryptoError("Ed25519 key", "expected 32 bytes, got \(key.count)") }
        guard let pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, key, 32) else {
            throw CryptoError("Ed25519 private key")
        }
        return pkey
    }
}

/// X25519 key agreement (RFC 7748) through `EVP_PKEY_derive`: the pairing of a host with a
/// reader.
public enum X25519 {
    /// The 32-byte public key of a 32-byte private key.
    public static func publicKey(privateKey: [UInt8]) throws -> [UInt8] {
        guard privateKey.count == 32, let pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, privateKey, 32) else {
            ERR_clear_error()
            throw CryptoError("X25519 private key", "expected 32 bytes, got \(privateKey.count)")
        }
        defer { EVP_PKEY_free(pkey) }
        var out = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_get_raw_public_key(pkey, &out, &length) == 1, length == 32 else { throw CryptoError("X25519 public key") }
        return out
    }

    /// The shared secret of our private key and the peer's public key; throws for a peer key
    /// that gives the all-zero secret (a small-order point).
    public static func sharedSecret(privateKey: [UInt8], peerPublicKey: [UInt8]) throws -> [UInt8] {
        guard privateKey.count == 32, let ours = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, privateKey, 32) else {
            ERR_clear_error()
            throw CryptoError("X25519 private key")
        }
        defer { EVP_PKEY_free(ours) }
        guard peerPublicKey.count == 32, let theirs = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nil, peerPublicKey, 32) else {
            ERR_clear_error()
            throw CryptoError("X25519 peer key", "expected 32 bytes, got \(peerPublicKey.count)")
        }
        defer { EVP_PKEY_free(theirs) }
        guard let ctx = EVP_PKEY_CTX_new(ours, nil) else { throw CryptoError("EVP_PKEY_CTX_new") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var secret = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_derive_init(ctx) == 1, EVP_PKEY_derive_set_peer(ctx, theirs) == 1,
              EVP_PKEY_derive(ctx, &secret, &length) == 1, length == 32 else {
            ERR_clear_error()
            throw CryptoError("X25519 derive", "the peer's key is not usable")
        }
        return secret
    }
}

/// Hex text ↔ bytes, as the payment protocols write keys and ciphertexts (upper case).
public enum Hex {
    public static func encode(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }

    /// Nil for odd lengths or non-hex characters (either case accepted).
    public static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(chars.count / 2)
        var i = 0
        while i < chars.count {
            guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }

    /// The value of one hex digit.
    public static func nibbleValue(_ c: UInt8) -> UInt8? { nibble(c) }

    static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case 48...57: return c - 48
        case 65...70: return c - 55
        case 97...102: return c - 87
        default: return nil
        }
    }
}
