import Crypto

public enum TR31Error: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsupportedVersion(String)
    case kbpkLength(Int)
    case macMismatch

    public var description: String {
        switch self {
        case .malformed(let why): return "malformed key block: \(why)"
        case .unsupportedVersion(let v): return "key block version \(v) is not supported"
        case .kbpkLength(let n): return "a key block protection key of \(n) bytes does not fit this version"
        case .macMismatch: return "key block MAC does not verify (wrong KBPK or altered block)"
        }
    }
}

/// The clear header of an ANSI X9.143 / TR-31 key block.
public struct TR31Header: Sendable, Equatable {
    public struct OptionalBlock: Sendable, Equatable {
        public var id: String
        public var data: String
        public init(id: String, data: String) { self.id = id; self.data = data }
    }

    public var version: String
    public var keyUsage: String
    public var algorithm: String
    public var modeOfUse: String
    public var keyVersion: String
    public var exportability: String
    public var optionalBlocks: [OptionalBlock]

    public init(version: String = "D", keyUsage: String, algorithm: String, modeOfUse: String,
                keyVersion: String = "00", exportability: String = "N", optionalBlocks: [OptionalBlock] = []) {
        self.version = version
        self.keyUsage = keyUsage
        self.algorithm = algorithm
        self.modeOfUse = modeOfUse
        self.keyVersion = keyVersion
        self.exportability = exportability
        self.optionalBlocks = optionalBlocks
    }

    public func optionalBlock(_ id: String) -> String? { optionalBlocks.first { $0.id == id }?.data }

    /// The header text for a block of `totalLength` characters.
    func text(totalLength: Int) -> String {
        var s = version + pad(totalLength, 4) + keyUsage + algorithm + modeOfUse + keyVersion + exportability
        s += pad(optionalBlocks.count, 2) + "00"
        for block in optionalBlocks {
            s += block.id + hex2(block.data.utf8.count + 4) + block.data
        }
        return s
    }

    var textLength: Int { 16 + optionalBlocks.reduce(0) { $0 + 4 + $1.data.utf8.count } }

    private func pad(_ n: Int, _ width: Int) -> String {
        let s = String(n)
        return String(repeating: "0", count: max(0, width - s.count)) + s
    }

    private func hex2(_ n: Int) -> String { let s = String(n, radix: 16, uppercase: true); return s.count < 2 ? "0" + s : s }
}

/// TR-31 key blocks: unwrap versions A and C (key variant binding, TDES), B (TDES-CMAC derived
/// keys) and D (AES-CMAC derived keys); wrap version D. All MACs and ciphers are OpenSSL's.
public enum TR31 {
    public static func parseHeader(_ block: String) throws -> (header: TR31Header, length: Int) {
        let c = Array(block.utf8)
        guard c.count >= 16, c.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { throw TR31Error.malformed("shorter than a header") }
        func s(_ a: Int, _ b: Int) -> String { String(decoding: c[a..<b], as: UTF8.self) }
        // Numeric fields are digits only (ANSI X9.143 §6.2): `Int` alone would take a sign, and a
        // count of "-1" would make an empty range of blocks trap.
        func number(_ a: Int, _ b: Int, radix: Int = 10) -> Int? {
            guard c[a..<b].allSatisfy({ Hex.nibbleValue($0).map { Int($0) < radix } ?? false }) else { return nil }
            return Int(s(a, b), radix: radix)
        }
        guard let total = number(1, 5), total == c.count else { throw TR31Error.malformed("length field does not match") }
        guard let count = number(12, 14) else { throw TR31Error.malformed("optional block count") }
        var blocks = [TR31Header.OptionalBlock]()
        var at = 16
        for _ in 0..<count {
            guard at + 4 <= c.count, let length = number(at + 2, at + 4, radix: 16), length >= 4,
                  at + length <= c.count else { throw TR31Error.malformed("optional block") }
            blocks.append(.init(id: s(at, at + 2), data: s(at + 4, at + length)))
            at += length
        }
        let header = TR31Header(version: s(0, 1), keyUsage: s(5, 7), algorithm: s(7, 8), modeOfUse: s(8, 9),
                                keyVersion: s(9, 11), exportability: s(11, 12), optionalBlocks: blocks)
        return (header, at)
    }

