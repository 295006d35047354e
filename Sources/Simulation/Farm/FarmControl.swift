import Channel
import Foundation
import Glibc

/// A farm's control socket: one JSON object a line in, one a line out (a Unix socket, 0600,
/// this user's clients only).
///
///     {"cmd":"status"}                                  counts for the whole farm
///     {"cmd":"list"}                                    every terminal: up, opens, downs, ...
///     {"cmd":"hangup","terminal":5,"downFor":2}         the device goes for 2 s, comes back new
///     {"cmd":"silence","terminal":5,"for":10}           frozen for 10 s, then restarts
///     {"cmd":"noise","terminal":5,"ber":0.001,"for":3}  bit errors on what it writes for 3 s
public final class FarmControl {
    public static let lineLimit = 4096
    public static let clientLimit = 16
    private let farm: TerminalFarm
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: (connection: StreamConnection, lines: LineAssembler)] = [:]

    public init(farm: TerminalFarm, path: String) throws(SystemError) {
        self.farm = farm
        listener = try StreamListener(unixPath: path, mode: 0o600, loop: farm.loop) { [weak self] c in self?.accepted(c) }
    }

    public func close() {
        listener?.close()
        listener = nil
        for c in clients.values { c.connection.close() }
        clients = [:]
    }

    private func accepted(_ c: StreamConnection) {
        guard clients.count < Self.clientLimit else { return c.close() }
        let key = ObjectIdentifier(c)
        clients[key] = (c, LineAssembler(limit: Self.lineLimit, skipsBlankLines: true))
        c.onData = { [weak self] bytes in
            guard let self, var entry = self.clients[key] else { return }
            let pieces = entry.lines.feed(bytes)
            self.clients[key] = entry
            for piece in pieces {
                let answer: [String: Any]
                switch piece {
                case .tooLong: answer = ["ok": false, "error": "line longer than \(Self.lineLimit) bytes"]
                case let .line(line): answer = self.answer(line)
                }
                entry.connection.send(Self.encode(answer))
            }
        }
        c.onEndOfStream = { [weak self] in
            self?.clients[key]?.connection.close()
            self?.clients[key] = nil
        }
        c.onClose = { [weak self] _ in self?.clients[key] = nil }
    }

    static func encode(_ object: [String: Any]) -> [UInt8] {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{\"ok\":false}".utf8)
        return [UInt8](data) + [0x0A]
    }

    /// Seconds as given (a number, 0 to a day).
    private static func seconds(_ value: Any?) -> Duration? {
        guard let n = value as? NSNumber else { return nil }
        let s = n.doubleValue
        guard s.isFinite, s >= 0, s <= 86_400 else { return nil }
        return .nanoseconds(Int64(s * 1e9))
    }

    func answer(_ line: [UInt8]) -> [String: Any] {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any], let cmd = object["cmd"] as? String else {
            return ["ok": false, "error": "not a JSON object with a \"cmd\""]
        }
        switch cmd {
        case "status":
            let s = farm.status
            return ["ok": true, "terminals": s.count, "up": s.filter(\.up).count, "opens": s.reduce(0) { $0 + $1.opens },
                    "downs": s.reduce(0) { $0 + $1.downs }, "hangups": s.reduce(0) { $0 + $1.hangUps },
                    "faults": s.reduce(0) { $0 + $1.faults }, "startFailures": s.reduce(0) { $0 + $1.startFailures }]
        case "list":
            return ["ok": true, "terminals": farm.status.map {
                ["n": $0.index, "behaviour": $0.behaviour, "up": $0.up, "opens": $0.opens, "downs": $0.downs, "hangups": $0.hangUps,
                 "faults": $0.faults, "startFailures": $0.startFailures] as [String: Any]
            }]
        case "hangup", "silence", "noise":
            guard let n = (object["terminal"] as? NSNumber)?.intValue else { return ["ok": false, "error": "\(cmd) needs \"terminal\""] }
            let fault: FarmFault
            switch cmd {
            case "hangup":
                guard let d = Self.seconds(object["downFor"] ?? 0) else { return ["ok": false, "error": "downFor is seconds, 0 to 86400"] }
                fault = .hangUp(downFor: d)
            case "silence":
                guard let d = Self.seconds(object["for"]) else { return ["ok": false, "error": "silence needs \"for\" (seconds)"] }
                fault = .silence(for: d)
            default:
                guard let d = Self.seconds(object["for"]), let ber = (object["ber"] as? NSNumber)?.doubleValue, ber.isFinite, ber > 0, ber <= 0.5 else {
                    return ["ok": false, "error": "noise needs \"for\" (seconds) and \"ber\" (0 to 0.5)"]
                }
                fault = .noise(bitErrorRate: ber, for: d)
            }
            guard farm.apply(fault, to: n) else { return ["ok": false, "error": "no terminal \(n)"] }
            return ["ok": true]
        default:
            return ["ok": false, "error": "unknown command (status, list, hangup, silence, noise)"]
        }
    }
}
