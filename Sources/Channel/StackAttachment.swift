import Glibc
import NetStack
import PPP

/// The diagnostic TCP services of RFC 862 (echo), 863 (discard), 864 (chargen) and 867
/// (daytime: our side sends the time and half-closes first, then reads until the peer closes).
public enum DiagnosticService: String, Sendable, CaseIterable {
    case echo, discard, chargen, daytime

    public var port: UInt16 {
        switch self {
        case .echo: return 7
        case .discard: return 9
        case .chargen: return 19
        case .daytime: return 13
        }
    }
}

/// Our own IP stack on the link, answering pings and, on request, the diagnostic services on
/// our PPP address; it can also ping through the link.
public final class StackAttachment: NetworkAttachment {
    public private(set) var stack: IPStack?
    public let services: [DiagnosticService]
    public let tcp: TCPConfiguration
    private let seed: UInt64
    private let output: (String) -> Void
    private var sessions: [ConnectionID: Session] = [:]
    private var ping: Ping?

    struct Session {
        var service: DiagnosticService
        /// Echo: bytes read but not yet taken by our send buffer; reading stops while any
        /// wait, so a peer that does not read its echo closes its own window. Chargen: the
        /// rest of the current line.
        var pending: [UInt8] = []
        var chargenOffset = 0
        /// Daytime: the time was sent and our direction closed.
        var greeted = false
        var peerDone = false
    }

    struct Ping {
        var target: IPv4Address
        var count: Int
        var interval: Duration
        var sent = 0
        var received = 0
        var sentAt: [UInt16: Instant] = [:]
        var next: Instant?
        var deadline: Instant?
        var reported = false
    }

    public init(services: [DiagnosticService], tcp: TCPConfiguration = TCPConfiguration(), seed: UInt64, output: @escaping (String) -> Void) {
        self.services = services
        self.tcp = tcp
        self.seed = seed
        self.output = output
    }

    /// Pings `target` `count` times, `interval` apart, once the link is up.
    public func ping(_ target: IPv4Address, count: Int, interval: Duration = .seconds(1)) {
        ping = Ping(target: target, count: count, interval: interval)
    }

    public var finished: Bool { ping?.reported ?? false }

    public func linkUp(_ result: IPCPResult, mtu: Int, now: Instant) throws(SystemError) {
        var c = IPStackConfiguration(address: result.localAddress)
        c.mtu = mtu
        c.tcp = tcp
        // VJ compresses only headers whose TCP options repeat; timestamps change in every
        // segment, so with VJ on the link we do not offer them (RFC 1144 predates them).
        if result.transmitVJ != nil { c.tcp.timestamps = false }
        var s = IPStack(configuration: c, seed: seed)
        for service in services { try? s.listen(port: service.port) }
        stack = s
        if !services.isEmpty {
            output("stack: \(result.localAddress) answers " + services.map { "\($0.rawValue) (\($0.port))" }.joined(separator: ", "))
        }
        // The first ping waits one interval: the peer's side of the link is usually still being
        // configured (pppd runs ip-up after IPCP opens) and would not answer it.
        if ping != nil { ping!.next = now + ping!.interval }
    }

    public func linkDown() {
        if stack != nil { output("stack: " + (stack!.counters.description)) }
        stack = nil
        sessions = [:]
    }

    public func receive(packet: [UInt8], now: Instant) {
        stack?.receive(packet: packet, now: now)
        serve(now: now)
    }

    public func takeOutgoing(now: Instant) -> [[UInt8]] {
        serve(now: now)
        return stack?.takeOutgoing() ?? []
    }

    public var pollAt: Instant? {
        earliest(stack?.pollAt, ping?.next, ping?.deadline)
    }

    public func poll(now: Instant) {
        if let p = stack?.pollAt, p <= now { stack?.poll(now: now) }
        pingTick(now: now)
        serve(now: now)
    }

    public var descriptors: [Int32] { [] }
    public func readable(_ descriptor: Int32, room: Int, now: Instant) throws(SystemError) {}

    public func report() -> [String] {
        guard let stack else { return ["stack: link not up"] }
        var lines = ["stack: " + stack.counters.description]
        for id in stack.connectionIDs {
            if let c = stack.connection(id) {
                lines.append("stack: \(id) \(c.local) <-> \(c.remote) \(c.state.rawValue) in \(c.counters.bytesReceived) out \(c.counters.bytesSent) retrans \(c.counters.retransmittedSegments)")
            }
        }
        return lines
    }

    // MARK: Services

