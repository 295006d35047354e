import Crypto
import Wire

/// The host's side of one reader, sans-IO: calls, reader bytes, link events, gateway answers
/// and time in; frames, link requests, gateway requests, events and deadlines out. It drives
/// connect, the reader's login and pairing, payments, refunds, signatures, reversals, reboot,
/// software updates and auto-reconnect with TransactionStatus recovery (SPEC §4). The async
/// SDK (`PaymentReader`) is a shell that carries its outputs out and feeds what comes back in.
///
/// One operation at a time: a second gets `busy` and changes nothing. A link lost unexpectedly
/// starts one reconnect episode: one `reconnectStarted`, then one `reconnectSucceeded` or
/// `reconnectFailed`; a payment in flight is recovered with TransactionStatus after it.
public final class ReaderSession {
    /// How to log in to the reader and what to do when it goes.
    public struct Settings: Sendable {
        public var locationID: String
        public var environment = "int"
        public var licence = "LIC-TEST-0001"
        public var merchantID = "999008881"
        public var terminalID = "001"
        /// The merchant's gateway session; without it, the one from the merchant login.
        public var sessionToken: String?
        public var saleID = "HOST-1"
        public var autoReconnect = true
        public var reconnectTimeout: Duration = .seconds(60)
        public var connectTimeout: Duration = .seconds(10)
        /// Reconnect backoff 0.5, 1, 2, 4, 8, 8 … s times this.
        public var backoffScale = 1.0
        /// How long a payment the reader still reports in progress after a reconnect (or leaves
        /// unanswered) is checked on, in all: then it is aborted and fails `unknownOutcome`.
        /// Longer than a customer takes at a terminal's card and PIN prompts.
        public var recoveryLimit: Duration = .seconds(300)
        /// Pair with a reader that requires it and has no bond yet (else `pairingRequired`).
        public var autoPair = false
        /// Who this host is to the readers it pairs with.
        public var hostID: String

        public init(locationID: String, hostID: String) {
            self.locationID = locationID
            self.hostID = hostID
        }
    }

    /// The reader a connect is for.
    public struct Target: Sendable {
        public var path: String
        public var serial: String?
        /// As discovery or its advertisement described it (pairing needs), if known.
        public var peripheral: DiscoveredReader?
        /// The bond's link key with that peripheral, if there is one.
        public var bondKey: [UInt8]?

        public init(path: String, serial: String? = nil, peripheral: DiscoveredReader? = nil, bondKey: [UInt8]? = nil) {
            self.path = path
            self.serial = serial
            self.peripheral = peripheral
            self.bondKey = bondKey
        }
    }

    /// What the reader said at the last login.
    public struct Info: Sendable, Equatable {
        public var serialNumber: String
        public var softwareVersion: String
        public var batteryLevel: String?
        public var transactionsRemaining: Int64?
        public var availableUpdate: ReaderSoftwareUpdate?
        public var locationID: String
    }

    /// A call's result.
    public enum Answer: Sendable, Equatable {
        case done
        case outcome(PaymentOutcome)
        case json(JSONValue)
    }

    /// How a relayed authorisation came back from the shell.
    public enum RelayResult: Sendable {
        /// The app declined to submit it.
        case declined
        /// The gateway's answer as it sent it, or nil when it could not be reached.
        case answer([UInt8]?)
    }

    public typealias LinkID = Int

    public enum Output: Sendable, Equatable {
        /// Is the reader's line there (a terminal re-arming its line is away for a moment)?
        /// Answer with `lineProbed`.
        case probeLine(path: String)
        /// Open a link on the line and a stream to the reader's port; answer with `linkOpened`
        /// or `linkFailed`, then `received` and `linkLost`.
        case openLink(LinkID, path: String)
        /// One reader frame for the link.
        case send(LinkID, [UInt8])
        /// Let the link go (the stream, then the PPP link).
        case closeLink(LinkID)
        /// One request to the gateway (a signature); answer with `gatewayAnswered`.
        case gateway(Int, JSONValue)
        /// An authorisation the reader asks the host to relay: ask the app (the summary holds
        /// no card data), send `payload` as it is, answer with `relayAnswered`.
        case relay(Int, payload: [UInt8], summary: [String: String], timeout: Duration)
        /// The person compares this passkey with the reader's display; answer with
        /// `pairingConfirmed`.
        case confirmPairing(String)
        case storeBond(peripheralUUID: String, key: [UInt8])
        case removeBond(peripheralUUID: String)
        /// Cancel was asked while discovery runs: the shell ends it.
        case stopDiscovery
        case state(PaymentState)
        case report(ReaderEvent)
        case updateAvailable(ReaderSoftwareUpdate)
        case installStarted(ReaderSoftwareUpdate)
        case installProgress(Float)
        case installFinished(ReaderSoftwareUpdate, PaymentError?)
        case reconnectStarted(episode: Int, reason: DisconnectReason)
        case reconnectSucceeded
        case reconnectFailed
        case disconnected(DisconnectReason)
        /// The call with this ticket is over.
        case finished(ticket: Int, Result<Answer, PaymentError>)
    }

