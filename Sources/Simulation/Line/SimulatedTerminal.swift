import Channel
import Crypto
import Glibc
import NetStack
import PPP

/// How one scripted connection from the terminal ended.
public struct TransferResult: Sendable, Equatable {
    public var sent: Int
    public var received: [UInt8]
    /// "closed" when both sides finished cleanly; otherwise why not (a reset, a refusal, a
    /// SOCKS reply code).
    public var outcome: String
    public var succeeded: Bool { outcome == "closed" }
}

/// The terminal's side of a link, for demonstrations, tests and benchmarks: our own stack in
/// the terminal role on the far end of a line (it accepts the addresses it is given), serving
/// echo on the ports asked for and making scripted connections, directly or through a SOCKS5
/// proxy. A real program on a real pty, not a stand-in: it speaks PPP byte for byte.
public final class SimulatedTerminal: @unchecked Sendable {
    public let loop: EventLoop
    private let line: SerialLine
    private let session: LinkSession
    private let attachment: StackAttachment
    private let transfers: TerminalTransfers
    private var upWaiters: [(IPCPResult?) -> Void] = []
    private var result: IPCPResult?
    private var down: LinkDownReason?

    /// The terminal on `line` (a pty it created, or a device), serving echo on `echoPorts` and
    /// the other diagnostic services on the ports given.
    public init(line: ChannelLine, echoPorts: [UInt16] = [], services: [(DiagnosticService, UInt16)] = [], link: LinkConfiguration = .terminal(),
                loop: EventLoop = .shared) throws(SystemError) {
        self.loop = loop
        switch line {
        case let .device(path, options): self.line = try SerialLine(device: path, options: options)
        case let .pty(link, options): self.line = try SerialLine(ptyLinkedAt: link, options: options)
        case let .descriptor(fd): self.line = try SerialLine(descriptor: fd)
        }
        var seed: UInt64 = 0
        withUnsafeMutableBytes(of: &seed) { _ = getentropy($0.baseAddress, $0.count) }
        attachment = StackAttachment { _ in }
        let served = echoPorts.map { (DiagnosticService.echo, $0) } + services
        if !served.isEmpty { attachment.add(DiagnosticServices(ports: served)) }
        transfers = TerminalTransfers(loop: loop)
        attachment.add(transfers)
        session = LinkSession(line: self.line, link: PPPLink(configuration: link, random: CSPRNG()), attachment: attachment, seed: seed &+ 2) { _ in }
        let events: (LinkEvent) -> Void = { [weak self] event in
            guard let self else { return }
            switch event {
            case let .ipcpOpened(r):
                self.result = r
                self.wakeUpWaiters(r)
                self.onUp?(r)
            default: break
            }
        }
        session.onDown = { [weak self] reason in
            guard let self else { return }
            self.down = reason
            self.result = nil
            self.wakeUpWaiters(nil)
            self.onDown?(reason)
        }
        sessionEvents = events
    }

    private var sessionEvents: (LinkEvent) -> Void = { _ in }

    /// How its busy line is read (`LinkSession.readModeration`); set before `start`.
    public var readModeration: LineReadModeration.Settings {
        get { session.readModeration }
        set { session.readModeration = newValue }
    }

    /// Called on the loop when the link goes down (the peer closed it, the line hung up).
    public var onDown: ((LinkDownReason) -> Void)?
    /// Called on the loop when IPCP opens (the addresses are settled).
    public var onUp: ((IPCPResult) -> Void)?

    deinit {
        let session = self.session
        let line = self.line
        loop.sync {
            session.forceDown()
            line.close()
        }
    }

    private func wakeUpWaiters(_ r: IPCPResult?) {
        let w = upWaiters
        upWaiters = []
        for f in w { f(r) }
    }

    /// The pty's name when the terminal created it: what the channel opens.
    public var linePath: String? { line.peerPath }

    public func start() throws(SystemError) {
        let r: SystemError? = loop.sync {
            session.onLinkEvent = sessionEvents
            do throws(SystemError) { try session.start(on: loop) } catch { return error }
            return nil
        }
        if let r { throw r }
    }

    /// Waits for IPCP; nil when the link went down instead.
    public func waitUntilUp() async -> IPCPResult? {
        await withCheckedContinuation { (c: CheckedContinuation<IPCPResult?, Never>) in
            loop.enqueue { [self] in
                if let result { c.resume(returning: result); return }
                if down != nil { c.resume(returning: nil); return }
                upWaiters.append { c.resume(returning: $0) }
            }
        }
    }

    public var downReason: LinkDownReason? { loop.sync { down } }

