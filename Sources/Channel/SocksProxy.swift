import CSystem
import Glibc
import NetStack
import Proxy

/// The SOCKS proxy settings: where it listens on our PPP address, who may use it, where to.
public struct SocksConfiguration: Sendable, Equatable {
    public var port: UInt16 = 1080
    /// At most this many outbound connections at once (ICPPP: 5); one more gets a refusal.
    public var maximumConnections = 5
    /// Destinations allowed, as given (`host:port`, host a name or an address); nil allows every
    /// destination outside the host's own addresses and networks. An entry naming an address
    /// also opens exactly that `address:port` when it is the host's own, loopback, private,
    /// link-local or otherwise not global. An entry naming a host name does not: what the name
    /// resolves to meets the same rules as an address asked for (DNS can change under us),
    /// unless that `address:port` is listed too.
    public var allow: [SocksDestination]?
    /// Opens loopback, private, link-local, shared, multicast, reserved and documentation
    /// destinations, the host's own addresses and the link's to the terminal without naming each
    /// (off by default: the terminal reaches the internet, not the host's services and networks).
    public var allowPrivate = false
    /// A client that has not finished its handshake (up to its CONNECT request) this long after
    /// connecting is reset, so a silent one cannot hold a connection of our stack.
    public var handshakeTimeout: Duration = .seconds(10)
    /// SOCKS5 username/password (RFC 1929) pairs; nil: no authentication (SOCKS4/4a allowed).
    public var passwords: [String: String]?
    /// The host address outbound connections are made from (bound before connecting), for a
    /// host with several addresses whose firewall or gateway knows the terminals by one; nil:
    /// the kernel's choice.
    public var outboundAddress: IPv4Address?
    public init(port: UInt16 = 1080) { self.port = port }
}

public struct SocksDestination: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    /// A host that is dotted-quad text is kept in its plain form ("127.000.000.001" is
    /// "127.0.0.1"), as requests for an address are compared in that form.
    public init(host: String, port: UInt16) {
        self.host = IPv4Address(host)?.description ?? host.lowercased()
        self.port = port
    }
    /// `HOST:PORT`.
    public init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let p = UInt16(text[text.index(after: colon)...]), colon > text.startIndex else { return nil }
        self.init(host: String(text[..<colon]), port: p)
    }
    /// Escaped: a destination a terminal asked for is its text.
    public var description: String { "\(PeerText.escaped(host)):\(port)" }
}

/// One outbound connection the terminal has through the proxy, for status and tests.
public struct ProxyConnectionStatus: Sendable, Equatable {
    /// What the terminal asked for, escaped.
    public var destination: String
    public var hostEndpoint: TCPEndpoint?
    /// The keep-alive the kernel holds for the host socket (read back with getsockopt).
    public var keepAlive: KeepAliveSettings?
}

extension SocksDestination {
    /// What `request` asked for, as the policy weighs it; nil for an IPv6 address, which the
    /// proxy does not serve.
    public init?(_ request: SocksRequest) {
        switch request.host {
        case let .ipv4(a): self.init(host: a.description, port: request.port)
        case let .name(name): self.init(host: name, port: request.port)
        case .ipv6: return nil
        }
    }
}

/// Where the proxy may connect on the terminal's behalf. The decision is made on the address
/// the connection would go to, after a name is resolved, so a name for 127.0.0.1 meets the same
/// rule as 127.0.0.1 itself.
public struct SocksPolicy: Sendable, Equatable {
    public enum Decision: Sendable, Equatable {
        /// Allowed. `openedByOperator`: an entry naming this address and port, or
        /// `allowPrivate`, opened it; otherwise the rules let it through, and a connection
        /// that turns out to reach this host after all is reset once made.
        case connect(openedByOperator: Bool)
        /// There is an allow-list and it does not name the destination.
        case notListed
        /// Our PPP address or the terminal's.
        case ownAddress
        /// An address on one of the host's interfaces: its services bound to 0.0.0.0 answer
        /// there as on loopback.
        case hostAddress
        /// Loopback, private and the rest that only `allowPrivate` or an entry opens.
        case restricted(IPv4AddressScope)
    }

    public var allow: [SocksDestination]?
    public var allowPrivate = false
    /// Our PPP address and the terminal's.
    public var ownAddresses: [IPv4Address] = []

    public init(allow: [SocksDestination]?, allowPrivate: Bool = false, ownAddresses: [IPv4Address] = []) {
        self.allow = allow
        self.allowPrivate = allowPrivate
        self.ownAddresses = ownAddresses
    }