    /// Where the session is with its reader.
    public enum Phase: Sendable, Equatable {
        /// No reader (never connected, disconnected, failed).
        case idle
        /// A connect call runs.
        case connecting(Connecting)
        /// Logged in on a live link.
        case connected
        /// The link went unexpectedly (or for an update's restart): getting it back.
        case reconnecting(Episode)
    }

    public struct Connecting: Sendable, Equatable {
        public var ticket: Int
        /// Probes of a line that was not there yet.
        public var linePolls = 0
        /// The person asked to cancel while the line was away.
        public var canceled = false
        public var setup: Setup = .waitingForLine
    }

    public struct Episode: Sendable, Equatable {
        public var id: Int
        /// An update's restart: the app is not told.
        public var silent: Bool
        public var deadline: Instant
        public var attempt = 0
        public var setup: Setup = .waiting
    }

    /// Getting one link from the line to a logged-in reader.
    public enum Setup: Sendable, Equatable {
        case waitingForLine
        /// Between reconnect attempts.
        case waiting
        case opening(LinkID)
        case loggingIn(LinkID)
        /// The reader's pairing answer is in; our nonce or the confirmation is on its way.
        case pairing(LinkID)
        /// The person compares the passkey.
        case confirmingPasskey(LinkID)
        /// A required update installs before the connect returns.
        case installingRequiredUpdate
    }

    /// The connect call's settings (the reader's login, reconnects).
    public internal(set) var settings = Settings(locationID: "", hostID: "")
    public internal(set) var phase: Phase = .idle
    public internal(set) var state: PaymentState = .ready
    public internal(set) var info: Info?
    /// The reader the last connect was for.
    public internal(set) var target: Target?
    var outputs: [Output] = []
    let random: (Int) throws -> [UInt8]
    var clock: WallClock

    /// The link in use or being set up; at most one.
    var link: LinkState?
    var nextLinkID = 0
    var explicitDisconnect = false
    var nextEpisode = 0

    var payment: PaymentInFlight?
    var install: Install?
    /// The approved payment a signature or its refusal is for.
    var lastOutcome: PaymentOutcome?
    var offer: UpdateOffer?
    /// The gateway session and merchant from the merchant login.
    var sessionToken: String?
    var gatewayMerchantID: String?
    /// The reader session token the terminal answered our last login with: presented again when
    /// we log in on a new connection while the old one may still hold the session.
    var readerSession: (path: String, token: String)?
    var pairingPlan: PairingPlan?
    var signatureCall: (id: Int, ticket: Int)?
    var relays: [Int: (link: LinkID, request: PaymentMessage.Header)] = [:]
    var nextCall = 0
    /// Relayed authorisations waiting for the gateway.
    public var relaysInFlight: Int { relays.count }
    /// Relays the reader asked for beyond the cap (a reader has one authorisation at a time).
    public internal(set) var relaysRefused = 0
    static let relayCap = 4

    enum Timer: Hashable, CaseIterable { case linePoll, connect, lineRetry, backoff, reconnectDeadline, recovery, answer, install }
    /// How long a reboot or diagnosis waits for the reader's answer.
    static let answerTimeout: Duration = .seconds(30)
    /// How long an update may go without a sign of progress (a chunk, the end, the restart).
    static let installSilence: Duration = .seconds(120)
    var timers: [Timer: Instant] = [:]

    /// `random(n)` gives n bytes from a CSPRNG (nonces, the pairing key); `wallClock` is the
    /// real time at `now`.
    public init(now: Instant, wallClock: WallTime, random: @escaping (Int) throws -> [UInt8]) {
        self.random = random
        clock = WallClock(wallClock, at: now)
    }

    public func takeOutputs() -> [Output] {
        defer { outputs = [] }
        return outputs
    }

