import Crypto
import Payment
import Wire

/// The payment terminal's application, sans-IO (specification §4.3–4.7, §4.12): it serves the
/// reader protocol to the host, takes cards and PINs through its pad inputs ("inside the pad",
/// `TerminalPad.swift`; the simulator's control socket drives them), talks to the gateway, and
/// says what to send and when to go down.
/// Time comes in as an `Instant`; wall-clock stamps are derived from it.
public final class TerminalCore: @unchecked Sendable {
    public struct Configuration: Sendable {
        public var serialNumber = "SIM-00000001"
        public var softwareVersion = "1.0.0"
        public var battery = 0.82
        /// The gateway as the terminal dials it through the host's SOCKS proxy ("name:port").
        public var gatewayAddress = "gateway:0"
        /// Ed25519 key that signs updates.
        public var updatePublicKey: [UInt8] = []
        public var transmitTimeout: Duration = .seconds(30)
        public var loginUpdateCheckTimeout: Duration = .seconds(3)
        public var rebootDuration: Duration = .seconds(3)
        public var updateChunkSize = 8192
        /// Hosts must pair (SPEC §4.5) before they may log in.
        public var requiresPairing = false
        /// Whether the person at the terminal confirms a pairing's passkey (the simulator's
        /// stand-in for pressing OK; false: every pairing is rejected here).
        public var confirmsPairing = true
        public init() {}
    }

    public enum Output: Sendable, Equatable {
        /// A message payload for the host (frame it).
        case host([UInt8])
        /// Close the reader connection.
        case closeHost
        /// A request payload for the gateway: open a connection through the host's SOCKS proxy to
        /// `configuration.gatewayAddress`, send it, read one answer (or fail).
        case gateway([UInt8])
        /// Go down: end the PPP link; come back after the duration (nil: stay off until powered on).
        case shutdown(reason: String, restartAfter: Duration?)
    }

    public var configuration: Configuration
    public var security: TerminalSecurity
    public internal(set) var outputs: [Output] = []
    /// Human-readable trace of what the terminal did (no card data; peer text escaped): the most
    /// recent 1000 lines, and how many there were.
    public internal(set) var trace = RecentLines()
    public var journal: [String] { trace.lines }
    /// Messages for the host that would not fit in a frame: dropped (a service request gets a
    /// MessageFormat failure instead).
    public internal(set) var oversizeMessages = 0

    var clock: WallClock
    var hostConnected = false
    var session: Session?
    var transaction: Transaction?
    var admin: AdminOperation?
    var deviceCounter = 0
    var results: [StoredResult] = []
    /// Bonded hosts (by host ID) and their link keys: at most 64, the oldest bond forgotten first
    /// (every host that pairs takes a place).
    var bonds = RecentMap<String, [UInt8]>(capacity: 64)
    /// Nonces of recent bond proofs (a replayed login is refused).
    var bondNonces: [String] = []
    /// The passkey on the terminal's display while a pairing waits for confirmation: for the
    /// person at the terminal (the simulator's own output, a test beside it), never told to a
    /// control client, which could be the host it is meant to be compared against.
    public var displayedPasskey: String? { session?.pairing?.passkey }
    var operations: [String: ApprovedOperation] = [:]
    /// Merchant, day and transaction ID of recent payments (unique per merchant and day): the
    /// most recent 4096.
    var transactionIDs = RecentMap<String, Bool>(capacity: 4096)
    var gatewayQueue: [GatewayRequest] = []
    var gatewayInFlight: GatewayRequest?
    var gatewayDeadline: Instant?
    var pendingLogin: PendingLogin?
    var availableUpdate: UpdateOffer?
    var poweredOn = true
    var pendingCard: PresentedCard?
    /// Test hook: go down as soon as the next gateway answer arrives, before the host hears of it.
    var dropAfterAuthorise: Duration?
    /// The session a transaction started in, kept while the host is away.
    var lastSession: Session?
    /// What the login of the connected host was answered with (`Ext.ReaderSession`, random): a
    /// second connection to the reader port takes the session over only by presenting it in its
    /// own Login (the host reconnecting); nil while no host is logged in.
    public internal(set) var readerSessionToken: String?
    /// Second connections refused while a host held the session.
    public internal(set) var refusedSecondHosts = 0

