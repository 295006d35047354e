import CSystem
import Crypto
import Glibc
import NetStack
import Proxy

/// Answers the terminal's DNS queries (UDP port 53 on our PPP address, the `dns` address we
/// hand out) by asking an upstream resolver from the host. An off-path attacker who wants to
/// slip a forged answer in must guess both the query id and the source port (RFC 5452 §4,
/// §9.2), so each query leaves with an id and from a port of its own, drawn independently from
/// the CSPRNG; unanswered ones are forgotten after 5 s. The book of queries is sans-IO
/// (`DNSRelayQueries`); this class owns their sockets.
final class DNSRelay: StackApplication {
    static let port: UInt16 = 53
    static let timeout: Duration = .seconds(5)
    /// Each query in flight holds a socket; the terminal's queries beyond this are dropped.
    static let maximumInFlight = 64
    /// Random ports tried for one query before it is dropped (another socket may hold one).
    static let bindAttempts = 8

    /// Any generator, held so that `random(in:using:)` can take it.
    private struct Generator: RandomNumberGenerator {
        var base: any RandomNumberGenerator
        mutating func next() -> UInt64 { base.next() }
    }

    let upstream: TCPEndpoint
    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    private var random: Generator
    /// Source ports are drawn from the kernel's ephemeral range, away from ports services use.
    private let sourcePorts: ClosedRange<UInt16>
    /// By the query's own socket.
    private var queries = DNSRelayQueries<FileDescriptor>(capacity: DNSRelay.maximumInFlight, timeout: DNSRelay.timeout)
    var counters: DNSRelayQueries<FileDescriptor>.Counters { queries.counters }
    var log: (String) -> Void = { _ in }

    init(upstream: TCPEndpoint, loop: EventLoop, random: any RandomNumberGenerator = CSPRNG(),
         sourcePorts: ClosedRange<UInt16> = DNSRelay.ephemeralPorts()) {
        self.upstream = upstream
        self.loop = loop
        self.random = Generator(base: random)
        self.sourcePorts = sourcePorts
    }

    /// The first `nameserver` in resolv.conf (IPv4), as the host's own resolver.
    static func systemResolver(path: String = "/etc/resolv.conf") -> IPv4Address? {
        lines(path).lazy.compactMap { text -> IPv4Address? in
            let words = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0.isNewline })
            return words.count >= 2 && words[0] == "nameserver" ? IPv4Address(String(words[1])) : nil
        }.first
    }

    /// The kernel's ephemeral port range (ip(7) `ip_local_port_range`), or its default.
    static func ephemeralPorts(path: String = "/proc/sys/net/ipv4/ip_local_port_range") -> ClosedRange<UInt16> {
        let words = lines(path).first?.split(whereSeparator: { $0 == " " || $0 == "\t" || $0.isNewline }) ?? []
        guard words.count == 2, let low = UInt16(words[0]), let high = UInt16(words[1]), 1024 <= low, low < high else {
            return 32768...60999
        }
        return low...high
    }

    private static func lines(_ path: String) -> [String] {
        guard let f = fopen(path, "r") else { return [] }
        defer { fclose(f) }
        var result: [String] = []
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, Int32(line.count), f) != nil {
            result.append(String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return result
    }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        do { try host.bindUDP(port: DNSRelay.port, for: self) } catch { log("dns relay: \(error)") }
    }

    func stop() {
        for fd in queries.slots { finish(fd) }
        host = nil
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {}
    func step(now: Instant) {}

    func datagram(port: UInt16, now: Instant) {
        guard let host else { return }
        while let (from, payload) = host.stack?.receiveDatagram(port: port) {
            guard queries.admits(payload) else { continue }
            let upstreamID = UInt16.random(in: .min ... .max, using: &random)
            guard let query = DNSRelayQueries<FileDescriptor>.upstreamQuery(payload, id: upstreamID), let fd = openSocket() else {
                queries.notSent()
                continue
            }
            let sent = query.withUnsafeBytes { Glibc.send(fd.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent == query.count else {
                closeSocket(fd)
                queries.notSent()
                continue
            }
            do {
                try loop.register(fd, events: EPOLLIN.rawValue, serving: host.loopClient) { [unowned self] _ in self.answer(fd) }
            } catch {
                closeSocket(fd)
                queries.notSent()
                continue
            }
            queries.sent(payload, from: from, upstreamID: upstreamID, on: fd, now: now)
        }
    }

    /// A UDP socket from a random source port (tried again on a port in use), connected to the
    /// upstream so the kernel passes on only its datagrams.
    /// The terminal's part of the process's descriptors: each query in flight holds a socket.
    var share: DescriptorShare?

    private func openSocket() -> FileDescriptor? {
        guard share?.acquire() ?? true else { return nil }
        for _ in 0..<DNSRelay.bindAttempts {
            do {
                return try HostSocket.datagram(from: UInt16.random(in: sourcePorts, using: &random), connectedTo: upstream)
            } catch where error.errno == .addressInUse {
                continue
            } catch {
                break
            }
        }
        share?.release()
        return nil
    }

    private func closeSocket(_ fd: FileDescriptor) {
        fd.close()
        share?.release()
    }

    private func finish(_ fd: FileDescriptor) {
        queries.remove(fd)
        loop.unregister(fd)
        closeSocket(fd)
    }

    /// The upstream's answer on a query's socket: only one carrying the id we sent is taken.
    private func answer(_ fd: FileDescriptor) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while queries.isWaiting(on: fd) {
            let n = buffer.withUnsafeMutableBytes { recv(fd.rawValue, $0.baseAddress, $0.count, 0) }
            // Nothing more now, or an error queued for the socket (ICMP port unreachable): the
            // query stays until its deadline.
            guard n > 0 else { return }
            guard let (client, answer) = queries.answer(Array(buffer[0..<n]), on: fd) else { continue }
            finish(fd)
            guard host?.stackIsUp == true else { return }
            host?.stack?.sendDatagram(from: DNSRelay.port, to: client, payload: answer, now: loop.now)
            return
        }
    }

    var pollAt: Instant? { inPlace(&queries) { $0.pollAt } }

    func poll(now: Instant) {
        for fd in queries.expire(now: now) { finish(fd) }
    }

    func report() -> [String] {
        ["dns relay to \(upstream): \(counters.queries) queries, \(counters.answers) answers, \(counters.timeouts) timed out, "
            + "\(counters.dropped) dropped, \(counters.mismatched) with a wrong id"]
    }
}
