import Crypto
import Foundation

/// The strings both ends MAC (specification §4.10): `v1|` and the fields joined by `|`, upper-case
/// hex, decimal amounts, empty strings for absent fields, booleans as `true`/`false`.
public enum GatewayCanonical {
    public static func authorise(_ r: JSONValue) -> String {
        "v1|" + ["MerchantID", "TerminalID", "TransactionID", "AmountMinor", "CurrencyNumeric", "PaymentType",
                 "EntryMode", "CVM", "KSN", "EncCardData", "EncPinBlock", "OriginalOperationID"].map { field(r, $0) }.joined(separator: "|")
    }

    public static func authoriseResult(_ r: JSONValue) -> String {
        "v1|" + ["OperationID", "Result", "ResponseCode", "ApprovalCode", "AuthenticatedByPin", "SignatureRequired",
                 "AmountMinor", "CurrencyNumeric", "KSN", "TransactionID"].map { field(r, $0) }.joined(separator: "|")
    }

    public static func reverse(_ r: JSONValue) -> String {
        "v1|REV|" + ["OperationID", "Reason", "KSN"].map { field(r, $0) }.joined(separator: "|")
    }

    public static func reverseResult(_ r: JSONValue) -> String {
        "v1|REVR|" + ["OperationID", "Result", "ReversedAmountMinor", "KSN"].map { field(r, $0) }.joined(separator: "|")
    }

    static func field(_ r: JSONValue, _ name: String) -> String {
        switch r[name] {
        case .string(let s)?: return s
        case .integer(let i)?: return String(i)
        case .bool(let b)?: return b ? "true" : "false"
        default: return ""
        }
    }
}

/// Base64 through Foundation.
public enum Base64 {
    public static func encode(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }
    public static func decode(_ text: String) -> [UInt8]? { Data(base64Encoded: text).map { [UInt8]($0) } }
}

/// The software update the gateway offers, and the string its Ed25519 signature covers.
public struct UpdateOffer: Sendable, Equatable {
    public var version: String
    public var requiredAt: WallTime?
    public var durationEstimate: String
    public var size: Int
    public var sha256: String
    public var signature: String

    public init(version: String, requiredAt: WallTime?, durationEstimate: String = "lessThanOneMinute", size: Int, sha256: String, signature: String) {
        self.version = version
        self.requiredAt = requiredAt
        self.durationEstimate = durationEstimate
        self.size = size
        self.sha256 = sha256
        self.signature = signature
    }

    public static func signedString(version: String, sha256: String, size: Int, requiredAt: WallTime?) -> String {
        "v1|\(version)|\(sha256)|\(size)|\(requiredAt?.description ?? "")"
    }

    public var signedString: String { UpdateOffer.signedString(version: version, sha256: sha256, size: size, requiredAt: requiredAt) }

    public var json: JSONValue {
        ["Version": .string(version), "RequiredAt": requiredAt.map { .string($0.description) } ?? .null,
         "DurationEstimate": .string(durationEstimate), "Components": ["Firmware"], "Size": .integer(Int64(size)),
         "SHA256": .string(sha256), "Signature": .string(signature)]
    }

    public init?(json: JSONValue?) {
        guard let json, let v = json["Version"]?.string, let size = json["Size"]?.integer, let sha = json["SHA256"]?.string,
              let sig = json["Signature"]?.string else { return nil }
        // The version is shown and repeated to the host: dotted digits, short; the size whole.
        // Every field is shown or repeated to the host (the login answer carries the offer):
        // only their own forms, so none can carry text of the gateway's choosing.
        let duration = json["DurationEstimate"]?.string ?? "lessThanOneMinute"
        guard UpdateOffer.isVersion(v), size >= 0, sha.utf8.count == 64, Hex.decode(sha) != nil, sig.utf8.count == 128, Hex.decode(sig) != nil,
              (1...32).contains(duration.utf8.count), duration.utf8.allSatisfy({ PaymentRules.isLetter($0) }) else { return nil }
        version = v
        self.size = Int(size)
        sha256 = sha
        signature = sig
        durationEstimate = duration
        requiredAt = json["RequiredAt"]?.string.flatMap { WallTime(rfc3339: $0) }
    }

    /// A software version: dotted digits ("1.10.0"), at most 32 bytes.
    public static func isVersion(_ v: String) -> Bool {
        (1...32).contains(v.utf8.count) && v.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E }
    }

    /// Whether `image` is this update: its size, its SHA-256, and the signature under `publicKey`.
    public func verify(image: [UInt8], publicKey: [UInt8]) -> Bool {
        guard image.count == size, let digest = Digest.hash(.sha256, image), Hex.encode(digest) == sha256.uppercased(),
              let sig = Hex.decode(signature) else { return false }
        return Ed25519.verify(publicKey: publicKey, signature: sig, Array(signedString.utf8))
    }

    public func isRequired(at now: WallTime) -> Bool { requiredAt.map { $0 <= now } ?? false }
}

/// Signature image formats (1 BMP, 2 JPG, 3 TIF, 4 GIF) told apart by their magic bytes.
public enum SignatureImage {
    public static let maximumSize = 256 * 1024

    public static func isValid(_ image: [UInt8], format: Int) -> Bool {
        guard (1...maximumSize).contains(image.count) else { return false }
        func starts(_ magic: [UInt8]) -> Bool { image.count >= magic.count && Array(image.prefix(magic.count)) == magic }
        switch format {
        case 1: return starts([0x42, 0x4D])
        case 2: return starts([0xFF, 0xD8, 0xFF])
        case 3: return starts([0x49, 0x49, 0x2A, 0x00]) || starts([0x4D, 0x4D, 0x00, 0x2A])
        case 4: return starts(Array("GIF87a".utf8)) || starts(Array("GIF89a".utf8))
        default: return false
        }
    }
}
