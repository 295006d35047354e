import Crypto

/// The key types AES DUKPT (ANSI X9.24-3-2017) derives, with the algorithm and length codes of
/// its derivation data.
public enum DUKPTKeyType: Sendable, Equatable {
    case tdes2, tdes3, aes128, aes192, aes256, hmac128, hmac192, hmac256

    var algorithm: UInt16 {
        switch self {
        case .tdes2: return 0x0000
        case .tdes3: return 0x0001
        case .aes128: return 0x0002
        case .aes192: return 0x0003
        case .aes256: return 0x0004
        case .hmac128, .hmac192, .hmac256: return 0x0005
        }
    }

    public var bits: Int {
        switch self {
        case .tdes2, .aes128, .hmac128: return 128
        case .tdes3, .aes192, .hmac192: return 192
        case .aes256, .hmac256: return 256
        }
    }

    /// The AES key type of a key of `length` bytes (a BDK, an initial or a transaction key).
    public static func aes(length: Int) -> DUKPTKeyType? {
        switch length {
        case 16: return .aes128
        case 24: return .aes192
        case 32: return .aes256
        default: return nil
        }
    }
}

/// Key usages of X9.24-3's derivation data.
public enum DUKPTKeyUsage: UInt16, Sendable {
    case keyEncryption = 0x0002
    case pinEncryption = 0x1000
    case macGeneration = 0x2000
    case macVerification = 0x2001
    case macBoth = 0x2002
    case dataEncryption = 0x3000
    case dataDecryption = 0x3001
    case dataBoth = 0x3002
    case keyDerivation = 0x8000
    case initialKeyDerivation = 0x8001
}

public enum DUKPTError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformedKSN(Int)
    case invalidCounter(UInt32)
    case exhausted
    case keyLength(Int)

    public var description: String {
        switch self {
        case .malformedKSN(let n): return "KSN of \(n) bytes"
        case .invalidCounter(let c): return "transaction counter \(String(c, radix: 16, uppercase: true)) is not a valid DUKPT counter"
        case .exhausted: return "the device's transaction counters are exhausted"
        case .keyLength(let n): return "key of \(n) bytes"
        }
    }
}

/// A 12-byte AES DUKPT key serial number: initial key ID (BDK ID ‖ derivation ID) ‖ 32-bit counter.
public struct AESKSN: Sendable, Equatable, Hashable, CustomStringConvertible {
    public static let maximumCounter: UInt32 = 0xFFFF_0000
    public static let maximumOneBits = 16

    public var initialKeyID: [UInt8]
    public var counter: UInt32

    public init(initialKeyID: [UInt8], counter: UInt32) {
        precondition(initialKeyID.count == 8, "an AES DUKPT initial key ID is 8 bytes")
        self.initialKeyID = initialKeyID
        self.counter = counter
    }

    public init(bytes: [UInt8]) throws {
        guard bytes.count == 12 else { throw DUKPTError.malformedKSN(bytes.count) }
        initialKeyID = Array(bytes[0..<8])
        counter = bytes[8..<12].reduce(0) { $0 << 8 | UInt32($1) }
    }

    public init?(hex: String) {
        guard let bytes = Hex.decode(hex), let ksn = try? AESKSN(bytes: bytes) else { return nil }
        self = ksn
    }

    public var bytes: [UInt8] {
        initialKeyID + [UInt8(counter >> 24), UInt8(counter >> 16 & 0xFF), UInt8(counter >> 8 & 0xFF), UInt8(counter & 0xFF)]
    }

    public var bdkID: [UInt8] { Array(initialKeyID[0..<4]) }
    public var derivationID: [UInt8] { Array(initialKeyID[4..<8]) }
    public var description: String { Hex.encode(bytes) }

    /// A counter the derivation accepts: non-zero, at most 16 one-bits, at most `FFFF0000`.
    public static func isValid(counter: UInt32) -> Bool {
        counter != 0 && counter <= maximumCounter && counter.nonzeroBitCount <= maximumOneBits
    }

    /// The next valid counter after `counter` (`tc += 1`, then skip while more than 16 bits are
    /// set by adding the lowest set bit); nil once exhausted.
    public static func next(after counter: UInt32) -> UInt32? {
        var tc = UInt64(counter) + 1
        while tc.nonzeroBitCount > maximumOneBits { tc += tc & (~tc &+ 1) }
        guard tc <= UInt64(maximumCounter) else { return nil }
        return UInt32(tc)
    }
}

