import Crypto
import Foundation

/// The bytes both ends MAC (specification §4.10, changed; see docs/PAYMENTS.md): a tag naming
/// the message, then each field as its JSON type (one byte: `s` string, `i` integer, `b`
/// boolean, `-` absent or anything else), its length in UTF-8 bytes (4 bytes, big-endian) and
/// its bytes (decimal integers, `true`/`false`). The specification joins the fields with `|`,
/// which a field may itself contain, so two different messages could MAC the same string; and
/// without the type, `"SignatureRequired":"true"` would MAC like `true` while a reader of
/// `.bool` takes it for false. With lengths and types no two messages give the same bytes.
public enum GatewayCanonical {
    public static let authoriseFields = ["MerchantID", "TerminalID", "TransactionID", "AmountMinor", "CurrencyNumeric", "PaymentType",
                                         "EntryMode", "CVM", "KSN", "EncCardData", "EncPinBlock", "OriginalOperationID", "SessionToken"]

    public static func authorise(_ r: JSONValue) -> [UInt8] { encode("Authorise", r, authoriseFields) }

    public static func authoriseResult(_ r: JSONValue) -> [UInt8] {
        encode("AuthoriseResult", r, ["OperationID", "Result", "ResponseCode", "ApprovalCode", "AuthenticatedByPin", "SignatureRequired",
                                      "AmountMinor", "CurrencyNumeric", "KSN", "TransactionID"])
    }

    public static func reverse(_ r: JSONValue) -> [UInt8] { encode("Reverse", r, ["OperationID", "Reason", "KSN", "SessionToken"]) }

    public static func reverseResult(_ r: JSONValue) -> [UInt8] {
        encode("ReverseResult", r, ["OperationID", "Result", "Error", "ReversedAmountMinor", "KSN"])
    }

    /// `pppbridge-mac-v3`, the message's name, then the named fields of `r`, each typed and length-prefixed.
    public static func encode(_ message: String, _ r: JSONValue, _ names: [String]) -> [UInt8] {
        var out: [UInt8] = []
        func append(_ type: UInt8?, _ text: String) {
            if let type { out.append(type) }
            let bytes = Array(text.utf8)
            let n = UInt32(truncatingIfNeeded: bytes.count)
            out += [UInt8(truncatingIfNeeded: n >> 24), UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n)]
            out += bytes
        }
        append(nil, "pppbridge-mac-v3")
        append(nil, message)
        for name in names {
            switch r[name] {
            case .string(let s)?: append(UInt8(ascii: "s"), s)
            case .integer(let i)?: append(UInt8(ascii: "i"), String(i))
            case .bool(let b)?: append(UInt8(ascii: "b"), b ? "true" : "false")
            default: append(UInt8(ascii: "-"), "")
            }
        }
        return out
    }

    package static func field(_ r: JSONValue, _ name: String) -> String {
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
