import CSystem
import Glibc
import NetStack

/// The three kinds of ICPPP bridge; the port is the same on both sides.
public enum BridgeKind: String, Sendable, CaseIterable, CustomStringConvertible {
    /// Listen on every host interface; each client is connected to the terminal's port.
    case hostToTerminal = "host"
    /// The same, listening on loopback only.
    case hostToTerminalLocal = "local"
    /// Listen on our PPP address; each terminal connection is connected to 127.0.0.1 on the host.
    case terminalToHost = "terminal"

    /// host and local listen on the host, terminal on our stack: one bridge per port on each side.
    var listensOnHost: Bool { self != .terminalToHost }

    public var description: String {
        switch self {
        case .hostToTerminal: return "host→terminal"
        case .hostToTerminalLocal: return "host→terminal (local only)"
        case .terminalToHost: return "terminal→host"
        }
    }
}

/// Why a bridge could not be added; the raw values are the ICPPP header's return codes.
public enum BridgeError: Int32, Error, Sendable, CustomStringConvertible {
    case noMoreBridges = -1
    case alreadyExists = -2
    case couldNotStart = -3
    case initialisationFailed = -4

    public var description: String {
        switch self {
        case .noMoreBridges: return "no more bridges (at most \(Bridges.maximum))"
        case .alreadyExists: return "the bridge already exists"
        case .couldNotStart: return "the bridge could not start (the channel is not open)"
        case .initialisationFailed: return "the bridge could not be initialised (its port is in use)"
        }
    }
}

public struct BridgeSpec: Sendable, Hashable, CustomStringConvertible {
    public var kind: BridgeKind
    public var port: UInt16
    public init(_ kind: BridgeKind, port: UInt16) {
        self.kind = kind
        self.port = port
    }
    public var description: String { "\(kind.rawValue):\(port)" }
}

/// A bridge's state for status and tests.
public struct BridgeStatus: Sendable, Equatable {
    public var kind: BridgeKind
    public var port: UInt16
    public var traffic: TrafficCounters
}

/// Bridges a channel holds at most (ICPPP.h: 12 in all).
public let maximumBridges = 12

/// The channel's bridges, as an application on our stack with listeners on the host.
final class Bridges: StackApplication {
    static let maximum = maximumBridges

    private final class Bridge {
        let spec: BridgeSpec
        var listener: FileDescriptor?
        let counters = Relay.Counter()
        var backoff = AcceptBackoff()
        /// While set, the listener is not watched (see `AcceptBackoff`).
        var backoffTimer: Int?
        init(_ spec: BridgeSpec) { self.spec = spec }
    }

    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    private var bridges: [Bridge] = []
    private let relays: RelayTable
    /// Connections one bridge carries at once: each holds a host descriptor and buffers. A
    /// host client beyond it is reset here; a terminal's SYN beyond it, by our stack.
    let connectionLimit: Int
    /// Times a host listener rested because accept(2) ran out of descriptors.
    private(set) var acceptBackoffs = 0
    var log: (String) -> Void = { _ in }
    /// A connection of a bridge opened (true) or ended (false).
    var onConnection: (BridgeSpec, Relay, Bool) -> Void = { _, _, _ in }
    /// A client refused before a connection was made: the bridge, where it would have gone,
    /// who asked, and why.
    var onRefused: (BridgeSpec, String, String, String) -> Void = { _, _, _, _ in }

    init(loop: EventLoop, connectionLimit: Int = 64, share: DescriptorShare? = nil) {
        self.loop = loop
        self.connectionLimit = connectionLimit
        relays = RelayTable(loop: loop, share: share)
    }

