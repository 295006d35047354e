import Channel
import Glibc
import NetStack

/// A minimal HTTP/1.x server for `GET /metrics` on the loop: one request per connection, the
/// answer, then the connection is closed. Requests are bounded in size, clients in number and
/// time, so a client that sends nothing or never reads holds nothing for long.
final class MetricsServer {
    static let clientLimit = 16
    static let requestLimit = 8_192
    static let clientTimeout = Duration.seconds(10)

    /// Where it listens (the port chosen when 0 was asked for).
    var endpoint: TCPEndpoint? { listener?.endpoint }
    private let loop: EventLoop
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: (connection: StreamConnection, timer: Int)] = [:]
    private let render: () -> String
    private(set) var refused = 0

    init(on endpoint: TCPEndpoint, loop: EventLoop, render: @escaping () -> String) throws(SystemError) {
        self.loop = loop
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
        guard clients.count < MetricsServer.clientLimit else {
            refused += 1
            return c.close(reset: true)
        }
        let key = ObjectIdentifier(c)
        let timer = loop.schedule(at: loop.now + MetricsServer.clientTimeout) { [weak self] in self?.drop(key) }
        clients[key] = (c, timer)
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
                self.respond(c, key, status: "200 OK", body: self.render())
            } else if words.count >= 2, words[0] != "GET" {
                self.respond(c, key, status: "405 Method Not Allowed", body: "only GET /metrics\n")
            } else {
                self.respond(c, key, status: "404 Not Found", body: "only /metrics\n")
            }
        }
        c.onClose = { [weak self] _ in self?.drop(key) }
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
