import Crypto
import Wire

/// What the link brings in: its opening, the reader's bytes, its loss; and the messages from
/// the reader that are not answers (display, print and relay requests, events).
extension ReaderSession {
    // MARK: The link's events

    /// The link is up and the stream to the reader's port is connected: the reader's login goes out.
    public func linkOpened(_ id: LinkID, now: Instant) {
        guard link?.id == id, case .opening = setup else { return }
        link?.opened = true
        sendLogin(now: now)
    }

    /// The link could not be opened; `lineLost` when the line itself went (hung up or failed)
    /// rather than PPP or the reader's port refusing.
    public func linkFailed(_ id: LinkID, _ error: PaymentError, lineLost: Bool, now: Instant) {
        guard let l = link, l.id == id else { return }
        // Once open, its end is a loss, whatever the shell calls it.
        if l.opened { return linkLost(id, echoTimeout: false, lineLost: lineLost, now: now) }
        // The shell has let it go already.
        link = nil
        setupFailed(error, lineLost: lineLost, now: now)
    }

    /// The link went after it opened; `echoTimeout` when the reader stopped answering LCP echoes.
    public func linkLost(_ id: LinkID, echoTimeout: Bool, lineLost: Bool, now: Instant) {
        guard let l = link, l.id == id else { return }
        guard l.loggedIn else {
            link = nil
            return setupFailed(PaymentError(.connectionLost, "the link went during the reader's login"), lineLost: lineLost, now: now)
        }
        lost(echoTimeout: echoTimeout, protocolViolation: false, now: now)
    }

    /// Bytes of the reader's stream.
    public func received(_ id: LinkID, _ bytes: [UInt8], now: Instant) {
        guard var l = link, l.id == id else { return }
        let frames: [[UInt8]]
        do { frames = try l.decoder.feed(bytes) } catch {
            // A zero or oversize length: the connection is closed (2012 for what waits on it).
            link = l
            if l.loggedIn { return lost(echoTimeout: false, protocolViolation: true, now: now) }
            dropLink(now: now)
            return setupFailed(PaymentError(.messageFormat, "invalid frame from the reader"), lineLost: false, now: now)
        }
        link = l
        for frame in frames {
            // A frame may have ended the link (a failed login, a shutdown).
            guard link?.id == id else { return }
            guard let message = try? PaymentMessage.decode(frame) else { continue }
            let h = message.header
            if h.type == .response, h.messageClass == .service, let sid = h.identifier,
               let purpose = link?.pending.removeValue(forKey: Self.key(h.category, sid)) {
                link?.answerDeadlines[Self.key(h.category, sid)] = nil
                timers[.answer] = link?.answerDeadlines.values.min()
                answered(purpose, message, now: now)
            } else if link?.loggedIn == true {
                incoming(message, now: now)
            } else {
                // Until the reader has logged us in (and proved our bond), nothing it says but
                // its answers counts: a stand-in must not report a payment, print, or relay.
                link?.ignoredBeforeLogin += 1
            }
        }
    }

    /// The setup step the current phase is in.
    var setup: Setup? {
        switch phase {
        case .connecting(let c): return c.setup
        case .reconnecting(let e): return e.setup
        case .idle, .connected: return nil
        }
    }

    func setSetup(_ s: Setup) {
        switch phase {
        case .connecting(var c):
            c.setup = s
            phase = .connecting(c)
        case .reconnecting(var e):
            e.setup = s
            phase = .reconnecting(e)
        case .idle, .connected: break
        }
    }

    /// Opens a new link on the target's line for a connect or a reconnect attempt.
    func openLink(now: Instant) {
        guard let target else { return }
        nextLinkID += 1
        let id = nextLinkID
        link = LinkState(id: id, path: target.path, poiID: target.serial ?? "UNKNOWN")
        setSetup(.opening(id))
        outputs.append(.openLink(id, path: target.path))
    }

    // MARK: Answers

    func answered(_ purpose: Purpose, _ m: PaymentMessage, now: Instant) {
        let status = PaymentResponseStatus(json: m.body["Response"])
        switch purpose {
        case .login: loginAnswered(m, now: now)
        case .pairingNonce: pairingNonceAnswered(status, now: now)
        case .confirmPairing: pairingConfirmationAnswered(status, now: now)
        case .payment: paymentAnswered(m.body, recovered: false)
        case .transactionStatus: transactionStatusAnswered(m.body, now: now)
        case .reversal(let outcome, let ticket):
            let status = status ?? .failure(.messageFormat)
            if status.result == .success {
                var o = outcome
                o.result = .reversed
                setState(.finished)
                finish(ticket, .success(.outcome(o)))
            } else {
                let e = Self.map(status)
                setState(.failed(e.code))
                finish(ticket, .failure(e))
            }
        case .reboot(let ticket):
            finish(ticket, status?.result == .success ? .success(.done) : .failure(Self.map(status ?? .failure(.messageFormat))))
        case .diagnosis(let ticket):
            finish(ticket, .success(.json(m.body)))
        case .installUpdate:
            if status?.result != .success {
                finishInstall(.failure(PaymentError(.updateIntegrity, "the reader did not start the update")), now: now)
            }
        }
    }

    // MARK: Messages from the reader

