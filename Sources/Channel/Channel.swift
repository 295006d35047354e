import Capture
import Crypto
import Glibc
import NetStack
import PPP
import RemoteSerial

/// Where the channel's PPP line is.
public enum ChannelLine: Sendable, Equatable {
    /// A serial device or an existing pty (a symlink to one is followed at every open).
    case device(String, SerialLine.Options = SerialLine.Options())
    /// A pty we create at every open; its name is announced in a `.line` event.
    case pty(linkedAt: String?, SerialLine.Options = SerialLine.Options())
    /// A descriptor handed to us (a socket or tty another program opened); each link runs on a
    /// duplicate of it, so it stays the caller's to close.
    case descriptor(FileDescriptor)
}

/// Everything a channel needs to know before it opens.
public struct ChannelConfiguration: Sendable {
    public var line: ChannelLine
    /// The PPP link (host role by default: we assign the terminal its address).
    public var link: LinkConfiguration
    public var tcp = TCPConfiguration()
    /// The SOCKS proxy on our PPP address (on by default, as in ICPPP); nil turns it off.
    public var socks: SocksConfiguration? = SocksConfiguration()
    /// Keep-alive for the proxy's outbound host sockets (nil: the kernel's default, off).
    public var keepAlive: KeepAliveSettings?
    /// Relay the terminal's DNS queries (sent to our PPP address, which we hand out as its DNS
    /// server unless `link.ipcp.dnsServers` says otherwise) to this resolver; nil asks the
    /// host's own (resolv.conf).
    public var relayDNS = true
    public var dnsUpstream: TCPEndpoint?
    /// Diagnostic services on our PPP address.
    public var services: [DiagnosticService] = []
    /// Ports that differ from a service's own (echo on 5000 rather than 7).
    public var servicePorts: [DiagnosticService: UInt16] = [:]
    /// The line's output queue: IP packets beyond it are dropped and the line is not read
    /// until it drains (see `LineFlowControl.limit`). nil: about two seconds of line time
    /// at the line's speed, 256 KiB on a pty or a descriptor without one
    /// (`LineFlowControl.defaultLimit`).
    public var lineQueueLimit: Int?
    /// How a busy line is read: on a clock every 2 ms by default, an interval of zero for on
    /// every arrival (see `LineReadModeration`).
    public var lineReadModeration = LineReadModeration.Settings.standard
    /// Connections one bridge carries at once; more are refused (counted in `refused`).
    public var bridgeConnectionLimit = 64
    /// Where the host connections and DNS relay sockets this channel's peers make us open are
    /// drawn from (`serve` gives each terminal a share of the process's descriptors); nil:
    /// limited only by the per-bridge, proxy and relay caps.
    public var descriptorShare: DescriptorShare?
    /// Connections our stack holds at once, half-open ones included; SYNs beyond it are dropped.
    public var stackConnectionLimit = 256
    /// A connection of the bridges, the proxy or the services whose data the terminal has not
    /// acknowledged for this long is aborted, and a host socket it is relayed to reset (RFC
    /// 9293 §3.8.3, RFC 5482). Persist probes (§3.8.6.1) go on for as long as the terminal
    /// answers them: without this, a terminal holding its window shut keeps the connection,
    /// its buffers and the host descriptor for the life of the link. nil: `tcp.userTimeout`.
    public var connectionUserTimeout: Duration? = .seconds(120)
    public var pcapPath: String?
    public var recordPath: String?
    /// Write PAP and SOCKS5 passwords into the captures as they were (see `SecretMasker` for
    /// what is masked otherwise).
    public var captureSecrets = false
    /// Each capture file stops growing at this many bytes.
    public var captureLimit = CaptureFile.defaultLimit
    /// Beyond ICPPP: add the bridges of the previous link again when the channel reopens.
    public var rearmBridgesOnReopen = false
    /// Testing only: drop this share of frames both ways.
    public var frameLoss = 0.0
    /// Ping this address through the link once it is up, `count` times a second apart; with
    /// `closeAfterPing` the channel closes after the last reply (or 10 s without it).
    public var ping: (target: IPv4Address, count: Int)?
    public var closeAfterPing = false

