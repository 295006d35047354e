import Crypto
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

/// Something that runs on our stack: the diagnostic services, the channel's bridges, its SOCKS
/// proxy and DNS relay. The attachment routes each stack event to the application that owns
/// the port or connection; an application keeps its own work list and does it in `step`.
public protocol StackApplication: AnyObject {
    /// The link is up and `host.stack` exists: listen, bind.
    func start(_ host: StackAttachment, now: Instant)
    /// The link is down and the stack is gone: let go of everything that belonged to it.
    func stop()
    /// A handshake finished on a port this application listens on.
    func acceptable(port: UInt16, now: Instant)
    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant)
    func datagram(port: UInt16, now: Instant)
    /// After a batch of input (every packet a line read brought), and after the events it
    /// caused: move what can be moved. What goes to a host socket then leaves in one send
    /// for the whole batch.
    func step(now: Instant)
    var pollAt: Instant? { get }
    func poll(now: Instant)
    func report() -> [String]
}

extension StackApplication {
    public func acceptable(port: UInt16, now: Instant) {}
    public func datagram(port: UInt16, now: Instant) {}
    public var pollAt: Instant? { nil }
    public func poll(now: Instant) {}
    public func report() -> [String] { [] }
}

/// Our own IP stack on the link, answering pings and carrying the applications that run on it;
/// it can also ping through the link.
public final class StackAttachment: NetworkAttachment {
    /// Set and cleared only by `linkUp` and `linkDown`, together with `stackIsUp`.
    #if DEBUG
    public package(set) var stack: IPStack?
    #else
    // Unchecked in release builds (docs/PERFORMANCE.md): the stack is sans-IO, and the
    // applications reach it one call at a time (`host.stack!.read(…)`) or through `inPlace`
    // with closures that touch only the stack they are given, so no access nests in another.
    @exclusivity(unchecked) public package(set) var stack: IPStack?
    #endif
    // Unchecked in release builds (docs/PERFORMANCE.md says why): plain values and standard
    // collections, never changed across a call back into this object.
    /// Whether `stack` is set, kept beside it: asked on every packet, and looking at an
    /// optional struct in an object's property copies it. (No observer on `stack` instead:
    /// that would turn every change made in place into a copy and a write back.)
    #if DEBUG
    public private(set) var stackIsUp = false
    #else
    @exclusivity(unchecked) public private(set) var stackIsUp = false
    #endif
    public private(set) var result: IPCPResult?
    /// The loop client that drives this stack (its link session): the applications' host
    /// descriptors are registered as serving it, so it is serviced when they have I/O.
    public weak var loopClient: LoopClient?
    weak var loop: EventLoop?

    /// Set by the link session while it services: work the stack is given then is sent by
    /// that same service, so it needs no wake (and a wake from it would service it again and
    /// again).
    var insideSessionService = false
    /// Events the last `serve` left for lack of rounds: the next turn serves them.
    private var eventsLeft = false

    /// Has the link session serviced: something outside its own turn (a program's stream, a
    /// name lookup's answer) gave the stack work, which the session's drain sends.
    func wakeSession() {
        guard !insideSessionService, let loop, let client = loopClient else { return }
        loop.wake(client)
    }
    public let tcp: TCPConfiguration
    /// Connections the stack holds at once, half-open ones included (nil: the stack's default).
    public var maximumConnections: Int?
    /// The user timeout of the connections applications accept and open (see
    /// `ChannelConfiguration.connectionUserTimeout`); nil leaves `tcp.userTimeout`.
    public var connectionUserTimeout: Duration?
    /// Seeds each stack's secrets in tests and simulations; nil (production) draws them from
    /// the CSPRNG, afresh for every link.
    private let seed: UInt64?
    private let output: (String) -> Void
    // Unchecked in release builds, as above.
    #if DEBUG
    public private(set) var applications: [StackApplication] = []
    private var portOwners: [UInt16: StackApplication] = [:]
    private var udpOwners: [UInt16: StackApplication] = [:]
    private var connectionOwners: [ConnectionID: StackApplication] = [:]
    #else
    @exclusivity(unchecked) public private(set) var applications: [StackApplication] = []
    @exclusivity(unchecked) private var portOwners: [UInt16: StackApplication] = [:]
    @exclusivity(unchecked) private var udpOwners: [UInt16: StackApplication] = [:]
    @exclusivity(unchecked) private var connectionOwners: [ConnectionID: StackApplication] = [:]
    #endif
    private var ping: Ping?
    private var serving = false
    private var eventBuffer: [StackEvent] = []

