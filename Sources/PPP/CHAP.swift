import Wire

/// CHAP packets (RFC 1994 §4).
public enum CHAPPacket: Sendable, Equatable {
    case challenge(identifier: UInt8, value: [UInt8], name: [UInt8])
    case response(identifier: UInt8, value: [UInt8], name: [UInt8])
    case success(identifier: UInt8, message: [UInt8])
    case failure(identifier: UInt8, message: [UInt8])

    public enum Code {
        public static let challenge = ControlCode(1)
        public static let response = ControlCode(2)
        public static let success = ControlCode(3)
        public static let failure = ControlCode(4)
    }

    public init(_ p: ControlPacket) throws(WireError) {
        let d = p.data
        switch p.code {
        case Code.challenge, Code.response:
            guard d.count >= 1 else { throw .malformed("CHAP \(p.code == Code.challenge ? "Challenge" : "Response") without Value-Size") }
            let size = Int(d[0])
            guard d.count >= 1 + size else { throw .malformed("CHAP Value runs past the packet") }
            let value = Array(d[1..<(1 + size)])
            let name = Array(d[(1 + size)...])
            self = p.code == Code.challenge ? .challenge(identifier: p.identifier, value: value, name: name)
                : .response(identifier: p.identifier, value: value, name: name)
        case Code.success: self = .success(identifier: p.identifier, message: d)
        case Code.failure: self = .failure(identifier: p.identifier, message: d)
        default: throw .malformed("CHAP code \(p.code.rawValue) is not defined")
        }
    }

    /// The packet; a Value longer than its one-byte Value-Size is refused.
    public var packet: ControlPacket {
        get throws(WireError) {
            switch self {
            case let .challenge(id, value, name): return ControlPacket(code: Code.challenge, identifier: id, data: try CHAPPacket.sized(value) + name)
            case let .response(id, value, name): return ControlPacket(code: Code.response, identifier: id, data: try CHAPPacket.sized(value) + name)
            case let .success(id, message): return ControlPacket(code: Code.success, identifier: id, data: message)
            case let .failure(id, message): return ControlPacket(code: Code.failure, identifier: id, data: message)
            }
        }
    }

    /// A Value behind its Value-Size octet (RFC 1994 §4.1).
    static func sized(_ value: [UInt8]) throws(WireError) -> [UInt8] {
        guard let size = UInt8(exactly: value.count) else { throw .malformed("CHAP Value of \(value.count) bytes exceeds 255") }
        return [size] + value
    }

    /// pppd's rendering (chap_print_pkt).
    public var description: String {
        switch self {
        case let .challenge(id, value, name):
            return "Challenge id=0x\(String(id, radix: 16)) <\(PppdHex.string(value))>, name = \(PrintableString.quoted(name))"
        case let .response(id, value, name):
            return "Response id=0x\(String(id, radix: 16)) <\(PppdHex.string(value))>, name = \(PrintableString.quoted(name))"
        case let .success(id, message):
            return "Success id=0x\(String(id, radix: 16))" + (message.isEmpty ? "" : " " + PrintableString.quoted(message))
        case let .failure(id, message):
            return "Failure id=0x\(String(id, radix: 16))" + (message.isEmpty ? "" : " " + PrintableString.quoted(message))
        }
    }
}
