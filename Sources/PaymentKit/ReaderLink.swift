import Channel
import Glibc
import NetStack
import PPP
import Payment

/// One connection to a reader: the channel on its line (our PPP link, the SOCKS proxy for the
/// terminal's gateway traffic) and a stream through our stack to the terminal's reader port held
/// inside the process (no host socket another local process could connect to). The reader
/// protocol over it is `ReaderSession`'s; this carries its bytes. Loop thread only.
final class ReaderLink {
    let loop: EventLoop
    let channel: Channel
    let configuration: ReaderConnectionConfiguration
    private(set) var connection: TerminalStream?
    private(set) var up = false
    private(set) var gone = false
    private var connectRetry: Int?
    /// Loses the session a moment after it ended, unless the link's end says why first.
    private var endTimer: Int?
    /// The reader's bytes.
    var onData: (([UInt8]) -> Void)?
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

    /// Why the channel closed, once it has.
    private(set) var closeReason: ChannelCloseReason?

    /// The line itself went away (hung up or failed) rather than PPP refusing.
    var lineLost: Bool {
        switch closeReason {
        case .lineHangUp?, .lineFailed?: return true
        default: return false
        }
    }

    /// Opens the link and the reader connection; `ready` is called once.
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
        onData?(bytes)
    }

    /// Sends one frame of the reader protocol.
    func send(_ frame: [UInt8]) {
        guard !gone else { return }
        observer?(frame)
        connection?.send(frame)
    }

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
        onData = nil
        channel.requestClose()
    }

    /// Closes politely and waits for the link to be down.
    func close() async {
        await loop.perform { [self] in teardown() }
        await channel.close()
    }
}