    /// Connects to `target` (through the SOCKS5 proxy at `socks`, asking it for `target`, or
    /// for `name` when given), sends `payload`, half-closes, and collects everything until
    /// the other side closes.
    public func transfer(to target: TCPEndpoint, via socks: TCPEndpoint? = nil, name: String? = nil, payload: [UInt8]) async -> TransferResult {
        await withCheckedContinuation { (c: CheckedContinuation<TransferResult, Never>) in
            loop.enqueue { [self] in
                transfers.begin(target: target, socks: socks, name: name, payload: payload, now: loop.now) { c.resume(returning: $0) }
                attachment.serve(now: loop.now)
                session.service(now: loop.now)
            }
        }
    }

    /// Sends one UDP datagram from port `localPort` and waits up to `timeout` for the first
    /// datagram back on that port (a DNS query, for instance).
    public func exchangeDatagram(to target: TCPEndpoint, localPort: UInt16 = 5353, payload: [UInt8], timeout: Duration = .seconds(5)) async -> [UInt8]? {
        await withCheckedContinuation { (c: CheckedContinuation<[UInt8]?, Never>) in
            loop.enqueue { [self] in
                transfers.exchange(to: target, localPort: localPort, payload: payload, deadline: loop.now + timeout, now: loop.now) { c.resume(returning: $0) }
                session.service(now: loop.now)
            }
        }
    }

    /// Closes the link with LCP Terminate and waits until it is down.
    public func stop() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            loop.enqueue { [self] in
                if down != nil { c.resume(); return }
                let previous = session.onDown
                session.onDown = { reason in
                    previous?(reason)
                    c.resume()
                }
                session.close(now: loop.now)
            }
        }
        line.close()
    }

    /// `stop` for code on the loop thread: LCP Terminate, then `whenDown` (on the loop) once the
    /// link is down and the line closed.
    public func close(whenDown: @escaping () -> Void) {
        let finish: () -> Void = { [line] in
            line.close()
            whenDown()
        }
        if down != nil { return finish() }
        let previous = session.onDown
        session.onDown = { reason in
            previous?(reason)
            finish()
        }
        session.close(now: loop.now)
    }

    /// Adds an application to the terminal's stack (it starts when the link is up). Loop thread.
    public func add(_ application: StackApplication) {
        attachment.add(application, now: loop.now)
    }

    /// `transfer` for code already on the loop thread: the completion runs there too.
    public func beginTransfer(to target: TCPEndpoint, via socks: TCPEndpoint? = nil, name: String? = nil, payload: [UInt8],
                              completion: @escaping (TransferResult) -> Void) {
        transfers.begin(target: target, socks: socks, name: name, payload: payload, now: loop.now, completion: completion)
        attachment.serve(now: loop.now)
        session.service(now: loop.now)
    }

    /// Sends what applications wrote outside a stack event (a timer, another socket). Loop thread.
    public func kick() {
        attachment.serve(now: loop.now)
        session.service(now: loop.now)
    }

    /// The negotiated addresses while the link is up. Loop thread.
    public var linkResult: IPCPResult? { result }

    /// The stack's counters and connections, as lines for a person.
    public func report() -> [String] { loop.sync { attachment.report() } }

    /// Drops the line at once, as an unplugged cable does: no Terminate, the descriptor closed.
    public func hangUp() {
        loop.sync {
            session.forceDown()
            line.close()
        }
    }

    /// Stops answering anything (a frozen terminal): the line stays open but nothing is read.
    public func freeze() {
        loop.sync { session.forceDown() }
    }

    /// Bit errors on everything the terminal writes to its line from now on (nil: a clean
    /// line again). Loop thread.
    public var lineNoise: LineNoise? {
        get { session.lineNoise }
        set { session.lineNoise = newValue }
    }

    /// The link is up (IPCP opened and not down since). Loop thread.
    public var isUp: Bool { result != nil && down == nil }
}

/// Scripted client connections on the terminal's stack.
final class TerminalTransfers: StackApplication {
    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    private var jobs: [ConnectionID: Job] = [:]
    private var dirty: Set<ConnectionID> = []

    final class Job {
        var payload: [UInt8]
        var offset = 0
        var received: [UInt8] = []
        var socksReplyNeeded = 0
        var prefixLength = 0
        var socksReply: [UInt8] = []
        var established = false
        var shutDown = false
        let completion: (TransferResult) -> Void
        init(payload: [UInt8], completion: @escaping (TransferResult) -> Void) {
            self.payload = payload
            self.completion = completion
        }
    }

    private var datagramWaiters: [UInt16: (deadline: Instant, completion: ([UInt8]?) -> Void)] = [:]

    init(loop: EventLoop) { self.loop = loop }

    func start(_ host: StackAttachment, now: Instant) { self.host = host }

    func exchange(to target: TCPEndpoint, localPort: UInt16, payload: [UInt8], deadline: Instant, now: Instant, completion: @escaping ([UInt8]?) -> Void) {
        guard let host, host.stackIsUp, datagramWaiters[localPort] == nil else { return completion(nil) }
        do { try host.bindUDP(port: localPort, for: self) } catch { return completion(nil) }
        datagramWaiters[localPort] = (deadline, completion)
        host.stack!.sendDatagram(from: localPort, to: target, payload: payload, now: now)
    }

