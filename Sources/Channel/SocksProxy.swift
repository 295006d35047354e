import CSystem
import Dispatch
import Glibc
import NetStack

/// The SOCKS proxy settings: where it listens on our PPP address, who may use it, where to.
public struct SocksConfiguration: Sendable, Equatable {
    public var port: UInt16 = 1080
    /// At most this many outbound connections at once (ICPPP: 5); one more gets a refusal.
    public var maximumConnections = 5
    /// Destinations allowed, as given (`host:port`, host a name or an address); nil allows all.
    public var allow: [SocksDestination]?
    /// SOCKS5 username/password (RFC 1929) pairs; nil: no authentication (SOCKS4/4a allowed).
    public var passwords: [String: String]?
    public init(port: UInt16 = 1080) { self.port = port }
}

public struct SocksDestination: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    public init(host: String, port: UInt16) {
        self.host = host.lowercased()
        self.port = port
    }
    /// `HOST:PORT`.
    public init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let p = UInt16(text[text.index(after: colon)...]), colon > text.startIndex else { return nil }
        self.init(host: String(text[..<colon]), port: p)
    }
    public var description: String { "\(host):\(port)" }
}

/// One outbound connection the terminal has through the proxy, for status and tests.
public struct ProxyConnectionStatus: Sendable, Equatable {
    public var destination: String
    public var hostEndpoint: TCPEndpoint?
    /// The keep-alive the kernel holds for the host socket (read back with getsockopt).
    public var keepAlive: KeepAliveSettings?
}

/// SOCKS4, SOCKS4a and SOCKS5 CONNECT on our PPP address; each accepted request becomes a host
/// connection relayed like a bridge's. Confined to the loop's thread (a name lookup runs
/// elsewhere and posts its answer back).
final class SocksProxy: StackApplication, @unchecked Sendable {
    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    let configuration: SocksConfiguration
    var keepAlive: KeepAliveSettings?
    private var negotiating: [ConnectionID: SocksNegotiation] = [:]
    private var dirty: Set<ConnectionID> = []
    /// Requests whose host name is being resolved (holding an outbound slot).
    private var resolving: Set<ConnectionID> = []
    private var destinations: [ConnectionID: String] = [:]
    private let relays: RelayTable
    let counters = Relay.Counter()
    private(set) var refusals = 0
    var log: (String) -> Void = { _ in }

    init(configuration: SocksConfiguration, loop: EventLoop) {
        self.configuration = configuration
        self.loop = loop
        relays = RelayTable(loop: loop)
    }

    var outbound: Int { relays.count + resolving.count }

