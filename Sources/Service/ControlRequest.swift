import Channel
import Foundation
import NetStack

/// A request to the service, as the control socket carries it (`{"cmd":"add-bridge",
/// "terminal":"t1","bridge":"host:5000"}`, one JSON object a line) and as the Swift and C APIs
/// pass it. Decoding checks every field, so a value reaches the service only when it is one
/// the service can act on; what is wrong is said in `ControlRequestError`.
public enum ControlRequest: Sendable, Equatable {
    case list
    case status(terminal: String)
    case addBridge(terminal: String, BridgeSpec)
    case removeBridge(terminal: String, BridgeSpec)
    case setKeepAlive(terminal: String, KeepAliveSettings)
    /// Keep the link up (and reopen it when it goes down).
    case open(terminal: String)
    /// Close the link and keep it closed.
    case close(terminal: String)
    /// Events from now on, as lines on the same connection.
    case subscribe
    /// Read the configuration directory again.
    case reload

    /// The command names, as the wire spells them.
    public static let commands = ["list", "status", "add-bridge", "remove-bridge", "set-keepalive", "open", "close", "subscribe", "reload"]

    public var command: String {
        switch self {
        case .list: return "list"
        case .status: return "status"
        case .addBridge: return "add-bridge"
        case .removeBridge: return "remove-bridge"
        case .setKeepAlive: return "set-keepalive"
        case .open: return "open"
        case .close: return "close"
        case .subscribe: return "subscribe"
        case .reload: return "reload"
        }
    }

    /// The terminal the request is for, if it is for one.
    public var terminal: String? {
        switch self {
        case let .status(t), let .addBridge(t, _), let .removeBridge(t, _), let .setKeepAlive(t, _), let .open(t), let .close(t): return t
        case .list, .subscribe, .reload: return nil
        }
    }
}

/// Why a request was not taken: a code beyond the header's -1…-4 and a line for a person (peer
/// text in it escaped).
public struct ControlRequestError: Error, Equatable, Sendable {
    public var code: Int32
    public var message: String
    public init(_ code: Int32, _ message: String) {
        self.code = code
        self.message = message
    }
}

/// The codes the control socket answers with beyond the header's -1…-4 (which `add-bridge`
/// returns as they are).
public enum ControlReplyCode {
    public static let noSuchBridge: Int32 = -5
    public static let noSuchTerminal: Int32 = -6
    public static let badRequest: Int32 = -7
}

extension ControlRequest: Codable {
    private enum Key: String, CodingKey { case cmd, terminal, bridge, idle, interval, count }

    /// The wire's fields, each decoded on its own: a field of the wrong type is as absent.
    private struct Fields {
        var cmd: String?
        var terminal: String?
        var bridge: String?
        var idle: Int?, interval: Int?, count: Int?

        init(from decoder: Decoder) throws {
            let c = try decoder.container(keyedBy: Key.self)
            cmd = try? c.decodeIfPresent(String.self, forKey: .cmd)
            terminal = try? c.decodeIfPresent(String.self, forKey: .terminal)
            bridge = try? c.decodeIfPresent(String.self, forKey: .bridge)
            idle = try? c.decodeIfPresent(Int.self, forKey: .idle)
            interval = try? c.decodeIfPresent(Int.self, forKey: .interval)
            count = try? c.decodeIfPresent(Int.self, forKey: .count)
        }
    }

    public init(from decoder: Decoder) throws {
        let f = try Fields(from: decoder)
        switch ControlRequest.make(f) {
        case let .success(r): self = r
        case let .failure(e): throw e
        }
    }

    private static func make(_ f: Fields) -> Result<ControlRequest, ControlRequestError> {
        let bad = ControlReplyCode.badRequest
        guard let command = f.cmd else { return .failure(ControlRequestError(bad, "expected a JSON object with cmd")) }
        switch command {
        case "list": return .success(.list)
        case "subscribe": return .success(.subscribe)
        case "reload": return .success(.reload)
        default: break
        }
        guard commands.contains(command) else {
            return .failure(ControlRequestError(bad, "unknown cmd '\(PeerText.escaped(command, limit: 64))' (\(commands.joined(separator: ", ")))"))
        }
        guard let terminal = f.terminal else { return .failure(ControlRequestError(bad, "\(command) needs \"terminal\"")) }
        switch command {
        case "status": return .success(.status(terminal: terminal))
        case "open": return .success(.open(terminal: terminal))
        case "close": return .success(.close(terminal: terminal))
        case "add-bridge", "remove-bridge":
            guard let text = f.bridge, let spec = BridgeSpec(parsing: text) else {
                return .failure(ControlRequestError(bad, "\"bridge\" is host:PORT, local:PORT or terminal:PORT"))
            }
            return .success(command == "add-bridge" ? .addBridge(terminal: terminal, spec) : .removeBridge(terminal: terminal, spec))
        default:
            guard let idle = f.idle.flatMap(Int32.init(exactly:)), let interval = f.interval.flatMap(Int32.init(exactly:)),
                  let count = f.count.flatMap(Int32.init(exactly:)),
                  case let k = KeepAliveSettings(idleSeconds: idle, probeIntervalSeconds: interval, probeCount: count), k.isValid
            else {
                return .failure(ControlRequestError(bad, "set-keepalive takes idle (1–32767 s), interval (1–32767 s) and count (1–127)"))
            }
            return .success(.setKeepAlive(terminal: terminal, k))
        }
    }

    public func encode(to encoder: Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        try c.encode(command, forKey: .cmd)
        try c.encodeIfPresent(terminal, forKey: .terminal)
        switch self {
        case let .addBridge(_, spec), let .removeBridge(_, spec): try c.encode(spec.description, forKey: .bridge)
        case let .setKeepAlive(_, k):
            try c.encode(Int(k.idleSeconds), forKey: .idle)
            try c.encode(Int(k.probeIntervalSeconds), forKey: .interval)
            try c.encode(Int(k.probeCount), forKey: .count)
        default: break
        }
    }

    /// One line of the control socket as a request, or why it is not one.
    public static func decode(_ line: [UInt8]) -> Result<ControlRequest, ControlRequestError> {
        do {
            return .success(try JSONDecoder().decode(ControlRequest.self, from: Data(line)))
        } catch let e as ControlRequestError {
            return .failure(e)
        } catch {
            return .failure(ControlRequestError(ControlReplyCode.badRequest, "expected a JSON object with cmd"))
        }
    }

    /// The request as one line of the control socket (without its newline).
    public var line: String {
        guard let data = try? JSONEncoder.sorted.encode(self) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }
}

extension JSONEncoder {
    fileprivate static var sorted: JSONEncoder {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return e
    }
}

extension BridgeSpec {
    /// `host:PORT`, `local:PORT` or `terminal:PORT`.
    public init?(parsing text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let kind = BridgeKind(rawValue: String(parts[0])), let port = decimal(parts[1], as: UInt16.self), port > 0 else { return nil }
        self.init(kind, port: port)
    }
}