    public init(line: ChannelLine, link: LinkConfiguration = .host(local: IPv4Address(192, 168, 53, 1), terminal: IPv4Address(192, 168, 53, 2))) {
        self.line = line
        self.link = link
    }
}

/// The link's addresses, known once the channel is open (ICPPP's IP, submask, dns, terminalIP).
public struct ChannelAddresses: Sendable, Equatable {
    public var ip: IPv4Address
    public var submask: IPv4Address
    public var dns: IPv4Address?
    public var terminalIP: IPv4Address
}

/// Why the channel closed.
public enum ChannelCloseReason: Sendable, Equatable, CustomStringConvertible {
    case closedByUs
    case peerTerminated(String)
    case lineHangUp
    case echoTimeout
    case loopback
    case authenticationFailed(String)
    case negotiationFailed(String)
    /// The line could not be opened or failed (with the system's words).
    case lineFailed(String)

    init(_ reason: LinkDownReason) {
        switch reason {
        case .closedByUs: self = .closedByUs
        case let .peerTerminated(m): self = .peerTerminated(m)
        case .lineHangUp: self = .lineHangUp
        case .echoTimeout: self = .echoTimeout
        case .loopback: self = .loopback
        case let .authenticationFailed(m): self = .authenticationFailed(m)
        case let .negotiationFailed(m), let .networkFailed(m): self = .negotiationFailed(m)
        case let .addressConflict(c): self = .negotiationFailed(c.description)
        }
    }

    public var description: String {
        switch self {
        case .closedByUs: return "closed by us"
        case let .peerTerminated(m): return "peer terminated the link" + (m.isEmpty ? "" : " (\"\(m)\")")
        case .lineHangUp: return "line hang-up"
        case .echoTimeout: return "no answer to LCP echo requests"
        case .loopback: return "the line is looped back"
        case let .authenticationFailed(m): return "authentication failed: \(m)"
        case let .negotiationFailed(m): return "negotiation failed: \(m)"
        case let .lineFailed(m): return "line failed: \(m)"
        }
    }

    /// pppd's exit status for the same cause (0: closed on request); the C API's and the
    /// control socket's reason code.
    public var code: Int32 {
        switch self {
        case .closedByUs: return 0
        case .lineFailed: return 7
        case .negotiationFailed: return 10
        case .authenticationFailed: return 11
        case .echoTimeout: return 15
        case .lineHangUp: return 16
        case .loopback: return 17
        case .peerTerminated: return 22
        }
    }

    /// A name for machines (metrics labels, event lines).
    public var name: String {
        switch self {
        case .closedByUs: return "closed_by_us"
        case .lineFailed: return "line_failed"
        case .negotiationFailed: return "negotiation_failed"
        case .authenticationFailed: return "authentication_failed"
        case .echoTimeout: return "echo_timeout"
        case .lineHangUp: return "line_hang_up"
        case .loopback: return "loopback"
        case .peerTerminated: return "peer_terminated"
        }
    }
    public static let names = ["closed_by_us", "line_failed", "negotiation_failed", "authentication_failed", "echo_timeout",
                               "line_hang_up", "loopback", "peer_terminated"]
}

public enum ChannelEvent: Sendable, Equatable {
    /// The line is open (for a pty we created: the name another program opens).
    case line(String?)
    case opened(ChannelAddresses)
    case closed(ChannelCloseReason)
    /// What the PPP link reports (phases, LCP/IPCP results, debug lines when asked for).
    case link(LinkEvent)
    /// A line for a person: bridges and proxy connections opening and failing.
    case log(String)
    /// A connection through a bridge or the proxy opened, ended, or was refused (ICNetwork's
    /// per-connection delegate calls, for every language).
    case connection(ConnectionReport)
}