/// AES DUKPT (ANSI X9.24-3-2017): initial key from the BDK, the transaction key of a counter,
/// working keys for PIN, MAC and data. Every block operation is OpenSSL's AES-ECB.
public enum AESDUKPT {
    /// One block of derivation data.
    public static func derivationData(usage: DUKPTKeyUsage, keyType: DUKPTKeyType, data: [UInt8],
                                      blockCounter: UInt8 = 1) -> [UInt8] {
        precondition(data.count == 8)
        let bits = UInt16(keyType.bits)
        return [0x01, blockCounter,
                UInt8(usage.rawValue >> 8), UInt8(usage.rawValue & 0xFF),
                UInt8(keyType.algorithm >> 8), UInt8(keyType.algorithm & 0xFF),
                UInt8(bits >> 8), UInt8(bits & 0xFF)] + data
    }

    /// Derives a key of `keyType` from `key` (one AES block per 128 bits, truncated).
    public static func derive(key: [UInt8], usage: DUKPTKeyUsage, keyType: DUKPTKeyType,
                              data: [UInt8]) throws -> [UInt8] {
        guard DUKPTKeyType.aes(length: key.count) != nil else { throw DUKPTError.keyLength(key.count) }
        let length = keyType.bits / 8
        var out = [UInt8]()
        var counter: UInt8 = 1
        while out.count < length {
            let block = derivationData(usage: usage, keyType: keyType, data: data, blockCounter: counter)
            out += try BlockCipher.aes.encrypt(key: key, block)
            counter += 1
        }
        return Array(out.prefix(length))
    }

    /// The initial key of a device from the BDK and its 8-byte initial key ID.
    public static func initialKey(bdk: [UInt8], initialKeyID: [UInt8]) throws -> [UInt8] {
        guard let type = DUKPTKeyType.aes(length: bdk.count) else { throw DUKPTError.keyLength(bdk.count) }
        return try derive(key: bdk, usage: .initialKeyDerivation, keyType: type, data: initialKeyID)
    }

    /// The transaction key for `ksn` from the device's initial key.
    public static func transactionKey(initialKey: [UInt8], ksn: AESKSN) throws -> [UInt8] {
        guard AESKSN.isValid(counter: ksn.counter) else { throw DUKPTError.invalidCounter(ksn.counter) }
        guard let type = DUKPTKeyType.aes(length: initialKey.count) else { throw DUKPTError.keyLength(initialKey.count) }
        var key = initialKey
        var working: UInt32 = 0
        var bit: UInt32 = 1 << 31
        while bit != 0 {
            if ksn.counter & bit != 0 {
                working |= bit
                let next = try derive(key: key, usage: .keyDerivation, keyType: type,
                                      data: ksn.derivationID + bigEndian(working))
                SecureBytes.wipe(&key)
                key = next
            }
            bit >>= 1
        }
        return key
    }

    /// A working key of `usage` and `keyType` under the transaction key for `ksn`.
    public static func workingKey(transactionKey: [UInt8], usage: DUKPTKeyUsage, keyType: DUKPTKeyType,
                                  ksn: AESKSN) throws -> [UInt8] {
        try derive(key: transactionKey, usage: usage, keyType: keyType,
                   data: ksn.derivationID + bigEndian(ksn.counter))
    }

    static func bigEndian(_ v: UInt32) -> [UInt8] {
        [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)]
    }
}

/// A 10-byte TDES DUKPT key serial number (59-bit initial KSN ‖ 21-bit counter).
public struct TDESKSN: Sendable, Equatable, Hashable, CustomStringConvertible {
    public static let maximumCounter: UInt32 = 0x1F_F800
    public static let maximumOneBits = 10

    public private(set) var bytes: [UInt8]

    public init(bytes: [UInt8]) throws {
        guard bytes.count == 10 else { throw DUKPTError.malformedKSN(bytes.count) }
        self.bytes = bytes
    }

    public init?(hex: String) {
        guard let bytes = Hex.decode(hex), let ksn = try? TDESKSN(bytes: bytes) else { return nil }
        self = ksn
    }

