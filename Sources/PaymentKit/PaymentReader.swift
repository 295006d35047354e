import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// The host SDK: one reader at a time over the PPP channel, async/await calls with delegate
/// callbacks in the seeds' shape. One operation at a time (a second gets `busy` and changes
/// nothing); unexpected disconnects are reconnected with exactly one did-start and then exactly
/// one did-succeed or did-fail, and a payment in flight is recovered with TransactionStatus.
/// All state lives on the event loop; the delegate is called there.
public final class PaymentReader: @unchecked Sendable {
    public let loop: EventLoop
    public weak var delegate: PaymentReaderDelegate?

    /// What the reader said at the last login.
    public struct Info: Sendable, Equatable {
        public var serialNumber: String
        public var softwareVersion: String
        public var batteryLevel: String?
        public var transactionsRemaining: Int64?
        public var availableUpdate: ReaderSoftwareUpdate?
        public var locationID: String
    }

    private var stateValue: PaymentState = .ready
    private(set) var link: ReaderLink?
    private var path: String?
    private var serial: String?
    private var configuration: ReaderConnectionConfiguration?
    private var infoValue: Info?
    private var offer: UpdateOffer?
    private var payment: PaymentOperation?
    private var simple: SimpleOperation?
    private var episode: Episode?
    private var install: Install?
    private var explicitDisconnect = false
    private var nextEpisode = 0
    private var connectTimer: Int?
    /// Every byte of the reader connection and of the SDK's gateway exchanges, when asked for.
    public var recordsBytes = false
    private var wire: [UInt8] = []

    public init(loop: EventLoop = .shared) { self.loop = loop }

    public var state: PaymentState { loop.sync { stateValue } }
    public var info: Info? { loop.sync { infoValue } }
    public var isConnected: Bool { loop.sync { link?.up == true && infoValue != nil } }
    public var recorded: [UInt8] { loop.sync { wire } }
    /// The channel of the current connection (status, addresses), if any.
    public var channel: Channel? { loop.sync { link?.channel } }

    struct PaymentOperation {
        var serviceID: String
        var saleID: String
        var transactionID: String
        var amount: Int64
        var currency: Currency
        var finish: (Result<PaymentOutcome, PaymentError>) -> Void
        var recovering = false
    }

    struct SimpleOperation {
        var name: String
        var finish: (Result<PaymentOutcome?, PaymentError>) -> Void
    }

    struct Episode {
        var id: Int
        var silent: Bool
        var deadline: Instant
        var attempt = 0
        var timer: Int?
        var deadlineTimer: Int?
        var candidate: ReaderLink?
    }

    struct Install {
        var update: ReaderSoftwareUpdate
        var offer: UpdateOffer
        /// The connect this required update belongs to, if any.
        var duringConnect: ((Result<Void, PaymentError>) -> Void)?
        var finish: ((Result<Void, PaymentError>) -> Void)?
        var lastProgress: Float = -1
        var restarting = false
    }

    private var lastOutcome: PaymentOutcome?
    /// The reader being connected to, as discovery or its advertisement described it.
    private var peripheral: DiscoveredReader?
    private var discovery: DiscoveryRun?
    private var lastChannel: Channel?
    private var lastLineLost = false
    /// Ends the connect in progress (cancel).
    private var connectAbort: ((PaymentError) -> Void)?
    private var connectCanceled = false
    /// The gateway session from `login`, used when a configuration carries none.
    private var sessionToken: String?
    /// The merchant the gateway login named: the reader's Login carries it, as the gateway
    /// keeps that session's operations under it.
    private var gatewayMerchantID: String?
    /// The reader session token the terminal answered our last login with: presented again when
    /// we log in on a new connection while the old one may still hold the session.
    private var readerSession: (path: String, token: String)?

    struct DiscoveryRun {
        var core: DiscoveryCore
        var pattern: String
        var timer: Int?
        var finish: (Result<DiscoveredReader?, PaymentError>) -> Void
    }

    // MARK: Plumbing

    /// Runs `body` on the loop with a completion that resumes the caller exactly once.
    /// The caller's task is suspended meanwhile; no thread waits (`EventLoop.enqueue`).
    private func run<T: Sendable>(_ body: @escaping (@escaping (Result<T, PaymentError>) -> Void) -> Void) async throws(PaymentError) -> T {
        let result = await withCheckedContinuation { (c: CheckedContinuation<Result<T, PaymentError>, Never>) in
            let once = Once(c)
            loop.enqueue { body { once.resume($0) } }
        }
        return try result.get()
    }

    private func setState(_ s: PaymentState) {
        guard s != stateValue else { return }
        stateValue = s
        delegate?.reader(self, didChangeState: s)
    }

    private func busy<T>(_ finish: (Result<T, PaymentError>) -> Void) -> Bool {
        if !stateValue.isIdle || simple != nil || install != nil {
            finish(.failure(PaymentError(.busy, "an operation is in progress (\(stateValue))")))
            return true
        }
        return false
    }

    private var scale: Double { configuration?.backoffScale ?? 1 }

    // MARK: Connect

    /// Connects to the reader whose line is at `path` (its name is the reader's serial number),
    /// logs in with the location, and installs a required update before returning.
    public func connect(path: String, serialNumber: String? = nil, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        let _: Bool = try await run { [self] finish in
            connectOnLoop(path: path, serial: serialNumber, configuration: configuration) { r in finish(r.map { true }) }
        }
    }