/// One connection a bridge or the proxy carried, or refused. Peer text (a name the terminal
/// asked the proxy for) is escaped where it is taken (`PeerText`): the fields are safe to
/// print as they are.
public struct ConnectionReport: Sendable, Equatable, CustomStringConvertible {
    public enum Phase: String, Sendable {
        /// Being made: the host socket is connecting, or our stack's connection to the terminal.
        case opened
        /// Over: `failure` says why when it did not end with both sides closing.
        case closed
        /// Never made: the proxy's rules, a limit, a name that did not resolve, a handshake.
        case refused
    }

    public var carrier: ConnectionCarrier
    public var phase: Phase
    /// The connection's number on this channel, from 1: its opened and closed reports share
    /// it. 0 for a refusal, which opened nothing.
    public var number: Int
    /// Where it goes: the terminal's port for a host→terminal bridge, the host's for a
    /// terminal→host one, what the terminal asked the proxy for (a name as it asked, or an
    /// address) with its port. Empty when a handshake failed before saying.
    public var destination: String
    /// Who opened it: the host client's address and port, or the terminal's.
    public var source: String
    /// Why it was refused, or failed (nil: closed by its ends).
    public var failure: String?
    public var bytesToTerminal: Int
    public var bytesToHost: Int

    public init(carrier: ConnectionCarrier, phase: Phase, number: Int, destination: String, source: String, failure: String? = nil,
                bytesToTerminal: Int = 0, bytesToHost: Int = 0) {
        self.carrier = carrier
        self.phase = phase
        self.number = number
        self.destination = destination
        self.source = source
        self.failure = failure
        self.bytesToTerminal = bytesToTerminal
        self.bytesToHost = bytesToHost
    }

    public var description: String {
        var text = "\(carrier) connection"
        if number > 0 { text += " #\(number)" }
        text += " \(phase.rawValue): \(source) → \(destination)"
        if phase == .closed { text += ", \(bytesToTerminal) B to the terminal, \(bytesToHost) B to the host" }
        if let failure { text += " (\(failure))" }
        return text
    }
}

/// What carries a connection between the terminal and the host.
public enum ConnectionCarrier: Sendable, Equatable, CustomStringConvertible {
    case bridge(BridgeSpec)
    case proxy
    public var description: String {
        switch self {
        case let .bridge(spec): return "bridge \(spec)"
        case .proxy: return "proxy"
        }
    }
}

public enum ChannelError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The link closed before it opened.
    case closed(ChannelCloseReason)
    public var description: String {
        switch self {
        case let .closed(r): return "the channel closed before it opened: \(r)"
        }
    }
}

/// The channel's delegate, called on the event loop's thread. A bridge added in
/// `channelDidOpen` accepts connections at once.
public protocol ChannelDelegate: AnyObject {
    func channelDidOpen(_ channel: Channel)
    func channelDidClose(_ channel: Channel, reason: ChannelCloseReason)
}

/// A snapshot for status displays.
public struct ChannelStatus: Sendable, Equatable {
    public enum State: String, Sendable { case closed, opening, open, closing }
    public var state: State
    public var addresses: ChannelAddresses?
    public var bridges: [BridgeStatus]
    public var proxy: TrafficCounters?
    public var proxyRefusals: Int
    /// Of those, refused by the destination rules (allow-list, private and own addresses).
    public var proxyPolicyRefusals: Int
    /// Proxy clients reset for not finishing their handshake in time.
    public var proxyHandshakeTimeouts: Int
    public var lineBytesIn: Int
    public var lineBytesOut: Int
    /// Frames decoded from the line and sent on it (this link, or the last one).
    public var framesIn: Int
    public var framesOut: Int
    public var framesDropped: Int
    /// The line's output queue (zero while no link runs).
    public var lineQueue: LineQueueCounters
    /// Host listeners paused after accept ran out of descriptors (EMFILE, ENFILE).
    public var acceptBackoffs: Int
    /// Terminal SYNs our stack reset because their port (a bridge, the proxy) was at its limit.
    public var listenRefusals: Int
    public var opens: Int
    public var lastCloseReason: ChannelCloseReason?
    /// An `rfc2217:` line's port as the server answered our settings (this link, while it runs).
    public var comPort: ComPortReport?
}