    /// A class, so that `pollAt` (after each service) looks at its timers without copying its table.
    final class Ping {
        let target: IPv4Address
        let count: Int
        let interval: Duration
        init(target: IPv4Address, count: Int, interval: Duration) {
            self.target = target
            self.count = count
            self.interval = interval
        }
        var sent = 0
        var received = 0
        var sentAt: [UInt16: Instant] = [:]
        var next: Instant?
        var deadline: Instant?
        var reported = false
    }

    public init(services: [DiagnosticService] = [], servicePorts: [DiagnosticService: UInt16] = [:], tcp: TCPConfiguration = TCPConfiguration(),
                seed: UInt64? = nil, output: @escaping (String) -> Void) {
        self.tcp = tcp
        self.seed = seed
        self.output = output
        if !services.isEmpty { add(DiagnosticServices(ports: services.map { ($0, servicePorts[$0] ?? $0.port) }, output: output)) }
    }

    /// Adds an application; when the link is already up it starts at once.
    public func add(_ application: StackApplication, now: Instant? = nil) {
        applications.append(application)
        if stackIsUp, let now { application.start(self, now: now) }
    }

    public func remove(_ application: StackApplication) {
        application.stop()
        applications.removeAll { $0 === application }
        portOwners = portOwners.filter { $0.value !== application }
        udpOwners = udpOwners.filter { $0.value !== application }
        connectionOwners = connectionOwners.filter { $0.value !== application }
    }

    // MARK: What applications call

    /// Listens on `port` for `owner`, holding at most `maximumConnections` there at once (a SYN
    /// beyond them is reset; nil: the stack's default per listener).
    public func listen(port: UInt16, for owner: StackApplication, maximumConnections: Int? = nil) throws(StackError) {
        guard stackIsUp else { throw StackError.tooManyConnections }
        try stack!.listen(port: port, maximumConnections: maximumConnections)
        portOwners[port] = owner
    }

    public func unlisten(port: UInt16) {
        stack?.unlisten(port: port)
        portOwners[port] = nil
    }

    /// Takes the next connection that finished its handshake on `port`, owned by `owner`.
    public func accept(port: UInt16, for owner: StackApplication) -> ConnectionID? {
        guard let id = stack?.accept(port: port) else { return nil }
        connectionOwners[id] = owner
        if let t = connectionUserTimeout { stack?.setUserTimeout(id, t) }
        return id
    }

    /// Opens a connection from our address for `owner`.
    public func connect(to remote: TCPEndpoint, for owner: StackApplication, now: Instant) throws(StackError) -> ConnectionID {
        guard stackIsUp else { throw StackError.tooManyConnections }
        let id = try stack!.connect(to: remote, now: now)
        connectionOwners[id] = owner
        if let t = connectionUserTimeout { stack?.setUserTimeout(id, t) }
        return id
    }

    // Connection I/O for applications in other modules (the stack itself is a value only this
    // module mutates).

    public func read(_ id: ConnectionID, maximum: Int = .max, now: Instant) -> [UInt8] {
        stack?.read(id, maximum: maximum, now: now) ?? []
    }

    @discardableResult
    public func write(_ id: ConnectionID, _ bytes: [UInt8], now: Instant) -> Int {
        stack?.write(id, bytes, now: now) ?? 0
    }

