import Channel
import Foundation
import Glibc
import Payment

/// `serve`'s control socket: a Unix socket whose mode (0660) says who may drive the service;
/// JSON lines, one request and one reply each, and for subscribers a stream of event lines.
/// Every client is held to a line length, a number of clients and a queue of unread output: one
/// that never reads is let go rather than holding the loop or the process's memory.
final class ControlServer {
    static let clientLimit = 32
    static let lineLimit = 16_384
    /// Unread bytes a client may have queued before it is let go.
    static let outputLimit = 1 << 20

    private final class Client {
        let connection: StreamConnection
        var lines = LineAssembler(limit: ControlServer.lineLimit)
        var subscribed = false
        init(_ connection: StreamConnection) { self.connection = connection }
    }

    let path: String
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: Client] = [:]
    /// Clients refused at the limit, or let go for not reading or for overlong lines.
    private(set) var clientsRefused = 0
    private(set) var clientsDropped = 0
    private let handle: ([UInt8]) -> [String: Any]

    /// Listens at `path` (mode 0660). `handle` answers one request line.
    init(path: String, loop: EventLoop, handle: @escaping ([UInt8]) -> [String: Any]) throws(SystemError) {
        self.path = path
        self.handle = handle
        listener = try StreamListener(unixPath: path, mode: 0o660, anyUser: true, loop: loop) { [weak self] c in self?.accepted(c) }
    }

    func close() {
        listener?.close()
        listener = nil
        for c in clients.values { c.connection.close() }
        clients = [:]
    }

    var subscriberCount: Int { clients.values.filter(\.subscribed).count }

    private func accepted(_ c: StreamConnection) {
        guard clients.count < ControlServer.clientLimit else {
            clientsRefused += 1
            // One try at saying why (the socket takes a short line at once), then closed.
            c.send(Array(ControlServer.line(["ok": false, "error": "too many control clients"]).utf8))
            return c.close()
        }
        let key = ObjectIdentifier(c)
        let client = Client(c)
        clients[key] = client
        c.onData = { [weak self] bytes in self?.received(bytes, from: key) }
        c.onClose = { [weak self] _ in self?.clients[key] = nil }
    }

    private func received(_ bytes: [UInt8], from key: ObjectIdentifier) {
        guard let client = clients[key] else { return }
        for piece in client.lines.feed(bytes) {
            let reply: [String: Any]
            switch piece {
            case .tooLong:
                reply = ["ok": false, "error": "request longer than \(ControlServer.lineLimit) bytes: skipped"]
            case let .line(line):
                if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { continue }
                if ControlServer.command(of: line) == "subscribe" {
                    client.subscribed = true
                    reply = ["ok": true]
                } else {
                    reply = handle(line)
                }
            }
            guard send(ControlServer.line(reply), to: client, key: key) else { return }
        }
    }

    /// The `cmd` of a request, if it has one.
    static func command(of line: [UInt8]) -> String? {
        (try? JSONParser.parse(line))?["cmd"]?.string
    }

    /// Sends `text` to every subscriber.
    func publish(_ object: [String: Any]) {
        let text = ControlServer.line(object)
        for (key, client) in clients where client.subscribed { _ = send(text, to: client, key: key) }
    }

    /// False when the client is gone (closed, or let go for not reading).
    private func send(_ text: String, to client: Client, key: ObjectIdentifier) -> Bool {
        client.connection.send(Array(text.utf8))
        guard client.connection.isOpen, clients[key] != nil else {
            clients[key] = nil
            return false
        }
        guard client.connection.queuedBytes <= ControlServer.outputLimit else {
            clientsDropped += 1
            clients[key] = nil
            client.connection.close()
            return false
        }
        return true
    }

    /// `object` as one JSON line (keys sorted; every string escaped by the serializer).
    static func line(_ object: [String: Any]) -> String {
        ChannelRun.encode(object)
    }
}
