import Wire

/// PAP packets (RFC 1334 §2.2).
public enum PAPPacket: Sendable, Equatable {
    case authenticateRequest(identifier: UInt8, peerID: [UInt8], password: [UInt8])
    case authenticateAck(identifier: UInt8, message: [UInt8])
    case authenticateNak(identifier: UInt8, message: [UInt8])

    public enum Code {
        public static let request = ControlCode(1)
        public static let ack = ControlCode(2)
        public static let nak = ControlCode(3)
    }

    /// - Parameter lenient: accept an Ack or Nak without its Msg-Length octet (a receiver's
    ///   choice; a decoder reporting on a capture keeps it strict).
    public init(_ p: ControlPacket, lenient: Bool = false) throws(WireError) {
        let d = p.data
        switch p.code {
        case Code.request:
            guard d.count >= 1 else { throw .malformed("PAP Authenticate-Request without Peer-ID-Length") }
            let idLength = Int(d[0])
            guard d.count >= 1 + idLength + 1 else { throw .malformed("PAP Peer-ID runs past the packet") }
            let passwordLength = Int(d[1 + idLength])
            guard d.count >= 2 + idLength + passwordLength else { throw .malformed("PAP Password runs past the packet") }
            self = .authenticateRequest(identifier: p.identifier, peerID: Array(d[1..<(1 + idLength)]),
                                        password: Array(d[(2 + idLength)..<(2 + idLength + passwordLength)]))
        case Code.ack, Code.nak:
            // RFC 1334 §2.2.2 makes the Msg-Length octet mandatory; pppd takes an Ack or Nak
            // without it, and so do we (as an empty message), so `lenient` keeps the link up.
            guard d.count >= 1 else {
                guard lenient else { throw .malformed("PAP Authenticate-\(p.code == Code.ack ? "Ack" : "Nak") without Msg-Length") }
                self = p.code == Code.ack ? .authenticateAck(identifier: p.identifier, message: [])
                    : .authenticateNak(identifier: p.identifier, message: [])
                return
            }
            let length = Int(d[0])
            guard d.count >= 1 + length else { throw .malformed("PAP Message runs past the packet") }
            let message = Array(d[1..<(1 + length)])
            self = p.code == Code.ack ? .authenticateAck(identifier: p.identifier, message: message)
                : .authenticateNak(identifier: p.identifier, message: message)
        default:
            throw .malformed("PAP code \(p.code.rawValue) is not defined")
        }
    }

    /// The packet; a Peer-ID, Password or Message longer than its one-byte length is refused.
    public var packet: ControlPacket {
        get throws(WireError) {
            switch self {
            case let .authenticateRequest(id, peer, password):
                return ControlPacket(code: Code.request, identifier: id,
                                     data: try PAPPacket.counted(peer, "Peer-ID") + PAPPacket.counted(password, "Password"))
            case let .authenticateAck(id, message):
                return ControlPacket(code: Code.ack, identifier: id, data: try PAPPacket.counted(message, "Message"))
            case let .authenticateNak(id, message):
                return ControlPacket(code: Code.nak, identifier: id, data: try PAPPacket.counted(message, "Message"))
            }
        }
    }

    /// A field behind its one-byte length (RFC 1334 §2.2.1, §2.2.2).
    static func counted(_ field: [UInt8], _ name: String) throws(WireError) -> [UInt8] {
        guard let length = UInt8(exactly: field.count) else { throw .malformed("PAP \(name) of \(field.count) bytes exceeds 255") }
        return [length] + field
    }

    /// pppd's rendering (upap_printpkt); the password is hidden unless asked for.
    public func describe(showPassword: Bool) -> String {
        switch self {
        case let .authenticateRequest(id, peer, password):
            let shown = showPassword ? PrintableString.quoted(password) : "<hidden>"
            return "AuthReq id=0x\(String(id, radix: 16)) user=\(PrintableString.quoted(peer)) password=\(shown)"
        case let .authenticateAck(id, message):
            return "AuthAck id=0x\(String(id, radix: 16))" + (message.isEmpty ? "" : " " + PrintableString.quoted(message))
        case let .authenticateNak(id, message):
            return "AuthNak id=0x\(String(id, radix: 16))" + (message.isEmpty ? "" : " " + PrintableString.quoted(message))
        }
    }
}

/// Peer text in the printers' quotes (where pppd's print_string puts it): escaped by the one
/// function every piece of peer text goes through, so nothing the peer sends can steer a
/// terminal or break a log line.
public enum PrintableString {
    public static func quoted(_ bytes: [UInt8]) -> String {
        "\"" + PeerText.escaped(bytes) + "\""
    }
}

extension PeerText {
    /// The longest piece of peer text a link event or down reason carries, in bytes.
    static let eventLimit = 128

    /// Peer text (a Terminate-Request's data, a PAP or CHAP name or message) as a link event
    /// carries it: escaped and cut.
    static func event(_ bytes: some Sequence<UInt8>) -> String { escaped(bytes, limit: eventLimit) }
}