    public func shutdownWrite(_ id: ConnectionID, now: Instant) { stack?.shutdownWrite(id, now: now) }
    public func close(_ id: ConnectionID, now: Instant) { stack?.close(id, now: now) }
    public func abort(_ id: ConnectionID, now: Instant?) { stack?.abort(id, now: now) }
    public func atEndOfStream(_ id: ConnectionID) -> Bool { inPlace(&stack) { $0?.atEndOfStream(id) ?? true } }
    /// What `id` may still be given to send (`IPStack.writableBytes`), 0 without a stack.
    public func writableBytes(_ id: ConnectionID) -> Int { inPlace(&stack) { $0?.writableBytes(id) ?? 0 } }
    public func state(_ id: ConnectionID) -> TCPState? { inPlace(&stack) { $0?.state(id) } }
    /// Bytes written to `id` that the peer has not acknowledged yet (sent or not).
    public func unacknowledgedBytes(_ id: ConnectionID) -> Int { inPlace(&stack) { $0?.unacknowledgedBytes(id) ?? 0 } }

    public func bindUDP(port: UInt16, for owner: StackApplication) throws(StackError) {
        guard stackIsUp else { throw StackError.tooManyConnections }
        try stack!.bindUDP(port: port)
        udpOwners[port] = owner
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
        // The line session collects the output after each batch a line read brings.
        c.acknowledgeAtCollection = true
        if let maximumConnections { c.maximumConnections = maximumConnections }
        // VJ compresses only headers whose TCP options repeat; timestamps change in every
        // segment, so with VJ on the link we do not offer them (RFC 1144 predates them).
        if result.transmitVJ != nil { c.tcp.timestamps = false }
        if let seed {
            stack = IPStack(configuration: c, seed: seed)
            stackIsUp = true
        } else {
            var random = CSPRNG()
            stack = IPStack(configuration: c, random: &random)
            stackIsUp = true
        }
        self.result = result
        for a in applications { a.start(self, now: now) }
        // The first ping waits one interval: the peer's side of the link is usually still being
        // configured (pppd runs ip-up after IPCP opens) and would not answer it. After a
        // renegotiation only pings still to send are re-armed: a timer nobody serves would stay
        // in the past and keep the loop spinning.
        if let p = ping, p.sent < p.count {
            p.next = now + p.interval
        }
    }

    public func linkDown() {
        guard stackIsUp else { return }
        output("stack: " + (stack!.counters.description))
        for a in applications { a.stop() }
        stack = nil
        stackIsUp = false
        result = nil
        portOwners = [:]
        udpOwners = [:]
        connectionOwners = [:]
    }

    /// Hands the stack one packet of a batch (every packet a line read brought). Its events
    /// wait for the batch's end (`takeOutgoing`), where the applications are served once for
    /// the whole batch: what they read then leaves for a host socket in one send, and the ACKs
    /// (`IPStackConfiguration.acknowledgeAtCollection`) advertise what was read.
    public func receive(packet: [UInt8], now: Instant) {
        stack?.receive(packet: packet, now: now)
    }

    public func takeOutgoing(now: Instant) -> [[UInt8]] {
        serve(now: now)
        return stack?.takeOutgoing() ?? []
    }

    public func takeOutgoing(now: Instant, into packets: inout [[UInt8]]) {
        serve(now: now)
        packets.removeAll(keepingCapacity: true)
        stack?.takeOutgoing(into: &packets)
    }

    public func recycle(_ packets: inout [[UInt8]]) {
        stack?.recycle(&packets)
        packets.removeAll(keepingCapacity: true)
    }

    public var pollAt: Instant? {
        // What the last serve could not finish is due now (the far past is due at any now).
        if eventsLeft && stackIsUp { return Instant(nanoseconds: .min) }
        // Ping timers are served only while the link is up (see `pingTick`).
        var p = stack?.pollAtInPlace()
        if let ping, stackIsUp { p = earliest(p, ping.next, ping.deadline) }
        for a in applications { p = earliest(p, a.pollAt) }
        return p
    }

    public func poll(now: Instant) {
        if let p = stack?.pollAtInPlace(), p <= now { stack?.poll(now: now) }
        for a in applications { if let p = a.pollAt, p <= now { a.poll(now: now) } }
        pingTick(now: now)
        serve(now: now)
    }