/// The ICPPP channel: a PPP link on a line, our TCP/IP stack on it, the bridges, the SOCKS
/// proxy and the DNS relay. All of its state lives on its event loop; the public calls may be
/// made from any thread (they are posted to the loop and waited for) and from the delegate.
public final class Channel: @unchecked Sendable {
    public let loop: EventLoop
    private var configuration: ChannelConfiguration
    public weak var delegate: ChannelDelegate?

    private var state = ChannelStatus.State.closed
    private var session: LinkSession?
    private var attachment: StackAttachment?
    private var bridges: Bridges?
    private var terminalStreams: TerminalStreams?
    private var socks: SocksProxy?
    private var addresses: ChannelAddresses?
    private var reopenRequested = false
    private var openWaiters: [(Result<ChannelAddresses, ChannelError>) -> Void] = []
    private var closeWaiters: [(ChannelCloseReason) -> Void] = []
    private var subscribers: [Int: AsyncStream<ChannelEvent>.Continuation] = [:]
    private var nextSubscriber = 0
    private var previousBridges: [BridgeSpec] = []
    private var opens = 0
    /// The number the next connection through a bridge or the proxy is reported with.
    private var nextConnectionNumber = 1

    /// Refusals reported a second at most; beyond, counted and said with the next one
    /// reported. A peer makes them at will (a LAN client at a full bridge, a terminal's SYNs
    /// to a closed port), and every report reaches every subscriber.
    static let refusalReportsPerSecond = 16
    private var refusalWindow = (start: Instant(nanoseconds: 0), reported: 0, held: 0)

    private func reportRefusal(_ report: ConnectionReport) {
        let now = loop.now
        if now - refusalWindow.start >= .seconds(1) { refusalWindow = (now, 0, refusalWindow.held) }
        guard refusalWindow.reported < Self.refusalReportsPerSecond else {
            refusalWindow.held += 1
            return
        }
        refusalWindow.reported += 1
        var r = report
        if refusalWindow.held > 0 {
            r.failure = (r.failure ?? "refused") + " (and \(refusalWindow.held) more refused since the last report)"
            refusalWindow.held = 0
        }
        emit(.connection(r))
    }

    private func reportConnection(_ carrier: ConnectionCarrier, _ relay: Relay, opened: Bool) {
        if opened {
            relay.number = nextConnectionNumber
            nextConnectionNumber += 1
        }
        emit(.connection(ConnectionReport(carrier: carrier, phase: opened ? .opened : .closed, number: relay.number,
                                          destination: relay.destination, source: relay.source, failure: opened ? nil : relay.failure,
                                          bytesToTerminal: relay.bytesToTerminal, bytesToHost: relay.bytesToHost)))
    }
    private var lastCloseReason: ChannelCloseReason?
    private var lastLineBytes = (0, 0)
    private var lastFrames = (0, 0, 0)
    private var seed: UInt64

    public init(configuration: ChannelConfiguration, loop: EventLoop = .shared) {
        self.configuration = configuration
        self.loop = loop
        var s: UInt64 = 0
        withUnsafeMutableBytes(of: &s) { _ = getentropy($0.baseAddress, $0.count) }
        seed = s
    }

    /// A channel let go while its link runs takes the link down (without a word to the peer)
    /// and closes everything it holds.
    deinit {
        if let session {
            loop.sync {
                session.forceDown()
                session.line.close()
            }
        }
        for c in subscribers.values { c.finish() }
    }

    // MARK: Events

