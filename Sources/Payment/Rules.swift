/// Field rules both ends check the same way (the SDK before any I/O, the terminal on receipt).
public enum PaymentRules {
    static func isDigit(_ c: UInt8) -> Bool { c >= 48 && c <= 57 }
    static func isLetter(_ c: UInt8) -> Bool { c | 0x20 >= 97 && c | 0x20 <= 122 }

    /// A location id: `^[A-Za-z0-9_-]{1,64}$`.
    public static func isLocationID(_ s: String) -> Bool {
        (1...64).contains(s.utf8.count) && s.utf8.allSatisfy { isDigit($0) || isLetter($0) || $0 == 95 || $0 == 45 }
    }

    /// A transaction id (invoice / order number): `^[0-9]{4}[0-9A-Za-z]{0,8}$`.
    public static func isTransactionID(_ s: String) -> Bool {
        let c = Array(s.utf8)
        guard (4...12).contains(c.count), c.prefix(4).allSatisfy(isDigit) else { return false }
        return c.dropFirst(4).allSatisfy { isDigit($0) || isLetter($0) }
    }

    /// A fraction (a battery level, a progress) as a JSON number: finite and in 0...1, else nil.
    public static func fraction(_ v: JSONValue?) -> Double? {
        let d: Double?
        switch v {
        case .integer(let i)?: d = Double(i)
        case .number(let t)?: d = Double(t)
        default: d = nil
        }
        guard let d, d.isFinite, (0...1).contains(d) else { return nil }
        return d
    }

    /// A fraction in 0...1 (battery, progress) written with two decimals; anything else is
    /// clamped into it (NaN reads as 0).
    public static func fraction(_ v: Double) -> String {
        let hundredths = Int(((v.isNaN ? 0 : min(1, max(0, v))) * 100).rounded())
        return "\(hundredths / 100).\(hundredths % 100 < 10 ? "0" : "")\(hundredths % 100)"
    }

    /// `count` decimal digits in `range`.
    public static func isDigits(_ s: String, _ range: ClosedRange<Int>) -> Bool {
        range.contains(s.utf8.count) && s.utf8.allSatisfy(isDigit)
    }
}