    var connections: [ProxyConnectionStatus] {
        relays.relays.values.sorted { $0.id < $1.id }.map {
            ProxyConnectionStatus(destination: destinations[$0.id] ?? "?", hostEndpoint: HostSocket.localEndpoint($0.fd),
                                  keepAlive: HostSocket.keepAlive(of: $0.fd))
        }
    }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        relays.host = host
        do { try host.listen(port: configuration.port, for: self) } catch { log("socks: port \(configuration.port): \(error)") }
    }

    func stop() {
        relays.closeAll()
        negotiating = [:]
        resolving = []
        destinations = [:]
        dirty = []
        host = nil
    }

    func acceptable(port: UInt16, now: Instant) {
        guard let host else { return }
        while let id = host.accept(port: port, for: self) {
            negotiating[id] = SocksNegotiation(passwords: configuration.passwords)
            dirty.insert(id)
        }
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        if negotiating[id] != nil || resolving.contains(id) {
            if case .closed = event {
                negotiating[id] = nil
                resolving.remove(id)
                destinations[id] = nil
                host?.stack?.abort(id, now: nil)
            } else {
                dirty.insert(id)
            }
            return
        }
        if case .closed = event { destinations[id] = nil }
        relays.event(id, event, now: now)
    }

    func step(now: Instant) {
        let work = dirty
        dirty = []
        for id in work where negotiating[id] != nil { negotiate(id, now: now) }
        relays.step(now: now)
    }

    private func negotiate(_ id: ConnectionID, now: Instant) {
        guard let host, host.stack != nil, var n = negotiating[id] else { return }
        let bytes = host.stack!.read(id, maximum: SocksNegotiation.maximumHandshakeBytes + 1, now: now)
        if bytes.isEmpty {
            if host.stack!.atEndOfStream(id) {
                negotiating[id] = nil
                host.stack!.close(id, now: now)
            }
            return
        }
        let steps = n.feed(bytes)
        negotiating[id] = n
        for s in steps {
            switch s {
            case .needMore:
                break
            case let .reply(b):
                host.stack!.write(id, b, now: now)
            case let .refuse(b, reason):
                log("socks: refused: \(reason)")
                refuse(id, b, now: now)
                return
            case let .request(request, reply):
                if !reply.isEmpty { host.stack!.write(id, reply, now: now) }
                negotiating[id] = nil
                admit(id, request, leftover: n.leftover, now: now)
                return
            }
        }
    }

    private func refuse(_ id: ConnectionID, _ reply: [UInt8], now: Instant) {
        refusals += 1
        negotiating[id] = nil
        resolving.remove(id)
        destinations[id] = nil
        host?.stack?.write(id, reply, now: now)
        // Bytes the client sent early are read away first: closing over unread data would
        // reset the connection and lose the reply.
        while !(host?.stack?.read(id, now: now).isEmpty ?? true) {}
        host?.stack?.close(id, now: now)
    }

    private func admit(_ id: ConnectionID, _ request: SocksRequest, leftover: [UInt8], now: Instant) {
        let destination = "\(request.host):\(request.port)"
        if let allow = configuration.allow, !allow.contains(SocksDestination(host: request.host.description, port: request.port)) {
            log("socks: \(destination) is not on the allow-list")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .notAllowed), now: now)
            return
        }
        guard outbound < configuration.maximumConnections else {
            log("socks: \(destination) refused: \(configuration.maximumConnections) outbound connections already open")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now)
            return
        }
        destinations[id] = destination
        switch request.host {
        case let .ipv4(a):
            connect(id, request, TCPEndpoint(a, request.port), leftover: leftover, now: now)
        case let .name(name):
            resolving.insert(id)
            let port = request.port
            DispatchQueue.global().async { [loop] in
                let address = SocksProxy.resolve(name)
                loop.execute { [weak self] in
                    guard let self, self.resolving.remove(id) != nil else { return }
                    let now = self.loop.now
                    guard let address else {
                        self.log("socks: \(name) did not resolve")
                        self.refuse(id, SocksNegotiation.failureReply(for: request.version, .hostUnreachable), now: now)
                        self.host?.serve(now: now)
                        return
                    }
                    self.connect(id, request, TCPEndpoint(address, port), leftover: leftover, now: now)
                    self.host?.serve(now: now)
                }
            }
        case .ipv6:
            refuse(id, SocksNegotiation.failureReply(for: request.version, .addressTypeNotSupported), now: now)
        }
    }

    private func connect(_ id: ConnectionID, _ request: SocksRequest, _ endpoint: TCPEndpoint, leftover: [UInt8], now: Instant) {
        let fd: Int32
        do {
            fd = try HostSocket.connect(to: endpoint, keepAlive: keepAlive)
        } catch {
            log("socks: \(endpoint): \(error)")
            refuse(id, SocksNegotiation.failureReply(for: request.version, SocksProxy.failure(error.errno)), now: now)
            return
        }
        let r = Relay(id: id, fd: fd, counters: counters, hostConnected: false, stackEstablished: true)
        r.toHost = leftover
        // The client learns of success only once the host connection is made.
        r.onHostConnected = { [unowned self] r in
            let bound = HostSocket.localEndpoint(r.fd) ?? TCPEndpoint(IPv4Address(0), 0)
            self.host?.stack?.write(r.id, SocksNegotiation.successReply(for: request, bound: bound.address, port: bound.port), now: self.loop.now)
            self.log("socks: connected to \(endpoint)" + (request.host.isName ? " (\(request.host))" : ""))
        }
        r.onHostConnectFailed = { [unowned self] r, e in
            self.log("socks: \(endpoint): \(SystemError("connect", errno: e))")
            self.refuse(r.id, SocksNegotiation.failureReply(for: request.version, SocksProxy.failure(e)), now: self.loop.now)
            self.refusals -= 1
        }
        r.onFinished = { [unowned self] r in self.destinations[r.id] = nil }
        relays.add(r)
    }

    static func failure(_ e: Int32) -> SocksFailure {
        switch e {
        case ECONNREFUSED: return .connectionRefused
        case ENETUNREACH: return .networkUnreachable
        case EHOSTUNREACH: return .hostUnreachable
        case ETIMEDOUT: return .ttlExpired
        default: return .generalFailure
        }
    }

    /// Blocking lookup of an IPv4 address (run off the loop).
    static func resolve(_ name: String) -> IPv4Address? {
        if let a = IPv4Address(name) { return a }
        var hints = addrinfo()
        hints.ai_family = AF_INET
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(name, nil, &hints, &result) == 0, let first = result else { return nil }
        defer { freeaddrinfo(result) }
        guard let sa = first.pointee.ai_addr else { return nil }
        return sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { HostSocket.endpoint($0.pointee).address }
    }

    func report() -> [String] {
        let t = counters.value
        return ["socks on port \(configuration.port): connections \(t.connections) (\(t.active) open), refused \(refusals), to terminal \(t.bytesToTerminal) B, to host \(t.bytesToHost) B"]
    }
}

extension SocksDestinationHost {
    var isName: Bool { if case .name = self { return true } else { return false } }
}