    /// `random(n)`: n bytes from a CSPRNG (session tokens, pairing keys and nonces, PIN fill).
    let random: @Sendable (Int) throws -> [UInt8]

    public init(configuration: Configuration = Configuration(), security: TerminalSecurity = .testDevice(),
                now: Instant, wallClock: WallTime, random: @escaping @Sendable (Int) throws -> [UInt8] = { try SecureBytes.random($0) }) {
        self.configuration = configuration
        self.security = security
        self.random = random
        clock = WallClock(wallClock, at: now)
    }

    public func takeOutputs() -> [Output] {
        defer { outputs = [] }
        return outputs
    }

    public func wall(_ now: Instant) -> WallTime {
        clock.at(now)
    }

    // MARK: State

    struct Session {
        var saleID: String
        var merchantID: String
        var terminalID: String
        var environment: String
        var locationID: String
        /// ServiceIDs seen in this session (unique per session): the most recent 1024.
        var usedServiceIDs = RecentMap<String, Bool>(capacity: 1024)
        /// A pairing awaiting the host's nonce and confirmation: nothing but those (or logout)
        /// is allowed.
        var pairing: PendingPairing?
        /// Who the host is (its bond's key here): `Ext.HostID`, else the SaleID.
        var hostID = ""
        /// The merchant's gateway session the host logged in with (`Ext.SessionToken`): the
        /// gateway keeps this session's operations under that merchant.
        var gatewaySession = ""
    }

    struct PendingPairing {
        var hostID: String
        var hostKey: [UInt8]
        var terminalKey: [UInt8]
        var sharedSecret: [UInt8]
        var commitment: String
        var terminalNonce: [UInt8]
        /// Known once the host revealed its nonce.
        var linkKey: [UInt8]?
        var passkey: String?
    }

    enum Phase: String { case waitingForCard = "WaitingForCard", cardRead = "CardRead", pinEntry = "PinEntry", authorizing = "Authorizing" }

    struct Transaction {
        var header: PaymentMessage.Header
        var transactionID: String
        var timeStamp: String
        var amount: Int64
        var currency: Currency
        var paymentType: String
        var originalOperationID: String?
        var hostRelay: Bool
        var phase: Phase
        var card: PresentedCard?
        var keys: TerminalSecurity.TransactionKeys?
        var reversal: (operationID: String, amount: Int64)?
        /// The session the transaction began in: its merchant and gateway session authorise it,
        /// whoever logs in meanwhile (a host recovering it, or another merchant).
        var origin: Session? = nil
    }

    struct PresentedCard {
        var data: CardData
        var entryMode: String
        var cvm: String
        var pin: String?
    }

    struct StoredResult {
        var saleID: String
        var serviceID: String
        var header: PaymentMessage.Header
        var body: JSONValue
    }

    struct ApprovedOperation {
        var operationID: String
        var poiTransactionID: String
        var amount: Int64
        var currency: Currency
        var reversed = false
    }

    enum GatewayPurpose {
        case authorise
        case reverse
        case updateCheck
        case updateChunk
        case ping(PaymentMessage.Header)
    }

    struct GatewayRequest {
        var purpose: GatewayPurpose
        var payload: [UInt8]
        var hostRelay: Bool
        var timeout: Duration
    }

    struct PendingLogin {
        var header: PaymentMessage.Header
        var session: Session
        var deadline: Instant
        var pairing: JSONValue?
        var bond: JSONValue?
    }

    struct AdminOperation {
        var header: PaymentMessage.Header
        var offer: UpdateOffer
        var image: [UInt8] = []
        var canceled = false
    }

    // MARK: Connection events

    public func hostDidConnect(now: Instant) {
        hostConnected = true
        session = nil
        readerSessionToken = nil
        record("host connected")
    }