    public var descriptors: [FileDescriptor] { [] }
    public func readable(_ descriptor: FileDescriptor, room: Int, now: Instant) throws(SystemError) {}

    public func report() -> [String] {
        guard let stack else { return ["stack: link not up"] }
        let counters = stack.counters
        var lines = ["stack: " + counters.description,
                     "stack: SYNs reset at a listener's limit \(counters.tcpListenRefused), dropped with the backlog or table full \(counters.tcpListenDrops)"]
        for id in stack.connectionIDs {
            if let c = stack.connection(id) {
                lines.append("stack: \(id) \(c.local) <-> \(c.remote) \(c.state.rawValue) in \(c.counters.bytesReceived) out \(c.counters.bytesSent) retrans \(c.counters.retransmittedSegments) unread \(c.readableBytes)")
            }
        }
        for a in applications { lines += a.report() }
        return lines
    }

    /// Routes the stack's events to their owners, then lets every application move data.
    /// Applications may call back into the stack (and so cause more events) while serving.
    package func serve(now: Instant) {
        guard stackIsUp, !serving else { return }
        serving = true
        eventsLeft = false
        defer {
            serving = false
            wakeSession()
        }
        for round in 0..<8 {
            // The buffer is taken out while it is read and put back emptied: one array for
            // every batch (`IPStack.takeEvents(into:)`).
            var events = eventBuffer
            eventBuffer = []
            stack?.takeEvents(into: &events)
            defer {
                events.removeAll(keepingCapacity: true)
                eventBuffer = events
            }
            for event in events {
                switch event {
                case let .acceptable(port):
                    portOwners[port]?.acceptable(port: port, now: now)
                case let .tcp(id, e):
                    let owner = connectionOwners[id]
                    if case .closed = e { connectionOwners[id] = nil }
                    owner?.event(id, e, now: now)
                case let .datagram(port):
                    udpOwners[port]?.datagram(port: port, now: now)
                case let .echoReply(from, identifier, sequence, _):
                    pingReply(from: from, identifier: identifier, sequence: sequence, now: now)
                case .icmpError:
                    break
                }
            }
            guard stackIsUp else { return }
            for a in applications { a.step(now: now) }
            if events.isEmpty { return }
            // Out of rounds with more to route: due at once, so the loop comes back next turn.
            if round == 7 { eventsLeft = true }
        }
    }

    // MARK: Ping

    private func pingTick(now: Instant) {
        guard let p = ping, stackIsUp else { return }
        // A timer that is due is served: cleared, or moved forward by a send; never left in the past.
        if let next = p.next, now >= next {
            p.next = nil
            if p.sent < p.count {
                p.sent += 1
                let seq = UInt16(truncatingIfNeeded: p.sent)
                p.sentAt[seq] = now
                let payload = (0..<56).map { UInt8(truncatingIfNeeded: $0) }
                stack?.ping(p.target, identifier: 0x5050, sequence: seq, payload: payload, now: now)
                p.next = p.sent < p.count ? now + p.interval : nil
                // Like ping(8)'s linger: replies to the last request are awaited up to 10 s, since a
                // serial line busy with bulk data can hold an echo behind it for seconds.
                if p.sent == p.count { p.deadline = now + .seconds(10) }
            }
        }
        if let d = p.deadline, now >= d, !p.reported {
            p.reported = true
            p.deadline = nil
            output("ping \(p.target): \(p.sent) sent, \(p.received) received")
        }
    }

    private func pingReply(from: IPv4Address, identifier: UInt16, sequence: UInt16, now: Instant) {
        guard let p = ping, identifier == 0x5050, from == p.target, let sent = p.sentAt.removeValue(forKey: sequence) else { return }
        p.received += 1
        let ms = Double((now - sent).nanoseconds) / 1e6
        output("ping \(from): icmp_seq=\(sequence) time=\(String(Int(ms * 10) / 10)).\(Int(ms * 10) % 10) ms")
        if p.received == p.count && !p.reported {
            p.reported = true
            p.deadline = nil
            output("ping \(p.target): \(p.sent) sent, \(p.received) received")
        }
    }
}