    /// Before any lookup: with an allow-list, a destination it does not name is refused without
    /// resolving anything.
    public func listed(_ requested: SocksDestination) -> Bool { allow?.contains(requested) ?? true }

    /// Whether the terminal may have `requested` (as it asked for it), which leads to `address`,
    /// on a host whose interfaces have `hostAddresses` now.
    public func decide(_ requested: SocksDestination, address: IPv4Address, hostAddresses: [IPv4Address]) -> Decision {
        guard listed(requested) else { return .notListed }
        // An entry naming this very address and port is the operator's word for it. An entry
        // naming a host name is not: the name's owner decides where it leads, and may point it
        // at 127.0.0.1 or 169.254.169.254 tomorrow.
        if allowPrivate || allow?.contains(SocksDestination(host: address.description, port: requested.port)) == true {
            return .connect(openedByOperator: true)
        }
        if ownAddresses.contains(address) { return .ownAddress }
        // A special range says more (127.0.0.1 is on `lo` too); an address of the host that looks
        // global would otherwise pass.
        let scope = IPv4AddressScope(address)
        guard scope == .global else { return .restricted(scope) }
        return hostAddresses.contains(address) ? .hostAddress : .connect(openedByOperator: false)
    }
}

/// Log lines a peer can cause, by kind: the first of a kind is written at once, then at most
/// one per `interval`, saying how many were held back since the one before, so a flood of bad
/// requests costs a line a minute, not a line each. Keyed by our own kinds, never by peer text.
struct ThrottledLog<Kind: Hashable> {
    let interval: Duration
    private var lastLine: [Kind: Instant] = [:]
    private var heldSinceLine: [Kind: Int] = [:]
    /// Every occurrence by kind, written or not.
    private(set) var occurrences: [Kind: Int] = [:]

    init(interval: Duration) { self.interval = interval }

    /// nil: hold this one back; a number: write a line now, this many having been held back
    /// since the last.
    mutating func admit(_ kind: Kind, now: Instant) -> Int? {
        occurrences[kind, default: 0] += 1
        if let last = lastLine[kind], now - last < interval {
            heldSinceLine[kind, default: 0] += 1
            return nil
        }
        lastLine[kind] = now
        return heldSinceLine.removeValue(forKey: kind) ?? 0
    }

    /// Held back and not yet told in a later line.
    var held: Int { heldSinceLine.values.reduce(0, +) }
}

/// Keys reported once each (a terminal retrying one refused destination writes one log line),
/// remembering at most `capacity`; what it cannot remember is counted instead of reported.
struct ReportedOnce {
    let capacity: Int
    private var seen: Set<String> = []
    private(set) var unreported = 0

    init(capacity: Int) { self.capacity = capacity }

    /// True the first time `key` comes, while there is room to remember it.
    mutating func first(_ key: String) -> Bool {
        guard !seen.contains(key) else { return false }
        guard seen.count < capacity else {
            unreported += 1
            return false
        }
        seen.insert(key)
        return true
    }
}

/// Requests whose host name is being resolved, each under a token of its own. Connection ids
/// start again at 1 in the stack of a renegotiated link, so an answer is matched by its token
/// and can only reach the client that asked; the client's id alone could name another one.
/// Lookups are counted apart from the clients waiting for them: a client that resets stops
/// waiting at once, but getaddrinfo cannot be interrupted and holds its thread until the
/// resolver answers, so only a lookup that came back frees its place.
struct PendingLookups {
    private var tokens: [ConnectionID: UInt64] = [:]
    private var nextToken: UInt64 = 0
    /// Lookups started and not yet come back, whether anyone still waits for them or not.
    private(set) var running = 0

    /// Clients waiting for a lookup.
    var count: Int { tokens.count }
    func contains(_ id: ConnectionID) -> Bool { tokens[id] != nil }

    mutating func begin(_ id: ConnectionID) -> UInt64 {
        nextToken &+= 1
        tokens[id] = nextToken
        running += 1
        return nextToken
    }

    /// The lookup `token` came back (or never started): true, and the wait is over, when `id`
    /// is still waiting for it.
    mutating func returned(_ id: ConnectionID, token: UInt64) -> Bool {
        running = max(0, running - 1)
        guard tokens[id] == token else { return false }
        tokens[id] = nil
        return true
    }

