import CSystem
import Glibc
import NetStack

/// Answers the terminal's DNS queries (UDP port 53 on our PPP address, the `dns` address we
/// hand out) by asking an upstream resolver from the host. Query ids are rewritten so queries
/// from different terminal ports cannot be confused; unanswered ones are forgotten after 5 s.
final class DNSRelay: StackApplication {
    static let port: UInt16 = 53
    static let timeout: Duration = .seconds(5)
    static let maximumInFlight = 256

    let upstream: TCPEndpoint
    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    private var fd: Int32 = -1
    private var inFlight: [UInt16: (client: TCPEndpoint, id: UInt16, deadline: Instant)] = [:]
    private var nextID: UInt16
    private(set) var counters = (queries: 0, answers: 0, timeouts: 0, dropped: 0)
    var log: (String) -> Void = { _ in }

    init(upstream: TCPEndpoint, loop: EventLoop, seed: UInt64) {
        self.upstream = upstream
        self.loop = loop
        nextID = UInt16(truncatingIfNeeded: seed)
    }

    /// The first `nameserver` in resolv.conf (IPv4), as the host's own resolver.
    static func systemResolver(path: String = "/etc/resolv.conf") -> IPv4Address? {
        guard let f = fopen(path, "r") else { return nil }
        defer { fclose(f) }
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, Int32(line.count), f) != nil {
            let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let words = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0.isNewline })
            if words.count >= 2, words[0] == "nameserver", let a = IPv4Address(String(words[1])) { return a }
        }
        return nil
    }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        do {
            try host.bindUDP(port: DNSRelay.port, for: self)
            fd = try HostSocket.datagram(connectedTo: upstream)
            try loop.register(fd, events: EPOLLIN.rawValue) { [unowned self] _ in self.answers() }
        } catch {
            log("dns relay: \(error)")
            closeSocket()
        }
    }

    func stop() {
        closeSocket()
        inFlight = [:]
        host = nil
    }

    private func closeSocket() {
        guard fd >= 0 else { return }
        loop.unregister(fd)
        Glibc.close(fd)
        fd = -1
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {}
    func step(now: Instant) {}

    func datagram(port: UInt16, now: Instant) {
        guard let host else { return }
        while let (from, payload) = host.stack?.receiveDatagram(port: port) {
            guard fd >= 0, payload.count >= 12, inFlight.count < DNSRelay.maximumInFlight else {
                counters.dropped += 1
                continue
            }
            repeat { nextID &+= 40503 } while inFlight[nextID] != nil
            inFlight[nextID] = (from, UInt16(payload[0]) << 8 | UInt16(payload[1]), now + DNSRelay.timeout)
            var query = payload
            query[0] = UInt8(nextID >> 8)
            query[1] = UInt8(nextID & 0xFF)
            counters.queries += 1
            _ = query.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
    }

    private func answers() {
        let now = loop.now
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return }
            guard n >= 12 else { continue }
            let id = UInt16(buffer[0]) << 8 | UInt16(buffer[1])
            guard let q = inFlight.removeValue(forKey: id), host?.stack != nil else { continue }
            var answer = Array(buffer[0..<n])
            answer[0] = UInt8(q.id >> 8)
            answer[1] = UInt8(q.id & 0xFF)
            counters.answers += 1
            host!.stack!.sendDatagram(from: DNSRelay.port, to: q.client, payload: answer, now: now)
        }
    }

    var pollAt: Instant? { inFlight.values.map(\.deadline).min() }

    func poll(now: Instant) {
        for (id, q) in inFlight where q.deadline <= now {
            inFlight[id] = nil
            counters.timeouts += 1
        }
    }

    func report() -> [String] {
        ["dns relay to \(upstream): \(counters.queries) queries, \(counters.answers) answers, \(counters.timeouts) timed out, \(counters.dropped) dropped"]
    }
}
