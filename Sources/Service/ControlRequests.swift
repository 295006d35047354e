import Channel
import Foundation
import NetStack
import Payment

/// The control socket's requests: `{"cmd":NAME, ...}` in, one JSON object out.
extension Service {
    /// Codes beyond the header's -1…-4 (which `add-bridge` returns as they are).
    enum ControlCode {
        static let noSuchBridge: Int32 = -5
        static let noSuchTerminal: Int32 = -6
        static let badRequest: Int32 = -7
    }

    func answer(_ line: [UInt8]) -> [String: Any] {
        func failure(_ code: Int32, _ text: String) -> [String: Any] { ["ok": false, "code": Int(code), "error": text] }
        guard let request = try? JSONParser.parse(line), request.members != nil else {
            return failure(ControlCode.badRequest, "expected a JSON object with cmd")
        }
        guard let command = request["cmd"]?.string else { return failure(ControlCode.badRequest, "expected a JSON object with cmd") }
        if command == "list" {
            return ["ok": true, "terminals": terminals.keys.sorted().compactMap { terminal($0).map(Service.summary) }]
        }
        if stopping { return failure(ControlCode.badRequest, "the service is stopping") }
        if command == "reload" {
            // Debounced: a client asking for thousands of reloads gets one.
            scheduleScan()
            return ["ok": true]
        }
        let known = ["status", "add-bridge", "remove-bridge", "set-keepalive", "open", "close"]
        guard known.contains(command) else {
            return failure(ControlCode.badRequest, "unknown cmd '\(PeerText.escaped(command, limit: 64))' (list, status, add-bridge, remove-bridge, set-keepalive, open, close, subscribe, reload)")
        }
        guard let name = request["terminal"]?.string else { return failure(ControlCode.badRequest, "\(command) needs \"terminal\"") }
        guard let t = terminal(name) else { return failure(ControlCode.noSuchTerminal, "no terminal '\(PeerText.escaped(name, limit: 64))'") }
        switch command {
        case "status":
            var object = StatusJSON.object(t.channel.status)
            for (k, v) in Service.summary(t) { object[k] = v }
            return ["ok": true, "terminal": object]
        case "add-bridge", "remove-bridge":
            guard let text = request["bridge"]?.string, let spec = BridgeSpec(parsing: text) else {
                return failure(ControlCode.badRequest, "\"bridge\" is host:PORT, local:PORT or terminal:PORT")
            }
            if command == "remove-bridge" {
                return t.removeBridge(spec) ? ["ok": true] : failure(ControlCode.noSuchBridge, "no bridge \(spec)")
            }
            do throws(BridgeError) { try t.addBridge(spec) } catch { return failure(error.rawValue, error.description) }
            updateReserve()
            return ["ok": true]
        case "set-keepalive":
            guard let idle = request["idle"]?.integer, let interval = request["interval"]?.integer, let count = request["count"]?.integer,
                  let i = Int32(exactly: idle), let v = Int32(exactly: interval), let c = Int32(exactly: count),
                  KeepAliveSettings(idleSeconds: i, probeIntervalSeconds: v, probeCount: c).isValid
            else {
                return failure(ControlCode.badRequest, "set-keepalive takes idle (1–32767 s), interval (1–32767 s) and count (1–127)")
            }
            t.channel.setKeepAlive(KeepAliveSettings(idleSeconds: i, probeIntervalSeconds: v, probeCount: c))
            return ["ok": true]
        case "open":
            t.start()
            return ["ok": true, "state": t.state.rawValue]
        default:
            t.stop()
            return ["ok": true, "state": t.state.rawValue]
        }
    }

    /// One terminal as `list` shows it.
    static func summary(_ t: ServedTerminal) -> [String: Any] {
        var object: [String: Any] = ["name": t.name, "state": t.state.rawValue, "device": t.file.device,
                                     "bridges": t.bridges.map(\.description), "failures": t.failures]
        if t.state == .open, let a = t.channel.currentAddresses {
            object["ip"] = a.ip.description
            object["terminal_ip"] = a.terminalIP.description
            object["submask"] = a.submask.description
            object["dns"] = a.dns.map { $0.description as Any } ?? NSNull()
        }
        if let r = t.lastCloseReason { object["last_close_reason"] = r.description }
        return object
    }

    /// An event as a line for subscribers.
    static func eventObject(_ event: ServiceEvent) -> [String: Any] {
        switch event {
        case let .opened(name, a):
            return ["event": "opened", "terminal": name, "ip": a.ip.description, "terminal_ip": a.terminalIP.description,
                    "submask": a.submask.description, "dns": a.dns.map { $0.description as Any } ?? NSNull()]
        case let .closed(name, reason):
            return ["event": "closed", "terminal": name, "reason": reason.name, "code": Int(reason.code), "text": reason.description]
        case let .waiting(name, device):
            return ["event": "waiting", "terminal": name, "device": device]
        case let .gaveUp(name, failures):
            return ["event": "gave-up", "terminal": name, "failures": failures]
        case let .connection(name, carrier, opened):
            var object: [String: Any] = ["event": opened ? "connection-opened" : "connection-closed", "terminal": name]
            switch carrier {
            case let .bridge(spec): object["bridge"] = spec.description
            case .proxy: object["proxy"] = true
            }
            return object
        case let .configuration(name, added):
            return ["event": added ? "terminal-added" : "terminal-removed", "terminal": name]
        case let .configurationError(path, errors):
            return ["event": "configuration-error", "file": path, "errors": errors]
        }
    }
}

extension BridgeSpec {
    /// `host:PORT`, `local:PORT` or `terminal:PORT`.
    init?(parsing text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let kind = BridgeKind(rawValue: String(parts[0])), let port = decimal(parts[1], as: UInt16.self), port > 0 else { return nil }
        self.init(kind, port: port)
    }
}