    public func hostDidDisconnect(now: Instant) {
        hostConnected = false
        session = nil
        readerSessionToken = nil
        pendingLogin = nil
        record("host disconnected")
        // A host-relayed gateway exchange cannot complete without the host.
        if let inFlight = gatewayInFlight, inFlight.hostRelay { gatewayDidFail(now: now) }
    }

    // MARK: Host messages

    public func receive(hostPayload payload: [UInt8], now: Instant) {
        let message: PaymentMessage
        do { message = try PaymentMessage.decode(payload) } catch let error as MessageFormatError {
            record("message format: \(error.reason)")
            if let header = error.header, header.messageClass == .service, header.type == .request {
                respond(header, body: ["Response": PaymentResponseStatus.failure(.messageFormat, [("reason", error.reason)]).json])
            } else if let sid = error.serviceID {
                let h = PaymentMessage.Header(messageClass: .service, category: .login, type: .response, identifier: sid,
                                              saleID: session?.saleID ?? "UNKNOWN", poiID: configuration.serialNumber)
                respond(h, body: ["Response": PaymentResponseStatus.failure(.messageFormat, [("reason", error.reason)]).json])
            } else {
                notify("Reject", details: [("reason", "MessageFormat")], now: now)
            }
            return
        } catch {
            return
        }
        switch (message.header.messageClass, message.header.type) {
        case (.device, .response): deviceResponse(message, now: now)
        case (.service, .request): serviceRequest(message, now: now)
        default:
            notify("Reject", details: [("reason", "NotAllowed"), ("message", message.bodyName)], now: now)
        }
    }

    func serviceRequest(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        // Abort has no answer; TransactionStatus may come while busy.
        if h.category == .abort { return abort(m, now: now) }
        if h.category == .login { return login(m, now: now) }
        guard let s = session, s.saleID == h.saleID, h.poiID == configuration.serialNumber else {
            return fail(h, .loggedOut)
        }
        guard let sid = h.identifier, !s.usedServiceIDs.contains(sid) else {
            return fail(h, .messageFormat, [("reason", "DuplicateServiceID")])
        }
        session?.usedServiceIDs.insert(sid)
        if s.pairing != nil {
            if h.category == .admin, m.body["ServiceIdentification"]?.string == "PairingNonce" { return pairingNonce(m) }
            if h.category == .admin, m.body["ServiceIdentification"]?.string == "ConfirmPairing" { return confirmPairing(m) }
            if h.category != .logout { return fail(h, .notAllowed, [("reason", "PairingPending")]) }
        }
        if h.category == .transactionStatus { return transactionStatus(m) }
        if h.category == .admin, m.body["ServiceIdentification"]?.string == "CancelUpdate" { return cancelUpdate(m, now: now) }
        if transaction != nil || admin != nil { return fail(h, .busy) }
        switch h.category {
        case .logout:
            session = nil
            respond(h, body: ["Response": PaymentResponseStatus.success.json])
        case .payment: payment(m, now: now)
        case .reversal: reversal(m, now: now)
        case .diagnosis: diagnosis(m, now: now)
        case .admin: adminRequest(m, now: now)
        default: fail(h, .notAllowed)
        }
    }

    func respond(_ request: PaymentMessage.Header, body: JSONValue) {
        let message = PaymentMessage(direction: .response, header: request.response(), body: body)
        send(message)
    }

    func send(_ message: PaymentMessage) {
        guard hostConnected else { return }
        let payload = message.encoded
        guard PaymentFrame.fits(payload) else {
            // What the host sent came back too large to frame (copied peer text, re-escaped):
            // dropped, and a service request is told so.
            oversizeMessages += 1
            record("\(message.bodyName) of \(payload.count) bytes does not fit in a frame: dropped")
            let h = message.header
            if h.messageClass == .service, h.type == .response {
                let status = PaymentResponseStatus.failure(.messageFormat, [("reason", "ResponseTooLarge")])
                outputs.append(.host(PaymentMessage(direction: .response, header: h, body: ["Response": status.json]).encoded))
            }
            return
        }
        outputs.append(.host(payload))
    }

