import Channel
import Foundation
import Glibc
import NetStack

/// `serve`'s control socket: a Unix socket whose mode (0660) says who may drive the service;
/// JSON lines, one request and one reply each, and for subscribers a stream of event lines.
/// Every client is held to a budget per turn (one read, `requestsPerTurn` answers; the rest
/// wait, its socket unread, for the next turn), a line length, a queue of unread output, and a
/// time to send its next request: a client that floods, never reads or holds its connection
/// idle costs the others nothing beyond its turn, and cannot keep a new client out.
final class ControlServer {
    static let defaultClientLimit = 32
    /// Clients at once (fewer where the process has few descriptors).
    let clientLimit: Int
    /// Subscribers at most: each is kept however long it is silent, so they are fewer than
    /// the clients, and a new client always finds a place.
    static let subscriberLimit = 8
    static let lineLimit = 16_384
    /// Unread bytes a client may have queued before it is let go.
    static let outputLimit = 1 << 20
    /// Bytes read from a client per turn: a request is a line of a few dozen bytes.
    static let readPerTurn = 16_384
    /// Bytes a client may send without a request among them (blank lines) before it is let
    /// go: what a flood of nothing costs the loop is bounded, not only spread over turns.
    static let bytesWithoutRequest = 65_536
    /// Requests answered per client per turn of the loop.
    static let requestsPerTurn = 8
    /// A client (not a subscriber) that sends no complete request for this long is let go.
    static let requestTimeout = Duration.seconds(5)

    private final class Client {
        let connection: StreamConnection
        var lines = LineAssembler(limit: ControlServer.lineLimit, skipsBlankLines: true)
        /// Complete lines read but not answered yet (at most one read's worth: reading pauses
        /// while any wait).
        var waiting: [LineAssembler.Piece] = []
        var next = 0
        var subscribed = false
        /// When it connected or last had a request answered.
        var lastRequest: Instant
        var timer: Int?
        var drainScheduled = false
        /// Bytes received since the last request.
        var idleBytes = 0
        init(_ connection: StreamConnection, now: Instant) {
            self.connection = connection
            lastRequest = now
        }
    }

