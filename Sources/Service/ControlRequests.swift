import Channel
import Foundation
import NetStack

/// The control socket's requests: `{"cmd":NAME, ...}` in, one JSON object out.
extension Service {
    static func failure(_ code: Int32, _ text: String) -> [String: Any] { ["ok": false, "code": Int(code), "error": text] }

    /// Answers a request (`subscribe` is the control server's, and only acknowledged here).
    func answer(_ request: ControlRequest) -> [String: Any] {
        let bad = ControlReplyCode.badRequest
        switch request {
        case .list:
            return ["ok": true, "terminals": terminals.keys.sorted().compactMap { terminal($0).map(Service.summary) }]
        case .subscribe:
            return ["ok": true]
        default:
            break
        }
        if stopping { return Service.failure(bad, "the service is stopping") }
        if case .reload = request {
            // Debounced: a client asking for thousands of reloads gets one.
            scheduleScan()
            return ["ok": true]
        }
        guard let name = request.terminal else { return Service.failure(bad, "\(request.command) needs \"terminal\"") }
        guard let t = terminal(name) else {
            return Service.failure(ControlReplyCode.noSuchTerminal, "no terminal '\(PeerText.escaped(name, limit: 64))'")
        }
        switch request {
        case .status:
            var object = StatusJSON.object(t.channel.status)
            for (k, v) in Service.summary(t) { object[k] = v }
            return ["ok": true, "terminal": object]
        case let .removeBridge(_, spec):
            guard t.removeBridge(spec) else { return Service.failure(ControlReplyCode.noSuchBridge, "no bridge \(spec)") }
            updateReserve()
            return ["ok": true]
        case let .addBridge(_, spec):
            do throws(BridgeError) { try t.addBridge(spec) } catch { return Service.failure(error.rawValue, error.description) }
            updateReserve()
            return ["ok": true]
        case let .setKeepAlive(_, settings):
            t.channel.setKeepAlive(settings)
            return ["ok": true]
        case .open:
            t.start()
            return ["ok": true, "state": t.state.name]
        case .close:
            t.stop()
            return ["ok": true, "state": t.state.name]
        case .list, .subscribe, .reload:
            return ["ok": true]
        }
    }

    /// One terminal as `list` shows it.
    static func summary(_ t: ServedTerminal) -> [String: Any] {
        var object: [String: Any] = ["name": t.name, "state": t.state.name, "device": t.file.device,
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
        case let .connection(name, report):
            // One per connection through a bridge or the proxy, opened and closed (sharing
            // "connection"), or refused; what the terminal asked the proxy for is its text,
            // escaped by JSON like every string here.
            var object = StatusJSON.connection(report)
            object["terminal"] = name
            return object
        case let .configuration(name, added):
            return ["event": added ? "terminal-added" : "terminal-removed", "terminal": name]
        case let .configurationError(path, errors):
            return ["event": "configuration-error", "file": path, "errors": errors]
        }
    }
}
