import Crypto

public enum PINBlockError: Error, Equatable, Sendable, CustomStringConvertible {
    case invalidPIN
    case invalidPAN
    case malformedBlock

    public var description: String {
        switch self {
        case .invalidPIN: return "a PIN is 4 to 12 decimal digits"
        case .invalidPAN: return "a PAN is 12 to 19 decimal digits"
        case .malformedBlock: return "the PIN block does not decode under this PAN and key"
        }
    }
}

/// ISO 9564-1 PIN blocks: format 0 (TDES, 8 bytes) and format 4 (AES, 16 bytes).
public enum PINBlock {
    static func digits(_ text: String, _ range: ClosedRange<Int>, _ error: PINBlockError) throws -> [UInt8] {
        let d = Array(text.utf8)
        guard range.contains(d.count), d.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { throw error }
        return d.map { $0 - 48 }
    }

    static func pack(_ nibbles: [UInt8]) -> [UInt8] {
        stride(from: 0, to: nibbles.count, by: 2).map { nibbles[$0] << 4 | nibbles[$0 + 1] }
    }

    static func unpack(_ bytes: [UInt8]) -> [UInt8] {
        bytes.flatMap { [$0 >> 4, $0 & 0x0F] }
    }

    // MARK: Format 0

    /// The clear format-0 block: `0 N PIN F…F` XOR `0000` ‖ the 12 rightmost PAN digits before
    /// the check digit.
    public static func format0(pin: String, pan: String) throws -> [UInt8] {
        let p = try digits(pin, 4...12, .invalidPIN)
        let pinField = pack([0, UInt8(p.count)] + p + [UInt8](repeating: 0xF, count: 14 - p.count))
        return xor(pinField, try format0PANField(pan))
    }

    static func format0PANField(_ pan: String) throws -> [UInt8] {
        let a = try digits(pan, 12...19, .invalidPAN)
        return pack([0, 0, 0, 0] + Array(a.dropLast().suffix(12)))
    }

    /// The PIN of a clear format-0 block.
    public static func decodeFormat0(_ block: [UInt8], pan: String) throws -> String {
        guard block.count == 8 else { throw PINBlockError.malformedBlock }
        let field = unpack(xor(block, try format0PANField(pan)))
        let n = Int(field[1])
        guard field[0] == 0, (4...12).contains(n),
              field[2..<(2 + n)].allSatisfy({ $0 <= 9 }),
              field[(2 + n)...].allSatisfy({ $0 == 0xF }) else { throw PINBlockError.malformedBlock }
        return String(decoding: field[2..<(2 + n)].map { $0 + 48 }, as: UTF8.self)
    }

    // MARK: Format 4

    /// The format-4 PIN field: `4 N PIN A…A` to 16 nibbles ‖ 8 random bytes.
    public static func format4PINField(pin: String, random: [UInt8]) throws -> [UInt8] {
        precondition(random.count == 8, "format 4 takes 8 random bytes")
        let p = try digits(pin, 4...12, .invalidPIN)
        return pack([4, UInt8(p.count)] + p + [UInt8](repeating: 0xA, count: 14 - p.count)) + random
    }

    /// The format-4 PAN field: M (= length − 12) ‖ the PAN (left-padded to 12) ‖ zeros to 32 nibbles.
    public static func format4PANField(pan: String) throws -> [UInt8] {
        let a = try digits(pan, 12...19, .invalidPAN)
        let field = [UInt8(a.count - 12)] + a
        return pack(field + [UInt8](repeating: 0, count: 32 - field.count))
    }

    /// `C = E(K, E(K, PIN field) ⊕ PAN field)` with AES under `key`. `random` defaults to 8
    /// bytes from OpenSSL's generator.
    public static func encipherFormat4(pin: String, pan: String, key: [UInt8], random: [UInt8]? = nil) throws -> [UInt8] {
        var pinField = try format4PINField(pin: pin, random: try random ?? SecureBytes.random(8))
        defer { SecureBytes.wipe(&pinField) }
        let panField = try format4PANField(pan: pan)
        var first = try BlockCipher.aes.encrypt(key: key, pinField)
        defer { SecureBytes.wipe(&first) }
        return try BlockCipher.aes.encrypt(key: key, xor(first, panField))
    }

    /// `PIN field = D(K, D(K, C) ⊕ PAN field)`, then the PIN it carries.
    public static func decipherFormat4(_ block: [UInt8], pan: String, key: [UInt8]) throws -> String {
        guard block.count == 16 else { throw PINBlockError.malformedBlock }
        let panField = try format4PANField(pan: pan)
        let intermediate = try BlockCipher.aes.decrypt(key: key, block)
        var pinField = try BlockCipher.aes.decrypt(key: key, xor(intermediate, panField))
        defer { SecureBytes.wipe(&pinField) }
        let nibbles = unpack(Array(pinField[0..<8]))
        let n = Int(nibbles[1])
        guard nibbles[0] == 4, (4...12).contains(n),
              nibbles[2..<(2 + n)].allSatisfy({ $0 <= 9 }),
              nibbles[(2 + n)...].allSatisfy({ $0 == 0xA }) else { throw PINBlockError.malformedBlock }
        return String(decoding: nibbles[2..<(2 + n)].map { $0 + 48 }, as: UTF8.self)
    }
}
