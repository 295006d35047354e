import Wire

/// A JSON value as the reader protocol uses it. Numbers are kept as written: integers exactly
/// (`Int64`), anything with a fraction or exponent only as text, so an amount can never pass
/// through floating point. Object members keep their order.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case integer(Int64)
    /// A number that is not an integer in Int64's range, as its literal text.
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([(String, JSONValue)])

    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.integer(let x), .integer(let y)): return x == y
        case (.number(let x), .number(let y)): return x == y
        case (.string(let x), .string(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members.first { $0.0 == key }?.1 }
        return nil
    }

    public var string: String? { if case .string(let s) = self { return s }; return nil }
    public var integer: Int64? { if case .integer(let i) = self { return i }; return nil }
    public var bool: Bool? { if case .bool(let b) = self { return b }; return nil }
    public var array: [JSONValue]? { if case .array(let a) = self { return a }; return nil }
    public var members: [(String, JSONValue)]? { if case .object(let m) = self { return m }; return nil }
    public var isNull: Bool { if case .null = self { return true }; return false }

    /// A copy with `key` set (replaced in place, or appended).
    public func setting(_ key: String, _ value: JSONValue) -> JSONValue {
        guard case .object(var members) = self else { return self }
        if let i = members.firstIndex(where: { $0.0 == key }) { members[i].1 = value } else { members.append((key, value)) }
        return .object(members)
    }

    /// Compact UTF-8 text (members in order, no insignificant space).
    public var serialized: [UInt8] {
        var out = [UInt8]()
        write(into: &out)
        return out
    }

    public var text: String { String(decoding: serialized, as: UTF8.self) }

    func write(into out: inout [UInt8]) {
        switch self {
        case .null: out += Array("null".utf8)
        case .bool(let b): out += Array((b ? "true" : "false").utf8)
        case .integer(let i): out += Array(String(i).utf8)
        case .number(let s): out += Array(s.utf8)
        case .string(let s): JSONValue.writeString(s, into: &out)
        case .array(let a):
            out.append(0x5B)
            for (i, v) in a.enumerated() {
                if i > 0 { out.append(0x2C) }
                v.write(into: &out)
            }
            out.append(0x5D)
        case .object(let m):
            out.append(0x7B)
            for (i, (k, v)) in m.enumerated() {
                if i > 0 { out.append(0x2C) }
                JSONValue.writeString(k, into: &out)
                out.append(0x3A)
                v.write(into: &out)
            }
            out.append(0x7D)
        }
    }

    static func writeString(_ s: String, into out: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        out.append(0x22)
        for b in s.utf8 {
            switch b {
            case 0x22: out += [0x5C, 0x22]
            case 0x5C: out += [0x5C, 0x5C]
            case 0x0A: out += [0x5C, 0x6E]
            case 0x0D: out += [0x5C, 0x72]
            case 0x09: out += [0x5C, 0x74]
            case 0..<0x20: out += [0x5C, 0x75, 0x30, 0x30, hex[Int(b >> 4)], hex[Int(b & 15)]]
            default: out.append(b)
            }
        }
        out.append(0x22)
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) { self = .object(elements) }
    public init(nilLiteral: ()) { self = .null }
}

public struct JSONError: Error, Equatable, Sendable, CustomStringConvertible {
    public let offset: Int
    public let reason: String
    public var description: String { "invalid JSON at byte \(offset): \(reason)" }
}

/// A strict RFC 8259 parser: one value, no trailing data, valid UTF-8, no duplicate keys, bounded
/// nesting.
public struct JSONParser {
    public static let maximumDepth = 32

    let bytes: [UInt8]
    var at = 0

    public static func parse(_ bytes: [UInt8]) throws -> JSONValue {
        var p = JSONParser(bytes: bytes)
        p.skipSpace()
        let value = try p.value(depth: 0)
        p.skipSpace()
        guard p.at == bytes.count else { throw p.fail("trailing data") }
        return value
    }

    func fail(_ reason: String) -> JSONError { JSONError(offset: at, reason: reason) }

    mutating func skipSpace() {
        while at < bytes.count {
            switch bytes[at] {
            case 0x20, 0x09, 0x0A, 0x0D: at += 1
            default: return
            }
        }
    }

    mutating func value(depth: Int) throws -> JSONValue {
        guard depth < JSONParser.maximumDepth else { throw fail("nested too deeply") }
        guard at < bytes.count else { throw fail("unexpected end") }
        switch bytes[at] {
        case 0x7B: return try object(depth: depth)
        case 0x5B: return try array(depth: depth)
        case 0x22: return .string(try string())
        case 0x74: try literal("true"); return .bool(true)
        case 0x66: try literal("false"); return .bool(false)
        case 0x6E: try literal("null"); return .null
        case 0x2D, 0x30...0x39: return try number()
        default: throw fail("unexpected character")
        }
    }

    mutating func literal(_ word: String) throws {
        for b in word.utf8 {
            guard at < bytes.count, bytes[at] == b else { throw fail("bad literal") }
            at += 1
        }
    }