    func incoming(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        switch (h.messageClass, h.type) {
        case (.device, .request):
            switch h.category {
            case .display:
                for output in m.body["DisplayOutput"]?.array ?? [] {
                    let text = output["OutputContent"]?["OutputText"]?.array?.compactMap { $0["Text"]?.string }.joined(separator: " ") ?? ""
                    outputs.append(.report(.display(readerMessage: output["Ext"]?["ReaderMessage"]?.string ?? "", text: text)))
                }
                answer(h, body: ["OutputResult": [["Device": "CashierDisplay", "InfoQualify": "Status", "Response": ["Result": "Success"]]]])
            case .print:
                // The answer names the document printed: one of nexo's, never the reader's text.
                let qualifier = m.body["PrintOutput"]?["DocumentQualifier"]?.string ?? "CustomerReceipt"
                guard Self.documentQualifiers.contains(qualifier) else {
                    answer(h, body: ["Response": PaymentResponseStatus.failure(.messageFormat, [("reason", "DocumentQualifier")]).json])
                    return
                }
                let lines = m.body["PrintOutput"]?["OutputContent"]?["OutputText"]?.array?.compactMap { $0["Text"]?.string } ?? []
                outputs.append(.report(.receipt(lines)))
                answer(h, body: ["Response": ["Result": "Success"], "DocumentQualifier": .string(qualifier)])
            case .transmit:
                relay(m)
            default:
                answer(h, body: ["Response": PaymentResponseStatus.failure(.notAllowed).json])
            }
        case (.event, .notification):
            event(m.body, now: now)
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

    func event(_ body: JSONValue, now: Instant) {
        let name = body["EventToNotify"]?.string ?? ""
        let details = FormEncoding.decode(body["EventDetails"]?.string ?? "")
        func detail(_ k: String) -> String? { details.first { $0.0 == k }?.1 }
        switch name {
        case "ExtPhase":
            let phase = body["Ext"]?["Phase"]?.string ?? ""
            if phase == "Authorizing", state == .interaction { setState(.authorizing) }
            outputs.append(.report(.phase(phase)))
        case "CardInserted": outputs.append(.report(.cardInserted))
        case "CardRemoved": outputs.append(.report(.cardRemoved))
        case "Shutdown":
            link?.shutdownReason = DisconnectReason(name: detail("reason") ?? "")
        case "ExtUpdateProgress":
            // A fraction in 0...1; anything else from the reader is no progress.
            guard var i = install, let p = PaymentRules.fraction(body["Ext"]?["Progress"]).map({ Float($0) }) else { break }
            // Reported non-decreasing.
            if p >= i.lastProgress {
                i.lastProgress = p
                install = i
                timers[.install] = now + Self.installSilence
                outputs.append(.installProgress(p))
            }
        case "EndMaintenance":
            guard var i = install else { break }
            switch detail("result") {
            case "ok":
                i.restarting = true
                install = i
                // The restart's reconnect has its own deadline.
                timers[.install] = nil
            case "updateCanceled": finishInstall(.failure(PaymentError(.updateCanceled)), now: now)
            default: finishInstall(.failure(PaymentError(.updateIntegrity, "the reader refused the image")), now: now)
            }
        default:
            outputs.append(.report(.notification(name, details: body["EventDetails"]?.string ?? "")))
        }
    }

    // MARK: Host-relay route

    /// The reader asks the host to carry an authorisation to the gateway.
    func relay(_ m: PaymentMessage) {
        guard let l = link, let bytes = m.body["Message"]?.string.flatMap(Base64.decode), let request = try? JSONParser.parse(bytes) else {
            answer(m.header, body: ["Response": PaymentResponseStatus.failure(.messageFormat).json])
            return
        }
        // A reader has one authorisation at a time; more waiting is a reader gone wrong.
        guard relays.count < Self.relayCap else {
            relaysRefused += 1
            answer(m.header, body: ["Response": PaymentResponseStatus.failure(.busy).json])
            return
        }
        let summary = ["KSN": request["KSN"]?.string ?? "", "AmountMinor": request["AmountMinor"]?.integer.map(String.init) ?? "",
                       "CurrencyNumeric": request["CurrencyNumeric"]?.string ?? ""]
        // The reader's wait, within reason: at least a second, at most five minutes.
        let seconds = min(300, max(1, m.body["MaximumTransmitTime"]?.integer ?? 30))
        nextCall += 1
        relays[nextCall] = (l.id, m.header)
        // The request goes as the reader sent it, and the answer back as the gateway sent it:
        // re-encoding either could outgrow a frame.
        outputs.append(.relay(nextCall, payload: bytes, summary: summary, timeout: .seconds(seconds)))
    }

    /// The relayed authorisation's end: its answer goes back to the reader, if the link that
    /// asked is still the one in use.
    public func relayAnswered(_ id: Int, _ result: RelayResult, now: Instant) {
        guard let r = relays.removeValue(forKey: id), link?.id == r.link else { return }
        switch result {
        case .declined:
            answer(r.request, body: ["Response": PaymentResponseStatus.failure(.aborted).json])
        case .answer(let bytes):
            guard let bytes, (try? JSONParser.parse(bytes)) != nil else {
                answer(r.request, body: ["Response": PaymentResponseStatus.failure(.unreachableHost).json])
                return
            }
            if !answer(r.request, body: ["Response": ["Result": "Success"], "Message": .string(Base64.encode(bytes))]) {
                answer(r.request, body: ["Response": PaymentResponseStatus.failure(.unreachableHost, [("reason", "AnswerTooLarge")]).json])
            }
        }
    }
}