    /// The client is gone; its lookup runs on and still counts until it returns.
    mutating func cancel(_ id: ConnectionID) { tokens[id] = nil }
    /// The stack is gone; tokens are never reused, so lookups still running find nothing.
    mutating func removeAll() { tokens = [:] }
}

/// A blocking name lookup on a thread of its own. A resolver that hangs then holds only that
/// thread, never one of the process's shared pool (Dispatch's, which Swift's cooperative
/// executor and everything else need); the proxy caps how many run at once.
enum LookupThread {
    private final class Work {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    /// False when no thread could be made (the system is out of them); `body` then never runs.
    static func start(_ body: @escaping @Sendable () -> Void) -> Bool {
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        let work = Unmanaged.passRetained(Work(body)).toOpaque()
        var thread = pthread_t()
        let r = pthread_create(&thread, &attributes, { raw in
            guard let raw else { return nil }
            Unmanaged<Work>.fromOpaque(raw).takeRetainedValue().body()
            return nil
        }, work)
        if r != 0 { Unmanaged<Work>.fromOpaque(work).release() }
        return r == 0
    }
}

/// SOCKS4, SOCKS4a and SOCKS5 CONNECT on our PPP address; each accepted request becomes a host
/// connection relayed like a bridge's. Confined to the loop's thread (a name lookup runs
/// elsewhere and posts its answer back).
final class SocksProxy: StackApplication, @unchecked Sendable {
    /// Refused destinations remembered for the log.
    static let reportedCapacity = 256
    /// At most one line per kind of peer-caused event in this long.
    static let logInterval: Duration = .seconds(60)

    /// Kinds of log line a terminal can cause (policy refusals are logged once per destination
    /// instead).
    enum Notice: Hashable {
        case badHandshake, outboundFull, lookupsFull, lookupFailed, connectFailed, connected, reachedHost
    }

    private struct Handshake {
        var negotiation: SocksNegotiation
        let deadline: Instant
    }

    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    let configuration: SocksConfiguration
    var keepAlive: KeepAliveSettings?
    /// The blocking lookup, run on a thread of its own.
    var resolve: @Sendable (String) -> IPv4Address? = SocksProxy.resolve
    /// The addresses on the host's interfaces, read for each decision (nil: unreadable).
    var hostAddresses: () -> [IPv4Address]? = SocksProxy.interfaceAddresses
    private var policy: SocksPolicy
    private var negotiating: [ConnectionID: Handshake] = [:]
    private var dirty: Set<ConnectionID> = []
    /// Requests whose host name is being resolved (holding an outbound slot), and lookups
    /// still running (each holding a thread, capped at `maximumConnections`).
    private var resolving = PendingLookups()
    private var destinations: [ConnectionID: String] = [:]
    private let relays: RelayTable
    let counters = Relay.Counter()
    private(set) var refusals = 0
    /// Refusals by the destination rules (allow-list, private, the host's and the link's own
    /// addresses), connections reset for reaching this host included.
    private(set) var policyRefusals = 0
    private(set) var handshakeTimeouts = 0
    /// Requests for a name refused because as many lookups as allowed were running.
    private(set) var lookupRefusals = 0
    private var reported = ReportedOnce(capacity: SocksProxy.reportedCapacity)
    private var notices = ThrottledLog<Notice>(interval: SocksProxy.logInterval)
    var log: (String) -> Void = { _ in }
    /// A request refused before a connection was made: what the terminal asked for (empty
    /// when its handshake failed before saying), the terminal's address, and why.
    var onRefused: (String, String, String) -> Void = { _, _, _ in }

    init(configuration: SocksConfiguration, loop: EventLoop, share: DescriptorShare? = nil) {
        self.configuration = configuration
        self.loop = loop
        policy = SocksPolicy(allow: configuration.allow, allowPrivate: configuration.allowPrivate)
        relays = RelayTable(loop: loop, share: share)
    }

    var outbound: Int { relays.count + resolving.count }
    var lookupsRunning: Int { resolving.running }

    var connections: [ProxyConnectionStatus] {
        relays.relays.values.sorted { $0.id < $1.id }.map {
            ProxyConnectionStatus(destination: destinations[$0.id] ?? "?", hostEndpoint: HostSocket.localEndpoint($0.fd),
                                  keepAlive: HostSocket.keepAlive(of: $0.fd))
        }
    }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        relays.host = host
        policy.ownAddresses = host.result.map { [$0.localAddress, $0.peerAddress] } ?? []
        do { try host.listen(port: configuration.port, for: self) } catch { log("socks: port \(configuration.port): \(error)") }
    }

