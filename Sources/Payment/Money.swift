import Wire

/// ISO 4217 currencies the payment layer knows, with their minor-unit exponents.
public struct Currency: Sendable, Equatable, Hashable, CustomStringConvertible {
    public let code: String
    public let numeric: String
    public let exponent: Int

    public static let eur = Currency(code: "EUR", numeric: "978", exponent: 2)
    public static let usd = Currency(code: "USD", numeric: "840", exponent: 2)
    public static let gbp = Currency(code: "GBP", numeric: "826", exponent: 2)
    public static let jpy = Currency(code: "JPY", numeric: "392", exponent: 0)
    public static let kwd = Currency(code: "KWD", numeric: "414", exponent: 3)
    public static let known: [Currency] = [.eur, .usd, .gbp, .jpy, .kwd]

    public static func named(_ code: String) -> Currency? { known.first { $0.code == code.uppercased() } }
    public static func numeric(_ numeric: String) -> Currency? { known.first { $0.numeric == numeric } }

    public var description: String { code }

    /// `minor` as decimal text in this currency ("10.50", "1050", "1.250").
    public func format(_ minor: Int64) -> String {
        guard exponent > 0 else { return String(minor) }
        let sign = minor < 0 ? "-" : ""
        let digits = String(minor.magnitude)
        let padded = String(repeating: "0", count: max(0, exponent + 1 - digits.count)) + digits
        return sign + padded.dropLast(exponent) + "." + padded.suffix(exponent)
    }

    /// Exact decimal text → minor units: at most `exponent` fraction digits, no sign, no
    /// exponent notation, nothing through floating point. "10.5" EUR → 1050; "10.505" EUR fails.
    public func parse(_ text: String) -> Int64? {
        let parts = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        let whole = parts[0], fraction = parts.count > 1 ? parts[1] : ""
        guard !whole.isEmpty, whole.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
              fraction.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
              fraction.count <= exponent, parts.count == 1 || !fraction.isEmpty,
              whole.count <= 15 else { return nil }
        let scaled = String(whole) + fraction + String(repeating: "0", count: exponent - fraction.count)
        return Int64(scaled)
    }
}

/// The payment layer's error codes (specification §4.8), shared by the SDK, the terminal and
/// the gateway.
public enum PaymentErrorCode: Int, Sendable, Error, CaseIterable, CustomStringConvertible {
    case bluetoothDisabled = 1001, discoveryTimedOut = 1002, readerNotFound = 1004
    case invalidLocationId = 1101, connectTimedOut = 1102, pppNegotiationFailed = 1103
    case unsupportedReaderVersion = 1104, readerLoginFailed = 1105
    case pairingRequired = 1201, pairingRejected = 1202, pairingLost = 1203
    case connectionLost = 1301, reconnectCanceled = 1302, reconnectTimeout = 1303
    case busy = 2001, notConnected = 2002, notLoggedIn = 2003, canceled = 2004, invalidAmount = 2005
    case unsupportedCurrency = 2006, invalidTransactionID = 2007, invalidSignatureImage = 2008
    case updateCanceled = 2009, updateIntegrity = 2010, messageFormat = 2012
    case declined = 3001, wrongPIN = 3002, gatewayUnreachable = 3003, licenceInvalid = 3004
    case loginFailed = 3005, environmentMismatch = 3006, refundExceedsOriginal = 3007
    case originalNotFound = 3008, submissionDeclined = 3009, unknownOutcome = 3010
    case macVerificationFailed = 4001, replayDetected = 4002, unknownKeyID = 4003, ksnExhausted = 4004
    case decryptFailed = 4005, responseMacInvalid = 4006

    public var description: String { "\(rawValue) \(name)" }

    public var name: String {
        switch self {
        case .bluetoothDisabled: return "bluetoothDisabled"
        case .discoveryTimedOut: return "discoveryTimedOut"
        case .readerNotFound: return "readerNotFound"
        case .invalidLocationId: return "invalidLocationId"
        case .connectTimedOut: return "connectTimedOut"
        case .pppNegotiationFailed: return "pppNegotiationFailed"
        case .unsupportedReaderVersion: return "unsupportedReaderVersion"
        case .readerLoginFailed: return "readerLoginFailed"
        case .pairingRequired: return "pairingRequired"
        case .pairingRejected: return "pairingRejected"
        case .pairingLost: return "pairingLost"
        case .connectionLost: return "connectionLost"
        case .reconnectCanceled: return "reconnectCanceled"
        case .reconnectTimeout: return "reconnectTimeout"
        case .busy: return "busy"
        case .notConnected: return "notConnected"
        case .notLoggedIn: return "notLoggedIn"
        case .canceled: return "canceled"
        case .invalidAmount: return "invalidAmount"
        case .unsupportedCurrency: return "unsupportedCurrency"
        case .invalidTransactionID: return "invalidTransactionID"
        case .invalidSignatureImage: return "invalidSignatureImage"
        case .updateCanceled: return "updateCanceled"
        case .updateIntegrity: return "updateIntegrity"
        case .messageFormat: return "messageFormat"
        case .declined: return "declined"
        case .wrongPIN: return "wrongPIN"
        case .gatewayUnreachable: return "gatewayUnreachable"
        case .licenceInvalid: return "licenceInvalid"
        case .loginFailed: return "loginFailed"
        case .environmentMismatch: return "environmentMismatch"
        case .refundExceedsOriginal: return "refundExceedsOriginal"
        case .originalNotFound: return "originalNotFound"
        case .submissionDeclined: return "submissionDeclined"
        case .unknownOutcome: return "unknownOutcome"
        case .macVerificationFailed: return "macVerificationFailed"
        case .replayDetected: return "replayDetected"
        case .unknownKeyID: return "unknownKeyID"
        case .ksnExhausted: return "ksnExhausted"
        case .decryptFailed: return "decryptFailed"
        case .responseMacInvalid: return "responseMacInvalid"
        }
    }
}

