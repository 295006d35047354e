import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// The host SDK: one reader at a time over the PPP channel, async/await calls with delegate
/// callbacks in the seeds' shape. The session itself (connect, login, payments, reconnects,
/// updates) is `ReaderSession`, sans-IO; this shell feeds it on the event loop and carries its
/// outputs out: links on the line, frames, gateway exchanges, delegate calls, its deadline.
/// The delegate is called on the loop's thread.
public final class PaymentReader: @unchecked Sendable {
    public let loop: EventLoop
    public weak var delegate: PaymentReaderDelegate?
    public typealias Info = ReaderSession.Info

    let core: ReaderSession
    /// The links the core asked for, by its link ID.
    var links: [ReaderSession.LinkID: ReaderLink] = [:]
    /// What each call in flight resumes, by its ticket.
    var calls: [Int: (Result<ReaderSession.Answer, PaymentError>) -> Void] = [:]
    var nextTicket = 0
    var draining = false
    var deadlineTimer: (id: Int, at: Instant)?
    var configuration: ReaderConnectionConfiguration?
    var discovery: DiscoveryRun?
    /// The channel of the last link opened: a new connect waits until it is down.
    var lastChannel: Channel?
    /// Links let go during `disconnect`, closed after the logout had a moment to leave.
    var closingPolitely: [ReaderLink]?
    /// Every byte of the reader connection and of the SDK's gateway exchanges, when asked for.
    public var recordsBytes = false
    var wire: [UInt8] = []

    public init(loop: EventLoop = .shared) {
        self.loop = loop
        core = ReaderSession(now: loop.clock.now, wallClock: .current(), random: { try SecureBytes.random($0) })
    }

    public var state: PaymentState { loop.sync { core.state } }
    public var info: Info? { loop.sync { core.info } }
    public var isConnected: Bool { loop.sync { core.isConnected } }
    public var recorded: [UInt8] { loop.sync { wire } }
    /// The channel of the current connection (status, addresses), if any.
    public var channel: Channel? { loop.sync { core.currentLinkID.flatMap { links[$0]?.channel } } }

    struct DiscoveryRun {
        var core: DiscoveryCore
        var pattern: String
        var timer: Int?
        var finish: (Result<DiscoveredReader?, PaymentError>) -> Void
    }

    // MARK: Plumbing

    /// Runs `body` on the loop with a completion that resumes the caller exactly once.
    /// The caller's task is suspended meanwhile; no thread waits (`EventLoop.enqueue`).
    func run<T: Sendable>(_ body: @escaping (@escaping (Result<T, PaymentError>) -> Void) -> Void) async throws(PaymentError) -> T {
        let result = await withCheckedContinuation { (c: CheckedContinuation<Result<T, PaymentError>, Never>) in
            let once = Once(c)
            loop.enqueue { body { once.resume($0) } }
        }
        return try result.get()
    }

    /// One call into the core under a new ticket; returns the answer its `finished` output carries.
    func call(_ start: @escaping (_ ticket: Int, _ now: Instant) -> Void) async throws(PaymentError) -> ReaderSession.Answer {
        try await run { [self] finish in
            nextTicket += 1
            calls[nextTicket] = finish
            tick()
            start(nextTicket, loop.now)
            drain()
        }
    }

    /// Before every input: the core's wall clock is the system's now (it may have been stepped,
    /// or the machine suspended, since the last input).
    func tick() {
        core.setWallClock(.current(), at: loop.now)
    }

    /// Carries out everything the core has to say, until it has nothing more, and keeps one
    /// loop timer at its deadline. A delegate that calls back in (cancel from a callback) adds
    /// to what the running drain carries out, in order, rather than starting another.
    func drain() {
        guard !draining else { return }
        draining = true
        defer { draining = false }
        while true {
            let outputs = core.takeOutputs()
            if outputs.isEmpty { break }
            for o in outputs { perform(o) }
        }
        let deadline = core.nextDeadline
        if let t = deadlineTimer, t.at != deadline {
            loop.cancelTimer(t.id)
            deadlineTimer = nil
        }
        if let deadline, deadlineTimer == nil {
            let id = loop.schedule(at: deadline) { [weak self] in
                guard let self else { return }
                self.deadlineTimer = nil
                self.tick()
                self.core.poll(now: self.loop.now)
                self.drain()
            }
            deadlineTimer = (id, deadline)
        }
    }