    var specs: [BridgeSpec] { bridges.map(\.spec) }
    /// The bridges there were when the link last went down.
    private(set) var lastSpecs: [BridgeSpec] = []
    var status: [BridgeStatus] { bridges.map { BridgeStatus(kind: $0.spec.kind, port: $0.spec.port, traffic: $0.counters.value) } }
    var activeConnections: Int { relays.count }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        relays.host = host
    }

    /// The link is down: bridges die with it (ICPPP), their connections are reset.
    func stop() {
        lastSpecs = specs
        relays.closeAll()
        for b in bridges { closeListener(b) }
        bridges = []
        host = nil
    }

    func add(_ spec: BridgeSpec) throws(BridgeError) {
        guard let host, let stack = host.stack, let peer = host.result?.peerAddress else { throw .couldNotStart }
        guard bridges.count < Bridges.maximum else { throw .noMoreBridges }
        guard !bridges.contains(where: { $0.spec.port == spec.port && $0.spec.kind.listensOnHost == spec.kind.listensOnHost }) else {
            throw .alreadyExists
        }
        let b = Bridge(spec)
        b.counters.onChange = { [weak self] relay, opened in self?.onConnection(spec, relay, opened) }
        switch spec.kind {
        case .hostToTerminal, .hostToTerminalLocal:
            let address = spec.kind == .hostToTerminal ? IPv4Address(0) : IPv4Address(127, 0, 0, 1)
            do {
                let listener = try HostSocket.listen(on: TCPEndpoint(address, spec.port))
                b.listener = listener
                try loop.register(listener, events: EPOLLIN.rawValue, serving: host.loopClient) { [unowned self, weak b] _ in
                    guard let b else { return }
                    self.acceptHost(b, terminal: TCPEndpoint(peer, spec.port))
                }
            } catch {
                log("bridge \(spec): \(error)")
                closeListener(b)
                throw .initialisationFailed
            }
        case .terminalToHost:
            guard !stack.listeningPorts.contains(spec.port) else { throw .initialisationFailed }
            // Our stack resets a terminal's SYN beyond the limit (counted as `tcpListenRefused`).
            do { try host.listen(port: spec.port, for: self, maximumConnections: connectionLimit) } catch { throw .initialisationFailed }
        }
        bridges.append(b)
        log("bridge \(spec.kind) on port \(spec.port)")
    }

    /// Removes a bridge: no new connections; those it carries run to their end. On our stack
    /// the port stops listening, and handshakes not yet handed to us are the stack's to abort.
    func remove(_ spec: BridgeSpec) -> Bool {
        guard let i = bridges.firstIndex(where: { $0.spec == spec }) else { return false }
        let b = bridges.remove(at: i)
        if spec.kind == .terminalToHost { host?.unlisten(port: spec.port) }
        closeListener(b)
        return true
    }

    private func closeListener(_ b: Bridge) {
        if let t = b.backoffTimer { loop.cancelTimer(t) }
        b.backoffTimer = nil
        guard let listener = b.listener else { return }
        loop.unregister(listener)
        listener.close()
        b.listener = nil
    }

    /// A host client: open the same port on the terminal through our stack.
    private func acceptHost(_ b: Bridge, terminal: TCPEndpoint) {
        let now = loop.now
        // A budget per turn, as every handler has (the rest wait in the backlog).
        var accepted = 0
        accepting: while let listener = b.listener, accepted < StreamListener.acceptBudget {
            accepted += 1
            switch HostSocket.accept(listener) {
            case .none:
                break accepting
            case .outOfResources:
                rest(b, now: now)
                break accepting
            case let .client(fd, client):
                b.backoff.succeeded()
                let source = "\(client)", destination = "\(terminal)"
                // Beyond the limit the client is reset at once rather than left in the kernel's
                // queue, where it would keep the listener readable.
                guard b.counters.value.active < connectionLimit else {
                    b.counters.value.refused += 1
                    HostSocket.closeWithReset(fd)
                    onRefused(b.spec, destination, source, "\(connectionLimit) connections open on this bridge")
                    continue
                }
                // This terminal's part of the process's descriptors is used up: the client is
                // reset, and the other terminals' lines and the control socket keep theirs.
                guard relays.acquireDescriptor() else {
                    b.counters.value.refused += 1
                    HostSocket.closeWithReset(fd)
                    onRefused(b.spec, destination, source, "no descriptors left for this terminal")
                    continue
                }
                guard let host else {
                    b.counters.value.failures += 1
                    relays.lastFailure = "the link is not up"
                    relays.releaseDescriptor()
                    HostSocket.closeWithReset(fd)
                    onRefused(b.spec, destination, source, "the link is not up")
                    continue
                }
                let id: ConnectionID
                do {
                    id = try host.connect(to: terminal, for: self, now: now)
                } catch {
                    b.counters.value.failures += 1
                    relays.lastFailure = "our stack did not connect: \(error)"
                    relays.releaseDescriptor()
                    HostSocket.closeWithReset(fd)
                    onRefused(b.spec, destination, source, "our stack did not connect: \(error)")
                    continue
                }
                relays.add(Relay(id: id, fd: fd, counters: b.counters, hostConnected: true, stackEstablished: false,
                                 destination: destination, source: source))
            }
        }
        host?.serve(now: now)
    }

    /// Stops watching `b`'s listener for its back-off, then watches it again.
    private func rest(_ b: Bridge, now: Instant) {
        let pause = b.backoff.failed()
        acceptBackoffs += 1
        log("bridge \(b.spec): out of descriptors, not accepting for \(pause)")
        guard let listener = b.listener else { return }
        loop.setInterest(listener, 0)
        b.backoffTimer = loop.schedule(at: now + pause) { [weak self, weak b] in
            guard let self, let b, let listener = b.listener else { return }
            b.backoffTimer = nil
            self.loop.setInterest(listener, EPOLLIN.rawValue)
        }
    }

    /// A terminal client: open the same port on the host's loopback.
    func acceptable(port: UInt16, now: Instant) {
        guard let host, let b = bridges.first(where: { $0.spec.kind == .terminalToHost && $0.spec.port == port }) else { return }
        while let id = host.accept(port: port, for: self) {
            let destination = "\(TCPEndpoint(IPv4Address(127, 0, 0, 1), port))"
            let source = host.stack?.connection(id).map { "\($0.remote)" } ?? ""
            guard relays.acquireDescriptor() else {
                b.counters.value.refused += 1
                host.stack?.abort(id, now: now)
                onRefused(b.spec, destination, source, "no descriptors left for this terminal")
                continue
            }
            do {
                let fd = try HostSocket.connect(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), port))
                relays.add(Relay(id: id, fd: fd, counters: b.counters, hostConnected: false, stackEstablished: true,
                                 destination: destination, source: source))
            } catch {
                relays.releaseDescriptor()
                b.counters.value.failures += 1
                relays.lastFailure = "host \(error)"
                host.stack?.abort(id, now: now)
                onRefused(b.spec, destination, source, "host \(error)")
            }
        }
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) { relays.event(id, event, now: now) }
    func step(now: Instant) { relays.step(now: now) }

    func report() -> [String] {
        bridges.map { b in
            let t = b.counters.value
            return "bridge \(b.spec): connections \(t.connections) (\(t.active) open), to terminal \(t.bytesToTerminal) B, to host \(t.bytesToHost) B, failures \(t.failures), refused at the limit of \(connectionLimit) \(t.refused)"
        } + (acceptBackoffs > 0 ? ["bridges: accept ran out of descriptors \(acceptBackoffs) times"] : [])
            + (relays.lastFailure.map { ["bridges: the last connection that failed: \($0)"] } ?? [])
    }
}
