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

    var stateValue: PaymentState = .ready
    internal(set) var link: ReaderLink?
    var path: String?
    var serial: String?
    var configuration: ReaderConnectionConfiguration?
    var infoValue: Info?
    var offer: UpdateOffer?
    var payment: PaymentOperation?
    var simple: SimpleOperation?
    var episode: Episode?
    var install: Install?
    var explicitDisconnect = false
    var nextEpisode = 0
    var connectTimer: Int?
    /// Every byte of the reader connection and of the SDK's gateway exchanges, when asked for.
    public var recordsBytes = false
    var wire: [UInt8] = []

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

    var lastOutcome: PaymentOutcome?
    /// The reader being connected to, as discovery or its advertisement described it.
    var peripheral: DiscoveredReader?
    var discovery: DiscoveryRun?
    var lastChannel: Channel?
    var lastLineLost = false
    /// Ends the connect in progress (cancel).
    var connectAbort: ((PaymentError) -> Void)?
    var connectCanceled = false
    /// The gateway session from `login`, used when a configuration carries none.
    var sessionToken: String?
    /// The merchant the gateway login named: the reader's Login carries it, as the gateway
    /// keeps that session's operations under it.
    var gatewayMerchantID: String?
    /// The reader session token the terminal answered our last login with: presented again when
    /// we log in on a new connection while the old one may still hold the session.
    var readerSession: (path: String, token: String)?

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

    func setState(_ s: PaymentState) {
        guard s != stateValue else { return }
        stateValue = s
        delegate?.reader(self, didChangeState: s)
    }

    func busy<T>(_ finish: (Result<T, PaymentError>) -> Void) -> Bool {
        if !stateValue.isIdle || simple != nil || install != nil {
            finish(.failure(PaymentError(.busy, "an operation is in progress (\(stateValue))")))
            return true
        }
        return false
    }

    var scale: Double { configuration?.backoffScale ?? 1 }

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

    /// Makes `l` the current link.
    func adopt(_ l: ReaderLink) {
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

    func handle(_ m: PaymentMessage, on l: ReaderLink) {
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

    func event(_ body: JSONValue, on l: ReaderLink) {
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

    // MARK: Host-relay route

    func relay(_ m: PaymentMessage, on l: ReaderLink) {
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
    var continuation: CheckedContinuation<T, Never>?
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
