import NetStack

/// The SOCKS dialect a client spoke.
public enum SocksVersion: Sendable, Equatable {
    case socks4, socks4a, socks5
}

/// Where a client asked to connect.
public enum SocksDestinationHost: Sendable, Equatable, CustomStringConvertible {
    case ipv4(IPv4Address)
    /// A name for the caller to resolve (SOCKS4a; RFC 1928 §5 ATYP 3).
    case name(String)
    /// Sixteen bytes (RFC 1928 §5 ATYP 4); the caller decides whether to serve it.
    case ipv6([UInt8])

    /// For logs and status: a name is the terminal's text, so it is escaped (`PeerText`).
    public var description: String {
        switch self {
        case .ipv4(let address): return address.description
        case .name(let name): return PeerText.escaped(name)
        case .ipv6(let bytes): return Self.ipv6Text(bytes)
        }
    }

    /// Bracketed hex groups, the longest run of two or more zero groups as "::" (RFC 5952 §4.2).
    private static func ipv6Text(_ bytes: [UInt8]) -> String {
        var groups: [UInt16] = []
        var i = 0
        while i < bytes.count {
            groups.append(UInt16(bytes[i]) << 8 | UInt16(i + 1 < bytes.count ? bytes[i + 1] : 0))
            i += 2
        }
        var bestStart = 0, bestLength = 0, k = 0
        while k < groups.count {
            guard groups[k] == 0 else {
                k += 1
                continue
            }
            var end = k
            while end < groups.count && groups[end] == 0 { end += 1 }
            if end - k > bestLength {
                bestStart = k
                bestLength = end - k
            }
            k = end
        }
        let hex = groups.map { String($0, radix: 16) }
        guard groups.count == 8, bestLength >= 2 else { return "[" + hex.joined(separator: ":") + "]" }
        let head = hex[..<bestStart].joined(separator: ":")
        let tail = hex[(bestStart + bestLength)...].joined(separator: ":")
        return "[" + head + "::" + tail + "]"
    }
}

/// A complete CONNECT request.
public struct SocksRequest: Sendable, Equatable {
    public var version: SocksVersion
    public var host: SocksDestinationHost
    public var port: UInt16
    /// The SOCKS4 USERID (nil when empty) or the RFC 1929 username (nil without authentication).
    public var user: String?

    public init(version: SocksVersion, host: SocksDestinationHost, port: UInt16, user: String? = nil) {
        self.version = version
        self.host = host
        self.port = port
        self.user = user
    }
}

/// Why a request is refused; SOCKS5 sends it as REP (RFC 1928 §6), SOCKS4 as 0x5B for all.
public enum SocksFailure: Sendable, Equatable {
    case generalFailure, notAllowed, networkUnreachable, hostUnreachable, connectionRefused, ttlExpired,
        commandNotSupported, addressTypeNotSupported

    var socks5Code: UInt8 {
        switch self {
        case .generalFailure: return 0x01
        case .notAllowed: return 0x02
        case .networkUnreachable: return 0x03
        case .hostUnreachable: return 0x04
        case .connectionRefused: return 0x05
        case .ttlExpired: return 0x06
        case .commandNotSupported: return 0x07
        case .addressTypeNotSupported: return 0x08
        }
    }
}

/// The server side of a SOCKS4, SOCKS4a or SOCKS5 (RFC 1928, with RFC 1929 username/password)
/// handshake, up to the CONNECT request. Sans-IO: feed it what the client sent, send what it says.
public struct SocksNegotiation: Sendable {
    public enum Step: Sendable, Equatable {
        /// Feed more bytes.
        case needMore
        /// Send these bytes to the client and keep feeding.
        case reply([UInt8])
        /// Handshake complete; `reply` is to be sent now (always empty here: the success or
        /// failure reply follows the connection attempt, see `successReply`/`failureReply`).
        case request(SocksRequest, reply: [UInt8])
        /// Send these bytes (possibly none), then close.
        case refuse([UInt8], reason: String)
    }

    /// Handshake bytes beyond this without a complete request are refused, however they arrive.
    public static let maximumHandshakeBytes = 1024