    /// The clear key of `block` under the key block protection key.
    public static func unwrap(_ block: String, kbpk: [UInt8]) throws -> (header: TR31Header, key: [UInt8]) {
        let (header, headerLength) = try parseHeader(block)
        let chars = Array(block.utf8)
        let headerText = Array(chars[0..<headerLength])
        let macLength: Int
        switch header.version {
        case "A", "C": macLength = 4
        case "B": macLength = 8
        case "D": macLength = 16
        default: throw TR31Error.unsupportedVersion(header.version)
        }
        let body = String(decoding: chars[headerLength...], as: UTF8.self)
        guard let bytes = Hex.decode(body), bytes.count > macLength else { throw TR31Error.malformed("key data is not hex") }
        let encrypted = Array(bytes.dropLast(macLength))
        let mac = Array(bytes.suffix(macLength))
        var clear: [UInt8]
        switch header.version {
        case "A", "C":
            guard [16, 24].contains(kbpk.count) else { throw TR31Error.kbpkLength(kbpk.count) }
            guard encrypted.count % 8 == 0 else { throw TR31Error.malformed("key data length") }
            let kbek = kbpk.map { $0 ^ 0x45 }, kbak = kbpk.map { $0 ^ 0x4D }
            let chained = try BlockCipher.tdes.encrypt(key: kbak, headerText + encrypted, mode: .cbc)
            guard SecureBytes.equal(Array(chained.suffix(8).prefix(4)), mac) else { throw TR31Error.macMismatch }
            clear = try BlockCipher.tdes.decrypt(key: kbek, encrypted, mode: .cbc, iv: Array(headerText[0..<8]))
        case "B":
            guard [16, 24].contains(kbpk.count) else { throw TR31Error.kbpkLength(kbpk.count) }
            guard encrypted.count % 8 == 0 else { throw TR31Error.malformed("key data length") }
            let (kbek, kbak) = try deriveB(kbpk)
            clear = try BlockCipher.tdes.decrypt(key: kbek, encrypted, mode: .cbc, iv: mac)
            guard SecureBytes.equal(try MessageAuthentication.tdesCMAC(key: kbak, headerText + clear), mac) else {
                SecureBytes.wipe(&clear)
                throw TR31Error.macMismatch
            }
        default:
            guard [16, 24, 32].contains(kbpk.count) else { throw TR31Error.kbpkLength(kbpk.count) }
            guard encrypted.count % 16 == 0 else { throw TR31Error.malformed("key data length") }
            let (kbek, kbak) = try deriveD(kbpk)
            clear = try BlockCipher.aes.decrypt(key: kbek, encrypted, mode: .cbc, iv: mac)
            guard SecureBytes.equal(try MessageAuthentication.aesCMAC(key: kbak, headerText + clear), mac) else {
                SecureBytes.wipe(&clear)
                throw TR31Error.macMismatch
            }
        }
        defer { SecureBytes.wipe(&clear) }
        let bits = Int(clear[0]) << 8 | Int(clear[1])
        guard bits % 8 == 0, bits > 0, 2 + bits / 8 <= clear.count else { throw TR31Error.malformed("key length") }
        return (header, Array(clear[2..<(2 + bits / 8)]))
    }

    /// A version-D block carrying `key` under an AES `kbpk`; `padding` (random by default) fills
    /// the key data to whole AES blocks.
    public static func wrapD(header: TR31Header, key: [UInt8], kbpk: [UInt8], padding: [UInt8]? = nil) throws -> String {
        guard [16, 24, 32].contains(kbpk.count) else { throw TR31Error.kbpkLength(kbpk.count) }
        var h = header
        h.version = "D"
        let padLength = (16 - (2 + key.count) % 16) % 16
        let pad = try padding ?? SecureBytes.random(padLength)
        guard pad.count == padLength else { throw TR31Error.malformed("padding of \(pad.count) bytes, need \(padLength)") }
        var clear = [UInt8(key.count * 8 >> 8), UInt8(key.count * 8 & 0xFF)] + key + pad
        defer { SecureBytes.wipe(&clear) }
        let total = h.textLength + 2 * (clear.count + 16)
        let text = h.text(totalLength: total)
        let (kbek, kbak) = try deriveD(kbpk)
        let mac = try MessageAuthentication.aesCMAC(key: kbak, Array(text.utf8) + clear)
        let encrypted = try BlockCipher.aes.encrypt(key: kbek, clear, mode: .cbc, iv: mac)
        return text + Hex.encode(encrypted) + Hex.encode(mac)
    }

    /// KBEK and KBAK by CMAC under the KBPK over `counter ‖ usage ‖ 00 ‖ algorithm ‖ bits`
    /// (usage 0000 encryption, 0001 authentication), one CMAC block per counter, truncated to
    /// the KBPK's length.
    static func derive(_ kbpk: [UInt8], algorithm: [UInt8], bits: [UInt8], blockSize: Int,
                       cmac: ([UInt8], [UInt8]) throws -> [UInt8]) throws -> ([UInt8], [UInt8]) {
        var kbek = [UInt8](), kbak = [UInt8]()
        for counter in 1...((kbpk.count + blockSize - 1) / blockSize) {
            kbek += try cmac(kbpk, [UInt8(counter), 0, 0, 0] + algorithm + bits)
            kbak += try cmac(kbpk, [UInt8(counter), 0, 1, 0] + algorithm + bits)
        }
        return (Array(kbek.prefix(kbpk.count)), Array(kbak.prefix(kbpk.count)))
    }

    static func deriveB(_ kbpk: [UInt8]) throws -> ([UInt8], [UInt8]) {
        try derive(kbpk, algorithm: kbpk.count == 16 ? [0, 0] : [0, 1], bits: kbpk.count == 16 ? [0, 0x80] : [0, 0xC0],
                   blockSize: 8, cmac: { try MessageAuthentication.tdesCMAC(key: $0, $1) })
    }

    static func deriveD(_ kbpk: [UInt8]) throws -> ([UInt8], [UInt8]) {
        let algorithm: [UInt8], bits: [UInt8]
        switch kbpk.count {
        case 16: algorithm = [0, 2]; bits = [0, 0x80]
        case 24: algorithm = [0, 3]; bits = [0, 0xC0]
        default: algorithm = [0, 4]; bits = [1, 0]
        }
        return try derive(kbpk, algorithm: algorithm, bits: bits, blockSize: 16, cmac: { try MessageAuthentication.aesCMAC(key: $0, $1) })
    }
}
