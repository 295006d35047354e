import Crypto
import NetStack

/// The payment terminal's application, sans-IO (specification §4.3–4.7, §4.12): it serves the
/// reader protocol to the host, reads cards and PINs handed to it through the control interface
/// ("inside the pad"), talks to the gateway, and says what to send and when to go down.
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
    public private(set) var outputs: [Output] = []
    /// Human-readable trace of what the terminal did (no card data; peer text escaped): the most
    /// recent 1000 lines, and how many there were.
    public private(set) var trace = RecentLines()
    public var journal: [String] { trace.lines }
    /// Messages for the host that would not fit in a frame: dropped (a service request gets a
    /// MessageFormat failure instead).
    public private(set) var oversizeMessages = 0

    private let startInstant: Instant
    private var wallOffset: Int64
    private var hostConnected = false
    private var session: Session?
    private var transaction: Transaction?
    private var admin: AdminOperation?
    private var deviceCounter = 0
    private var results: [StoredResult] = []
    /// Bonded hosts (by host ID) and their link keys: at most 64, the oldest bond forgotten first
    /// (every host that pairs takes a place).
    private var bonds = RecentMap<String, [UInt8]>(capacity: 64)
    /// Nonces of recent bond proofs (a replayed login is refused).
    private var bondNonces: [String] = []
    /// The passkey on the terminal's display while a pairing waits for confirmation: for the
    /// person at the terminal (the simulator's own output, a test beside it), never told to a
    /// control client, which could be the host it is meant to be compared against.
    public var displayedPasskey: String? { session?.pairing?.passkey }
    private var operations: [String: ApprovedOperation] = [:]
    /// Merchant, day and transaction ID of recent payments (unique per merchant and day): the
    /// most recent 4096.
    private var transactionIDs = RecentMap<String, Bool>(capacity: 4096)
    private var gatewayQueue: [GatewayRequest] = []
    private var gatewayInFlight: GatewayRequest?
    private var gatewayDeadline: Instant?
    private var pendingLogin: PendingLogin?
    private var availableUpdate: UpdateOffer?
    private var poweredOn = true
    private var pendingCard: PresentedCard?
    /// Test hook: go down as soon as the next gateway answer arrives, before the host hears of it.
    private var dropAfterAuthorise: Duration?

    public init(configuration: Configuration = Configuration(), security: TerminalSecurity = .testDevice(),
                now: Instant, wallClock: WallTime) {
        self.configuration = configuration
        self.security = security
        startInstant = now
        wallOffset = wallClock.seconds
    }

    public func takeOutputs() -> [Output] {
        defer { outputs = [] }
        return outputs
    }

    public func wall(_ now: Instant) -> WallTime {
        WallTime(seconds: wallOffset + (now - startInstant).components.seconds)
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

    // MARK: A second host

    /// What the login of the connected host was answered with (`Ext.ReaderSession`, random): a
    /// second connection to the reader port takes the session over only by presenting it in its
    /// own Login (the host reconnecting); nil while no host is logged in.
    public private(set) var readerSessionToken: String?
    /// Second connections refused while a host held the session.
    public private(set) var refusedSecondHosts = 0

    /// Whether `payload`, the first message of a second connection while a host is connected,
    /// may take the session over: a Login that presents this session's token.
    public func mayTakeOver(with payload: [UInt8]) -> Bool {
        guard let token = readerSessionToken, let m = try? PaymentMessage.decode(payload),
              m.header.messageClass == .service, m.header.type == .request, m.header.category == .login,
              let presented = m.body["Ext"]?["ReaderSession"]?.string else { return false }
        return SecureBytes.equal(Array(token.utf8), Array(presented.utf8))
    }

    /// The answer to a second connection's first message when it may not take over (counted);
    /// the connected host's session goes on. nil when the message asks nothing.
    public func refusalOfSecondHost(_ payload: [UInt8]) -> [UInt8]? {
        refusedSecondHosts += 1
        record("a second host connection refused: the reader session is in use")
        guard let m = try? PaymentMessage.decode(payload), m.header.messageClass == .service, m.header.type == .request else { return nil }
        let body: JSONValue = ["Response": PaymentResponseStatus.failure(.busy, [("reason", "SessionInUse")]).json]
        let answer = PaymentMessage(direction: .response, header: m.header.response(), body: body).encoded
        return PaymentFrame.fits(answer) ? answer : nil
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

    // MARK: Login

    func login(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        // A transaction survives a new login (the host reconnecting to recover it); an update
        // or another login in progress does not allow one.
        if admin != nil || pendingLogin != nil { return fail(h, .busy) }
        guard h.poiID == configuration.serialNumber else { return fail(h, .notAllowed, [("reason", "UnknownPOIID")]) }
        let ext = m.body["Ext"]
        let location = ext?["LocationID"]?.string ?? ""
        let environment = ext?["Environment"]?.string ?? ""
        let merchant = ext?["MerchantID"]?.string ?? ""
        let terminal = ext?["TerminalID"]?.string ?? ""
        guard PaymentRules.isLocationID(location) else {
            return fail(h, .messageFormat, [("reason", "InvalidLocationID")])
        }
        guard ["des", "int", "ccal", "real"].contains(environment) else { return fail(h, .messageFormat, [("reason", "InvalidEnvironment")]) }
        if environment == "real" && security.testKeys { return fail(h, .notAllowed, [("reason", "TestKeysInProduction")]) }
        guard PaymentRules.isDigits(merchant, 9...9), PaymentRules.isDigits(terminal, 1...3) else {
            return fail(h, .messageFormat, [("reason", "InvalidMerchantOrTerminal")])
        }
        var s = Session(saleID: h.saleID, merchantID: merchant, terminalID: terminal, environment: environment, locationID: location)
        // Passed on to the gateway, never shown: hex of a sensible length or nothing.
        if let token = ext?["SessionToken"]?.string, (1...128).contains(token.utf8.count), Hex.decode(token) != nil { s.gatewaySession = token }
        s.usedServiceIDs.insert(h.identifier ?? "")
        var pairingExt: JSONValue?, bondExt: JSONValue?
        let hostID = ext?["HostID"]?.string ?? h.saleID
        // The bond's key and a journal word: printable and short.
        guard (1...64).contains(hostID.utf8.count), hostID.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            return fail(h, .messageFormat, [("reason", "InvalidHostID")])
        }
        s.hostID = hostID
        if configuration.requiresPairing {
            if let pairing = ext?["Pairing"] {
                guard let hostKey = pairing["HostPublicKey"]?.string.flatMap(Hex.decode), hostKey.count == 32,
                      let commitment = pairing["Commitment"]?.string, commitment.utf8.count == 64,
                      let ours = try? SecureBytes.random(32), let publicKey = try? X25519.publicKey(privateKey: ours),
                      let shared = try? X25519.sharedSecret(privateKey: ours, peerPublicKey: hostKey),
                      let nonce = try? SecureBytes.random(16) else {
                    return fail(h, .messageFormat, [("reason", "PairingKeyInvalid")])
                }
                s.pairing = PendingPairing(hostID: hostID, hostKey: hostKey, terminalKey: publicKey, sharedSecret: shared,
                                           commitment: commitment, terminalNonce: nonce)
                pairingExt = ["TerminalPublicKey": .string(Hex.encode(publicKey)), "TerminalNonce": .string(Hex.encode(nonce))]
                record("pairing with \(hostID) begins")
            } else if let proof = ext?["Bond"]?["Proof"]?.string {
                let dateTime = m.body["DateTime"]?.string ?? "", nonce = ext?["Bond"]?["Nonce"]?.string ?? ""
                guard let key = bonds[hostID],
                      Pairing.matches((try? Pairing.proof(linkKey: key, hostID: hostID, poiID: configuration.serialNumber, dateTime: dateTime, nonce: nonce)) ?? "", proof) else {
                    return fail(h, .notAllowed, [("reason", "PairingLost")])
                }
                // A proof seen recently, or from another time, is a replay.
                guard let sent = WallTime(rfc3339: dateTime), abs(sent.seconds - wall(now).seconds) <= 300,
                      nonce.utf8.count >= 16, !bondNonces.contains(nonce) else {
                    record("bond proof from \(hostID) replayed or stale: refused")
                    return fail(h, .notAllowed, [("reason", "BondProofReplayed")])
                }
                bondNonces.append(nonce)
                if bondNonces.count > 1024 { bondNonces.removeFirst() }
                // Our answer proves we hold the same key.
                guard let answer = try? Pairing.readerProof(linkKey: key, hostID: hostID, poiID: configuration.serialNumber, nonce: nonce) else {
                    return fail(h, .messageFormat, [("reason", "PairingKeyInvalid")])
                }
                bondExt = ["Proof": .string(answer)]
            } else {
                return fail(h, .notAllowed, [("reason", "PairingRequired")])
            }
        }
        record("login from \(PeerText.escaped(h.saleID)) at \(location) (\(environment))")
        // Ask the gateway for updates first; answer when it replies or after a short wait.
        pendingLogin = PendingLogin(header: h, session: s, deadline: now + configuration.loginUpdateCheckTimeout, pairing: pairingExt, bond: bondExt)
        enqueueGateway(.updateCheck, ["Type": "UpdateCheck", "Version": .string(configuration.softwareVersion),
                                      "SerialNumber": .string(configuration.serialNumber)],
                       timeout: configuration.loginUpdateCheckTimeout, now: now)
    }

    func completeLogin(now: Instant) {
        guard let pending = pendingLogin else { return }
        pendingLogin = nil
        // A fresh token for every login: the one a taken-over session had is spent.
        guard let token = try? SecureBytes.random(16) else {
            return fail(pending.header, .unavailableDevice, [("reason", "NoRandomBytes")])
        }
        session = pending.session
        readerSessionToken = Hex.encode(token)
        var ext: JSONValue = [
            "ReaderSession": .string(Hex.encode(token)),
            "LocationID": .string(pending.session.locationID),
            "Battery": ["Level": .number(TerminalCore.fraction(configuration.battery)), "Charging": false],
            "KeyProfile": ["Scheme": "AES128-DUKPT", "TransactionsRemaining": .integer(security.transactionsRemaining)],
        ]
        if let offer = availableUpdate { ext = ext.setting("AvailableUpdate", offer.json) }
        if let pairing = pending.pairing { ext = ext.setting("Pairing", pairing) }
        if let bond = pending.bond { ext = ext.setting("Bond", bond) }
        respond(pending.header, body: [
            "Response": PaymentResponseStatus.success.json,
            "POISystemData": [
                "DateTime": .string(wall(now).description),
                "POISoftware": ["ProviderIdentification": "pppbridge", "ApplicationName": "SimTelium",
                                "SoftwareVersion": .string(configuration.softwareVersion), "CertificationCode": "none"],
                "POITerminalData": ["TerminalEnvironment": "Attended", "POISerialNumber": .string(configuration.serialNumber),
                                    "POICapabilities": ["CashierDisplay", "CustomerDisplay", "CustomerInput", "ICC", "MagStripe", "EMVContactless"]],
                "POIStatus": ["GlobalStatus": "OK", "SecurityOKFlag": true, "PEDOKFlag": true, "CardReaderOKFlag": true, "CommunicationOKFlag": true],
            ],
            "Ext": ext,
        ])
    }

    /// A fraction in 0...1 (battery, progress) with two decimals; anything else is clamped
    /// into it (NaN reads as 0).
    static func fraction(_ v: Double) -> String {
        let hundredths = Int(((v.isNaN ? 0 : min(1, max(0, v))) * 100).rounded())
        return "\(hundredths / 100).\(hundredths % 100 < 10 ? "0" : "")\(hundredths % 100)"
    }

    // MARK: Payment

    func payment(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        let b = m.body
        let amounts = b["PaymentTransaction"]?["AmountsReq"]
        guard let amount = amounts?["RequestedAmountMinor"]?.integer, (1...999_999_999_999).contains(amount) else {
            return fail(h, .messageFormat, [("reason", "InvalidAmount")])
        }
        guard let currency = amounts?["Currency"]?.string.flatMap(Currency.named),
              amounts?["CurrencyNumeric"]?.string == currency.numeric else {
            return fail(h, .notAllowed, [("reason", "UnsupportedCurrency")])
        }
        let saleTx = b["SaleData"]?["SaleTransactionID"]
        let txID = saleTx?["TransactionID"]?.string ?? ""
        guard PaymentRules.isTransactionID(txID) else { return fail(h, .notAllowed, [("reason", "InvalidTransactionID")]) }
        // The sale's time is repeated in the answer and in TransactionStatus: only a real one.
        let timeStamp = saleTx?["TimeStamp"]?.string ?? wall(now).description
        guard WallTime(rfc3339: timeStamp) != nil else { return fail(h, .messageFormat, [("reason", "InvalidTimeStamp")]) }
        let day = wall(now).day
        guard !transactionIDs.contains(session!.merchantID + day + txID) else {
            return fail(h, .notAllowed, [("reason", "DuplicateTransactionID")])
        }
        let type = b["PaymentData"]?["PaymentType"]?.string ?? "Normal"
        guard type == "Normal" || type == "Refund" else { return fail(h, .messageFormat, [("reason", "PaymentType")]) }
        let original = b["Ext"]?["OriginalOperationID"]?.string
        if original != nil && type != "Refund" { return fail(h, .messageFormat, [("reason", "OriginalOperationID")]) }
        transactionIDs.insert(session!.merchantID + day + txID)
        transaction = Transaction(header: h, transactionID: txID, timeStamp: timeStamp,
                                  amount: amount, currency: currency, paymentType: type, originalOperationID: original,
                                  hostRelay: b["Ext"]?["Route"]?.string == "HostRelay", phase: .waitingForCard)
        transaction?.origin = session
        record("payment \(h.identifier ?? "") \(type) \(currency.format(amount)) \(currency.code) txn \(txID)")
        if original != nil {
            // A referenced refund needs no card.
            transaction?.card = nil
            authorise(now: now)
            return
        }
        phase(.waitingForCard, now: now)
        display("insertSwipeOrTapCard", "INSERT, SWIPE OR TAP")
        if let card = pendingCard {
            pendingCard = nil
            cardPresented(card, now: now)
        }
    }

    func cardPresented(_ card: PresentedCard, now: Instant) {
        guard var t = transaction, t.phase == .waitingForCard else { return }
        t.card = card
        transaction = t
        notify("CardInserted", details: [("entry", card.entryMode)], now: now)
        phase(.cardRead, now: now)
        if card.cvm == "OnlinePIN" {
            phase(.pinEntry, now: now)
            display("enterPin", "ENTER PIN")
            if card.pin != nil { pinEntered(now: now) }
        } else {
            authorise(now: now)
        }
    }

    func pinEntered(now: Instant) {
        guard let t = transaction, t.phase == .pinEntry, t.card?.pin != nil else { return }
        display("pinEntered", "PIN OK")
        authorise(now: now)
    }

    func authorise(now: Instant) {
        guard let s = transaction?.origin ?? session ?? lastSession else { return }
        // The phase first, then the copy: the copy written back below keeps it (a card presented
        // or a cancel pressed now finds the transaction authorizing, not waiting).
        phase(.authorizing, now: now)
        display("processing", "PROCESSING")
        guard var t = transaction else { return }
        do {
            let keys = try security.nextTransaction()
            t.keys = keys
            let fields = TerminalSecurity.AuthoriseFields(
                merchantID: s.merchantID, terminalID: s.terminalID, environment: s.environment, transactionID: t.transactionID,
                amountMinor: t.amount, currencyNumeric: t.currency.numeric, paymentType: t.paymentType,
                entryMode: t.card?.entryMode ?? "Keyed", cvm: t.card?.cvm ?? "NoCVM", originalOperationID: t.originalOperationID,
                sessionToken: s.gatewaySession)
            let request = try security.authorise(fields, card: t.card?.data, pin: t.card?.pin, keys: keys)
            t.card?.pin = nil
            transaction = t
            enqueueGateway(.authorise, request, hostRelay: t.hostRelay, timeout: configuration.transmitTimeout, now: now)
        } catch DUKPTError.exhausted {
            transaction = t
            finishPayment(status: .failure(.deviceOut, [("reason", "KSNExhausted")]), now: now)
        } catch {
            transaction = t
            finishPayment(status: .failure(.unavailableDevice, [("reason", "\(error)")]), now: now)
        }
    }

    /// The session a transaction started in, kept while the host is away.
    private var lastSession: Session?

    func authoriseAnswered(_ r: JSONValue, now: Instant) {
        guard var t = transaction, var keys = t.keys else { return }
        if let downFor = dropAfterAuthorise {
            dropAfterAuthorise = nil
            record("link dropped after the gateway answered")
            hostConnected = false
            session = nil
            outputs.append(.shutdown(reason: "dropLink", restartAfter: downFor))
        }
        defer { keys.wipe() }
        if r["Result"]?.string == "error" {
            let code = TerminalCore.gatewayCode(r)
            let condition: PaymentResponseStatus.ErrorCondition
            switch code {
            case "3007", "2005", "3005": condition = .notAllowed
            case "3008": condition = .notFound
            case "4004": condition = .deviceOut
            default: condition = .unreachableHost
            }
            t.keys = nil
            transaction = t
            return finishPayment(status: .failure(condition, [("reason", "Gateway\(code)"), ("code", code)]), now: now)
        }
        guard TerminalSecurity.verifyResponse(r, canonical: GatewayCanonical.authoriseResult(r), keys: keys),
              r["TransactionID"]?.string == t.transactionID, r["AmountMinor"]?.integer == t.amount else {
            record("gateway answer for \(t.transactionID) has a bad MAC: refused")
            t.keys = nil
            transaction = t
            return finishPayment(status: .failure(.unreachableHost, [("reason", "ResponseMacInvalid"), ("code", "4006")]), now: now)
        }
        t.keys = nil
        transaction = t
        let approved = r["Result"]?.string == "approved"
        let rc = r["ResponseCode"]?.string ?? ""
        let operationID = r["OperationID"]?.string ?? ""
        let signature = r["SignatureRequired"]?.bool ?? false
        let byPIN = r["AuthenticatedByPin"]?.bool ?? false
        var ext: JSONValue = ["ResponseCode": .string(rc), "AuthenticatedByPin": .bool(byPIN), "SignatureRequired": .bool(signature),
                              "OperationID": .string(operationID)]
        if !approved { ext = ext.setting("ApprovalCode", .null) }
        display(approved ? "approved" : "declined", approved ? "APPROVED" : "DECLINED")
        let status: PaymentResponseStatus = approved ? .success : .failure(rc == "55" ? .wrongPIN : .refusal, [("ResponseCode", rc)])
        if approved {
            operations[operationID] = ApprovedOperation(operationID: operationID, poiTransactionID: poiTransactionID(operationID),
                                                        amount: t.amount, currency: t.currency)
            printReceipt(t, operationID: operationID, approval: r["ApprovalCode"]?.string ?? "", now: now)
        }
        finishPayment(status: status, acquirer: approved ? (operationID, r["ApprovalCode"]?.string ?? "") : nil,
                      method: byPIN ? "OnlinePIN" : (signature ? "SignatureCapture" : "Bypass"), ext: ext, now: now)
    }

    func poiTransactionID(_ operationID: String) -> String {
        configuration.serialNumber + "-" + operationID.replacingOccurrences(of: "OP-", with: "")
    }

    func printReceipt(_ t: Transaction, operationID: String, approval: String, now: Instant) {
        let lines = ["SIMTELIUM \(configuration.serialNumber)", wall(now).description, t.paymentType == "Refund" ? "REFUND" : "SALE",
                     t.card.map { "\($0.data.brand) \($0.data.masked)" } ?? "REFERENCED", "\(t.currency.code) \(t.currency.format(t.amount))",
                     "AUTH \(approval)  \(operationID)"]
        deviceRequest(.print, body: ["PrintOutput": [
            "DocumentQualifier": "CustomerReceipt", "ResponseMode": "PrintEnd",
            "OutputContent": ["OutputFormat": "Text", "OutputText": .array(lines.map { ["Text": .string($0)] })],
        ]])
    }

    /// Ends the current transaction with its PaymentResponse (kept for TransactionStatus).
    func finishPayment(status: PaymentResponseStatus, acquirer: (String, String)? = nil, method: String? = nil,
                       ext: JSONValue? = nil, now: Instant) {
        guard var t = transaction else { return }
        t.keys?.wipe()
        transaction = nil
        var result: JSONValue = ["PaymentType": .string(t.paymentType)]
        if let card = t.card {
            result = result.setting("PaymentInstrumentData", ["PaymentInstrumentType": "Card", "CardData": [
                "EntryMode": [.string(card.entryMode)], "PaymentBrand": .string(card.data.brand), "MaskedPan": .string(card.data.masked)]])
        }
        if status.result == .success {
            result = result.setting("AmountsResp", ["Currency": .string(t.currency.code), "CurrencyNumeric": .string(t.currency.numeric),
                                                    "AuthorizedAmountMinor": .integer(t.amount)])
        }
        if let (operationID, approval) = acquirer {
            result = result.setting("PaymentAcquirerData", [
                "MerchantID": .string(session?.merchantID ?? lastSession?.merchantID ?? ""), "AcquirerPOIID": .string(session?.terminalID ?? lastSession?.terminalID ?? ""),
                "AcquirerTransactionID": ["TransactionID": .string(operationID), "TimeStamp": .string(wall(now).description)],
                "ApprovalCode": .string(approval)])
        }
        if let method { result = result.setting("AuthenticationMethod", [.string(method)]) }
        var body: JSONValue = [
            "Response": status.json,
            "SaleData": ["SaleTransactionID": ["TransactionID": .string(t.transactionID), "TimeStamp": .string(t.timeStamp)]],
        ]
        if let (operationID, _) = acquirer {
            body = body.setting("POIData", ["POITransactionID": ["TransactionID": .string(poiTransactionID(operationID)),
                                                                 "TimeStamp": .string(wall(now).description)]])
        }
        body = body.setting("PaymentResult", result)
        if let ext { body = body.setting("Ext", ext) }
        let header = t.header.response()
        results.append(StoredResult(saleID: t.header.saleID, serviceID: t.header.identifier ?? "", header: header, body: body))
        if results.count > 16 { results.removeFirst(results.count - 16) }
        record("payment \(t.header.identifier ?? "") → \(status.result.rawValue)\(status.errorCondition.map { "/" + $0.rawValue } ?? "")")
        if session?.saleID == t.header.saleID {
            send(PaymentMessage(direction: .response, header: header, body: body))
        }
        if status.result == .success { notify("CardRemoved", now: now) }
    }

    // MARK: Abort, status, reversal, diagnosis

    func abort(_ m: PaymentMessage, now: Instant) {
        let ref = m.body["MessageReference"]
        guard let t = transaction, ref?["ServiceID"]?.string == t.header.identifier, ref?["SaleID"]?.string == nil || ref?["SaleID"]?.string == t.header.saleID else {
            return notify("Reject", details: [("reason", "NotFound")], now: now)
        }
        if t.phase == .authorizing {
            record("abort of \(t.header.identifier ?? "") too late: authorising")
            return notify("Completed", details: [("reason", "AlreadyAuthorizing")], now: now)
        }
        record("abort of \(t.header.identifier ?? "")")
        finishPayment(status: .failure(.aborted, [("reason", TerminalCore.peerReason(m.body["AbortReason"]?.string ?? "MerchantAbort"))]), now: now)
    }

    func transactionStatus(_ m: PaymentMessage) {
        let h = m.header
        let ref = m.body["MessageReference"]
        let sid = ref?["ServiceID"]?.string ?? ""
        let sale = ref?["SaleID"]?.string ?? h.saleID
        if let t = transaction, t.header.identifier == sid, t.header.saleID == sale {
            return respond(h, body: ["Response": PaymentResponseStatus.failure(.inProgress, [("message", "Uncompleted transaction")]).json])
        }
        guard let stored = results.last(where: { $0.serviceID == sid && $0.saleID == sale }) else {
            return fail(h, .notFound)
        }
        respond(h, body: [
            "Response": PaymentResponseStatus.success.json,
            "RepeatedMessageResponse": ["MessageHeader": stored.header.json, "RepeatedResponseMessageBody": ["PaymentResponse": stored.body]],
        ])
    }

    func reversal(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        let poiTx = m.body["OriginalPOITransaction"]?["POITransactionID"]?["TransactionID"]?.string ?? ""
        guard let op = operations.values.first(where: { $0.poiTransactionID == poiTx }) else { return fail(h, .notFound) }
        guard !op.reversed else { return fail(h, .notAllowed, [("reason", "AlreadyReversed")]) }
        let reason = TerminalCore.peerReason(m.body["ReversalReason"]?.string ?? "MerchantCancel")
        do {
            let keys = try security.nextTransaction()
            let request = try security.reverse(operationID: op.operationID, reason: reason, sessionToken: (session ?? lastSession)?.gatewaySession ?? "", keys: keys)
            transaction = Transaction(header: h, transactionID: poiTx, timeStamp: wall(now).description, amount: op.amount, currency: op.currency,
                                      paymentType: "Reversal", originalOperationID: op.operationID, hostRelay: false, phase: .authorizing,
                                      keys: keys, reversal: (op.operationID, op.amount))
            record("reversal of \(op.operationID) (\(reason))")
            enqueueGateway(.reverse, request, timeout: configuration.transmitTimeout, now: now)
        } catch {
            fail(h, .deviceOut)
        }
    }

    func reverseAnswered(_ r: JSONValue?, now: Instant) {
        guard var t = transaction, let reversal = t.reversal else { return }
        transaction = nil
        defer { t.keys?.wipe() }
        guard let r, let keys = t.keys else { return fail(t.header, .unreachableHost) }
        guard r["Result"]?.string != "error" || r["MAC"] != nil else { return fail(t.header, .unreachableHost, [("code", TerminalCore.gatewayCode(r))]) }
        guard TerminalSecurity.verifyResponse(r, canonical: GatewayCanonical.reverseResult(r), keys: keys) else {
            return fail(t.header, .unreachableHost, [("reason", "ResponseMacInvalid"), ("code", "4006")])
        }
        guard r["Result"]?.string == "ok" else { return fail(t.header, .notAllowed, [("code", TerminalCore.gatewayCode(r))]) }
        if let id = operations.first(where: { $0.value.operationID == reversal.operationID })?.key { operations[id]?.reversed = true }
        record("reversal of \(reversal.operationID) done")
        respond(t.header, body: ["Response": PaymentResponseStatus.success.json,
                                 "POIData": ["POITransactionID": ["TransactionID": .string(t.transactionID), "TimeStamp": .string(wall(now).description)]],
                                 "Ext": ["ReversedAmountMinor": .integer(reversal.amount), "OperationID": .string(reversal.operationID)]])
    }

    func diagnosis(_ m: PaymentMessage, now: Instant) {
        if m.body["HostDiagnosisFlag"]?.bool == true {
            enqueueGateway(.ping(m.header), ["Type": "Ping"], timeout: .seconds(3), now: now)
        } else {
            answerDiagnosis(m.header, reachable: nil)
        }
    }

    func answerDiagnosis(_ h: PaymentMessage.Header, reachable: Bool?) {
        var body: JSONValue = [
            "Response": PaymentResponseStatus.success.json,
            "POIStatus": ["GlobalStatus": "OK", "CommunicationOKFlag": .bool(reachable ?? true)],
            "Ext": ["Battery": ["Level": .number(TerminalCore.fraction(configuration.battery)), "Charging": false],
                    "SoftwareVersion": .string(configuration.softwareVersion),
                    "KeyProfile": ["Scheme": "AES128-DUKPT", "TransactionsRemaining": .integer(security.transactionsRemaining)]],
        ]
        if let reachable { body = body.setting("HostStatus", [["AcquirerID": "SIMGW", "IsReachableFlag": .bool(reachable)]]) }
        respond(h, body: body)
    }

    // MARK: Admin: reboot and updates

    func adminRequest(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        switch m.body["ServiceIdentification"]?.string {
        case "Reboot":
            respond(h, body: ["Response": PaymentResponseStatus.success.json])
            shutdown(reason: "rebootRequested", restartAfter: configuration.rebootDuration, now: now)
        case "CheckUpdate":
            respond(h, body: ["Response": PaymentResponseStatus.success.json, "Ext": ["AvailableUpdate": availableUpdate?.json ?? .null]])
        case "InstallUpdate":
            guard let offer = availableUpdate else { return fail(h, .notFound, [("reason", "NoUpdate")]) }
            admin = AdminOperation(header: h, offer: offer)
            respond(h, body: ["Response": PaymentResponseStatus.success.json])
            record("installing \(offer.version)")
            notify("BeginMaintenance", details: [("version", offer.version)], now: now)
            notify("ExtUpdateProgress", ext: ["Progress": .number("0.0")], now: now)
            requestNextChunk(now: now)
        default:
            fail(h, .notAllowed, [("reason", "UnknownService")])
        }
    }

    /// The host reveals the nonce it committed to: both passkeys can now be derived, and ours
    /// goes on the display.
    func pairingNonce(_ m: PaymentMessage) {
        guard var pairing = session?.pairing, pairing.passkey == nil else { return fail(m.header, .notFound) }
        guard let nonce = m.body["Ext"]?["HostNonce"]?.string.flatMap(Hex.decode), nonce.count == 16,
              let commitment = try? Pairing.commitment(hostPublicKey: pairing.hostKey, hostNonce: nonce),
              Pairing.matches(commitment, pairing.commitment),
              let passkey = try? Pairing.passkey(hostPublicKey: pairing.hostKey, terminalPublicKey: pairing.terminalKey,
                                                 hostNonce: nonce, terminalNonce: pairing.terminalNonce),
              let key = try? Pairing.linkKey(sharedSecret: pairing.sharedSecret, hostPublicKey: pairing.hostKey,
                                             terminalPublicKey: pairing.terminalKey, hostNonce: nonce, terminalNonce: pairing.terminalNonce) else {
            session = nil
            record("pairing with \(PeerText.escaped(m.header.saleID)): the nonce does not match its commitment")
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        pairing.passkey = passkey
        pairing.linkKey = key
        session?.pairing = pairing
        display("pairing", "PAIRING CODE \(passkey)")
        record("pairing with \(pairing.hostID): passkey \(passkey) on the display")
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }

    /// The host's person confirmed the passkey: the bond is kept if ours did too.
    func confirmPairing(_ m: PaymentMessage) {
        guard let pairing = session?.pairing, let key = pairing.linkKey, let passkey = pairing.passkey else { return fail(m.header, .notFound) }
        guard let given = m.body["Ext"]?["Confirmation"]?.string,
              Pairing.matches((try? Pairing.confirmation(linkKey: key, passkey: passkey)) ?? "", given) else {
            session = nil
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        guard configuration.confirmsPairing else {
            session = nil
            record("pairing with \(pairing.hostID) rejected at the terminal")
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        bonds.insert(pairing.hostID, key)
        session?.pairing = nil
        record("paired with \(pairing.hostID)")
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }

    func cancelUpdate(_ m: PaymentMessage, now: Instant) {
        guard admin != nil else { return fail(m.header, .notFound) }
        admin?.canceled = true
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }

    func requestNextChunk(now: Instant) {
        guard let a = admin else { return }
        if a.canceled { return endUpdate(result: "updateCanceled", now: now) }
        if a.image.count >= a.offer.size {
            guard a.offer.verify(image: a.image, publicKey: configuration.updatePublicKey) else {
                return endUpdate(result: "updateIntegrity", now: now)
            }
            notify("ExtUpdateProgress", ext: ["Progress": .number("1.0")], now: now)
            return endUpdate(result: "ok", now: now)
        }
        enqueueGateway(.updateChunk, ["Type": "UpdateChunk", "Version": .string(a.offer.version), "Offset": .integer(Int64(a.image.count)),
                                      "Length": .integer(Int64(configuration.updateChunkSize))], timeout: configuration.transmitTimeout, now: now)
    }

    func chunkAnswered(_ r: JSONValue?, now: Instant) {
        guard var a = admin else { return }
        guard let r, r["Offset"]?.integer == Int64(a.image.count), let data = r["Data"]?.string.flatMap(Base64.decode), !data.isEmpty,
              a.image.count + data.count <= a.offer.size else {
            return endUpdate(result: "updateIntegrity", now: now)
        }
        a.image += data
        admin = a
        let progress = min(0.99, Double(a.image.count) / Double(max(1, a.offer.size)))
        notify("ExtUpdateProgress", ext: ["Progress": .number(TerminalCore.fraction(progress))], now: now)
        requestNextChunk(now: now)
    }

    func endUpdate(result: String, now: Instant) {
        guard let a = admin else { return }
        admin = nil
        record("update \(a.offer.version): \(result)")
        notify("EndMaintenance", details: [("result", result), ("version", a.offer.version)], now: now)
        if result == "ok" {
            configuration.softwareVersion = a.offer.version
            availableUpdate = nil
            shutdown(reason: "updateRestart", restartAfter: configuration.rebootDuration, now: now)
        }
    }

    func shutdown(reason: String, restartAfter: Duration?, now: Instant) {
        record("shutdown: \(reason)")
        notify("Shutdown", details: [("reason", reason)], now: now)
        if transaction != nil { finishPayment(status: .failure(.unavailableDevice, [("reason", reason)]), now: now) }
        if hostConnected { outputs.append(.closeHost) }
        hostConnected = false
        session = nil
        outputs.append(.shutdown(reason: reason, restartAfter: restartAfter))
    }

    // MARK: Gateway exchanges

    func enqueueGateway(_ purpose: GatewayPurpose, _ request: JSONValue, hostRelay: Bool = false, timeout: Duration, now: Instant) {
        if case .authorise = purpose { lastSession = session }
        gatewayQueue.append(GatewayRequest(purpose: purpose, payload: request.serialized, hostRelay: hostRelay, timeout: timeout))
        if gatewayInFlight == nil { startNextGatewayRequest(now: now) }
    }

    func startNextGatewayRequest(now: Instant) {
        guard gatewayInFlight == nil, !gatewayQueue.isEmpty else { return }
        let next = gatewayQueue.removeFirst()
        gatewayInFlight = next
        gatewayDeadline = now + next.timeout
        if next.hostRelay {
            deviceRequest(.transmit, body: ["Message": .string(Base64.encode(next.payload)), "WaitResponseFlag": true,
                                            "MaximumTransmitTime": .integer(next.timeout.components.seconds),
                                            "DestinationAddress": .string(configuration.gatewayAddress)])
        } else {
            outputs.append(.gateway(next.payload))
        }
    }

    /// The gateway's answer to the request in flight.
    public func receive(gatewayPayload payload: [UInt8], now: Instant) {
        guard let inFlight = gatewayInFlight else { return }
        gatewayInFlight = nil
        gatewayDeadline = nil
        let answer = try? JSONParser.parse(payload)
        complete(inFlight.purpose, answer, now: now)
        startNextGatewayRequest(now: now)
    }

    /// The request in flight got no answer (connection refused or closed, or its time ran out).
    public func gatewayDidFail(now: Instant) {
        guard let inFlight = gatewayInFlight else { return }
        gatewayInFlight = nil
        gatewayDeadline = nil
        record("gateway unreachable")
        complete(inFlight.purpose, nil, now: now)
        startNextGatewayRequest(now: now)
    }

    func complete(_ purpose: GatewayPurpose, _ answer: JSONValue?, now: Instant) {
        switch purpose {
        case .authorise:
            if let answer { authoriseAnswered(answer, now: now) } else {
                finishPayment(status: .failure(.unreachableHost, [("code", "3003")]), now: now)
            }
        case .reverse: reverseAnswered(answer, now: now)
        case .updateCheck:
            if let answer, answer["Available"]?.bool == true, let offer = UpdateOffer(json: answer["Update"]),
               UpdateOffer.isNewer(offer.version, than: configuration.softwareVersion) {
                availableUpdate = offer
            } else if answer != nil {
                availableUpdate = nil
            }
            completeLogin(now: now)
        case .updateChunk: chunkAnswered(answer, now: now)
        case .ping(let h): answerDiagnosis(h, reachable: answer?["Type"]?.string == "Pong")
        }
    }

    // MARK: Time

    public var pollAt: Instant? { gatewayDeadline }

    public func poll(now: Instant) {
        if let d = gatewayDeadline, now >= d { gatewayDidFail(now: now) }
    }

    // MARK: The control interface (test-only, "inside the pad")

    /// nexo's EntryMode values.
    static let entryModes = ["ICC", "MagStripe", "Contactless", "Tapped", "Keyed", "Manual", "SynchroICC", "RFID", "Mobile", "Scanned", "File"]

    /// How long a control command takes the link down: whole or fractional seconds, at most a
    /// day (a longer or non-finite time would overflow the clock's arithmetic).
    public static func downTime(_ v: JSONValue) -> Duration? {
        if let i = v.integer { return (0...86_400).contains(i) ? .seconds(i) : nil }
        guard case .number(let t) = v, let d = Double(t), d.isFinite, (0...86_400).contains(d),
              let ms = Int64(exactly: (d * 1000).rounded()) else { return nil }
        return .milliseconds(ms)
    }

    /// Handles one control command; returns its answer.
    public func control(_ command: JSONValue, now: Instant) -> JSONValue {
        func ok(_ extra: [(String, JSONValue)] = []) -> JSONValue { .object([("ok", true)] + extra) }
        func no(_ why: String) -> JSONValue { ["ok": false, "error": .string(why)] }
        switch command["cmd"]?.string ?? "" {
        case "presentCard":
            guard let pan = command["pan"]?.string, CardData.isValidPAN(pan) else { return no("pan must be 12-19 digits with a valid check digit") }
            // What the card says is repeated to the host and the gateway: only the known forms.
            let expiry = command["expiry"]?.string ?? "3012", serviceCode = command["serviceCode"]?.string ?? "201"
            let entry = command["entry"]?.string ?? "ICC", cvm = command["cvm"]?.string ?? "OnlinePIN"
            guard PaymentRules.isDigits(expiry, 4...4), PaymentRules.isDigits(serviceCode, 3...3) else {
                return no("expiry is YYMM, serviceCode 3 digits")
            }
            guard TerminalCore.entryModes.contains(entry) else { return no("entry is one of \(TerminalCore.entryModes.joined(separator: ", "))") }
            guard ["OnlinePIN", "Signature", "NoCVM"].contains(cvm) else { return no("cvm is OnlinePIN, Signature or NoCVM") }
            let card = PresentedCard(data: CardData(pan: pan, expiry: expiry, serviceCode: serviceCode), entryMode: entry, cvm: cvm,
                                     pin: command["pin"]?.string)
            if let p = card.pin, !PaymentRules.isDigits(p, 4...12) { return no("pin must be 4-12 digits") }
            if transaction?.phase == .waitingForCard { cardPresented(card, now: now) } else { pendingCard = card }
            return ok()
        case "enterPin":
            guard let pin = command["pin"]?.string, PaymentRules.isDigits(pin, 4...12) else { return no("pin must be 4-12 digits") }
            guard transaction?.phase == .pinEntry else { return no("not waiting for a PIN") }
            transaction?.card?.pin = pin
            pinEntered(now: now)
            return ok()
        case "removeCard":
            pendingCard = nil
            notify("CardRemoved", now: now)
            return ok()
        case "pressCancel":
            guard let t = transaction, t.phase != .authorizing else { return no("nothing to cancel") }
            finishPayment(status: .failure(.cancel), now: now)
            return ok()
        case "setBattery":
            guard let level = PaymentRules.fraction(command["level"]) else { return no("level is a number in [0,1]") }
            configuration.battery = level
            if level < 0.05 { shutdown(reason: "criticallyLowBattery", restartAfter: nil, now: now) }
            return ok()
        case "dropLinkAfterAuthorise":
            guard let downFor = TerminalCore.downTime(command["downFor"] ?? 1) else { return no("downFor is 0...86400 seconds") }
            dropAfterAuthorise = downFor
            return ok()
        case "setClock":
            guard let t = command["now"]?.string.flatMap({ WallTime(rfc3339: $0) }) else { return no("now is RFC 3339 UTC") }
            wallOffset += t.seconds - wall(now).seconds
            return ok()
        case "powerOff":
            poweredOn = false
            shutdown(reason: "poweredOff", restartAfter: nil, now: now)
            return ok()
        case "provisionKey":
            guard let block = command["tr31"]?.string, let kbpk = command["kbpk"]?.string.flatMap(Hex.decode) else { return no("tr31 and kbpk") }
            do {
                security = try TerminalSecurity(keyBlock: block, kbpk: kbpk, testKeys: command["testKeys"]?.bool ?? false)
                return ok()
            } catch {
                return no("\(error)")
            }
        case "erasePairing":
            bonds.removeAll()
            record("bonds erased")
            return ok()
        case "status":
            return ok([("pairing", .bool(displayedPasskey != nil)), ("bonds", .integer(Int64(bonds.count))), ("serial", .string(configuration.serialNumber)), ("version", .string(configuration.softwareVersion)),
                       ("loggedIn", .bool(session != nil)), ("busy", .bool(transaction != nil || admin != nil)),
                       ("phase", transaction.map { .string($0.phase.rawValue) } ?? .null),
                       ("ksnCounter", .integer(Int64(security.counter))), ("battery", .number(TerminalCore.fraction(configuration.battery)))])
        default:
            return no("unknown command")
        }
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