    /// Bytes the client sent after its request (and any fed after `.request`), to forward once connected.
    public private(set) var leftover: [UInt8] = []

    private enum Phase: Sendable { case start, socks4, greeting, authentication, request, accepted, refused }
    private enum Parse { case needMore, advance(Int, Step?), refuse([UInt8], String) }
    private enum Field { case needMore, tooLong, found([UInt8], next: Int) }

    private let passwords: [String: String]?
    private var phase = Phase.start
    private var buffer: [UInt8] = []
    private var consumed = 0
    private var user: String?

    /// nil: SOCKS5 without authentication (method 0x00), SOCKS4 and 4a accepted. Otherwise SOCKS5
    /// requires username/password (method 0x02) matching these user→password pairs, and SOCKS4/4a,
    /// which cannot carry a password, are refused.
    public init(passwords: [String: String]? = nil) {
        self.passwords = passwords
    }

    /// The steps these bytes lead to. Until the handshake ends the last step is `.needMore`; it
    /// ends with `.request` or `.refuse`, after which feeding returns [] (after `.request` the
    /// bytes are appended to `leftover`).
    public mutating func feed(_ bytes: [UInt8]) -> [Step] {
        switch phase {
        case .accepted:
            leftover += bytes
            return []
        case .refused:
            return []
        default:
            buffer += bytes
        }
        var steps: [Step] = []
        while true {
            // Parsing sees only the budget, so the outcome does not depend on how bytes were split.
            let budget = Self.maximumHandshakeBytes - consumed
            let window = buffer.count > budget ? Array(buffer[..<budget]) : buffer
            switch parse(window) {
            case .needMore:
                guard buffer.count > budget else { return steps + [.needMore] }
                let reply = refusalReply
                phase = .refused
                buffer = []
                return steps + [.refuse(reply, reason: "handshake longer than \(Self.maximumHandshakeBytes) bytes")]
            case .advance(let length, let step):
                buffer.removeFirst(length)
                consumed += length
                guard let step else { continue }
                steps.append(step)
                if case .request = step {
                    phase = .accepted
                    leftover = buffer
                    buffer = []
                    return steps
                }
            case .refuse(let reply, let reason):
                phase = .refused
                buffer = []
                return steps + [.refuse(reply, reason: reason)]
            }
        }
    }

    /// The reply once connected: SOCKS4 CD 0x5A with port and address; SOCKS5 REP 0 with the
    /// bound IPv4 address and port (RFC 1928 §6).
    public static func successReply(for request: SocksRequest, bound: IPv4Address, port: UInt16) -> [UInt8] {
        var reply: [UInt8]
        switch request.version {
        case .socks4, .socks4a:
            reply = [0x00, 0x5A]
            reply += BigEndian.bytes(port)
            reply += bound.bytes
        case .socks5:
            reply = [0x05, 0x00, 0x00, 0x01]
            reply += bound.bytes
            reply += BigEndian.bytes(port)
        }
        return reply
    }

    /// The reply refusing a request: SOCKS4 CD 0x5B with zero port and address; SOCKS5 REP per
    /// RFC 1928 §6 with ATYP 1 and zero address and port.
    public static func failureReply(for version: SocksVersion, _ failure: SocksFailure) -> [UInt8] {
        switch version {
        case .socks4, .socks4a: return [0x00, 0x5B, 0, 0, 0, 0, 0, 0]
        case .socks5: return [0x05, failure.socks5Code, 0x00, 0x01, 0, 0, 0, 0, 0, 0]
        }
    }

    // MARK: Parsing; each step looks at the unparsed bytes from the start of one message.

    private mutating func parse(_ w: [UInt8]) -> Parse {
        switch phase {
        case .start: return parseVersion(w)
        case .socks4: return parseSocks4(w)
        case .greeting: return parseGreeting(w)
        case .authentication: return parseAuthentication(w)
        case .request: return parseRequest(w)
        case .accepted, .refused: return .needMore
        }
    }