    /// Connects to a discovered reader; a discovery still running completes with it.
    public func connect(_ reader: DiscoveredReader, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        let _: Bool = try await run { [self] finish in
            // Discovery hands over to connecting directly (no idle state in between); a connect
            // refused at once leaves the discovery running.
            if discovery != nil {
                guard PaymentRules.isLocationID(configuration.locationID) else {
                    return finish(.failure(PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}")))
                }
                guard link == nil else { return finish(.failure(PaymentError(.busy, "already connected"))) }
                endDiscovery(.success(reader), state: nil)
            }
            connectOnLoop(path: reader.path, serial: reader.serialNumber, peripheral: reader, configuration: configuration) { r in finish(r.map { true }) }
        }
    }

    private func connectOnLoop(path: String, serial: String?, peripheral known: DiscoveredReader? = nil, configuration c: ReaderConnectionConfiguration,
                               linePolls: Int = 0, finish: @escaping (Result<Void, PaymentError>) -> Void) {
        if linePolls == 0, busy(finish) { return }
        guard PaymentRules.isLocationID(c.locationID) else {
            return finish(.failure(PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}")))
        }
        guard link == nil else { return finish(.failure(PaymentError(.busy, "already connected"))) }
        guard episode == nil else { return finish(.failure(PaymentError(.busy, "reconnecting"))) }
        // The line may be missing for a moment (a terminal re-arming it); gone for a second, it is not there.
        if linePolls > 0, connectCanceled {
            connectCanceled = false
            setState(.failed(.canceled))
            return finish(.failure(PaymentError(.canceled, "connect canceled")))
        }
        if access(path, F_OK) != 0 {
            if linePolls == 0 { connectCanceled = false }
            guard linePolls < 20 else {
                setState(.failed(.readerNotFound))
                return finish(.failure(PaymentError(.readerNotFound, path)))
            }
            setState(.connecting)
            _ = loop.schedule(at: loop.now + .milliseconds(50)) { [weak self] in
                self?.connectOnLoop(path: path, serial: serial, peripheral: known, configuration: c, linePolls: linePolls + 1, finish: finish)
            }
            return
        }
        let peripheral = known ?? ReaderLines.advert(at: path)
        if let peripheral, peripheral.requiresPairing, c.bonds.key(for: peripheral.peripheralUUID) == nil, !c.autoPair {
            setState(.failed(.pairingRequired))
            return finish(.failure(PaymentError(.pairingRequired, "\(peripheral.serialNumber) must be paired first (autoPair)")))
        }
        self.peripheral = peripheral
        self.path = path
        self.serial = serial ?? peripheral?.serialNumber ?? String(path.split(separator: "/").last ?? "")
        self.configuration = c
        explicitDisconnect = false
        setState(.connecting)
        let done: (Result<Void, PaymentError>) -> Void = { [weak self] r in
            guard let self else { return }
            if let t = self.connectTimer { self.loop.cancelTimer(t) }
            self.connectTimer = nil
            self.connectAbort = nil
            switch r {
            case .success: self.setState(.ready)
            case .failure(let e):
                self.link?.teardown()
                // A link still being opened (not adopted yet) goes too.
                if self.link == nil { self.lastChannel?.requestClose() }
                self.link = nil
                self.infoValue = nil
                self.setState(.failed(e.code))
            }
            finish(r)
        }
        var finished = false
        let once: (Result<Void, PaymentError>) -> Void = { r in
            guard !finished else { return }
            finished = true
            done(r)
        }
        connectAbort = { e in once(.failure(e)) }
        connectTimer = loop.schedule(at: loop.now + c.connectTimeout) { [weak self] in
            guard let self, self.install == nil else { return }
            self.connectTimer = nil
            once(.failure(PaymentError(.connectTimedOut, "no reader login within \(c.connectTimeout)")))
        }
        // A line that hangs up while we open it (a terminal re-arming its line after the last
        // host left) is tried again until the connect timeout.
        func attempt() {
            establish { [weak self] r in
                guard let self else { return }
                switch r {
                case .failure(let e):
                    guard self.lastLineLost, !finished, self.connectTimer != nil else { return once(.failure(e)) }
                    _ = self.loop.schedule(at: self.loop.now + .milliseconds(100)) {
                        if !finished && self.connectTimer != nil { attempt() }
                    }
                case .success(let l):
                    // Cancelled or timed out meanwhile: this link is not wanted.
                    guard !finished else { return l.teardown() }
                    self.connected(l, once)
                }
            }
        }
        attempt()
    }

    private func connected(_ l: ReaderLink, _ once: @escaping (Result<Void, PaymentError>) -> Void) {
        adopt(l)
        if let offer, offer.isRequired(at: Self.wallNow()) {
            if let t = connectTimer { loop.cancelTimer(t) }
            connectTimer = nil
            startInstall(offer, duringConnect: once, finish: nil)
        } else {
            if let update = infoValue?.availableUpdate { delegate?.reader(self, didReportAvailableUpdate: update) }
            once(.success(()))
        }
    }

    static func wallNow() -> WallTime { WallTime.current() }


    /// A link given up (a failed login, a rejected pairing) may still be saying goodbye on the
    /// line; a new one on the same line waits until it is down.
    private func previousLinkClosed() async {
        guard let previous = await loop.perform({ [self] in link == nil && stateValue.isIdle && episode == nil && install == nil ? lastChannel : nil }) else { return }
        await previous.close()
    }

    /// Opens a link and logs in; the link is handed over only when the login succeeded.
    private func establish(_ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        guard let path, let configuration else { return completion(.failure(PaymentError(.notConnected))) }
        let l = ReaderLink(path: path, configuration: configuration, loop: loop)
        lastChannel = l.channel
        l.setPOIID(serial ?? "UNKNOWN")
        l.observer = { [weak self] bytes in
            guard let self, self.recordsBytes else { return }
            self.wire += bytes
        }
        if episode != nil { episode?.candidate = l }
        lastLineLost = false
        l.open { [weak self, l] error in
            guard let self else { return }
            if let error {
                self.lastLineLost = l.lineLost
                return completion(.failure(error))
            }
            self.login(l, completion)
        }
    }

    private func login(_ l: ReaderLink, _ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        guard let c = configuration else { return }
        var ext: JSONValue = ["LocationID": .string(c.locationID), "Environment": .string(c.environment), "AppLicence": .string(c.licence),
                              "MerchantID": .string(c.sessionToken == nil ? gatewayMerchantID ?? c.merchantID : c.merchantID),
                              "TerminalID": .string(c.terminalID)]
        if let token = c.sessionToken ?? sessionToken { ext = ext.setting("SessionToken", .string(token)) }
        let dateTime = Self.wallNow().description
        ext = ext.setting("HostID", .string(c.bonds.hostID))
        // Only to the reader that gave it (another reader must not learn it).
        if let readerSession, readerSession.path == l.path { ext = ext.setting("ReaderSession", .string(readerSession.token)) }
        // What this login does about pairing: nothing, prove a bond, or begin a pairing.
        var bondNonce: String?, pairing: (key: [UInt8], nonce: [UInt8])?
        if let p = peripheral, p.requiresPairing {
            if let key = c.bonds.key(for: p.peripheralUUID) {
                let nonce = Hex.encode((try? SecureBytes.random(16)) ?? [])
                guard let proof = try? Pairing.proof(linkKey: key, hostID: c.bonds.hostID, poiID: l.poiID, dateTime: dateTime, nonce: nonce) else {
                    l.teardown()
                    return completion(.failure(PaymentError(.readerLoginFailed, "cannot prove the bond")))
                }
                bondNonce = nonce
                ext = ext.setting("Bond", ["Nonce": .string(nonce), "Proof": .string(proof)])
            } else if c.autoPair, let ours = try? SecureBytes.random(32), let pub = try? X25519.publicKey(privateKey: ours),
                      let nonce = try? SecureBytes.random(16), let commitment = try? Pairing.commitment(hostPublicKey: pub, hostNonce: nonce) {
                pairing = (ours, nonce)
                ext = ext.setting("Pairing", ["HostPublicKey": .string(Hex.encode(pub)), "Commitment": .string(commitment)])
            } else {
                l.teardown()
                return completion(.failure(PaymentError(.pairingRequired, "\(p.serialNumber) must be paired first")))
            }
        }
        l.request(.login, body: [
            "DateTime": .string(dateTime),
            "SaleSoftware": ["ProviderIdentification": "pppbridge", "ApplicationName": "pppbridge", "SoftwareVersion": "0.1.0", "CertificationCode": "none"],
            "SaleTerminalData": ["TerminalEnvironment": "Attended", "SaleCapabilities": ["CashierDisplay", "CashierStatus", "PrinterReceipt"]],
            "OperatorLanguage": "en",
            "Ext": ext,
        ]) { [weak self, l] response in
            guard let self else { return }
            let status = PaymentResponseStatus(json: response.body["Response"])
            guard response.header.poiID == l.poiID, response.header.saleID == c.saleID else {
                l.teardown()
                return completion(.failure(PaymentError(.messageFormat, "login answer does not echo SaleID/POIID")))
            }
            guard status?.result == .success else {
                l.teardown()
                switch status?.value("reason") {
                case "TestKeysInProduction"?:
                    return completion(.failure(PaymentError(.environmentMismatch, "the reader holds test keys")))
                case "PairingRequired"?:
                    return completion(.failure(PaymentError(.pairingRequired, "the reader requires pairing")))
                case "PairingLost"?:
                    if let p = self.peripheral { c.bonds.remove(p.peripheralUUID) }
                    return completion(.failure(PaymentError(.pairingLost, "the reader no longer knows this host; the bond was deleted")))
                case "BondProofReplayed"?:
                    return completion(.failure(PaymentError(.readerLoginFailed, "the reader took the bond proof for a replay (are both clocks right?)")))
                case "PairingKeyInvalid"?:
                    return completion(.failure(PaymentError(.pairingRejected, "the reader refused our pairing key")))
                default: break
                }
                return completion(.failure(PaymentError(.readerLoginFailed, status.map { PeerText.escaped($0.json.text, limit: 512) } ?? "no status")))
            }
            let system = response.body["POISystemData"]
            let ext = response.body["Ext"]
            if let token = ext?["ReaderSession"]?.string, (1...64).contains(token.utf8.count), Hex.decode(token) != nil { self.readerSession = (l.path, token) }
            let offer = UpdateOffer(json: ext?["AvailableUpdate"])
            self.offer = offer
            self.infoValue = Info(serialNumber: system?["POITerminalData"]?["POISerialNumber"]?.string ?? l.poiID,
                                  softwareVersion: system?["POISoftware"]?["SoftwareVersion"]?.string ?? "",
                                  batteryLevel: { if case .number(let t)? = ext?["Battery"]?["Level"] { return t }; return nil }(),
                                  transactionsRemaining: ext?["KeyProfile"]?["TransactionsRemaining"]?.integer,
                                  availableUpdate: offer.map { ReaderSoftwareUpdate(deviceSoftwareVersion: $0.version, durationEstimate: $0.durationEstimate,
                                                                                     requiredAt: $0.requiredAt, size: $0.size) },
                                  locationID: ext?["LocationID"]?.string ?? c.locationID)
            if let bondNonce, let p = self.peripheral, let key = c.bonds.key(for: p.peripheralUUID) {
                // The reader proves it holds the same link key: a stand-in that does not is refused.
                let expected = (try? Pairing.readerProof(linkKey: key, hostID: c.bonds.hostID, poiID: l.poiID, nonce: bondNonce)) ?? ""
                guard Pairing.matches(expected, ext?["Bond"]?["Proof"]?.string ?? "") else {
                    l.teardown()
                    return completion(.failure(PaymentError(.readerLoginFailed, "the reader could not prove our bond")))
                }
            }
            guard let pairing else { return completion(.success(l)) }
            self.completePairing(l, ours: pairing.key, hostNonce: pairing.nonce, answer: ext?["Pairing"], completion)
        }
    }

    /// Numeric comparison with commitments: we reveal the nonce we committed to, both sides
    /// derive the passkey from both keys and both nonces, the person confirms it matches the
    /// reader's display (the connect timeout waits meanwhile), and the confirmation commits the
    /// reader's bond.
    private func completePairing(_ l: ReaderLink, ours: [UInt8], hostNonce: [UInt8], answer: JSONValue?,
                                 _ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        let fail: (String) -> Void = { why in
            l.teardown()
            completion(.failure(PaymentError(.pairingRejected, why)))
        }
        guard let c = configuration, let p = peripheral, let terminalKey = answer?["TerminalPublicKey"]?.string.flatMap(Hex.decode),
              let terminalNonce = answer?["TerminalNonce"]?.string.flatMap(Hex.decode), terminalNonce.count == 16,
              let hostKey = try? X25519.publicKey(privateKey: ours), let shared = try? X25519.sharedSecret(privateKey: ours, peerPublicKey: terminalKey),
              let linkKey = try? Pairing.linkKey(sharedSecret: shared, hostPublicKey: hostKey, terminalPublicKey: terminalKey,
                                                 hostNonce: hostNonce, terminalNonce: terminalNonce),
              let passkey = try? Pairing.passkey(hostPublicKey: hostKey, terminalPublicKey: terminalKey, hostNonce: hostNonce, terminalNonce: terminalNonce),
              let confirmation = try? Pairing.confirmation(linkKey: linkKey, passkey: passkey) else {
            return fail("the reader's pairing answer is missing or unusable")
        }
        l.request(.admin, body: ["ServiceIdentification": "PairingNonce", "Ext": ["HostNonce": .string(Hex.encode(hostNonce))]], answer: { [weak self] response in
            guard let self else { return }
            guard PaymentResponseStatus(json: response.body["Response"])?.result == .success else { return fail("the reader refused our nonce") }
            // A person takes their time: the connect timeout starts again after the answer.
            if let t = self.connectTimer { self.loop.cancelTimer(t) }
            let confirmed = self.delegate?.reader(self, confirmPairing: passkey) == true
            if self.connectTimer != nil, let abort = self.connectAbort {
                self.connectTimer = self.loop.schedule(at: self.loop.now + c.connectTimeout) { [weak self] in
                    self?.connectTimer = nil
                    abort(PaymentError(.connectTimedOut, "no reader login within \(c.connectTimeout)"))
                }
            }
            guard confirmed else { return fail("passkey \(passkey) not confirmed") }
            l.request(.admin, body: ["ServiceIdentification": "ConfirmPairing", "Ext": ["Confirmation": .string(confirmation)]]) { response in
                guard PaymentResponseStatus(json: response.body["Response"])?.result == .success else { return fail("the reader rejected the pairing") }
                c.bonds.store(linkKey, for: p.peripheralUUID)
                completion(.success(l))
            }
        })
    }

    // MARK: Merchant login

    /// The merchant's login at the gateway (environment, licence, credentials): state `login`
    /// while it runs. The session it opens is what later connections log the reader in with
    /// (unless their configuration carries one). Returns the merchant ID.
    @discardableResult
    public func login(gateway: TCPEndpoint, environment: String, licence: String, user: String, password: String) async throws(PaymentError) -> String {
        let _: Bool = try await run { [self] finish in
            if busy(finish) { return }
            setState(.login)
            finish(.success(true))
        }
        do {
            let answer = try await GatewayClient.login(gateway: gateway, environment: environment, licence: licence, user: user,
                                                       password: password, loop: loop)
            let merchant = answer["MerchantID"]?.string ?? ""
            await loop.perform { [self] in
                sessionToken = answer["SessionToken"]?.string
                gatewayMerchantID = PaymentRules.isDigits(merchant, 9...9) ? merchant : nil
                setState(.ready)
            }
            return merchant
        } catch {
            await loop.perform { [self] in setState(.failed(error.code)) }
            throw error
        }
    }

    // MARK: Discovery

    /// Discovers readers on the lines matching `pattern` (SPEC §4.5): updates go to the
    /// delegate; it ends when `connect(_:configuration:)` picks a reader (returned), at the
    /// scan's timeout (`discoveryTimedOut`) or on `cancel()` (`canceled`).
    @discardableResult
    public func discoverReaders(_ configuration: DiscoveryConfiguration, pattern: String = ReaderLines.defaultPattern) async throws(PaymentError) -> DiscoveredReader? {
        try await run { [self] finish in
            if busy(finish) { return }
            do throws(PaymentError) { _ = try ReaderLines.scan(pattern) } catch {
                setState(.failed(error.code))
                return finish(.failure(error))
            }
            discovery = DiscoveryRun(core: DiscoveryCore(configuration: configuration, now: loop.now), pattern: pattern, finish: finish)
            setState(.discovery)
            discoveryTick()
        }
    }

    private func discoveryTick() {
        guard var d = discovery else { return }
        d.timer = nil
        let seen = (try? ReaderLines.scan(d.pattern)) ?? []
        let events = d.core.tick(seen, now: loop.now)
        discovery = d
        for e in events {
            switch e {
            case .update(let readers): delegate?.reader(self, didUpdateDiscoveredReaders: readers)
            case .failed(let code): return endDiscovery(.failure(PaymentError(code, "no reader chosen in time")), state: .failed(code))
            }
        }
        guard discovery != nil else { return }
        discovery?.timer = loop.schedule(at: d.core.nextTick(after: loop.now)) { [weak self] in self?.discoveryTick() }
    }

    private func endDiscovery(_ result: Result<DiscoveredReader?, PaymentError>, state: PaymentState?) {
        guard let d = discovery else { return }
        discovery = nil
        if let t = d.timer { loop.cancelTimer(t) }
        if let state { setState(state) } else { stateValue = .ready }
        d.finish(result)
    }

    /// Makes `l` the current link.
    private func adopt(_ l: ReaderLink) {
        link = l
        l.onMessage = { [weak self, weak l] m in
            guard let self, let l else { return }
            self.handle(m, on: l)
        }
        l.onLost = { [weak self, weak l] reason in
            guard let self, let l else { return }
            self.lost(l, reason)
        }
    }

    /// Logs out and closes the link (reason disconnectRequested).
    public func disconnect() async {
        let l: ReaderLink? = await loop.perform { [self] in
            explicitDisconnect = true
            if let e = episode { endEpisode(e.id, .failure(PaymentError(.connectionLost, "disconnected"))) }
            guard let l = link else { return nil }
            l.request(.logout, body: [:])
            link = nil
            infoValue = nil
            return l
        }
        guard let l else { return }
        try? await Task.sleep(for: .milliseconds(50))
        await l.close()
        await loop.perform { [self] in
            failInFlight(PaymentError(.connectionLost, "disconnected"))
            delegate?.reader(self, didDisconnect: .disconnectRequested)
            if !stateValue.isIdle { setState(.ready) }
        }
    }

    // MARK: Messages from the reader

    private func handle(_ m: PaymentMessage, on l: ReaderLink) {
        let h = m.header
        switch (h.messageClass, h.type) {
        case (.device, .request):
            switch h.category {
            case .display:
                for output in m.body["DisplayOutput"]?.array ?? [] {
                    let text = output["OutputContent"]?["OutputText"]?.array?.compactMap { $0["Text"]?.string }.joined(separator: " ") ?? ""
                    delegate?.reader(self, didReport: .display(readerMessage: output["Ext"]?["ReaderMessage"]?.string ?? "", text: text))
                }
                l.answer(m, body: ["OutputResult": [["Device": "CashierDisplay", "InfoQualify": "Status", "Response": ["Result": "Success"]]]])
            case .print:
                // The answer names the document printed: one of nexo's, never the reader's text.
                let qualifier = m.body["PrintOutput"]?["DocumentQualifier"]?.string ?? "CustomerReceipt"
                guard Self.documentQualifiers.contains(qualifier) else {
                    l.answer(m, body: ["Response": PaymentResponseStatus.failure(.messageFormat, [("reason", "DocumentQualifier")]).json])
                    return
                }
                let lines = m.body["PrintOutput"]?["OutputContent"]?["OutputText"]?.array?.compactMap { $0["Text"]?.string } ?? []
                delegate?.reader(self, didReport: .receipt(lines))
                l.answer(m, body: ["Response": ["Result": "Success"], "DocumentQualifier": .string(qualifier)])
            case .transmit:
                relay(m, on: l)
            default:
                l.answer(m, body: ["Response": PaymentResponseStatus.failure(.notAllowed).json])
            }
        case (.event, .notification):
            event(m.body, on: l)
        case (.service, .response):
            // A payment's answer arriving on a new connection after a reconnect.
            if h.category == .payment, let p = payment, p.serviceID == h.identifier, p.saleID == h.saleID {
                paymentAnswered(m.body, recovered: true)
            }
        default:
            break
        }
    }

    /// nexo's DocumentQualifier values.
    static let documentQualifiers: Set = ["CashierReceipt", "CustomerReceipt", "Document", "Voucher", "Journal", "SaleReceipt"]

    private func event(_ body: JSONValue, on l: ReaderLink) {
        let name = body["EventToNotify"]?.string ?? ""
        let details = FormEncoding.decode(body["EventDetails"]?.string ?? "")
        func detail(_ k: String) -> String? { details.first { $0.0 == k }?.1 }
        switch name {
        case "ExtPhase":
            let phase = body["Ext"]?["Phase"]?.string ?? ""
            if phase == "Authorizing", stateValue == .interaction { setState(.authorizing) }
            delegate?.reader(self, didReport: .phase(phase))
        case "CardInserted": delegate?.reader(self, didReport: .cardInserted)
        case "CardRemoved": delegate?.reader(self, didReport: .cardRemoved)
        case "Shutdown":
            l.shutdownReason = DisconnectReason(name: detail("reason") ?? "")
        case "ExtUpdateProgress":
            // A fraction in 0...1; anything else from the reader is no progress.
            guard var i = install, let p = PaymentRules.fraction(body["Ext"]?["Progress"]).map({ Float($0) }) else { break }
            // Reported non-decreasing.
            if p >= i.lastProgress {
                i.lastProgress = p
                install = i
                delegate?.reader(self, didReportReaderSoftwareUpdateProgress: p)
            }
        case "EndMaintenance":
            guard var i = install else { break }
            switch detail("result") {
            case "ok":
                i.restarting = true
                install = i
            case "updateCanceled": finishInstall(.failure(PaymentError(.updateCanceled)))
            default: finishInstall(.failure(PaymentError(.updateIntegrity, "the reader refused the image")))
            }
        default:
            delegate?.reader(self, didReport: .notification(name, details: body["EventDetails"]?.string ?? ""))
        }
    }

    // MARK: Payments

    /// A payment of `amountMinor` minor units. Declines come back as outcomes; failures throw.
    public func startPayment(amountMinor: Int64, currency: Currency, transactionID: String) async throws(PaymentError) -> PaymentOutcome {
        try await run { [self] finish in paymentOnLoop(type: "Normal", amount: amountMinor, currency: currency, transactionID: transactionID, original: nil, finish: finish) }
    }

    /// The same with the amount as decimal text ("10.50"), parsed exactly in the currency's exponent.
    public func startPayment(amount: String, currency: Currency, transactionID: String) async throws(PaymentError) -> PaymentOutcome {
        guard let minor = currency.parse(amount) else {
            throw PaymentError(.invalidAmount, "\"\(amount)\" is not an amount in \(currency.code) (\(currency.exponent) decimals)")
        }
        return try await startPayment(amountMinor: minor, currency: currency, transactionID: transactionID)
    }

    /// A refund of `amount` in decimal text ("10.50"; exact, the currency's exponent honoured).
    public func startRefund(amount: String, currency: Currency, transactionID: String, originalOperationID: String) async throws(PaymentError) -> PaymentOutcome {
        guard let minor = currency.parse(amount) else {
            throw PaymentError(.invalidAmount, "\"\(amount)\" is not an amount in \(currency.code) (\(currency.exponent) decimals)")
        }
        return try await startRefund(amountMinor: minor, currency: currency, transactionID: transactionID, originalOperationID: originalOperationID)
    }

    /// A refund referencing an earlier operation by its operation ID or by the authorisation
    /// code on its receipt (no card needed).
    public func startRefund(amountMinor: Int64, currency: Currency, transactionID: String, originalOperationID: String) async throws(PaymentError) -> PaymentOutcome {
        try await run { [self] finish in paymentOnLoop(type: "Refund", amount: amountMinor, currency: currency, transactionID: transactionID, original: originalOperationID, finish: finish) }
    }

    private func paymentOnLoop(type: String, amount: Int64, currency: Currency, transactionID: String, original: String?,
                               finish: @escaping (Result<PaymentOutcome, PaymentError>) -> Void) {
        if busy(finish) { return }
        guard let l = link, l.up, infoValue != nil else { return finish(.failure(PaymentError(.notConnected))) }
        guard (1...999_999_999_999).contains(amount) else { return finish(.failure(PaymentError(.invalidAmount, "\(amount)"))) }
        guard Currency.known.contains(currency) else { return finish(.failure(PaymentError(.unsupportedCurrency, currency.code))) }
        guard PaymentRules.isTransactionID(transactionID) else { return finish(.failure(PaymentError(.invalidTransactionID, transactionID))) }
        setState(.interaction)
        var ext: JSONValue = ["Route": "TerminalDirect"]
        ext = ext.setting("OriginalOperationID", original.map { .string($0) } ?? .null)
        let sid = l.request(.payment, body: [
            "SaleData": ["SaleTransactionID": ["TransactionID": .string(transactionID), "TimeStamp": .string(Self.wallNow().description)]],
            "PaymentTransaction": ["AmountsReq": ["Currency": .string(currency.code), "CurrencyNumeric": .string(currency.numeric),
                                                  "RequestedAmountMinor": .integer(amount)]],
            "PaymentData": ["PaymentType": .string(type)],
            "Ext": ext,
        ]) { [weak self] response in self?.paymentAnswered(response.body, recovered: false) }
        payment = PaymentOperation(serviceID: sid, saleID: l.configuration.saleID, transactionID: transactionID, amount: amount,
                                   currency: currency, finish: finish)
    }

    private func paymentAnswered(_ body: JSONValue, recovered: Bool) {
        guard let p = payment else { return }
        payment = nil
        let status = PaymentResponseStatus(json: body["Response"]) ?? .failure(.messageFormat)
        let result = body["PaymentResult"]
        let ext = body["Ext"]
        var outcome = PaymentOutcome(
            result: status.result == .success ? .approved : .declined,
            responseCode: ext?["ResponseCode"]?.string ?? status.value("ResponseCode") ?? "",
            approvalCode: result?["PaymentAcquirerData"]?["ApprovalCode"]?.string,
            operationID: ext?["OperationID"]?.string,
            poiTransactionID: body["POIData"]?["POITransactionID"]?["TransactionID"]?.string,
            transactionID: p.transactionID, amountMinor: result?["AmountsResp"]?["AuthorizedAmountMinor"]?.integer ?? p.amount,
            currency: p.currency, maskedPAN: result?["PaymentInstrumentData"]?["CardData"]?["MaskedPan"]?.string,
            authenticatedByPin: ext?["AuthenticatedByPin"]?.bool ?? false, signatureRequired: ext?["SignatureRequired"]?.bool ?? false)
        outcome.recovered = recovered
        if status.result == .success {
            lastOutcome = outcome
            setState(outcome.signatureRequired ? .signature : .finished)
            return p.finish(.success(outcome))
        }
        switch status.errorCondition {
        case .refusal?, .wrongPIN?:
            setState(.finished)
            p.finish(.success(outcome))
        default:
            let error = Self.map(status)
            setState(.failed(error.code))
            p.finish(.failure(error))
        }
    }

    /// A terminal's failure as an SDK error.
    static func map(_ s: PaymentResponseStatus) -> PaymentError {
        let reason = s.value("reason") ?? ""
        let code = s.value("code").flatMap { Int($0) }.flatMap(PaymentErrorCode.init(rawValue:))
        // The terminal's own words, shown to a person: inert and short.
        let text = PeerText.escaped(s.json.text, limit: 512)
        switch s.errorCondition {
        case .aborted?: return PaymentError(reason == "SubmissionDeclined" ? .submissionDeclined : .canceled, text)
        case .cancel?: return PaymentError(.canceled, text)
        case .busy?: return PaymentError(.busy, text)
        case .loggedOut?: return PaymentError(.notLoggedIn, text)
        case .messageFormat?: return PaymentError(reason == "InvalidAmount" ? .invalidAmount : .messageFormat, text)
        case .notAllowed?:
            if let code { return PaymentError(code, text) }
            switch reason {
            case "UnsupportedCurrency": return PaymentError(.unsupportedCurrency, text)
            case "InvalidTransactionID", "DuplicateTransactionID": return PaymentError(.invalidTransactionID, text)
            case "TestKeysInProduction": return PaymentError(.environmentMismatch, text)
            default: return PaymentError(.messageFormat, text)
            }
        case .notFound?: return PaymentError(code ?? .originalNotFound, text)
        case .unreachableHost?: return PaymentError(code == .responseMacInvalid || reason == "ResponseMacInvalid" ? .responseMacInvalid : (code ?? .gatewayUnreachable), text)
        case .deviceOut?: return PaymentError(.ksnExhausted, text)
        case .refusal?: return PaymentError(.declined, text)
        case .wrongPIN?: return PaymentError(.wrongPIN, text)
        default: return PaymentError(code ?? .messageFormat, text)
        }
    }

    /// Cancels what can be cancelled: a payment still waiting for the card (AbortRequest), a
    /// connect in progress. Ignored later.
    public func cancel() {
        loop.sync {
            switch stateValue {
            case .discovery:
                endDiscovery(.failure(PaymentError(.canceled, "discovery canceled")), state: .failed(.canceled))
            case .interaction:
                guard let p = payment, let l = link else { return }
                l.request(.abort, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID), "SaleID": .string(p.saleID)],
                                         "AbortReason": "MerchantAbort"])
            case .connecting:
                if let i = install, !i.restarting, let l = link {
                    // A required update installing inside the connect: cancel the update, which
                    // fails the connect (unsupportedReaderVersion) the documented way.
                    l.request(.admin, body: ["ServiceIdentification": "CancelUpdate"])
                } else if install != nil {
                    // Restarting into the new version: too late to cancel.
                } else if let abort = connectAbort {
                    abort(PaymentError(.canceled, "connect canceled"))
                } else {
                    // Still waiting for the line to appear.
                    connectCanceled = true
                }
            default:
                break
            }
        }
    }

    // MARK: Signature

    /// Sends the customer's signature for the approved payment waiting in `signature` state.
    public func submitSignature(image: [UInt8], format: Int) async throws(PaymentError) {
        let _: Bool = try await run { [self] finish in
            guard stateValue == .signature, let outcome = lastOutcome, let c = configuration else {
                return finish(.failure(PaymentError(.busy, "no payment waits for a signature")))
            }
            guard SignatureImage.isValid(image, format: format) else {
                return finish(.failure(PaymentError(.invalidSignatureImage, "format \(format) does not match the image's magic bytes or size")))
            }
            guard let token = c.sessionToken ?? sessionToken else { return finish(.failure(PaymentError(.loginFailed, "no gateway session"))) }
            let request: JSONValue = ["Type": "Signature", "SessionToken": .string(token), "OperationID": .string(outcome.operationID ?? ""),
                                      "ImageFormat": .integer(Int64(format)), "Image": .string(Base64.encode(image)),
                                      "SHA256": .string(Hex.encode(Digest.hash(.sha256, image) ?? []))]
            GatewayClient.exchange(request, with: c.gateway, loop: loop, timeout: .seconds(10), observer: recordsBytes ? { [weak self] in self?.wire += $0 } : nil) { [weak self] answer in
                guard let self else { return }
                guard let answer else { return finish(.failure(PaymentError(.gatewayUnreachable))) }
                if answer["Result"]?.string == "ok" {
                    self.setState(.finished)
                    finish(.success(true))
                } else {
                    let code = answer["Error"]?.string.flatMap { Int($0) }.flatMap(PaymentErrorCode.init(rawValue:)) ?? .invalidSignatureImage
                    finish(.failure(PaymentError(code, answer["Reason"]?.string ?? "")))
                }
            }
        }
    }

    /// The customer would not sign: the payment is reversed.
    public func declineSignature() async throws(PaymentError) -> PaymentOutcome {
        try await run { [self] finish in
            guard stateValue == .signature, let outcome = lastOutcome, let l = link else {
                return finish(.failure(PaymentError(.busy, "no payment waits for a signature")))
            }
            reversal(outcome, reason: "MerchantCancel", on: l, finish: finish)
        }
    }

    /// Reverses an approved payment of this session (void).
    public func reverse(_ outcome: PaymentOutcome, reason: String = "MerchantCancel") async throws(PaymentError) -> PaymentOutcome {
        try await run { [self] finish in
            if busy(finish) { return }
            guard let l = link else { return finish(.failure(PaymentError(.notConnected))) }
            setState(.authorizing)
            reversal(outcome, reason: reason, on: l, finish: finish)
        }
    }

    private func reversal(_ outcome: PaymentOutcome, reason: String, on l: ReaderLink, finish: @escaping (Result<PaymentOutcome, PaymentError>) -> Void) {
        l.request(.reversal, body: [
            "OriginalPOITransaction": ["SaleID": .string(l.configuration.saleID), "POIID": .string(l.poiID),
                                       "POITransactionID": ["TransactionID": .string(outcome.poiTransactionID ?? ""), "TimeStamp": .string(Self.wallNow().description)]],
            "ReversalReason": .string(reason),
        ], answer: { [weak self] response in
            guard let self else { return }
            let status = PaymentResponseStatus(json: response.body["Response"]) ?? .failure(.messageFormat)
            if status.result == .success {
                var o = outcome
                o.result = .reversed
                self.setState(.finished)
                finish(.success(o))
            } else {
                let e = Self.map(status)
                self.setState(.failed(e.code))
                finish(.failure(e))
            }
        }, ifLost: { [weak self] in
            // Whether the reversal reached the gateway is not known.
            self?.setState(.failed(.unknownOutcome))
            finish(.failure(PaymentError(.unknownOutcome, "the link went before the reversal's answer")))
        })
    }

    // MARK: Reboot, diagnosis, updates

    /// Reboots the reader (idle only). It disconnects with `rebootRequested`; no reconnect.
    public func rebootReader() async throws(PaymentError) {
        let _: Bool = try await run { [self] finish in
            if busy(finish) { return }
            guard let l = link else { return finish(.failure(PaymentError(.notConnected))) }
            l.request(.admin, body: ["ServiceIdentification": "Reboot"], answer: { response in
                let status = PaymentResponseStatus(json: response.body["Response"])
                finish(status?.result == .success ? .success(true) : .failure(Self.map(status ?? .failure(.messageFormat))))
            }, ifLost: { [weak l] in
                // The answer may be overtaken by the reboot itself.
                finish(l?.shutdownReason == .rebootRequested ? .success(true) : .failure(PaymentError(.connectionLost, "the reader went away")))
            })
        }
    }

    /// Asks the reader for its state; with `host` it also pings the gateway through the proxy.
    public func diagnose(host: Bool = false) async throws(PaymentError) -> JSONValue {
        try await run { [self] finish in
            guard let l = link else { return finish(.failure(PaymentError(.notConnected))) }
            l.request(.diagnosis, body: ["HostDiagnosisFlag": .bool(host)], answer: { finish(.success($0.body)) },
                      ifLost: { finish(.failure(PaymentError(.connectionLost, "the reader went away"))) })
        }
    }

    /// Installs the optional update the reader offered; returns when the reader runs it.
    public func installAvailableUpdate() async throws(PaymentError) {
        let _: Bool = try await run { [self] finish in
            if busy(finish) { return }
            guard link != nil, let offer else { return finish(.failure(PaymentError(.notConnected, "no update available"))) }
            startInstall(offer, duringConnect: nil) { finish($0.map { true }) }
        }
    }

    private func startInstall(_ offer: UpdateOffer, duringConnect: ((Result<Void, PaymentError>) -> Void)?,
                              finish: ((Result<Void, PaymentError>) -> Void)?) {
        guard let l = link else { return }
        let update = ReaderSoftwareUpdate(deviceSoftwareVersion: offer.version, durationEstimate: offer.durationEstimate,
                                          requiredAt: offer.requiredAt, size: offer.size)
        install = Install(update: update, offer: offer, duringConnect: duringConnect, finish: finish)
        let cancelable = Cancelable(loop: loop) { [weak self] in
            guard let self, let i = self.install, !i.restarting, let l = self.link else { return }
            l.request(.admin, body: ["ServiceIdentification": "CancelUpdate"])
        }
        delegate?.reader(self, didStartInstallingUpdate: update, cancelable: cancelable)
        l.request(.admin, body: ["ServiceIdentification": "InstallUpdate"]) { [weak self] response in
            guard let self else { return }
            if PaymentResponseStatus(json: response.body["Response"])?.result != .success {
                self.finishInstall(.failure(PaymentError(.updateIntegrity, "the reader did not start the update")))
            }
        }
    }

    private func finishInstall(_ r: Result<Void, PaymentError>) {
        guard let i = install else { return }
        install = nil
        switch r {
        case .success:
            delegate?.reader(self, didFinishInstallingUpdate: i.update, error: nil)
        case .failure(let e):
            delegate?.reader(self, didFinishInstallingUpdate: i.update, error: e)
        }
        if let connect = i.duringConnect {
            switch r {
            case .success: connect(.success(()))
            case .failure(let e):
                // A required update that does not install leaves a reader we cannot use.
                connect(.failure(e.code == .updateCanceled ? PaymentError(.unsupportedReaderVersion, "required update canceled") : e))
            }
        }
        i.finish?(r)
    }

    // MARK: Loss and reconnection

    private func lost(_ l: ReaderLink, _ channelReason: ChannelCloseReason?) {
        guard l === link else { return }
        link = nil
        var reason = l.shutdownReason ?? (explicitDisconnect ? .disconnectRequested : .unknown)
        if l.shutdownReason == nil, let r = channelReason, case .echoTimeout = r { reason = .linkTimeout }
        if let i = install, i.restarting || reason == .updateRestart {
            // The reader restarts into the new version: reconnect without telling the app.
            return startEpisode(silent: true, reason: reason)
        }
        if l.protocolViolation {
            // A reader sending frames we cannot take (a zero or oversize length) is not
            // reconnected to: what waited on it fails with a message-format error.
            if install != nil { finishInstall(.failure(PaymentError(.messageFormat, "invalid frame from the reader"))) }
            infoValue = nil
            failInFlight(PaymentError(.messageFormat, "invalid frame from the reader"))
            delegate?.reader(self, didDisconnect: .unknown)
            return
        }
        if install != nil { finishInstall(.failure(PaymentError(.connectionLost))) }
        if reason.isExpected || !(configuration?.autoReconnectOnUnexpectedDisconnect ?? false) {
            infoValue = nil
            failInFlight(PaymentError(.connectionLost, "reader disconnected: \(reason)"))
            delegate?.reader(self, didDisconnect: reason)
            return
        }
        startEpisode(silent: false, reason: reason)
    }

    private func failInFlight(_ e: PaymentError) {
        if let p = payment {
            payment = nil
            setState(.failed(e.code))
            p.finish(.failure(e))
        } else if stateValue == .signature {
            setState(.failed(e.code))
        }
    }

    private static let backoff: [Double] = [0.5, 1, 2, 4, 8]

    private func startEpisode(silent: Bool, reason: DisconnectReason) {
        guard let c = configuration else { return }
        nextEpisode += 1
        let id = nextEpisode
        var e = Episode(id: id, silent: silent, deadline: loop.now + c.reconnectTimeout)
        e.deadlineTimer = loop.schedule(at: e.deadline) { [weak self] in
            self?.endEpisode(id, .failure(PaymentError(.reconnectTimeout, "no reader within \(c.reconnectTimeout)")))
        }
        episode = e
        if !silent {
            let cancelable = Cancelable(loop: loop) { [weak self] in
                self?.endEpisode(id, .failure(PaymentError(.reconnectCanceled)))
            }
            delegate?.reader(self, didStartReconnect: cancelable, disconnectReason: reason)
        }
        scheduleAttempt(id)
    }

    private func scheduleAttempt(_ id: Int) {
        guard var e = episode, e.id == id else { return }
        let delay = Self.backoff[min(e.attempt, Self.backoff.count - 1)] * scale
        e.attempt += 1
        e.timer = loop.schedule(at: loop.now + .milliseconds(Int64(delay * 1000))) { [weak self] in self?.attempt(id) }
        episode = e
    }

    private func attempt(_ id: Int) {
        guard let e = episode, e.id == id else { return }
        establish { [weak self] r in
            guard let self, let e = self.episode, e.id == id else {
                if case .success(let l) = r { l.teardown() }
                return
            }
            switch r {
            case .success(let l):
                self.episode?.candidate = nil
                self.adopt(l)
                self.endEpisode(id, .success(()))
            case .failure:
                self.episode?.candidate = nil
                self.scheduleAttempt(id)
            }
        }
    }

    private func endEpisode(_ id: Int, _ r: Result<Void, PaymentError>) {
        guard let e = episode, e.id == id else { return }
        episode = nil
        if let t = e.timer { loop.cancelTimer(t) }
        if let t = e.deadlineTimer { loop.cancelTimer(t) }
        switch r {
        case .success:
            if e.silent {
                // Back after an update restart: finished when the reader runs the new version.
                if let i = install {
                    if infoValue?.softwareVersion == i.offer.version {
                        finishInstall(.success(()))
                    } else {
                        finishInstall(.failure(PaymentError(.updateIntegrity, "the reader came back with \(infoValue?.softwareVersion ?? "?")")))
                    }
                }
            } else {
                delegate?.readerDidSucceedReconnect(self)
            }
            recoverInFlight()
        case .failure(let error):
            e.candidate?.teardown()
            link?.teardown()
            link = nil
            infoValue = nil
            if e.silent {
                finishInstall(.failure(error))
            } else {
                delegate?.readerDidFailReconnect(self)
            }
            failInFlight(error)
        }
    }

    /// After a reconnect: what became of the payment that was in flight.
    private func recoverInFlight() {
        guard var p = payment, let l = link else { return }
        p.recovering = true
        payment = p
        l.request(.transactionStatus, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID), "SaleID": .string(p.saleID)]]) { [weak self] response in
            guard let self, self.payment != nil else { return }
            let status = PaymentResponseStatus(json: response.body["Response"])
            if status?.result == .success, let body = response.body["RepeatedMessageResponse"]?["RepeatedResponseMessageBody"]?["PaymentResponse"] {
                self.paymentAnswered(body, recovered: true)
            } else if status?.errorCondition == .inProgress {
                self.loop.schedule(at: self.loop.now + .milliseconds(Int64(max(50, 1000 * self.scale)))) { [weak self] in self?.recoverInFlight() }
            } else {
                // Never reached the reader: nothing was charged.
                self.failInFlight(PaymentError(.connectionLost, "the reader never received the payment"))
            }
        }
    }

    // MARK: Host-relay route

    private func relay(_ m: PaymentMessage, on l: ReaderLink) {
        guard let c = configuration, let bytes = m.body["Message"]?.string.flatMap(Base64.decode),
              let request = try? JSONParser.parse(bytes) else {
            l.answer(m, body: ["Response": PaymentResponseStatus.failure(.messageFormat).json])
            return
        }
        let summary = ["KSN": request["KSN"]?.string ?? "", "AmountMinor": request["AmountMinor"]?.integer.map(String.init) ?? "",
                       "CurrencyNumeric": request["CurrencyNumeric"]?.string ?? ""]
        guard delegate?.reader(self, shouldSubmit: summary) ?? true else {
            l.answer(m, body: ["Response": PaymentResponseStatus.failure(.aborted).json])
            return
        }
        // The reader's wait, within reason: at least a second, at most five minutes.
        let seconds = min(300, max(1, m.body["MaximumTransmitTime"]?.integer ?? 30))
        // The request goes as the reader sent it, and the answer back as the gateway sent it:
        // re-encoding either could outgrow a frame.
        GatewayClient.exchange(payload: bytes, with: c.gateway, loop: loop, timeout: .seconds(seconds), observer: nil) { [weak l] answer in
            guard let l else { return }
            guard let answer, (try? JSONParser.parse(answer)) != nil else {
                l.answer(m, body: ["Response": PaymentResponseStatus.failure(.unreachableHost).json])
                return
            }
            if !l.answer(m, body: ["Response": ["Result": "Success"], "Message": .string(Base64.encode(answer))]) {
                l.answer(m, body: ["Response": PaymentResponseStatus.failure(.unreachableHost, [("reason", "AnswerTooLarge")]).json])
            }
        }
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
    private var continuation: CheckedContinuation<T, Never>?
    init(_ c: CheckedContinuation<T, Never>) { continuation = c }
    func resume(_ value: T) {
        guard let c = continuation else { return }
        continuation = nil
        c.resume(returning: value)
    }
}