    private func serve(now: Instant) {
        guard stack != nil else { return }
        for event in stack!.takeEvents() {
            switch event {
            case let .acceptable(port):
                // Only when a handshake finished: `accept` sweeps every connection.
                guard let service = services.first(where: { $0.port == port }) else { continue }
                while let id = stack!.accept(port: port) { sessions[id] = Session(service: service) }
            case let .tcp(id, .closed):
                sessions[id] = nil
            case let .echoReply(from, identifier, sequence, _):
                pingReply(from: from, identifier: identifier, sequence: sequence, now: now)
            default:
                break
            }
        }
        for id in Array(sessions.keys) { step(id, now: now) }
    }

    private func step(_ id: ConnectionID, now: Instant) {
        guard var s = sessions[id] else { return }
        defer { sessions[id] = s }
        switch s.service {
        case .echo:
            while true {
                if !s.pending.isEmpty {
                    let n = stack!.write(id, s.pending, now: now)
                    s.pending.removeFirst(n)
                    if !s.pending.isEmpty { break }
                }
                let chunk = stack!.read(id, maximum: max(stack!.writableBytes(id), 1), now: now)
                if chunk.isEmpty { break }
                s.pending = chunk
            }
            if s.pending.isEmpty && stack!.atEndOfStream(id) && !s.peerDone {
                s.peerDone = true
                stack!.close(id, now: now)
            }
        case .daytime:
            if !s.greeted {
                s.greeted = true
                stack!.write(id, Array(Self.daytime().utf8), now: now)
                stack!.shutdownWrite(id, now: now)
            }
            fallthrough
        case .discard:
            while !stack!.read(id, now: now).isEmpty {}
            if stack!.atEndOfStream(id) && !s.peerDone {
                s.peerDone = true
                stack!.close(id, now: now)
            }
        case .chargen:
            while !stack!.read(id, now: now).isEmpty {}
            if stack!.atEndOfStream(id) {
                if !s.peerDone {
                    s.peerDone = true
                    stack!.close(id, now: now)
                }
                return
            }
            // The rest of a line the send buffer could not take waits in `pending`, so the
            // pattern stays exact however the writes are cut.
            while true {
                if s.pending.isEmpty {
                    s.pending = Self.chargenLine(s.chargenOffset)
                    s.chargenOffset += 1
                }
                let n = stack!.write(id, s.pending, now: now)
                s.pending.removeFirst(n)
                if !s.pending.isEmpty { break }
            }
        }
    }

    /// RFC 867 leaves the format open; this is the one its example suggests, in UTC.
    static func daytime() -> String {
        var t = time(nil)
        var parts = tm()
        gmtime_r(&t, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let n = strftime(&buffer, buffer.count, "%A, %B %d, %Y %H:%M:%S-UTC\r\n", &parts)
        return String(decoding: buffer.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// RFC 864: line i is 72 printable characters starting at character i of the 95-character
    /// ASCII ring (0x20...0x7E), then CR LF.
    static func chargenLine(_ index: Int) -> [UInt8] {
        (0..<72).map { UInt8(0x20 + (index + $0) % 95) } + [13, 10]
    }

    // MARK: Ping

    private func pingTick(now: Instant) {
        guard var p = ping, stack != nil else { return }
        defer { ping = p }
        if let next = p.next, now >= next, p.sent < p.count {
            p.sent += 1
            let seq = UInt16(truncatingIfNeeded: p.sent)
            p.sentAt[seq] = now
            let payload = (0..<56).map { UInt8(truncatingIfNeeded: $0) }
            stack!.ping(p.target, identifier: 0x5050, sequence: seq, payload: payload, now: now)
            p.next = p.sent < p.count ? now + p.interval : nil
            // Like ping(8)'s linger: replies to the last request are awaited up to 10 s, since a
            // serial line busy with bulk data can hold an echo behind it for seconds.
            if p.sent == p.count { p.deadline = now + .seconds(10) }
        }
        if let d = p.deadline, now >= d, !p.reported {
            p.reported = true
            p.deadline = nil
            output("ping \(p.target): \(p.sent) sent, \(p.received) received")
        }
    }

    private func pingReply(from: IPv4Address, identifier: UInt16, sequence: UInt16, now: Instant) {
        guard var p = ping, identifier == 0x5050, from == p.target, let sent = p.sentAt.removeValue(forKey: sequence) else { return }
        p.received += 1
        let ms = Double((now - sent).nanoseconds) / 1e6
        output("ping \(from): icmp_seq=\(sequence) time=\(String(Int(ms * 10) / 10)).\(Int(ms * 10) % 10) ms")
        if p.received == p.count && !p.reported {
            p.reported = true
            p.deadline = nil
            output("ping \(p.target): \(p.sent) sent, \(p.received) received")
        }
        ping = p
    }
}