    mutating func object(depth: Int) throws -> JSONValue {
        at += 1
        var members = [(String, JSONValue)]()
        var keys = Set<String>()
        skipSpace()
        if at < bytes.count, bytes[at] == 0x7D { at += 1; return .object(members) }
        while true {
            skipSpace()
            guard at < bytes.count, bytes[at] == 0x22 else { throw fail("expected a member name") }
            let key = try string()
            // The name is the peer's: the error (repeated to it, and logged) carries a short, escaped copy.
            guard keys.insert(key).inserted else { throw fail("duplicate member \"\(PeerText.escaped(key, limit: 32))\"") }
            skipSpace()
            guard at < bytes.count, bytes[at] == 0x3A else { throw fail("expected ':'") }
            at += 1
            skipSpace()
            members.append((key, try value(depth: depth + 1)))
            skipSpace()
            guard at < bytes.count else { throw fail("unexpected end") }
            if bytes[at] == 0x2C { at += 1; continue }
            if bytes[at] == 0x7D { at += 1; return .object(members) }
            throw fail("expected ',' or '}'")
        }
    }

    mutating func array(depth: Int) throws -> JSONValue {
        at += 1
        var items = [JSONValue]()
        skipSpace()
        if at < bytes.count, bytes[at] == 0x5D { at += 1; return .array(items) }
        while true {
            skipSpace()
            items.append(try value(depth: depth + 1))
            skipSpace()
            guard at < bytes.count else { throw fail("unexpected end") }
            if bytes[at] == 0x2C { at += 1; continue }
            if bytes[at] == 0x5D { at += 1; return .array(items) }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func number() throws -> JSONValue {
        let start = at
        if bytes[at] == 0x2D { at += 1 }
        func digits() -> Int {
            let s = at
            while at < bytes.count, bytes[at] >= 0x30, bytes[at] <= 0x39 { at += 1 }
            return at - s
        }
        guard at < bytes.count else { throw fail("bad number") }
        if bytes[at] == 0x30 { at += 1 } else if digits() == 0 { throw fail("bad number") }
        var integral = true
        if at < bytes.count, bytes[at] == 0x2E {
            at += 1
            integral = false
            guard digits() > 0 else { throw fail("bad fraction") }
        }
        if at < bytes.count, bytes[at] == 0x65 || bytes[at] == 0x45 {
            at += 1
            integral = false
            if at < bytes.count, bytes[at] == 0x2B || bytes[at] == 0x2D { at += 1 }
            guard digits() > 0 else { throw fail("bad exponent") }
        }
        let text = String(decoding: bytes[start..<at], as: UTF8.self)
        if integral, let i = Int64(text) { return .integer(i) }
        return .number(text)
    }

    mutating func string() throws -> String {
        at += 1
        var out = [UInt8]()
        while true {
            guard at < bytes.count else { throw fail("unterminated string") }
            let b = bytes[at]
            switch b {
            case 0x22:
                at += 1
                return String(decoding: out, as: UTF8.self)
            case 0x5C:
                at += 1
                guard at < bytes.count else { throw fail("unterminated escape") }
                let e = bytes[at]
                at += 1
                switch e {
                case 0x22: out.append(0x22)
                case 0x5C: out.append(0x5C)
                case 0x2F: out.append(0x2F)
                case 0x62: out.append(0x08)
                case 0x66: out.append(0x0C)
                case 0x6E: out.append(0x0A)
                case 0x72: out.append(0x0D)
                case 0x74: out.append(0x09)
                case 0x75:
                    var scalar = try hex4()
                    if (0xD800..<0xDC00).contains(scalar) {
                        guard at + 1 < bytes.count, bytes[at] == 0x5C, bytes[at + 1] == 0x75 else { throw fail("lone surrogate") }
                        at += 2
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw fail("lone surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(scalar) {
                        throw fail("lone surrogate")
                    }
                    out += Array(String(Character(Unicode.Scalar(scalar)!)).utf8)
                default: throw fail("bad escape")
                }
            case 0..<0x20:
                throw fail("control character in string")
            case 0x20..<0x80:
                out.append(b)
                at += 1
            default:
                let length = try utf8Sequence()
                out += bytes[at..<(at + length)]
                at += length
            }
        }
    }

    mutating func hex4() throws -> UInt32 {
        guard at + 4 <= bytes.count else { throw fail("short \\u escape") }
        var v: UInt32 = 0
        for i in 0..<4 {
            let c = bytes[at + i]
            let d: UInt32
            switch c {
            case 0x30...0x39: d = UInt32(c - 0x30)
            case 0x41...0x46: d = UInt32(c - 0x37)
            case 0x61...0x66: d = UInt32(c - 0x57)
            default: throw fail("bad \\u escape")
            }
            v = v << 4 | d
        }
        at += 4
        return v
    }

    /// The length of the well-formed UTF-8 sequence at `at` (RFC 3629: no overlongs, no
    /// surrogates, nothing above U+10FFFF).
    func utf8Sequence() throws -> Int {
        let b0 = bytes[at]
        func cont(_ i: Int, _ range: ClosedRange<UInt8> = 0x80...0xBF) -> Bool {
            at + i < bytes.count && range.contains(bytes[at + i])
        }
        switch b0 {
        case 0xC2...0xDF: if cont(1) { return 2 }
        case 0xE0: if cont(1, 0xA0...0xBF), cont(2) { return 3 }
        case 0xE1...0xEC, 0xEE, 0xEF: if cont(1), cont(2) { return 3 }
        case 0xED: if cont(1, 0x80...0x9F), cont(2) { return 3 }
        case 0xF0: if cont(1, 0x90...0xBF), cont(2), cont(3) { return 4 }
        case 0xF1...0xF3: if cont(1), cont(2), cont(3) { return 4 }
        case 0xF4: if cont(1, 0x80...0x8F), cont(2), cont(3) { return 4 }
        default: break
        }
        throw fail("invalid UTF-8")
    }
}