    func datagram(port: UInt16, now: Instant) {
        guard let host, let (_, payload) = host.stack?.receiveDatagram(port: port), let w = datagramWaiters.removeValue(forKey: port) else { return }
        host.stack?.unbindUDP(port: port)
        w.completion(payload)
    }

    var pollAt: Instant? { datagramWaiters.values.lazy.map { $0.deadline }.min() }

    func poll(now: Instant) {
        for (port, w) in datagramWaiters where w.deadline <= now {
            datagramWaiters[port] = nil
            host?.stack?.unbindUDP(port: port)
            w.completion(nil)
        }
    }

    func stop() {
        for w in datagramWaiters.values { w.completion(nil) }
        datagramWaiters = [:]
        for job in jobs.values { job.completion(TransferResult(sent: job.offset, received: job.received, outcome: "link down")) }
        jobs = [:]
        dirty = []
    }

    func begin(target: TCPEndpoint, socks: TCPEndpoint?, name: String?, payload: [UInt8], now: Instant, completion: @escaping (TransferResult) -> Void) {
        guard let host, host.stackIsUp else {
            completion(TransferResult(sent: 0, received: [], outcome: "link not up"))
            return
        }
        let job = Job(payload: payload, completion: completion)
        if socks != nil {
            // RFC 1928: greeting (no authentication) and CONNECT sent at once.
            var request: [UInt8] = [5, 1, 0, 5, 1, 0]
            if let name {
                request += [3, UInt8(name.utf8.count)] + Array(name.utf8)
            } else {
                request += [1] + target.address.bytes
            }
            request += [UInt8(target.port >> 8), UInt8(target.port & 0xFF)]
            job.payload = request + payload
            job.prefixLength = request.count
            job.socksReplyNeeded = 2 + 10
        }
        do {
            let id = try host.connect(to: socks ?? target, for: self, now: now)
            jobs[id] = job
        } catch {
            completion(TransferResult(sent: 0, received: [], outcome: "\(error)"))
        }
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        guard let job = jobs[id] else { return }
        switch event {
        case .established:
            job.established = true
            dirty.insert(id)
        case let .closed(reason):
            step(id, now: now)
            // The step may have finished the job already (a SOCKS refusal).
            guard jobs.removeValue(forKey: id) != nil else { return }
            dirty.remove(id)
            job.completion(TransferResult(sent: max(0, job.offset - job.prefixLength), received: job.received, outcome: reason == .closed ? "closed" : reason.rawValue))
        default:
            dirty.insert(id)
        }
    }

    func step(now: Instant) {
        let work = dirty
        dirty = []
        for id in work { step(id, now: now) }
    }

    private func step(_ id: ConnectionID, now: Instant) {
        guard let job = jobs[id], let host, host.stackIsUp, job.established else { return }
        if job.offset < job.payload.count {
            job.offset += host.stack!.write(id, job.payload[job.offset...], now: now)
        }
        if job.offset == job.payload.count && !job.shutDown {
            job.shutDown = true
            host.stack!.shutdownWrite(id, now: now)
        }
        while true {
            let chunk = host.stack!.read(id, now: now)
            if chunk.isEmpty { break }
            if job.socksReplyNeeded > 0 {
                let take = min(job.socksReplyNeeded, chunk.count)
                job.socksReply += chunk[0..<take]
                job.socksReplyNeeded -= take
                job.received += chunk[take...]
                if job.socksReplyNeeded == 0 && (job.socksReply[1] != 0 || job.socksReply[3] != 0) {
                    host.stack!.abort(id, now: now)
                    jobs[id] = nil
                    job.completion(TransferResult(sent: 0, received: [], outcome: "socks reply \(job.socksReply[3])"))
                    return
                }
            } else {
                job.received += chunk
            }
        }
        // The peer may finish its side first; ours closes once the whole payload is written.
        if host.atEndOfStream(id) && (job.shutDown || job.socksReplyNeeded > 0) {
            if job.socksReplyNeeded > 0 {
                // Refused before a whole reply: what came is the refusal.
                host.stack!.close(id, now: now)
                jobs[id] = nil
                let code = job.socksReply.count > 1 ? job.socksReply[1] == 0 && job.socksReply.count > 3 ? job.socksReply[3] : job.socksReply[1] : 255
                job.completion(TransferResult(sent: 0, received: [], outcome: "socks reply \(code)"))
                return
            }
            host.stack!.close(id, now: now)
        }
        // Both directions finished: done, without waiting out TIME-WAIT.
        if job.shutDown, host.atEndOfStream(id), let state = host.state(id), state == .timeWait {
            jobs[id] = nil
            job.completion(TransferResult(sent: max(0, job.offset - job.prefixLength), received: job.received, outcome: "closed"))
        }
    }
}