/// One request to the gateway from the host (login, signature, relayed authorisations): a
/// loopback connection, one frame each way.
public enum GatewayClient {
    public static func exchange(_ request: JSONValue, with gateway: TCPEndpoint, loop: EventLoop, timeout: Duration,
                                observer: (([UInt8]) -> Void)?, completion: @escaping (JSONValue?) -> Void) {
        exchange(payload: request.serialized, with: gateway, loop: loop, timeout: timeout, observer: observer) { answer in
            completion(answer.flatMap { try? JSONParser.parse($0) })
        }
    }

    /// The same with the request's bytes, and the answer's frame payload as it came.
    public static func exchange(payload: [UInt8], with gateway: TCPEndpoint, loop: EventLoop, timeout: Duration,
                                observer: (([UInt8]) -> Void)?, completion: @escaping ([UInt8]?) -> Void) {
        var done = false
        var timer: Int?
        var connection: StreamConnection?
        let finish: ([UInt8]?) -> Void = { answer in
            guard !done else { return }
            done = true
            if let timer { loop.cancelTimer(timer) }
            connection?.close()
            completion(answer)
        }
        do {
            let frame = try PaymentFrame.encode(payload)
            let c = try StreamConnection.connect(to: gateway, loop: loop)
            connection = c
            var decoder = PaymentFrameDecoder()
            observer?(frame)
            c.onConnected = { c.send(frame) }
            c.onData = { bytes in
                observer?(bytes)
                if let first = (try? decoder.feed(bytes))?.first { finish(first) }
            }
            c.onClose = { _ in finish(nil) }
            timer = loop.schedule(at: loop.now + timeout) { finish(nil) }
        } catch {
            finish(nil)
        }
    }

    /// Logs in to the gateway (merchant credentials, licence, environment).
    public static func login(gateway: TCPEndpoint, environment: String, licence: String, user: String, password: String,
                             loop: EventLoop = .shared) async throws(PaymentError) -> JSONValue {
        let answer = await withCheckedContinuation { (c: CheckedContinuation<JSONValue?, Never>) in
            let once = Once(c)
            loop.enqueue {
                exchange(["Type": "Login", "Environment": .string(environment), "Licence": .string(licence), "User": .string(user),
                          "Password": .string(password)], with: gateway, loop: loop, timeout: .seconds(10), observer: nil) { once.resume($0) }
            }
        }
        guard let answer else { throw PaymentError(.gatewayUnreachable) }
        guard answer["Result"]?.string == "ok" else {
            let code = answer["Error"]?.string.flatMap { Int($0) }.flatMap(PaymentErrorCode.init(rawValue:)) ?? .loginFailed
            throw PaymentError(code, answer["Reason"]?.string ?? "")
        }
        return answer
    }
}
