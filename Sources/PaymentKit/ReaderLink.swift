import Channel
import Glibc
import NetStack
import PPP
import Payment

/// One connection to a reader: the channel on its line (our PPP link, the SOCKS proxy for the
/// terminal's gateway traffic), a stream through our stack to the terminal's reader port held
/// inside the process (no host socket another local process could connect to), and the framed
/// reader protocol over it. Loop thread only.
final class ReaderLink {
    let loop: EventLoop
    let channel: Channel
    let configuration: ReaderConnectionConfiguration
    private(set) var connection: TerminalStream?
    private var decoder = PaymentFrameDecoder()
    private var serviceCounter = 0
    private var pending: [String: (PaymentMessage) -> Void] = [:]
    /// What to do for a pending request when the link goes before its answer came.
    private var unanswered: [String: () -> Void] = [:]
    private(set) var poiID = "UNKNOWN"
    /// Set by a Shutdown event: the reason the terminal gave before going.
    var shutdownReason: DisconnectReason?
    private(set) var up = false
    private(set) var gone = false
    private var connectRetry: Int?
    /// Loses the session a moment after it ended, unless the link's end says why first.
    private var endTimer: Int?
    /// Messages that are not answers (device requests, events, answers to earlier logins).
    var onMessage: ((PaymentMessage) -> Void)?
    /// Once, when the link or the reader connection is lost after it was up.
    var onLost: ((ChannelCloseReason?) -> Void)?
    /// Once: the reader connection is established (or the attempt failed).
    private var onReady: ((PaymentError?) -> Void)?
    /// Every byte of the reader connection (the SDK's own record, for checks on what crossed).
    var observer: (([UInt8]) -> Void)?

    /// The reader's line.
    let path: String

    init(path: String, configuration: ReaderConnectionConfiguration, loop: EventLoop) {
        self.path = path
        self.loop = loop
        self.configuration = configuration
        var c = ChannelConfiguration(line: .device(path))
        var socks = SocksConfiguration(port: configuration.socksPort)
        socks.allow = [SocksDestination(host: configuration.gateway.address.description, port: configuration.gateway.port)]
        c.socks = socks
        c.relayDNS = false
        c.pcapPath = configuration.pcapPath
        c.link.echo.interval = configuration.echoInterval
        c.link.echo.failureLimit = 3
        channel = Channel(configuration: c, loop: loop)
    }

    /// Opens the link and the reader connection; `ready` is called once.
    /// Why the channel closed, once it has.
    private(set) var closeReason: ChannelCloseReason?
    /// The reader sent a frame the decoder refused.
    private(set) var protocolViolation = false

    /// The line itself went away (hung up or failed) rather than PPP refusing.
    var lineLost: Bool {
        switch closeReason {
        case .lineHangUp?, .lineFailed?: return true
        default: return false
        }
    }

    func open(ready: @escaping (PaymentError?) -> Void) {
        onReady = ready
        channel.observe { [weak self] event in self?.channelEvent(event) }
        do { try channel.start() } catch {
            finishReady(PaymentError(.pppNegotiationFailed, "\(error)"))
        }
    }

    private func finishReady(_ error: PaymentError?) {
        guard let r = onReady else { return }
        onReady = nil
        if error != nil { teardown() }
        r(error)
    }

    private func channelEvent(_ event: ChannelEvent) {
        switch event {
        case .opened:
            // Once: after IPCP renegotiated (the link up again without closing), the reader
            // session that ended with it is over and is not quietly replaced.
            guard !up, connection == nil, connectRetry == nil else { return }
            connectReader(tries: 0)
        case .closed(let reason):
            closeReason = reason
            if onReady != nil {
                finishReady(PaymentError(.pppNegotiationFailed, "\(reason)"))
            } else {
                // The stream handed over what the terminal said last (a Shutdown event) before
                // it ended with the link.
                lose(reason)
            }
        default:
            break
        }
    }