    /// The real time is `wallClock` at `now` (a shell keeps this current across clock steps).
    public func setWallClock(_ wallClock: WallTime, at now: Instant) {
        clock = WallClock(wallClock, at: now)
    }

    func wall(_ now: Instant) -> WallTime { clock.at(now) }

    /// The earliest time `poll` has something to do.
    public var nextDeadline: Instant? { timers.values.min() }

    public func poll(now: Instant) {
        for timer in Timer.allCases {
            guard let at = timers[timer], at <= now else { continue }
            timers[timer] = nil
            fire(timer, now: now)
        }
    }

    func fire(_ timer: Timer, now: Instant) {
        switch timer {
        case .linePoll: probeLine()
        case .connect: connectTimedOut(now: now)
        case .lineRetry: openLink(now: now)
        case .backoff: attemptReconnect(now: now)
        case .reconnectDeadline:
            endEpisode(.failure(PaymentError(.reconnectTimeout, "no reader within \(settings.reconnectTimeout)")), now: now)
        case .recovery: recoverInFlight(now: now)
        case .answer: answersOverdue(now: now)
        case .install:
            finishInstall(.failure(PaymentError(.updateIntegrity, "the reader stopped reporting the update's progress")), now: now)
        }
    }

    // MARK: State

    func setState(_ s: PaymentState) {
        guard s != state else { return }
        state = s
        outputs.append(.state(s))
    }

    func finish(_ ticket: Int, _ result: Result<Answer, PaymentError>) {
        outputs.append(.finished(ticket: ticket, result))
    }

    /// The bond with the target reader as it is now (the app may have removed or replaced it):
    /// the next login proves this one.
    public func bondChanged(_ key: [UInt8]?) {
        target?.bondKey = key
    }

    /// Ends the call with `ticket` at once: the shell refused it before it reached the session.
    public func refuse(_ ticket: Int, _ error: PaymentError) {
        finish(ticket, .failure(error))
    }

    /// Whether an operation is in progress (a second call is refused with `busy`).
    public var isBusy: Bool { !state.isIdle || install != nil }

    func refusedAsBusy(_ ticket: Int) -> Bool {
        guard isBusy else { return false }
        finish(ticket, .failure(PaymentError(.busy, "an operation is in progress (\(state))")))
        return true
    }

    /// A live, logged-in link.
    var liveLink: LinkState? {
        guard case .connected = phase, let link, link.loggedIn else { return nil }
        return link
    }

    public var isConnected: Bool { liveLink != nil && info != nil }

    /// The link the shell holds for this session, if any (its channel has the link's status).
    public var currentLinkID: LinkID? { link?.id }
}

// MARK: - The link's bookkeeping

extension ReaderSession {
    /// What a request on the link is for, so its answer (or the link's loss) goes where it belongs.
    enum Purpose {
        case login
        case pairingNonce
        case confirmPairing
        case payment
        case transactionStatus
        case reversal(PaymentOutcome, ticket: Int)
        case reboot(ticket: Int)
        case diagnosis(ticket: Int)
        case installUpdate
    }

    struct LinkState {
        let id: LinkID
        let path: String
        var poiID: String
        var decoder = PaymentFrameDecoder()
        var serviceCounter = 0
        var pending: [String: Purpose] = [:]
        /// Set by a Shutdown event: the reason the terminal gave before going.
        var shutdownReason: DisconnectReason?
        var opened = false
        var loggedIn = false
        /// Messages not sent because they would not fit in a frame.
        var oversize = 0
        /// Messages other than answers that came before the login succeeded (and were ignored).
        var ignoredBeforeLogin = 0
        /// When each request that must be answered (reboot, diagnosis) stops being waited for.
        var answerDeadlines: [String: Instant] = [:]
    }

    struct PaymentInFlight {
        var ticket: Int
        var serviceID: String
        var saleID: String
        var transactionID: String
        var amount: Int64
        var currency: Currency
        var recovering = false
        /// When the first check of this payment after a drop went out: the checks, over every
        /// reconnect of its life, end `Settings.recoveryLimit` after it.
        var recoveryStarted: Instant?
    }

    struct Install {
        var update: ReaderSoftwareUpdate
        var offer: UpdateOffer
        /// The connect this required update belongs to, if any.
        var duringConnect: Int?
        var ticket: Int?
        var lastProgress: Float = -1
        var restarting = false
    }