    /// A stream of everything the channel reports from now on; each call makes a new subscriber.
    public func events() -> AsyncStream<ChannelEvent> {
        let (stream, continuation) = AsyncStream<ChannelEvent>.makeStream(bufferingPolicy: .bufferingNewest(1024))
        let key = loop.sync { () -> Int in
            nextSubscriber += 1
            subscribers[nextSubscriber] = continuation
            return nextSubscriber
        }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            self.loop.execute { self.subscribers[key] = nil }
        }
        return stream
    }

    private var observers: [(ChannelEvent) -> Void] = []

    /// Calls `handler` on the loop's thread with every event from now on (for programs that
    /// run the loop themselves, like the command-line tool).
    public func observe(_ handler: @escaping (ChannelEvent) -> Void) {
        loop.sync { observers.append(handler) }
    }

    private func emit(_ event: ChannelEvent) {
        for o in observers { o(event) }
        for c in subscribers.values { c.yield(event) }
    }

    private func log(_ text: String) { emit(.log(text)) }

    // MARK: Open and close

    /// Starts opening the link and returns at once (ICPPP's openChannel); did-open follows.
    /// While a previous close is still going on, the open waits for it to finish.
    /// Throws when the line cannot be opened.
    public func start() throws(ChannelError) {
        let failure: ChannelCloseReason? = loop.sync {
            startOnLoop()
            if state == .closed, !reopenRequested, let r = lastCloseReason, case .lineFailed = r { return r }
            return nil
        }
        if let failure { throw .closed(failure) }
    }

    /// Opens the link and returns its addresses once IP runs on it.
    public func open() async throws(ChannelError) -> ChannelAddresses {
        let result = await withCheckedContinuation { (c: CheckedContinuation<Result<ChannelAddresses, ChannelError>, Never>) in
            loop.enqueue { [self] in
                if state == .open, let addresses {
                    c.resume(returning: .success(addresses))
                    return
                }
                openWaiters.append { c.resume(returning: $0) }
                startOnLoop()
                if let session { loop.wake(session) }
            }
        }
        return try result.get()
    }

    /// Closes the link (LCP Terminate-Request) and returns at once (ICPPP's closeChannel).
    public func requestClose() {
        changing { closeOnLoop() }
    }

    /// Runs `body` on the loop, then has the link session serviced: a call from outside its
    /// turn changed what it has to do (a Terminate to send, a bridge, a keep-alive).
    private func changing<T>(_ body: () -> T) -> T {
        loop.sync {
            let result = body()
            if let session { loop.wake(session) }
            return result
        }
    }

    /// Closes the link and returns once it is down.
    @discardableResult
    public func close() async -> ChannelCloseReason {
        await withCheckedContinuation { (c: CheckedContinuation<ChannelCloseReason, Never>) in
            loop.enqueue { [self] in
                if state == .closed && !reopenRequested {
                    c.resume(returning: lastCloseReason ?? .closedByUs)
                    return
                }
                closeWaiters.append { c.resume(returning: $0) }
                closeOnLoop()
                if let session { loop.wake(session) }
            }
        }
    }

    private func startOnLoop() {
        switch state {
        case .open, .opening: return
        case .closing:
            reopenRequested = true
            return
        case .closed: break
        }
        reopenRequested = false
        lastCloseReason = nil
        // The status's line counters are this link's from now on (a failed open counts nothing).
        lastLineBytes = (0, 0)
        lastFrames = (0, 0, 0)
        let line: SerialLine
        do throws(SystemError) {
            switch configuration.line {
            case let .device(path, options): line = try SerialLine(device: path, options: options)
            case let .pty(link, options): line = try SerialLine(ptyLinkedAt: link, options: options)
            case let .descriptor(fd):
                // Each link gets its own copy, so the descriptor can be opened again.
                let copy = dup(fd.rawValue)
                guard copy >= 0 else { throw SystemError("dup descriptor \(fd.rawValue)") }
                line = try SerialLine(descriptor: FileDescriptor(copy))
            }
        } catch {
            finishOpen(.failure(.closed(.lineFailed(error.description))))
            lastCloseReason = .lineFailed(error.description)
            emit(.closed(.lineFailed(error.description)))
            delegate?.channelDidClose(self, reason: .lineFailed(error.description))
            return
        }
        var pcap: PcapWriter?
        var record: PPPDRecordWriter?
        do {
            let masking = configuration.captureSecrets ? nil : SecretMasker(socksPorts: Set(configuration.socks.map { [$0.port] } ?? []))
            let stopped: (String) -> Void = { [weak self] in self?.log($0) }
            if let p = configuration.pcapPath {
                pcap = try PcapWriter(path: p, linkType: .pppWithDirection, masking: masking, limit: configuration.captureLimit, onStop: stopped)
            }
            if let p = configuration.recordPath {
                var tv = timeval()
                gettimeofday(&tv, nil)
                record = try PPPDRecordWriter(path: p, startTime: Int64(tv.tv_sec), masking: masking,
                                              limit: configuration.captureLimit, onStop: stopped)
            }
        } catch {
            line.close()
            let reason = ChannelCloseReason.lineFailed("capture: \(error)")
            lastCloseReason = reason
            finishOpen(.failure(.closed(reason)))
            emit(.closed(reason))
            delegate?.channelDidClose(self, reason: reason)
            return
        }
        emit(.line(line.peerPath))
        seed = seed &* 6364136223846793005 &+ 1442695040888963407
        var link = configuration.link
        link.captureFrames = configuration.pcapPath != nil
        let relayUpstream: TCPEndpoint? = configuration.relayDNS
            ? (configuration.dnsUpstream ?? DNSRelay.systemResolver().map { TCPEndpoint($0, 53) }) : nil
        // The relay answers on our PPP address: in the host role (we hand out DNS rather than
        // ask for it) that address is the terminal's DNS server, the one IPCP settles on even
        // when the peer chooses it.
        if relayUpstream != nil, !link.ipcp.requestDNS {
            link.ipcp.localAddressAsDNS = true
        }
        let attachment = StackAttachment(services: configuration.services, servicePorts: configuration.servicePorts, tcp: configuration.tcp) { [weak self] text in
            self?.log(text)
        }
        attachment.maximumConnections = configuration.stackConnectionLimit
        attachment.connectionUserTimeout = configuration.connectionUserTimeout
        if let ping = configuration.ping { attachment.ping(ping.target, count: ping.count) }
        let bridges = Bridges(loop: loop, connectionLimit: configuration.bridgeConnectionLimit, share: configuration.descriptorShare)
        bridges.log = { [weak self] in self?.log($0) }
        bridges.onConnection = { [weak self] spec, relay, opened in self?.reportConnection(.bridge(spec), relay, opened: opened) }
        bridges.onRefused = { [weak self] spec, destination, source, why in
            self?.reportRefusal(ConnectionReport(carrier: .bridge(spec), phase: .refused, number: 0, destination: destination, source: source,
                                                 failure: why))
        }
        attachment.add(bridges)
        let streams = TerminalStreams(loop: loop)
        attachment.add(streams)
        terminalStreams = streams
        if let s = configuration.socks {
            let proxy = SocksProxy(configuration: s, loop: loop, share: configuration.descriptorShare)
            proxy.keepAlive = configuration.keepAlive
            proxy.log = { [weak self] in self?.log($0) }
            proxy.counters.onChange = { [weak self] relay, opened in self?.reportConnection(.proxy, relay, opened: opened) }
            proxy.onRefused = { [weak self] destination, source, why in
                self?.reportRefusal(ConnectionReport(carrier: .proxy, phase: .refused, number: 0, destination: destination, source: source,
                                                     failure: why))
            }
            attachment.add(proxy)
            socks = proxy
        } else {
            socks = nil
        }
        if let upstream = relayUpstream {
            let relay = DNSRelay(upstream: upstream, loop: loop)
            relay.share = configuration.descriptorShare
            relay.log = { [weak self] in self?.log($0) }
            attachment.add(relay)
        }
        let session = LinkSession(line: line, link: PPPLink(configuration: link, random: CSPRNG()), pcap: pcap, record: record,
                                  attachment: attachment, frameLoss: configuration.frameLoss, seed: seed &+ 2) { [weak self] event in
            self?.linkEvent(event)
        }
        session.report = { [weak self] in self?.log($0) }
        if let limit = configuration.lineQueueLimit { session.lineQueueLimit = limit }
        session.readModeration = configuration.lineReadModeration
        session.closeWhenAttachmentFinished = configuration.ping != nil && configuration.closeAfterPing
        session.onDown = { [weak self] reason in self?.linkDown(reason) }
        self.attachment = attachment
        self.bridges = bridges
        self.session = session
        state = .opening
        do {
            try session.start(on: loop)
        } catch {
            self.session = nil
            self.attachment = nil
            self.bridges = nil
            terminalStreams = nil
            socks = nil
            line.close()
            state = .closed
            let reason = ChannelCloseReason.lineFailed(error.description)
            lastCloseReason = reason
            finishOpen(.failure(.closed(reason)))
            emit(.closed(reason))
            delegate?.channelDidClose(self, reason: reason)
        }
    }

    private func closeOnLoop() {
        reopenRequested = false
        switch state {
        case .open, .opening:
            state = .closing
            session?.close(now: loop.now)
        case .closing:
            // A second request stops waiting for the peer's Terminate-Ack.
            session?.close(now: loop.now)
        case .closed:
            break
        }
    }

    private func linkEvent(_ event: LinkEvent) {
        emit(.link(event))
        guard case let .ipcpOpened(result) = event else { return }
        let a = ChannelAddresses(ip: result.localAddress, submask: result.netmask, dns: result.dnsServers.first, terminalIP: result.peerAddress)
        addresses = a
        if state == .opening { state = .open }
        opens += 1
        if configuration.rearmBridgesOnReopen {
            for spec in previousBridges {
                do { try bridges?.add(spec) } catch { log("bridge \(spec) not re-armed: \(error)") }
            }
        }
        // The delegate first: a bridge it adds exists when `open()` returns.
        emit(.opened(a))
        delegate?.channelDidOpen(self)
        finishOpen(.success(a))
    }

    private func linkDown(_ down: LinkDownReason) {
        let reason = ChannelCloseReason(down)
        previousBridges = bridges?.lastSpecs ?? []
        if let s = session {
            lastLineBytes = (s.lineBytesIn, s.lineBytesOut)
            lastFrames = (s.link.decoder.counters.frames, s.link.framesSent, s.link.decoder.counters.droppedFrames)
        }
        session?.line.close()
        session = nil
        attachment = nil
        bridges = nil
        terminalStreams = nil
        socks = nil
        addresses = nil
        state = .closed
        lastCloseReason = reason
        emit(.closed(reason))
        delegate?.channelDidClose(self, reason: reason)
        // An open asked for while this link was closing waits for the next one.
        if !reopenRequested { finishOpen(.failure(.closed(reason))) }
        let waiters = closeWaiters
        closeWaiters = []
        for w in waiters { w(reason) }
        if reopenRequested { startOnLoop() }
    }

    private func finishOpen(_ result: Result<ChannelAddresses, ChannelError>) {
        let waiters = openWaiters
        openWaiters = []
        for w in waiters { w(result) }
    }

    // MARK: Streams inside the process

    /// Opens a TCP connection from our stack to `port` on the terminal, held inside the process
    /// (see `TerminalStream`): what a program on the host uses when the terminal's port is for it
    /// alone and must not be offered to every local process as a bridge would. Call on the loop's
    /// thread while the channel is open; the stream ends (`onClose`) when the link goes down.
    public func openTerminalStream(port: UInt16) throws(TerminalStreamError) -> TerminalStream {
        guard state == .open, let terminalStreams else { throw .notOpen }
        defer { if let session { loop.wake(session) } }
        return try terminalStreams.open(port: port, now: loop.now)
    }

    // MARK: Properties (ICPPP's, valid after did-open)

    public var currentAddresses: ChannelAddresses? { loop.sync { addresses } }
    public var ip: String? { currentAddresses.map { $0.ip.description } }
    public var submask: String? { currentAddresses.map { $0.submask.description } }
    public var dns: String? { currentAddresses?.dns.map { $0.description } }
    public var terminalIP: String? { currentAddresses.map { $0.terminalIP.description } }
    public var isOpen: Bool { loop.sync { state == .open } }

    // MARK: Bridges

    /// Adds a bridge; the same port on both sides. Throws the ICPPP error (its raw value is the
    /// header's return code).
    public func addBridge(_ kind: BridgeKind, port: UInt16) throws(BridgeError) {
        let r: Result<Void, BridgeError> = changing {
            guard state == .open, let bridges else { return .failure(.couldNotStart) }
            do throws(BridgeError) { try bridges.add(BridgeSpec(kind, port: port)) } catch { return .failure(error) }
            return .success(())
        }
        try r.get()
    }

    /// Removes a bridge (beyond ICPPP): it takes no new connections; open ones run to their end.
    @discardableResult
    public func removeBridge(_ kind: BridgeKind, port: UInt16) -> Bool {
        changing { bridges?.remove(BridgeSpec(kind, port: port)) ?? false }
    }

    public var bridgeStatus: [BridgeStatus] { loop.sync { bridges?.status ?? [] } }

    // MARK: Proxy

    /// ICPPP's setKeepAliveDelay:Interval:andCount: for the proxy's outbound host sockets from
    /// now on (connections already open keep theirs).
    public func setKeepAlive(_ settings: KeepAliveSettings?) {
        changing {
            configuration.keepAlive = settings
            socks?.keepAlive = settings
        }
    }

    public var proxyConnections: [ProxyConnectionStatus] { loop.sync { socks?.connections ?? [] } }

    public var status: ChannelStatus {
        loop.sync {
            let lineBytes = session.map { ($0.lineBytesIn, $0.lineBytesOut) } ?? lastLineBytes
            let frames = session.map { ($0.link.decoder.counters.frames, $0.link.framesSent, $0.link.decoder.counters.droppedFrames) } ?? lastFrames
            return ChannelStatus(state: state, addresses: addresses, bridges: bridges?.status ?? [], proxy: socks?.counters.value,
                                 proxyRefusals: socks?.refusals ?? 0, proxyPolicyRefusals: socks?.policyRefusals ?? 0,
                                 proxyHandshakeTimeouts: socks?.handshakeTimeouts ?? 0, lineBytesIn: lineBytes.0, lineBytesOut: lineBytes.1,
                                 framesIn: frames.0, framesOut: frames.1, framesDropped: frames.2,
                                 lineQueue: session?.lineQueue ?? LineQueueCounters(), acceptBackoffs: bridges?.acceptBackoffs ?? 0,
                                 listenRefusals: attachment?.stack?.counters.tcpListenRefused ?? 0, opens: opens,
                                 lastCloseReason: lastCloseReason, comPort: session?.comPortReport)
        }
    }

    /// The stack's and applications' counters, as lines for a person.
    public func report() -> [String] {
        loop.sync {
            guard let attachment, let session else { return ["channel \(state.rawValue)"] }
            var lines = attachment.report() + [session.lineQueue.description]
            if let r = session.comPortReport, let c = session.comPortCounters {
                lines.append("rfc2217: server reports baud \(r.baudRate.map(String.init) ?? "-") data bits \(r.dataBits.map(String.init) ?? "-") "
                    + "parity \(r.parity.map(String.init) ?? "-") stop \(r.stopBits.map(String.init) ?? "-") control \(r.control.map(String.init) ?? "-") "
                    + "modem state \(r.modemState.map { "0x" + String($0, radix: 16) } ?? "-"); options refused \(c.optionsRefused) ignored \(c.optionsIgnored), "
                    + "subnegotiations too long \(c.subnegotiationsTooLong) ignored \(c.subnegotiationsIgnored), commands ignored \(c.commandsIgnored)")
            }
            return lines
        }
    }
}