    func perform(_ output: ReaderSession.Output) {
        switch output {
        case .probeLine(let path):
            let present = access(path, F_OK) == 0
            let advert = present ? ReaderLines.advert(at: path) : nil
            let peripheral = core.target?.peripheral ?? advert
            core.lineProbed(present: present, advert: advert,
                            bondKey: peripheral.flatMap { configuration?.bonds.key(for: $0.peripheralUUID) }, now: loop.now)
        case .openLink(let id, let path):
            // The bond as the store has it now: the app may have removed or replaced it.
            if let p = core.target?.peripheral { core.bondChanged(configuration?.bonds.key(for: p.peripheralUUID)) }
            openLink(id, path: path)
        case .send(let id, let frame):
            links[id]?.send(frame)
        case .closeLink(let id):
            guard let l = links.removeValue(forKey: id) else { return }
            if closingPolitely != nil { closingPolitely?.append(l) } else { l.teardown() }
        case .gateway(let id, let request):
            guard let c = configuration else { return core.gatewayAnswered(id, nil) }
            GatewayClient.exchange(request, with: c.gateway, loop: loop, timeout: .seconds(10), observer: recorder) { [weak self] answer in
                self?.tick()
                self?.core.gatewayAnswered(id, answer)
                self?.drain()
            }
        case .relay(let id, let payload, let summary, let timeout):
            guard let c = configuration, delegate?.reader(self, shouldSubmit: summary) ?? true else {
                return core.relayAnswered(id, .declined, now: loop.now)
            }
            GatewayClient.exchange(payload: payload, with: c.gateway, loop: loop, timeout: timeout, observer: nil) { [weak self] answer in
                guard let self else { return }
                self.tick()
                self.core.relayAnswered(id, .answer(answer), now: self.loop.now)
                self.drain()
            }
        case .confirmPairing(let passkey):
            core.pairingConfirmed(delegate?.reader(self, confirmPairing: passkey) == true, now: loop.now)
        case .storeBond(let uuid, let key):
            configuration?.bonds.store(key, for: uuid)
        case .removeBond(let uuid):
            configuration?.bonds.remove(uuid)
        case .stopDiscovery:
            endDiscovery(.failure(PaymentError(.canceled, "discovery canceled")), state: .failed(.canceled))
        case .state(let s):
            delegate?.reader(self, didChangeState: s)
        case .report(let event):
            delegate?.reader(self, didReport: event)
        case .updateAvailable(let update):
            delegate?.reader(self, didReportAvailableUpdate: update)
        case .installStarted(let update):
            let cancelable = Cancelable(loop: loop) { [weak self] in
                self?.core.cancelUpdate()
                self?.drain()
            }
            delegate?.reader(self, didStartInstallingUpdate: update, cancelable: cancelable)
        case .installProgress(let p):
            delegate?.reader(self, didReportReaderSoftwareUpdateProgress: p)
        case .installFinished(let update, let error):
            delegate?.reader(self, didFinishInstallingUpdate: update, error: error)
        case .reconnectStarted(let episode, let reason):
            let cancelable = Cancelable(loop: loop) { [weak self] in
                guard let self else { return }
                self.tick()
                self.core.cancelReconnect(episode: episode, now: self.loop.now)
                self.drain()
            }
            delegate?.reader(self, didStartReconnect: cancelable, disconnectReason: reason)
        case .reconnectSucceeded:
            delegate?.readerDidSucceedReconnect(self)
        case .reconnectFailed:
            delegate?.readerDidFailReconnect(self)
        case .disconnected(let reason):
            delegate?.reader(self, didDisconnect: reason)
        case .finished(let ticket, let result):
            calls.removeValue(forKey: ticket)?(result)
        }
    }