/// Wall-clock time in whole seconds since 1970 (UTC), written as RFC 3339 `YYYY-MM-DDTHH:MM:SSZ`.
/// The protocol cores take it as an input.
public struct WallTime: Sendable, Equatable, Comparable, Hashable, CustomStringConvertible {
    public var seconds: Int64
    public init(seconds: Int64) { self.seconds = seconds }
    public static func < (a: WallTime, b: WallTime) -> Bool { a.seconds < b.seconds }
    public func adding(_ s: Int64) -> WallTime { WallTime(seconds: seconds + s) }

    /// Days since the epoch → civil date (H. Hinnant's algorithm).
    static func civil(_ days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), m, d)
    }

    static func days(_ y: Int64, _ m: Int64, _ d: Int64) -> Int64 {
        let y2 = m <= 2 ? y - 1 : y
        let era = (y2 >= 0 ? y2 : y2 - 399) / 400
        let yoe = y2 - era * 400
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    public var description: String {
        let days = seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400
        let rest = seconds - days * 86400
        let (y, m, d) = WallTime.civil(days)
        func two(_ v: Int64) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(y)-\(two(m))-\(two(d))T\(two(rest / 3600)):\(two(rest / 60 % 60)):\(two(rest % 60))Z"
    }

    /// The calendar day, for "unique per day" rules.
    public var day: String { String(description.prefix(10)) }
    /// YYMM, for card expiry checks.
    public var yymm: String {
        let s = description
        return String(s.dropFirst(2).prefix(2)) + String(s.dropFirst(5).prefix(2))
    }

    public init?(rfc3339 text: String) {
        let c = Array(text.utf8)
        guard c.count == 20, c[4] == 45, c[7] == 45, c[10] == 84, c[13] == 58, c[16] == 58, c[19] == 90 else { return nil }
        func n(_ a: Int, _ b: Int) -> Int64? {
            guard c[a..<b].allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
            return Int64(String(decoding: c[a..<b], as: UTF8.self))
        }
        guard let y = n(0, 4), let mo = n(5, 7), let d = n(8, 10), let h = n(11, 13), let mi = n(14, 16), let s = n(17, 19),
              (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, s < 60 else { return nil }
        seconds = WallTime.days(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
    }
}

/// The real time a sans-IO core derives from its monotonic `Instant`s: `WallTime` `anchor` was
/// the time at `instant`; moving the anchor sets the clock (or follows the system's).
public struct WallClock: Sendable, Equatable {
    public var instant: Instant
    public var anchor: WallTime

    public init(_ anchor: WallTime, at instant: Instant) {
        self.anchor = anchor
        self.instant = instant
    }

    public func at(_ now: Instant) -> WallTime {
        WallTime(seconds: anchor.seconds + (now - instant).components.seconds)
    }
}

/// Card data as the terminal reads it, and what may be shown of it.
public struct CardData: Sendable, Equatable {
    public var pan: String
    public var expiry: String   // YYMM
    public var serviceCode: String

    public init(pan: String, expiry: String, serviceCode: String = "201") {
        self.pan = pan
        self.expiry = expiry
        self.serviceCode = serviceCode
    }

    /// Track-2 equivalent data: `PAN=YYMM` ‖ service code ‖ discretionary data.
    public var track2: String { "\(pan)=\(expiry)\(serviceCode)1000000000000" }

    public init?(track2: String) {
        let parts = track2.split(separator: "=", maxSplits: 1)
        guard parts.count == 2, parts[1].count >= 7 else { return nil }
        pan = String(parts[0])
        expiry = String(parts[1].prefix(4))
        serviceCode = String(parts[1].dropFirst(4).prefix(3))
        guard CardData.isValidPAN(pan), expiry.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
    }

    /// 12–19 digits with a correct Luhn check digit.
    public static func isValidPAN(_ pan: String) -> Bool {
        let d = pan.utf8.map { Int($0) - 48 }
        guard (12...19).contains(d.count), d.allSatisfy({ (0...9).contains($0) }) else { return false }
        var sum = 0
        for (i, v) in d.reversed().enumerated() {
            if i % 2 == 1 { let w = v * 2; sum += w > 9 ? w - 9 : w } else { sum += v }
        }
        return sum % 10 == 0
    }

    /// First six and last four digits, the rest masked: `411111******1111`.
    public static func mask(_ pan: String) -> String {
        guard pan.count > 10 else { return String(repeating: "*", count: pan.count) }
        return String(pan.prefix(6)) + String(repeating: "*", count: pan.count - 10) + String(pan.suffix(4))
    }

    public var masked: String { CardData.mask(pan) }

    public var brand: String {
        if pan.hasPrefix("4") { return "VISA" }
        if let two = Int(pan.prefix(2)), (51...55).contains(two) { return "MC" }
        if pan.hasPrefix("34") || pan.hasPrefix("37") { return "AMEX" }
        return "OTHER"
    }
}