    /// What to send when refusing an over-long handshake in the current phase.
    private var refusalReply: [UInt8] {
        switch phase {
        case .start, .accepted, .refused: return []
        case .socks4: return Self.failureReply(for: .socks4, .generalFailure)
        case .greeting: return [0x05, 0xFF]
        case .authentication: return [0x01, 0x01]
        case .request: return Self.failureReply(for: .socks5, .generalFailure)
        }
    }

    private mutating func parseVersion(_ w: [UInt8]) -> Parse {
        guard let first = w.first else { return .needMore }
        switch first {
        case 4:
            guard passwords == nil else {
                return .refuse(Self.failureReply(for: .socks4, .notAllowed), "SOCKS4 cannot carry the required password")
            }
            phase = .socks4
        case 5:
            phase = .greeting
        default:
            return .refuse([], "not a SOCKS request (first byte \(first))")
        }
        return .advance(0, nil)
    }

    /// SOCKS4: VN CD DSTPORT(2) DSTIP(4) USERID NUL; SOCKS4a: DSTIP 0.0.0.x (x ≠ 0), then HOSTNAME NUL.
    private mutating func parseSocks4(_ w: [UInt8]) -> Parse {
        let rejected = Self.failureReply(for: .socks4, .generalFailure)
        guard w.count >= 2 else { return .needMore }
        guard w[1] == 1 else {
            return .refuse(rejected, w[1] == 2 ? "SOCKS4 BIND not supported" : "SOCKS4 command \(w[1]) not supported")
        }
        guard w.count >= 8 else { return .needMore }
        let port = BigEndian.uint16(w, 2)
        let userBytes: [UInt8]
        let end: Int
        switch Self.terminatedField(w, from: 8) {
        case .needMore: return .needMore
        case .tooLong: return .refuse(rejected, "SOCKS4 user id longer than 255 bytes")
        case .found(let bytes, let next):
            userBytes = bytes
            end = next
        }
        let userID = userBytes.isEmpty ? nil : String(decoding: userBytes, as: UTF8.self)
        guard w[4] == 0, w[5] == 0, w[6] == 0, w[7] != 0 else {
            let host = SocksDestinationHost.ipv4(IPv4Address(w[4], w[5], w[6], w[7]))
            return .advance(end, .request(SocksRequest(version: .socks4, host: host, port: port, user: userID), reply: []))
        }
        switch Self.terminatedField(w, from: end) {
        case .needMore: return .needMore
        case .tooLong: return .refuse(rejected, "SOCKS4a host name longer than 255 bytes")
        case .found(let bytes, let next):
            guard let name = Self.hostName(bytes) else { return .refuse(rejected, "SOCKS4a host name empty or not UTF-8") }
            let request = SocksRequest(version: .socks4a, host: .name(name), port: port, user: userID)
            return .advance(next, .request(request, reply: []))
        }
    }

    /// RFC 1928 §3: VER NMETHODS METHODS; the reply names the method, 0xFF for none acceptable.
    private mutating func parseGreeting(_ w: [UInt8]) -> Parse {
        guard w.count >= 2 else { return .needMore }
        let count = Int(w[1])
        guard w.count >= 2 + count else { return .needMore }
        let wanted: UInt8 = passwords == nil ? 0x00 : 0x02
        guard w[2..<2 + count].contains(wanted) else {
            return .refuse([0x05, 0xFF], "no acceptable SOCKS5 authentication method offered")
        }
        phase = passwords == nil ? .request : .authentication
        return .advance(2 + count, .reply([0x05, wanted]))
    }