    var recorder: (([UInt8]) -> Void)? {
        recordsBytes ? { [weak self] in self?.wire += $0 } : nil
    }

    /// A link on the line with a stream to the reader's port, reporting to the core.
    func openLink(_ id: ReaderSession.LinkID, path: String) {
        guard let configuration else { return }
        let l = ReaderLink(path: path, configuration: configuration, loop: loop)
        links[id] = l
        lastChannel = l.channel
        l.observer = { [weak self] bytes in
            guard let self, self.recordsBytes else { return }
            self.wire += bytes
        }
        l.onData = { [weak self] bytes in
            guard let self else { return }
            self.tick()
            self.core.received(id, bytes, now: self.loop.now)
            self.drain()
        }
        l.onLost = { [weak self, weak l] reason in
            guard let self else { return }
            self.links[id] = nil
            var echoTimeout = false
            if case .echoTimeout? = reason { echoTimeout = true }
            self.tick()
            self.core.linkLost(id, echoTimeout: echoTimeout, lineLost: l?.lineLost ?? false, now: self.loop.now)
            self.drain()
        }
        l.open { [weak self, l] error in
            guard let self else { return }
            self.tick()
            if let error {
                self.links[id] = nil
                self.core.linkFailed(id, error, lineLost: l.lineLost, now: self.loop.now)
            } else {
                self.core.linkOpened(id, now: self.loop.now)
            }
            self.drain()
        }
    }

    // MARK: Merchant login

    /// The merchant's login at the gateway (environment, licence, credentials): state `login`
    /// while it runs. The session it opens is what later connections log the reader in with
    /// (unless their configuration carries one). Returns the merchant ID.
    @discardableResult
    public func login(gateway: TCPEndpoint, environment: String, licence: String, user: String, password: String) async throws(PaymentError) -> String {
        let _: Bool = try await run { [self] finish in
            if let refusal = core.beginMerchantLogin() { return finish(.failure(refusal)) }
            drain()
            finish(.success(true))
        }
        do {
            let answer = try await GatewayClient.login(gateway: gateway, environment: environment, licence: licence, user: user,
                                                       password: password, loop: loop)
            let merchant = answer["MerchantID"]?.string ?? ""
            await loop.perform { [self] in
                core.merchantLoginEnded(.success((answer["SessionToken"]?.string, merchant)))
                drain()
            }
            return merchant
        } catch {
            await loop.perform { [self] in
                core.merchantLoginEnded(.failure(error))
                drain()
            }
            throw error
        }
    }

    // MARK: Disconnect

    /// Logs out and closes the link (reason disconnectRequested).
    public func disconnect() async {
        let closing: [ReaderLink] = await loop.perform { [self] in
            closingPolitely = []
            tick()
            core.disconnect(now: loop.now)
            drain()
            defer { closingPolitely = nil }
            return closingPolitely ?? []
        }
        guard !closing.isEmpty else { return }
        // The logout leaves before the link goes.
        try? await Task.sleep(for: .milliseconds(50))
        for l in closing { await l.close() }
    }

    /// A link given up (a failed login, a rejected pairing) may still be saying goodbye on the
    /// line; a new one on the same line waits until it is down.
    func previousLinkClosed() async {
        guard let previous = await loop.perform({ [self] in core.phase == .idle && !core.isBusy ? lastChannel : nil }) else { return }
        await previous.close()
    }
}

extension WallTime {
    /// The system's real-time clock, for the programs that feed the sans-IO cores.
    public static func current() -> WallTime {
        var t = timespec()
        clock_gettime(CLOCK_REALTIME, &t)
        return WallTime(seconds: Int64(t.tv_sec))
    }
}

/// Resumes a continuation once, whoever calls first.
final class Once<T: Sendable>: @unchecked Sendable {
    var continuation: CheckedContinuation<T, Never>?
    init(_ c: CheckedContinuation<T, Never>) { continuation = c }
    func resume(_ value: T) {
        guard let c = continuation else { return }
        continuation = nil
        c.resume(returning: value)
    }
}