    func stop() {
        relays.closeAll()
        negotiating = [:]
        resolving.removeAll()
        destinations = [:]
        dirty = []
        host = nil
    }

    func acceptable(port: UInt16, now: Instant) {
        guard let host else { return }
        while let id = host.accept(port: port, for: self) {
            negotiating[id] = Handshake(negotiation: SocksNegotiation(passwords: configuration.passwords),
                                        deadline: now + configuration.handshakeTimeout)
            dirty.insert(id)
        }
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        if negotiating[id] != nil || resolving.contains(id) {
            if case .closed = event {
                negotiating[id] = nil
                resolving.cancel(id)
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


    var pollAt: Instant? { negotiating.values.lazy.map { $0.deadline }.min() }

    /// Handshakes past their deadline end with a reset (nothing in SOCKS says "too slow").
    func poll(now: Instant) {
        for (id, h) in negotiating where h.deadline <= now {
            negotiating[id] = nil
            dirty.remove(id)
            handshakeTimeouts += 1
            onRefused("", terminalEndpoint(id), "no complete handshake within \(configuration.handshakeTimeout)")
            host?.abort(id, now: now)
        }
    }

    /// Logs a line a peer caused, unless one of its kind went out less than `logInterval` ago.
    private func note(_ kind: Notice, now: Instant, _ line: @autoclosure () -> String) {
        guard let held = notices.admit(kind, now: now) else { return }
        log("socks: " + line() + (held > 0 ? " (and \(held) more like it since the last such line)" : ""))
    }

    private func negotiate(_ id: ConnectionID, now: Instant) {
        guard let host, host.stackIsUp, var h = negotiating[id] else { return }
        let bytes = host.stack!.read(id, maximum: SocksNegotiation.maximumHandshakeBytes + 1, now: now)
        if bytes.isEmpty {
            if host.atEndOfStream(id) {
                negotiating[id] = nil
                host.stack!.close(id, now: now)
            }
            return
        }
        let steps = h.negotiation.feed(bytes)
        negotiating[id] = h
        for s in steps {
            switch s {
            case .needMore:
                break
            case let .reply(b):
                host.stack!.write(id, b, now: now)
            case let .refuse(b, reason):
                note(.badHandshake, now: now, "refused: \(reason)")
                refuse(id, b, now: now, why: "handshake: \(reason)")
                return
            case let .request(request, reply):
                if !reply.isEmpty { host.stack!.write(id, reply, now: now) }
                negotiating[id] = nil
                admit(id, request, leftover: h.negotiation.leftover, now: now)
                return
            }
        }
    }

    /// The terminal's end of connection `id`, for reports.
    private func terminalEndpoint(_ id: ConnectionID) -> String {
        host?.stack?.connection(id).map { "\($0.remote)" } ?? ""
    }

    /// Answers `reply` and closes; `why`, when given, is reported (`onRefused`) with what the
    /// terminal asked for.
    private func refuse(_ id: ConnectionID, _ reply: [UInt8], now: Instant, why: String? = nil) {
        if let why { onRefused(destinations[id] ?? "", terminalEndpoint(id), why) }
        refusals += 1
        negotiating[id] = nil
        resolving.cancel(id)
        destinations[id] = nil
        host?.stack?.write(id, reply, now: now)
        // Bytes the client sent early are read away first: closing over unread data would
        // reset the connection and lose the reply.
        while !(host?.stack?.read(id, now: now).isEmpty ?? true) {}
        host?.stack?.close(id, now: now)
    }

    /// A refusal by the destination rules: SOCKS5 reply 2 "connection not allowed by ruleset"
    /// (RFC 1928 §6), SOCKS4 0x5B; logged once per destination.
    private func refuseByPolicy(_ id: ConnectionID, _ request: SocksRequest, why: String, now: Instant) {
        policyRefusals += 1
        let destination = "\(request.host):\(request.port)"
        if reported.first(destination) { log("socks: \(destination) refused: \(why)") }
        destinations[id] = destination
        refuse(id, SocksNegotiation.failureReply(for: request.version, .notAllowed), now: now, why: why)
    }

    private func admit(_ id: ConnectionID, _ request: SocksRequest, leftover: [UInt8], now: Instant) {
        destinations[id] = "\(request.host):\(request.port)"
        guard let requested = SocksDestination(request) else {
            refuse(id, SocksNegotiation.failureReply(for: request.version, .addressTypeNotSupported), now: now, why: "address type not supported")
            return
        }
        var address: IPv4Address?
        if case let .ipv4(a) = request.host { address = a }
        guard policy.listed(requested) else {
            refuseByPolicy(id, request, why: "not on the allow-list", now: now)
            return
        }
        guard outbound < configuration.maximumConnections else {
            note(.outboundFull, now: now, "\(request.host):\(request.port) refused: \(configuration.maximumConnections) outbound connections already open")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now,
                   why: "\(configuration.maximumConnections) outbound connections already open")
            return
        }
        if let address {
            connectIfAllowed(id, request, requested, address, leftover: leftover, now: now)
            return
        }
        // Lookups of clients that reset are still running: they count until they come back, or
        // a client asking for a slow name and resetting, again and again, would pile up threads.
        guard resolving.running < configuration.maximumConnections else {
            lookupRefusals += 1
            note(.lookupsFull, now: now, "\(request.host) refused: \(resolving.running) name lookups still running")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now,
                   why: "\(resolving.running) name lookups still running")
            return
        }
        // The rules apply to the address the name leads to, once it is known.
        let token = resolving.begin(id)
        let started = LookupThread.start { [loop, resolve] in
            let address = resolve(requested.host)
            loop.execute { [weak self] in
                guard let self, self.resolving.returned(id, token: token) else { return }
                let now = self.loop.now
                if let address {
                    self.connectIfAllowed(id, request, requested, address, leftover: leftover, now: now)
                } else {
                    self.note(.lookupFailed, now: now, "\(request.host) did not resolve")
                    self.refuse(id, SocksNegotiation.failureReply(for: request.version, .hostUnreachable), now: now, why: "the name did not resolve")
                }
                self.host?.serve(now: now)
            }
        }
        if !started {
            _ = resolving.returned(id, token: token)
            note(.lookupFailed, now: now, "\(request.host): no thread for the lookup")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now, why: "no thread for the name lookup")
        }
    }