    /// RFC 1929 §2: VER(1) ULEN UNAME PLEN PASSWD; STATUS 0 succeeds, anything else closes.
    private mutating func parseAuthentication(_ w: [UInt8]) -> Parse {
        guard let version = w.first else { return .needMore }
        guard version == 0x01 else {
            return .refuse([0x01, 0x01], "bad username/password subnegotiation version \(version)")
        }
        guard w.count >= 2 else { return .needMore }
        let userLength = Int(w[1])
        guard w.count >= 3 + userLength else { return .needMore }
        let length = 3 + userLength + Int(w[2 + userLength])
        guard w.count >= length else { return .needMore }
        let userBytes = Array(w[2..<2 + userLength])
        let password = Array(w[(3 + userLength)..<length])
        let name = String(decoding: userBytes, as: UTF8.self)
        let expected = name.utf8.elementsEqual(userBytes) ? passwords?[name] : nil
        let matches = Self.sameBytes(Array((expected ?? "").utf8), password)
        guard matches, expected != nil else {
            return .refuse([0x01, 0x01], "SOCKS5 authentication failed for user \"\(PeerText.escaped(userBytes))\"")
        }
        user = name
        phase = .request
        return .advance(length, .reply([0x01, 0x00]))
    }

    /// RFC 1928 §4: VER CMD RSV ATYP DST.ADDR DST.PORT; addresses per §5, reply codes per §6.
    private func parseRequest(_ w: [UInt8]) -> Parse {
        guard let version = w.first else { return .needMore }
        guard version == 0x05 else {
            return .refuse(Self.failureReply(for: .socks5, .generalFailure), "bad SOCKS5 request version \(version)")
        }
        guard w.count >= 2 else { return .needMore }
        let unsupported = Self.failureReply(for: .socks5, .commandNotSupported)
        switch w[1] {
        case 0x01: break
        case 0x02: return .refuse(unsupported, "SOCKS5 BIND not supported")
        case 0x03: return .refuse(unsupported, "SOCKS5 UDP ASSOCIATE not supported")
        default: return .refuse(unsupported, "SOCKS5 command \(w[1]) not supported")
        }
        guard w.count >= 4 else { return .needMore }
        let host: SocksDestinationHost
        let end: Int
        switch w[3] {
        case 0x01:
            end = 4 + 4 + 2
            guard w.count >= end else { return .needMore }
            host = .ipv4(IPv4Address(w[4], w[5], w[6], w[7]))
        case 0x03:
            guard w.count >= 5 else { return .needMore }
            let nameLength = Int(w[4])
            guard nameLength > 0 else {
                return .refuse(Self.failureReply(for: .socks5, .generalFailure), "empty SOCKS5 host name")
            }
            end = 5 + nameLength + 2
            guard w.count >= end else { return .needMore }
            guard let name = Self.hostName(Array(w[5..<5 + nameLength])) else {
                return .refuse(Self.failureReply(for: .socks5, .generalFailure), "SOCKS5 host name not UTF-8 or holds NUL")
            }
            host = .name(name)
        case 0x04:
            end = 4 + 16 + 2
            guard w.count >= end else { return .needMore }
            host = .ipv6(Array(w[4..<20]))
        default:
            return .refuse(
                Self.failureReply(for: .socks5, .addressTypeNotSupported), "SOCKS5 address type \(w[3]) not supported")
        }
        let port = BigEndian.uint16(w, end - 2)
        return .advance(end, .request(SocksRequest(version: .socks5, host: host, port: port, user: user), reply: []))
    }

    /// A NUL-terminated field of at most 255 bytes starting at `start`.
    private static func terminatedField(_ w: [UInt8], from start: Int) -> Field {
        var i = start
        while i < min(w.count, start + 256) {
            if w[i] == 0 { return .found(Array(w[start..<i]), next: i + 1) }
            i += 1
        }
        return w.count >= start + 256 ? .tooLong : .needMore
    }

    /// A non-empty host name that is valid UTF-8 and free of NUL; nil otherwise.
    private static func hostName(_ bytes: [UInt8]) -> String? {
        let name = String(decoding: bytes, as: UTF8.self)
        return !bytes.isEmpty && !bytes.contains(0) && name.utf8.elementsEqual(bytes) ? name : nil
    }

    /// Compares every given byte, whatever differs first, so timing does not reveal a prefix.
    private static func sameBytes(_ expected: [UInt8], _ given: [UInt8]) -> Bool {
        var difference: UInt8 = expected.count == given.count ? 0 : 1
        for i in given.indices {
            difference |= (expected.isEmpty ? 0 : expected[i % expected.count]) ^ given[i]
        }
        return difference == 0
    }
}