    func fail(_ h: PaymentMessage.Header, _ condition: PaymentResponseStatus.ErrorCondition, _ extra: [(String, String)] = []) {
        record("\(h.category.rawValue) \(h.identifier ?? "") → Failure/\(condition.rawValue) \(extra.map { "\($0)=\($1)" }.joined(separator: " "))")
        respond(h, body: ["Response": PaymentResponseStatus.failure(condition, extra).json])
    }

    func record(_ line: String) { trace.append(line) }

    /// A line in the terminal's journal from the program around the core (already safe to print).
    public func note(_ line: String) { record(line) }

    /// A peer's free text (an abort or reversal reason) as the terminal keeps and repeats it:
    /// escaped and at most 64 bytes of it.
    static func peerReason(_ s: String) -> String { PeerText.escaped(s, limit: 64) }

    /// A gateway error code: four digits, or nothing (it is repeated to the host).
    static func gatewayCode(_ r: JSONValue) -> String {
        r["Error"]?.string.flatMap { PaymentRules.isDigits($0, 4...4) ? $0 : nil } ?? ""
    }

    func deviceRequest(_ category: PaymentMessage.Category, body: JSONValue) {
        deviceCounter += 1
        let h = PaymentMessage.Header(protocolVersion: nil, messageClass: .device, category: category, type: .request,
                                      identifier: String(deviceCounter), saleID: session?.saleID ?? "UNKNOWN", poiID: configuration.serialNumber)
        send(PaymentMessage(direction: .request, header: h, body: body))
    }

    func display(_ readerMessage: String, _ text: String) {
        deviceRequest(.display, body: ["DisplayOutput": [[
            "Device": "CashierDisplay", "InfoQualify": "Status",
            "OutputContent": ["OutputFormat": "Text", "OutputText": [["Text": .string(text)]]],
            "Ext": ["ReaderMessage": .string(readerMessage)],
        ]]])
    }

    func notify(_ event: String, details: [(String, String)] = [], ext: JSONValue? = nil, now: Instant) {
        var body: JSONValue = ["TimeStamp": .string(wall(now).description), "EventToNotify": .string(event)]
        if !details.isEmpty { body = body.setting("EventDetails", .string(details.map { "\(FormEncoding.encode($0.0))=\(FormEncoding.encode($0.1))" }.joined(separator: "&"))) }
        if let ext { body = body.setting("Ext", ext) }
        let h = PaymentMessage.Header(protocolVersion: nil, messageClass: .event, category: .event, type: .notification,
                                      identifier: nil, saleID: session?.saleID ?? "UNKNOWN", poiID: configuration.serialNumber)
        send(PaymentMessage(direction: .request, header: h, body: body))
    }

    func phase(_ p: Phase, now: Instant) {
        transaction?.phase = p
        notify("ExtPhase", ext: ["Phase": .string(p.rawValue)], now: now)
    }

    func deviceResponse(_ m: PaymentMessage, now: Instant) {
        guard m.header.category == .transmit, let inFlight = gatewayInFlight, inFlight.hostRelay else { return }
        let status = PaymentResponseStatus(json: m.body["Response"])
        if status?.result == .success, let reply = m.body["Message"]?.string.flatMap(Base64.decode) {
            receive(gatewayPayload: reply, now: now)
        } else if status?.errorCondition == .aborted {
            gatewayInFlight = nil
            gatewayDeadline = nil
            finishPayment(status: .failure(.aborted, [("reason", "SubmissionDeclined")]), now: now)
            startNextGatewayRequest(now: now)
        } else {
            gatewayDidFail(now: now)
        }
    }


    // MARK: Time

    public var pollAt: Instant? { gatewayDeadline }

    public func poll(now: Instant) {
        if let d = gatewayDeadline, now >= d { gatewayDidFail(now: now) }
    }


    /// Back on after a shutdown or power-off: no session, no transaction.
    public func powerOn(now: Instant) {
        poweredOn = true
        session = nil
        hostConnected = false
        record("power on, version \(configuration.softwareVersion)")
    }

    public var isPoweredOn: Bool { poweredOn }
}
