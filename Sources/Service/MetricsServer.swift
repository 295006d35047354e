import Channel
import Glibc
import NetStack

/// A minimal HTTP/1.x server for `GET /metrics` on the loop: one request per connection, the
/// answer, then the connection is closed. Requests are bounded in size, clients in number and
/// time (a few seconds), and a new client at the limit takes the place of the one that has
/// been there longest, so slow clients cannot keep a scrape out. The page is rendered at most
/// once a turn, however many clients ask in it.
final class MetricsServer {
    static let defaultClientLimit = 16
    /// Clients at once (fewer where the process has few descriptors).
    let clientLimit: Int
    static let requestLimit = 8_192
    static let clientTimeout = Duration.seconds(3)

    /// Where it listens (the port chosen when 0 was asked for).
    var endpoint: TCPEndpoint? { listener?.endpoint }
    private let loop: EventLoop
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: (connection: StreamConnection, timer: Int, since: Instant)] = [:]
    private let render: () -> String
    private var rendered: (turn: Int, text: String)?
    /// Clients that made room for a newer one at the limit.
    private(set) var evicted = 0
    /// Clients refused at the limit while every place was taken by a client under a second old.
    private(set) var refused = 0
    private(set) var timedOut = 0

    init(on endpoint: TCPEndpoint, loop: EventLoop, clientLimit: Int = MetricsServer.defaultClientLimit,
         render: @escaping () -> String) throws(SystemError) {
        self.loop = loop
        self.clientLimit = max(1, clientLimit)
        self.render = render
        listener = try StreamListener(on: endpoint, loop: loop) { [weak self] c in self?.accepted(c) }
    }

    func close() {
        listener?.close()
        listener = nil
        for c in clients.values {
            loop.cancelTimer(c.timer)
            c.connection.close()
        }
        clients = [:]
    }

    private func accepted(_ c: StreamConnection) {
        if clients.count >= clientLimit {
            // The oldest makes room, unless it came less than a second ago (a flood of
            // connections must not push out a scraper before its request is read): then the
            // newcomer is refused.
            guard let oldest = clients.min(by: { $0.value.since < $1.value.since }), oldest.value.since <= loop.now + .seconds(-1) else {
                refused += 1
                return c.close(reset: true)
            }
            evicted += 1
            drop(oldest.key)
        }
        let key = ObjectIdentifier(c)
        let timer = loop.schedule(at: loop.now + MetricsServer.clientTimeout) { [weak self] in
            self?.timedOut += 1
            self?.drop(key)
        }
        clients[key] = (c, timer, loop.now)
        var request: [UInt8] = []
        c.onData = { [weak self, unowned c] bytes in
            guard let self else { return }
            request += bytes
            guard let end = MetricsServer.headerEnd(request) else {
                if request.count > MetricsServer.requestLimit { self.respond(c, key, status: "431 Request Header Fields Too Large", body: "") }
                return
            }
            let firstLine = request[..<end].split(separator: 0x0A, maxSplits: 1).first.map { String(decoding: $0, as: UTF8.self) } ?? ""
            let words = firstLine.split(separator: " ")
            if words.count >= 2, words[0] == "GET", words[1] == "/metrics" || words[1].hasPrefix("/metrics?") {
                self.respond(c, key, status: "200 OK", body: self.page())
            } else if words.count >= 2, words[0] != "GET" {
                self.respond(c, key, status: "405 Method Not Allowed", body: "only GET /metrics\n")
            } else {
                self.respond(c, key, status: "404 Not Found", body: "only /metrics\n")
            }
        }
        c.onClose = { [weak self] _ in self?.drop(key) }
    }

    /// The page as of this turn (rendered once a turn at most).
    private func page() -> String {
        if let rendered, rendered.turn == loop.turns { return rendered.text }
        let text = render()
        rendered = (loop.turns, text)
        return text
    }

    /// Where the request's header ends (an empty line), if it has.
    static func headerEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 2 else { return nil }
        for i in 1..<bytes.count where bytes[i] == 0x0A {
            if bytes[i - 1] == 0x0A { return i }
            if i >= 3, bytes[i - 1] == 0x0D, bytes[i - 2] == 0x0A { return i }
        }
        return nil
    }

    private func respond(_ c: StreamConnection, _ key: ObjectIdentifier, status: String, body: String) {
        c.onData = nil
        let bytes = Array(body.utf8)
        let head = "HTTP/1.1 \(status)\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: \(bytes.count)\r\nConnection: close\r\n\r\n"
        c.send(Array(head.utf8) + bytes)
        c.shutdownWrite()
    }

    private func drop(_ key: ObjectIdentifier) {
        guard let c = clients.removeValue(forKey: key) else { return }
        loop.cancelTimer(c.timer)
        c.connection.close()
    }
}
