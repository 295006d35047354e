/// A serial line on the network, as a device is named: `tcp:HOST:PORT` (a raw TCP serial
/// server: the connection carries the line's bytes unchanged) or `rfc2217:HOST:PORT` (telnet
/// with COM-PORT-OPTION: the line's settings are ours to set, and a carrier drop is heard).
///
/// HOST is a numeric IPv4 address, an IPv6 address in brackets, or `localhost`: a name would
/// have the loop wait on a resolver, and a shop's device server has a fixed address. PORT is
/// decimal digits only, 1–65535.
public struct RemoteLineAddress: Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        case tcp
        case rfc2217
    }

    public enum Host: Sendable, Equatable {
        case ipv4([UInt8])
        case ipv6([UInt8])
    }

    public var kind: Kind
    public var host: Host
    public var port: UInt16

    public init(kind: Kind, host: Host, port: UInt16) {
        self.kind = kind
        self.host = host
        self.port = port
    }

    /// Whether `text` names a network line at all (it starts `tcp:` or `rfc2217:`); a path
    /// never does, since a device path is absolute.
    public static func isNetworkName(_ text: String) -> Bool {
        text.hasPrefix("tcp:") || text.hasPrefix("rfc2217:")
    }

    /// Parses `text`; the error says what is wrong, quoting none of it (the caller prints the
    /// name escaped).
    public static func parse(_ text: String) -> Result<RemoteLineAddress, ParseError> {
        let kind: Kind
        let rest: Substring
        if text.hasPrefix("tcp:") {
            kind = .tcp
            rest = text.dropFirst(4)
        } else if text.hasPrefix("rfc2217:") {
            kind = .rfc2217
            rest = text.dropFirst(8)
        } else {
            return .failure(.notANetworkLine)
        }
        guard let colon = rest.lastIndex(of: ":") else { return .failure(.noPort) }
        let hostText = rest[..<colon], portText = rest[rest.index(after: colon)...]
        guard !portText.isEmpty, portText.count <= 5, portText.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), portText.first != "0",
              let p = Int(portText), (1...65535).contains(p) else { return .failure(.badPort) }
        let host: Host
        if hostText.lowercased() == "localhost" {
            host = .ipv4([127, 0, 0, 1])
        } else if hostText.hasPrefix("[") && hostText.hasSuffix("]") && hostText.count > 2 {
            guard let a = Self.ipv6(hostText.dropFirst().dropLast()) else { return .failure(.badHost) }
            host = .ipv6(a)
        } else if let a = Self.ipv4(hostText) {
            host = .ipv4(a)
        } else {
            return .failure(.badHost)
        }
        // The unspecified address (0.0.0.0, ::) names no server; connecting to it reaches this
        // host. An IPv6 link-local address needs a zone, which is not taken here.
        switch host {
        case let .ipv4(a) where a.allSatisfy({ $0 == 0 }): return .failure(.badHost)
        case let .ipv6(a) where a.allSatisfy({ $0 == 0 }) || (a[0] == 0xFE && a[1] & 0xC0 == 0x80): return .failure(.badHost)
        default: break
        }
        return .success(RemoteLineAddress(kind: kind, host: host, port: UInt16(p)))
    }

    public enum ParseError: Error, Sendable, Equatable, CustomStringConvertible {
        case notANetworkLine, noPort, badPort, badHost

        public var description: String {
            switch self {
            case .notANetworkLine: return "not a network line (tcp:HOST:PORT or rfc2217:HOST:PORT)"
            case .noPort: return "a network line is tcp:HOST:PORT or rfc2217:HOST:PORT; no port given"
            case .badPort: return "the port must be decimal digits, 1 to 65535"
            case .badHost: return "the host must be a numeric IPv4 address, an IPv6 address in brackets (not link-local), or localhost; not the unspecified address"
            }
        }
    }

    public var description: String {
        "\(kind.rawValue):\(hostText):\(port)"
    }

    /// The host as written back: dotted quad, or the IPv6 address in brackets (RFC 5952's
    /// shortest form is not attempted; groups are written in full hex).
    public var hostText: String {
        switch host {
        case let .ipv4(a) where a.count == 4: return a.map(String.init).joined(separator: ".")
        case let .ipv6(a) where a.count == 16:
            var groups: [String] = []
            for i in stride(from: 0, to: 16, by: 2) { groups.append(String(UInt16(a[i]) << 8 | UInt16(a[i + 1]), radix: 16)) }
            return "[" + groups.joined(separator: ":") + "]"
        default:
            // Made by a program with the wrong number of bytes (`parse` never does).
            return "invalid"
        }
    }

    /// Four decimal numbers 0–255, dot-separated, digits only, no leading zero (which
    /// inet_aton reads as octal), no shorthand.
    static func ipv4(_ text: Substring) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var out: [UInt8] = []
        for p in parts {
            guard !p.isEmpty, p.count <= 3, p.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), p.count == 1 || p.first != "0",
                  let v = Int(p), v <= 255 else { return nil }
            out.append(UInt8(v))
        }
        return out
    }

    /// RFC 4291 §2.2's text forms: eight groups of up to four hex digits, one `::` for a run of
    /// zero groups, and an IPv4 tail in dotted decimal.
    static func ipv6(_ text: Substring) -> [UInt8]? {
        guard text.count <= 45 else { return nil }
        var head: [UInt16] = [], tail: [UInt16] = []
        var text = text
        var ipv4Tail: [UInt8]?
        if let lastColon = text.lastIndex(of: ":"), text[text.index(after: lastColon)...].contains(".") {
            guard let v4 = ipv4(text[text.index(after: lastColon)...]) else { return nil }
            ipv4Tail = v4
            text = text[...lastColon]
            // "::1.2.3.4" leaves "::", "a::1.2.3.4" leaves "a::", "a:b:1.2.3.4" leaves "a:b:".
            if text.hasSuffix(":") && !text.hasSuffix("::") { text = text.dropLast() }
        }
        func groups(_ s: Substring) -> [UInt16]? {
            if s.isEmpty { return [] }
            var out: [UInt16] = []
            for g in s.split(separator: ":", omittingEmptySubsequences: false) {
                guard !g.isEmpty, g.count <= 4, let v = UInt16(g, radix: 16), g.utf8.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 | 0x20 >= 97 && $0 | 0x20 <= 102) }) else { return nil }
                out.append(v)
            }
            return out
        }
        let wanted = ipv4Tail == nil ? 8 : 6
        if let range = text.firstRange(of: "::") {
            guard text[range.upperBound...].firstRange(of: "::") == nil,
                  let h = groups(text[..<range.lowerBound]), let t = groups(text[range.upperBound...]),
                  h.count + t.count < wanted else { return nil }
            head = h
            tail = t
            head += [UInt16](repeating: 0, count: wanted - h.count - t.count)
        } else {
            guard let h = groups(text), h.count == wanted else { return nil }
            head = h
        }
        var out: [UInt8] = []
        for g in head + tail { out += [UInt8(g >> 8), UInt8(g & 0xFF)] }
        if let ipv4Tail { out += ipv4Tail }
        return out.count == 16 ? out : nil
    }
}