    public var counter: UInt32 {
        get { (UInt32(bytes[7] & 0x1F) << 16) | (UInt32(bytes[8]) << 8) | UInt32(bytes[9]) }
        set {
            bytes[7] = bytes[7] & 0xE0 | UInt8(newValue >> 16 & 0x1F)
            bytes[8] = UInt8(newValue >> 8 & 0xFF)
            bytes[9] = UInt8(newValue & 0xFF)
        }
    }

    /// The same KSN with the counter cleared.
    public var initial: TDESKSN { var k = self; k.counter = 0; return k }
    /// Key set identifier: the first 5 bytes (selects the BDK).
    public var keySetID: [UInt8] { Array(bytes[0..<5]) }
    public var description: String { Hex.encode(bytes) }

    public static func isValid(counter: UInt32) -> Bool {
        counter != 0 && counter <= maximumCounter && counter.nonzeroBitCount <= maximumOneBits
    }

    public static func next(after counter: UInt32) -> UInt32? {
        var tc = counter + 1
        while tc.nonzeroBitCount > maximumOneBits { tc += tc & (~tc &+ 1) }
        guard tc <= maximumCounter else { return nil }
        return tc
    }
}

/// TDES DUKPT (ANSI X9.24-1-2009): IPEK, the non-reversible key generation process, variants and
/// the data keys' one-way function. DES and TDES come from OpenSSL.
public enum TDESDUKPT {
    static let keyMask: [UInt8] = [0xC0, 0xC0, 0xC0, 0xC0, 0, 0, 0, 0, 0xC0, 0xC0, 0xC0, 0xC0, 0, 0, 0, 0]

    public enum Variant: Sendable {
        case pin, macRequest, macResponse, dataRequest, dataResponse

        /// The byte of each key half that the variant sets to FF.
        var offset: Int {
            switch self {
            case .pin: return 7
            case .macRequest: return 6
            case .macResponse: return 4
            case .dataRequest: return 5
            case .dataResponse: return 3
            }
        }
    }

    public static func initialKey(bdk: [UInt8], ksn: TDESKSN) throws -> [UInt8] {
        guard bdk.count == 16 else { throw DUKPTError.keyLength(bdk.count) }
        let data = Array(ksn.initial.bytes[0..<8])
        let left = try BlockCipher.tdes.encrypt(key: bdk, data)
        let right = try BlockCipher.tdes.encrypt(key: xor(bdk, keyMask), data)
        return left + right
    }

    public static func transactionKey(initialKey: [UInt8], ksn: TDESKSN) throws -> [UInt8] {
        guard initialKey.count == 16 else { throw DUKPTError.keyLength(initialKey.count) }
        let counter = ksn.counter
        guard TDESKSN.isValid(counter: counter) else { throw DUKPTError.invalidCounter(counter) }
        var register = Array(ksn.initial.bytes[2..<10])
        var key = initialKey
        var bit: UInt32 = 1 << 20
        while bit != 0 {
            if counter & bit != 0 {
                register[5] |= UInt8(bit >> 16 & 0x1F)
                register[6] |= UInt8(bit >> 8 & 0xFF)
                register[7] |= UInt8(bit & 0xFF)
                let next = try generate(key: key, register: register)
                SecureBytes.wipe(&key)
                key = next
            }
            bit >>= 1
        }
        return key
    }

    /// The non-reversible key generation process of X9.24-1 A.2.
    static func generate(key: [UInt8], register: [UInt8]) throws -> [UInt8] {
        func half(_ k: [UInt8]) throws -> [UInt8] {
            let kl = Array(k[0..<8]), kr = Array(k[8..<16])
            return xor(try BlockCipher.desEncrypt(key: kl, xor(register, kr)), kr)
        }
        return try half(xor(key, keyMask)) + half(key)
    }

    /// The transaction key with a variant applied; data variants also pass the one-way function
    /// (each half TDES-encrypted under the whole variant key).
    public static func workingKey(transactionKey: [UInt8], variant: Variant) throws -> [UInt8] {
        var key = transactionKey
        key[variant.offset] ^= 0xFF
        key[variant.offset + 8] ^= 0xFF
        switch variant {
        case .pin, .macRequest, .macResponse:
            return key
        case .dataRequest, .dataResponse:
            defer { SecureBytes.wipe(&key) }
            return try BlockCipher.tdes.encrypt(key: key, key)
        }
    }
}

func xor(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
    precondition(a.count == b.count)
    return zip(a, b).map { $0 ^ $1 }
}