    /// What this login does about pairing: nothing, prove a bond, or begin a pairing.
    struct PairingPlan {
        var bondNonce: String?
        var ours: (key: [UInt8], nonce: [UInt8])?
        var linkKey: [UInt8] = []
        var passkey = ""
        var confirmation = ""
    }

    static func key(_ category: PaymentMessage.Category, _ sid: String) -> String { category.rawValue + "/" + sid }

    /// Sends a Service request on the current link; its answer goes to `purpose`. With
    /// `answerWithin`, the request is given up after that long (`answersOverdue`).
    @discardableResult
    func request(_ category: PaymentMessage.Category, body: JSONValue, purpose: Purpose? = nil, answerWithin: Duration? = nil,
                 now: Instant? = nil) -> String? {
        guard var l = link else { return nil }
        l.serviceCounter += 1
        let sid = String(l.serviceCounter)
        let header = PaymentMessage.Header(protocolVersion: category == .login || category == .diagnosis ? "3.1" : nil,
                                           messageClass: .service, category: category, type: .request,
                                           identifier: sid, saleID: settings.saleID, poiID: l.poiID)
        if let purpose { l.pending[Self.key(category, sid)] = purpose }
        if let answerWithin, let now {
            let due = now + answerWithin
            l.answerDeadlines[Self.key(category, sid)] = due
            timers[.answer] = min(timers[.answer] ?? due, due)
        }
        link = l
        send(PaymentMessage(direction: .request, header: header, body: body))
        return sid
    }

    /// Answers a Device request from the reader; false when the answer would not fit in a frame.
    @discardableResult
    func answer(_ request: PaymentMessage.Header, body: JSONValue) -> Bool {
        send(PaymentMessage(direction: .response, header: request.response(), body: body))
    }

    @discardableResult
    func send(_ message: PaymentMessage) -> Bool {
        guard let id = link?.id else { return false }
        guard let frame = try? PaymentFrame.encode(message.encoded) else {
            link?.oversize += 1
            return false
        }
        outputs.append(.send(id, frame))
        return true
    }

    /// Lets the current link go; what waited for an answer on it learns it never comes.
    func dropLink(now: Instant) {
        guard let l = link else { return }
        link = nil
        outputs.append(.closeLink(l.id))
        relays = relays.filter { $0.value.link != l.id }
        timers[.answer] = nil
        for purpose in l.pending.values { unanswered(purpose, shutdownReason: l.shutdownReason, now: now) }
    }

    /// Requests the reader left unanswered past their deadline end as if their link had gone.
    func answersOverdue(now: Instant) {
        guard var l = link else { return }
        let overdue = l.answerDeadlines.filter { $0.value <= now }.map(\.key)
        for key in overdue {
            l.answerDeadlines[key] = nil
            if let purpose = l.pending.removeValue(forKey: key) {
                link = l
                switch purpose {
                case .login, .pairingNonce, .confirmPairing:
                    // A reader that takes the link but never logs us in: this attempt has failed.
                    return setupEnded(PaymentError(.connectTimedOut, "the reader did not answer the login within \(settings.connectTimeout)"), now: now)
                case .transactionStatus:
                    // As good as "still in progress": asked again, within the recovery limit.
                    checkAgainLater(now: now)
                default:
                    unanswered(purpose, shutdownReason: nil, now: now, detail: "no answer from the reader within \(Self.answerTimeout)")
                }
                guard let current = link, current.id == l.id else { return }
                l = current
            }
        }
        link = l
        timers[.answer] = l.answerDeadlines.values.min()
    }

    /// A request whose link went before its answer.
    func unanswered(_ purpose: Purpose, shutdownReason: DisconnectReason?, now: Instant, detail: String = "the reader went away") {
        switch purpose {
        case .reversal(_, let ticket):
            // Whether the reversal reached the gateway is not known.
            setState(.failed(.unknownOutcome))
            finish(ticket, .failure(PaymentError(.unknownOutcome, "the link went before the reversal's answer")))
        case .reboot(let ticket):
            // The answer may be overtaken by the reboot itself.
            finish(ticket, shutdownReason == .rebootRequested ? .success(.done) : .failure(PaymentError(.connectionLost, detail)))
        case .diagnosis(let ticket):
            finish(ticket, .failure(PaymentError(.connectionLost, detail)))
        case .login, .pairingNonce, .confirmPairing, .payment, .transactionStatus, .installUpdate:
            // The setup, the payment's recovery and the install follow the link's loss itself.
            break
        }
    }
}