    /// The terminal's reader port may listen a moment after the link is up: retried briefly.
    private func connectReader(tries: Int) {
        guard !gone else { return }
        do {
            let c = try channel.openTerminalStream(port: configuration.readerPort)
            connection = c
            c.onConnected = { [weak self] in
                guard let self else { return }
                self.up = true
                self.finishReady(nil)
            }
            c.onData = { [weak self] bytes in self?.received(bytes) }
            // The terminal ended the session (its last words, a Shutdown event, came before):
            // the link usually goes down next and says why; if it does not, the session is
            // lost all the same.
            c.onEndOfStream = { [weak self] in
                guard let self, self.up else { return }
                self.endTimer = self.loop.schedule(at: self.loop.now + .milliseconds(250)) { [weak self] in
                    guard let self else { return }
                    self.endTimer = nil
                    self.lose(self.closeReason)
                }
            }
            c.onClose = { [weak self, unowned c] _ in
                guard let self else { return }
                self.connection = nil
                if c.endedWithTheLink {
                    // Before it is up, the channel's closed event (or its next open) decides.
                    guard self.onReady == nil else { return }
                    // The channel's closed event follows in this turn with the reason; when the
                    // link only renegotiated IPCP it does not come, and the session is lost here.
                    self.endTimer = self.loop.schedule(at: self.loop.now) { [weak self] in
                        guard let self else { return }
                        self.endTimer = nil
                        self.lose(self.closeReason)
                    }
                    return
                }
                // Refused: the terminal's reader port is not listening yet; try again soon.
                if self.onReady != nil && tries < 50 {
                    self.connectRetry = self.loop.schedule(at: self.loop.now + .milliseconds(100)) { [weak self] in
                        self?.connectRetry = nil
                        self?.connectReader(tries: tries + 1)
                    }
                } else if self.onReady != nil {
                    self.finishReady(PaymentError(.connectTimedOut, "the reader port does not answer"))
                } else {
                    self.lose(self.closeReason)
                }
            }
        } catch {
            finishReady(PaymentError(.connectTimedOut, "\(error)"))
        }
    }

    private func received(_ bytes: [UInt8]) {
        observer?(bytes)
        let frames: [[UInt8]]
        do { frames = try decoder.feed(bytes) } catch {
            // A zero or oversize length: the connection is closed (2012 for what waits on it).
            protocolViolation = true
            connection?.close(reset: true)
            connection = nil
            return lose(nil)
        }
        for frame in frames {
            guard let message = try? PaymentMessage.decode(frame) else { continue }
            if message.header.type == .response, message.header.messageClass == .service, let sid = message.header.identifier,
               let handler = pending.removeValue(forKey: message.header.category.rawValue + "/" + sid) {
                unanswered[message.header.category.rawValue + "/" + sid] = nil
                // The answer must echo what was asked (else a protocol error for that request).
                handler(message)
                continue
            }
            onMessage?(message)
        }
    }

    /// Sends a Service request; `answer` gets its response (or nothing if the link goes).
    @discardableResult
    func request(_ category: PaymentMessage.Category, body: JSONValue, answer: ((PaymentMessage) -> Void)? = nil,
                 ifLost: (() -> Void)? = nil) -> String {
        if category == .login {
            serviceCounter = 0
            pending = [:]
            // Nothing asked before a new login is answered after it.
            let lost = unanswered.values
            unanswered = [:]
            for f in lost { f() }
        }
        serviceCounter += 1
        let sid = String(serviceCounter)
        let header = PaymentMessage.Header(protocolVersion: category == .login || category == .diagnosis ? "3.1" : nil,
                                           messageClass: .service, category: category, type: .request,
                                           identifier: sid, saleID: configuration.saleID, poiID: poiID)
        if let answer { pending[category.rawValue + "/" + sid] = answer }
        if let ifLost { unanswered[category.rawValue + "/" + sid] = ifLost }
        send(PaymentMessage(direction: .request, header: header, body: body))
        return sid
    }

    /// Answers a Device request from the terminal; false when the answer was too large to send.
    @discardableResult
    func answer(_ request: PaymentMessage, body: JSONValue) -> Bool {
        send(PaymentMessage(direction: .response, header: request.header.response(), body: body))
    }

    /// Messages not sent because they would not fit in a frame.
    private(set) var oversizeMessages = 0

    @discardableResult
    private func send(_ message: PaymentMessage) -> Bool {
        guard let frame = try? PaymentFrame.encode(message.encoded) else {
            oversizeMessages += 1
            return false
        }
        observer?(frame)
        connection?.send(frame)
        return true
    }

    func setPOIID(_ id: String) { poiID = id }

    private func lose(_ reason: ChannelCloseReason?) {
        if let endTimer { loop.cancelTimer(endTimer) }
        endTimer = nil
        guard up, !gone else { return }
        let callback = onLost
        onLost = nil
        teardown()
        callback?(reason)
    }

    /// Lets everything go: the reader connection and the channel (LCP Terminate when it is up).
    func teardown() {
        guard !gone else { return }
        gone = true
        if let connectRetry { loop.cancelTimer(connectRetry) }
        connectRetry = nil
        if let endTimer { loop.cancelTimer(endTimer) }
        endTimer = nil
        connection?.close()
        connection = nil
        pending = [:]
        onMessage = nil
        channel.requestClose()
        // Requests that will never be answered now: their callers must not wait for ever.
        let lost = unanswered.values
        unanswered = [:]
        for f in lost { f() }
    }

    /// Closes politely and waits for the link to be down.
    func close() async {
        await loop.perform { [self] in teardown() }
        await channel.close()
    }
}