    private func connectIfAllowed(_ id: ConnectionID, _ request: SocksRequest, _ requested: SocksDestination, _ address: IPv4Address,
                                  leftover: [UInt8], now: Instant) {
        let shown = request.host.isName ? " (\(address))" : ""
        let opens = "an allow-list entry naming \(address):\(request.port), or allowing private destinations, opens it"
        // The host's addresses are read only when the rules would let a global address through:
        // an operator's entry, a refusal by range or the link's own addresses never need them (and
        // so never fail with them, as getifaddrs may when descriptors run short).
        var decision = policy.decide(requested, address: address, hostAddresses: [])
        if case .connect(openedByOperator: false) = decision {
            guard let hostAddresses = hostAddresses() else {
                // Not knowing the host's addresses, no destination can be told apart from them.
                note(.connectFailed, now: now, "\(request.host):\(request.port) refused: the host's interface addresses could not be read")
                refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now,
                       why: "the host's interface addresses could not be read")
                return
            }
            decision = policy.decide(requested, address: address, hostAddresses: hostAddresses)
        }
        switch decision {
        case let .connect(openedByOperator):
            connect(id, request, TCPEndpoint(address, request.port), mayReachHost: openedByOperator, leftover: leftover, now: now)
        case .notListed:
            refuseByPolicy(id, request, why: "not on the allow-list", now: now)
        case .ownAddress:
            refuseByPolicy(id, request, why: "\(address) is an address of this link; \(opens)", now: now)
        case .hostAddress:
            refuseByPolicy(id, request, why: "\(address) is an address of this host; \(opens)", now: now)
        case let .restricted(scope):
            refuseByPolicy(id, request, why: "\(scope) destination\(shown); \(opens)", now: now)
        }
    }

    /// `mayReachHost` false: the connection must not turn out to be to this host.
    private func connect(_ id: ConnectionID, _ request: SocksRequest, _ endpoint: TCPEndpoint, mayReachHost: Bool,
                         leftover: [UInt8], now: Instant) {
        let fd: FileDescriptor
        guard relays.acquireDescriptor() else {
            note(.connectFailed, now: now, "\(endpoint): no descriptors left for this terminal")
            refuse(id, SocksNegotiation.failureReply(for: request.version, .generalFailure), now: now, why: "no descriptors left for this terminal")
            return
        }
        do {
            fd = try HostSocket.connect(to: endpoint, keepAlive: keepAlive, from: configuration.outboundAddress)
        } catch {
            relays.releaseDescriptor()
            note(.connectFailed, now: now, "\(endpoint): \(error)")
            refuse(id, SocksNegotiation.failureReply(for: request.version, SocksProxy.failure(error.errno)), now: now, why: "\(error)")
            return
        }
        let asked = destinations[id] ?? "\(endpoint)"
        let r = Relay(id: id, fd: fd, counters: counters, hostConnected: false, stackEstablished: true,
                      destination: asked == "\(endpoint)" ? asked : "\(asked) (\(endpoint))", source: terminalEndpoint(id))
        r.toHost = leftover
        // The client learns of success only once the host connection is made.
        r.onHostConnected = { [unowned self] r in
            let now = self.loop.now
            let bound = HostSocket.localEndpoint(r.fd) ?? TCPEndpoint(IPv4Address(0), 0)
            // An address that routes to this host without being on an interface (a local route
            // such as `ip route add local PREFIX dev lo`, or an address added since the
            // decision) shows as a connection from the very address it went to: reset, before
            // the success reply and before any of the client's bytes reach the host's service.
            if !mayReachHost, let peer = SocksProxy.peerAddress(r.fd), peer == bound.address {
                self.policyRefusals += 1
                self.note(.reachedHost, now: now, "\(endpoint) reset: it reached this host (\(bound.address) to itself)")
                r.failure = "reset: it reached this host"
                return false
            }
            self.host?.stack?.write(r.id, SocksNegotiation.successReply(for: request, bound: bound.address, port: bound.port), now: now)
            self.note(.connected, now: now, "connected to \(endpoint)" + (request.host.isName ? " (\(request.host))" : ""))
            return true
        }
        r.onHostConnectFailed = { [unowned self] r, code in
            let e = Errno(code)
            self.note(.connectFailed, now: self.loop.now, "\(endpoint): \(SystemError("connect", errno: e))")
            self.refuse(r.id, SocksNegotiation.failureReply(for: request.version, SocksProxy.failure(e)), now: self.loop.now)
            self.refusals -= 1
        }
        r.onFinished = { [unowned self] r in self.destinations[r.id] = nil }
        relays.add(r)
    }

    static func failure(_ e: Errno) -> SocksFailure {
        switch e {
        case .connectionRefused: return .connectionRefused
        case .networkUnreachable: return .networkUnreachable
        case .hostUnreachable: return .hostUnreachable
        case .timedOut: return .ttlExpired
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

    /// The IPv4 addresses on the host's interfaces now (getifaddrs(3)), nil when they cannot be
    /// read. Read for each decision: addresses come and go (DHCP, containers, VPNs), and the
    /// call is one netlink dump, cheap next to the connect it guards.
    static func interfaceAddresses() -> [IPv4Address]? {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return nil }
        defer { freeifaddrs(list) }
        var addresses: [IPv4Address] = []
        var next = list
        while let entry = next {
            if let a = entry.pointee.ifa_addr, a.pointee.sa_family == sa_family_t(AF_INET) {
                addresses.append(a.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { HostSocket.endpoint($0.pointee).address })
            }
            next = entry.pointee.ifa_next
        }
        return addresses
    }

    /// The address a connected socket goes to (getpeername(2)).
    static func peerAddress(_ descriptor: FileDescriptor) -> IPv4Address? {
        let fd = descriptor.rawValue
        var a = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let r = withUnsafeMutablePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) }
        }
        return r == 0 ? HostSocket.endpoint(a).address : nil
    }

    func report() -> [String] {
        let t = counters.value
        let unlogged = reported.unreported > 0 ? " (\(reported.unreported) not logged)" : ""
        let held = notices.held > 0 ? ", \(notices.held) log lines held back" : ""
        return ["socks on port \(configuration.port): connections \(t.connections) (\(t.active) open), refused \(refusals)"
            + " (\(policyRefusals) by the destination rules\(unlogged), \(lookupRefusals) with too many lookups running),"
            + " handshakes timed out \(handshakeTimeouts)\(held),"
            + " to terminal \(t.bytesToTerminal) B, to host \(t.bytesToHost) B, failures \(t.failures)"
            + (relays.lastFailure.map { " (the last: \($0))" } ?? "")]
    }
}

extension SocksDestinationHost {
    var isName: Bool { if case .name = self { return true } else { return false } }
}