    let path: String
    private let loop: EventLoop
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: Client] = [:]
    /// Clients refused at the limit, or let go for not reading or for overlong lines.
    private(set) var clientsRefused = 0
    private(set) var clientsDropped = 0
    /// Clients let go for sending no request in time, and idle ones let go to make room.
    private(set) var clientsTimedOut = 0
    private(set) var clientsEvicted = 0
    /// Clients let go for sending `bytesWithoutRequest` of nothing.
    private(set) var clientsSendingNothing = 0
    private let handle: (ControlRequest) -> [String: Any]

    /// Listens at `path` (mode 0660). `handle` answers one request (all but `subscribe`,
    /// which is the server's own).
    init(path: String, loop: EventLoop, clientLimit: Int = ControlServer.defaultClientLimit,
         handle: @escaping (ControlRequest) -> [String: Any]) throws(SystemError) {
        self.path = path
        self.clientLimit = max(2, clientLimit)
        self.loop = loop
        self.handle = handle
        listener = try StreamListener(unixPath: path, mode: 0o660, anyUser: true, loop: loop) { [weak self] c in self?.accepted(c) }
    }

    func close() {
        listener?.close()
        listener = nil
        for c in clients.values { letGo(c) }
        clients = [:]
    }

    var clientCount: Int { clients.count }
    var subscriberCount: Int { clients.values.filter(\.subscribed).count }

    private func accepted(_ c: StreamConnection) {
        if clients.count >= clientLimit {
            // Full: the client that has waited longest without a request makes room, so idle
            // connections can never keep a new client out; one that came less than a second
            // ago keeps its place (it has had no time to ask), so a flood of connections
            // cannot push out a client before it is heard.
            let settled = loop.now + .seconds(-1)
            if let (key, oldest) = clients.filter({ !$0.value.subscribed && $0.value.lastRequest <= settled })
                .min(by: { $0.value.lastRequest < $1.value.lastRequest }) {
                clientsEvicted += 1
                clients[key] = nil
                letGo(oldest)
            } else {
                clientsRefused += 1
                // One try at saying why (the socket takes a short line at once), then closed.
                c.send(Array(ControlServer.line(["ok": false, "error": "too many control clients"]).utf8))
                return c.close()
            }
        }
        c.readLimit = ControlServer.readPerTurn
        let key = ObjectIdentifier(c)
        let client = Client(c, now: loop.now)
        clients[key] = client
        arm(client, key: key)
        c.onData = { [weak self] bytes in self?.received(bytes, from: key) }
        c.onClose = { [weak self] _ in
            guard let self, let client = self.clients.removeValue(forKey: key) else { return }
            self.letGo(client)
        }
    }

    private func letGo(_ client: Client) {
        if let t = client.timer { loop.cancelTimer(t) }
        client.timer = nil
        client.connection.close()
    }

    /// (Re)starts the client's time to send its next request; subscribers have none.
    private func arm(_ client: Client, key: ObjectIdentifier) {
        if let t = client.timer { loop.cancelTimer(t) }
        client.timer = nil
        guard !client.subscribed else { return }
        client.timer = loop.schedule(at: loop.now + ControlServer.requestTimeout) { [weak self] in
            guard let self, let client = self.clients.removeValue(forKey: key) else { return }
            client.timer = nil
            self.clientsTimedOut += 1
            self.letGo(client)
        }
    }

    private func received(_ bytes: [UInt8], from key: ObjectIdentifier) {
        guard let client = clients[key] else { return }
        // Blank lines get no answer and cost no request (the assembler passes over them).
        let pieces = client.lines.feed(bytes)
        client.idleBytes = pieces.isEmpty ? client.idleBytes + bytes.count : 0
        guard client.idleBytes <= ControlServer.bytesWithoutRequest else {
            clientsSendingNothing += 1
            clients[key] = nil
            letGo(client)
            return
        }
        client.waiting += pieces
        drain(key)
    }

    /// Answers up to `requestsPerTurn` of the client's waiting lines; the rest wait a turn, and
    /// nothing more is read from it meanwhile.
    private func drain(_ key: ObjectIdentifier) {
        guard let client = clients[key] else { return }
        var answered = 0
        while answered < ControlServer.requestsPerTurn && client.next < client.waiting.count {
            let piece = client.waiting[client.next]
            client.next += 1
            answered += 1
            let reply: [String: Any]
            switch piece {
            case .tooLong:
                reply = ["ok": false, "error": "request longer than \(ControlServer.lineLimit) bytes: skipped"]
            case let .line(line):
                switch ControlRequest.decode(line) {
                case .success(.subscribe):
                    if client.subscribed || subscriberCount < min(ControlServer.subscriberLimit, clientLimit - 1) {
                        client.subscribed = true
                        reply = ["ok": true]
                    } else {
                        reply = ["ok": false, "error": "too many subscribers (\(ControlServer.subscriberLimit))"]
                    }
                case let .success(request):
                    reply = handle(request)
                case let .failure(e):
                    reply = Service.failure(e.code, e.message)
                }
            }
            guard send(ControlServer.line(reply), to: client, key: key) else { return }
        }
        if answered > 0 {
            client.lastRequest = loop.now
            arm(client, key: key)
        }
        if client.next < client.waiting.count {
            client.connection.readingPaused = true
            guard !client.drainScheduled else { return }
            client.drainScheduled = true
            loop.nextTurn { [weak self, weak client] in
                client?.drainScheduled = false
                self?.drain(key)
            }
        } else {
            client.waiting.removeAll(keepingCapacity: true)
            client.next = 0
            client.connection.readingPaused = false
        }
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
            if clients.removeValue(forKey: key) != nil { letGo(client) }
            return false
        }
        guard client.connection.queuedBytes <= ControlServer.outputLimit else {
            clientsDropped += 1
            clients[key] = nil
            letGo(client)
            return false
        }
        return true
    }

    /// `object` as one JSON line (keys sorted; every string escaped by the serializer).
    static func line(_ object: [String: Any]) -> String {
        StatusJSON.line(object)
    }
}
