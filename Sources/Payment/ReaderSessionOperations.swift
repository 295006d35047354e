import Crypto
import Wire

/// What the app asks of a connected reader: payments and refunds, cancel, signatures and
/// reversals, reboot, diagnosis and software updates; and the brackets around the shell's own
/// merchant login and discovery, which count as operations too.
extension ReaderSession {
    // MARK: Merchant login and discovery

    /// The shell's merchant login at the gateway begins (state `login`); nil, or why not.
    public func beginMerchantLogin() -> PaymentError? {
        guard !isBusy else { return PaymentError(.busy, "an operation is in progress (\(state))") }
        setState(.login)
        return nil
    }

    /// The merchant login's end: the session later logins present (unless their settings carry
    /// one), and the merchant it named.
    public func merchantLoginEnded(_ result: Result<(sessionToken: String?, merchantID: String), PaymentError>) {
        switch result {
        case .success(let session):
            // Kept whatever happened meanwhile: later logins and signatures need it.
            sessionToken = session.sessionToken
            gatewayMerchantID = PaymentRules.isDigits(session.merchantID, 9...9) ? session.merchantID : nil
            if state == .login { setState(.ready) }
        case .failure(let e):
            if state == .login { setState(.failed(e.code)) }
        }
    }

    /// The shell's discovery begins (state `discovery`); nil, or why not.
    public func beginDiscovery() -> PaymentError? {
        guard !isBusy else { return PaymentError(.busy, "an operation is in progress (\(state))") }
        setState(.discovery)
        return nil
    }

    /// Discovery is over: in `state`, or quietly ready when a connect follows at once.
    public func discoveryEnded(state next: PaymentState?) {
        guard state == .discovery else { return }
        if let next { setState(next) } else { state = .ready }
    }

    // MARK: Payments

    public enum PaymentType: String, Sendable { case normal = "Normal", refund = "Refund" }

    /// A payment, or a refund of `original` (an operation ID or the approval code on its
    /// receipt; no card needed). Declines come back as outcomes; failures as errors.
    public func pay(_ ticket: Int, type: PaymentType, amountMinor amount: Int64, currency: Currency, transactionID: String,
                    original: String? = nil, now: Instant) {
        if refusedAsBusy(ticket) { return }
        guard liveLink != nil, info != nil else { return finish(ticket, .failure(PaymentError(.notConnected))) }
        guard (1...999_999_999_999).contains(amount) else { return finish(ticket, .failure(PaymentError(.invalidAmount, "\(amount)"))) }
        guard Currency.known.contains(currency) else { return finish(ticket, .failure(PaymentError(.unsupportedCurrency, currency.code))) }
        guard PaymentRules.isTransactionID(transactionID) else { return finish(ticket, .failure(PaymentError(.invalidTransactionID, transactionID))) }
        setState(.interaction)
        var ext: JSONValue = ["Route": "TerminalDirect"]
        ext = ext.setting("OriginalOperationID", original.map { .string($0) } ?? .null)
        guard let sid = request(.payment, body: [
            "SaleData": ["SaleTransactionID": ["TransactionID": .string(transactionID), "TimeStamp": .string(wall(now).description)]],
            "PaymentTransaction": ["AmountsReq": ["Currency": .string(currency.code), "CurrencyNumeric": .string(currency.numeric),
                                                  "RequestedAmountMinor": .integer(amount)]],
            "PaymentData": ["PaymentType": .string(type.rawValue)],
            "Ext": ext,
        ], purpose: .payment) else { return }
        payment = PaymentInFlight(ticket: ticket, serviceID: sid, saleID: settings.saleID, transactionID: transactionID, amount: amount,
                                  currency: currency)
    }

    func paymentAnswered(_ body: JSONValue, recovered: Bool) {
        guard let p = payment else { return }
        payment = nil
        timers[.recovery] = nil
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
            return finish(p.ticket, .success(.outcome(outcome)))
        }
        switch status.errorCondition {
        case .refusal?, .wrongPIN?:
            setState(.finished)
            finish(p.ticket, .success(.outcome(outcome)))
        default:
            let error = Self.map(status)
            setState(.failed(error.code))
            finish(p.ticket, .failure(error))
        }
    }

    /// A terminal's failure as an SDK error.
    public static func map(_ s: PaymentResponseStatus) -> PaymentError {
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

    /// Cancels what can be cancelled: discovery, a payment still waiting for the card
    /// (AbortRequest), a connect in progress. Ignored later.
    public func cancel(now: Instant) {
        switch state {
        case .discovery:
            outputs.append(.stopDiscovery)
        case .interaction:
            guard let p = payment, liveLink != nil else { return }
            request(.abort, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID), "SaleID": .string(p.saleID)],
                                   "AbortReason": "MerchantAbort"])
        case .connecting:
            if let i = install, !i.restarting, liveLink != nil {
                // A required update installing inside the connect: cancel the update, which
                // fails the connect (unsupportedReaderVersion) the documented way.
                request(.admin, body: ["ServiceIdentification": "CancelUpdate"])
            } else if install != nil {
                // Restarting into the new version: too late to cancel.
            } else if case .connecting(var c) = phase {
                if c.setup == .waitingForLine {
                    // Still waiting for the line to appear.
                    c.canceled = true
                    phase = .connecting(c)
                } else {
                    connectFailed(PaymentError(.canceled, "connect canceled"), now: now)
                }
            }
        default:
            break
        }
    }

    // MARK: Signature

    /// The customer's signature for the approved payment waiting in `signature` state: it goes
    /// to the gateway with the merchant's session (`gatewayAnswered` brings its answer).
    public func submitSignature(_ ticket: Int, image: [UInt8], format: Int) {
        guard state == .signature, let outcome = lastOutcome, signatureCall == nil else {
            return finish(ticket, .failure(PaymentError(.busy, "no payment waits for a signature")))
        }
        guard SignatureImage.isValid(image, format: format) else {
            return finish(ticket, .failure(PaymentError(.invalidSignatureImage, "format \(format) does not match the image's magic bytes or size")))
        }
        guard let token = settings.sessionToken ?? sessionToken else { return finish(ticket, .failure(PaymentError(.loginFailed, "no gateway session"))) }
        nextCall += 1
        signatureCall = (nextCall, ticket)
        outputs.append(.gateway(nextCall, ["Type": "Signature", "SessionToken": .string(token), "OperationID": .string(outcome.operationID ?? ""),
                                           "ImageFormat": .integer(Int64(format)), "Image": .string(Base64.encode(image)),
                                           "SHA256": .string(Hex.encode(Digest.hash(.sha256, image) ?? []))]))
    }

    /// The gateway's answer to a `gateway` output, or nil when it could not be reached.
    public func gatewayAnswered(_ id: Int, _ answer: JSONValue?) {
        guard let call = signatureCall, call.id == id else { return }
        signatureCall = nil
        guard let answer else { return finish(call.ticket, .failure(PaymentError(.gatewayUnreachable))) }
        if answer["Result"]?.string == "ok" {
            setState(.finished)
            finish(call.ticket, .success(.done))
        } else {
            let code = answer["Error"]?.string.flatMap { Int($0) }.flatMap(PaymentErrorCode.init(rawValue:)) ?? .invalidSignatureImage
            finish(call.ticket, .failure(PaymentError(code, PeerText.escaped(answer["Reason"]?.string ?? "", limit: 512))))
        }
    }

    /// The customer would not sign: the payment is reversed.
    public func declineSignature(_ ticket: Int, now: Instant) {
        guard state == .signature, signatureCall == nil, let outcome = lastOutcome, liveLink != nil else {
            return finish(ticket, .failure(PaymentError(.busy, "no payment waits for a signature")))
        }
        reversal(ticket, outcome, reason: "MerchantCancel", now: now)
    }

    /// Reverses an approved payment of this session (void).
    public func reverse(_ ticket: Int, _ outcome: PaymentOutcome, reason: String = "MerchantCancel", now: Instant) {
        if refusedAsBusy(ticket) { return }
        guard liveLink != nil else { return finish(ticket, .failure(PaymentError(.notConnected))) }
        setState(.authorizing)
        reversal(ticket, outcome, reason: reason, now: now)
    }

    func reversal(_ ticket: Int, _ outcome: PaymentOutcome, reason: String, now: Instant) {
        guard let l = link else { return }
        request(.reversal, body: [
            "OriginalPOITransaction": ["SaleID": .string(settings.saleID), "POIID": .string(l.poiID),
                                       "POITransactionID": ["TransactionID": .string(outcome.poiTransactionID ?? ""), "TimeStamp": .string(wall(now).description)]],
            "ReversalReason": .string(reason),
        ], purpose: .reversal(outcome, ticket: ticket))
    }

    // MARK: Reboot, diagnosis, updates

    /// Reboots the reader (idle only). It disconnects with `rebootRequested`; no reconnect.
    public func reboot(_ ticket: Int, now: Instant) {
        if refusedAsBusy(ticket) { return }
        guard liveLink != nil else { return finish(ticket, .failure(PaymentError(.notConnected))) }
        request(.admin, body: ["ServiceIdentification": "Reboot"], purpose: .reboot(ticket: ticket), answerWithin: Self.answerTimeout, now: now)
    }

    /// Asks the reader for its state; with `host` it also pings the gateway through the proxy.
    public func diagnose(_ ticket: Int, host: Bool, now: Instant) {
        guard liveLink != nil else { return finish(ticket, .failure(PaymentError(.notConnected))) }
        request(.diagnosis, body: ["HostDiagnosisFlag": .bool(host)], purpose: .diagnosis(ticket: ticket), answerWithin: Self.answerTimeout, now: now)
    }

    /// Installs the optional update the reader offered; finishes when the reader runs it.
    public func installAvailableUpdate(_ ticket: Int, now: Instant) {
        if refusedAsBusy(ticket) { return }
        guard liveLink != nil, let offer else { return finish(ticket, .failure(PaymentError(.notConnected, "no update available"))) }
        startInstall(offer, duringConnect: nil, ticket: ticket, now: now)
    }

    func startInstall(_ offer: UpdateOffer, duringConnect: Int?, ticket: Int?, now: Instant) {
        guard liveLink != nil else { return }
        let update = ReaderSoftwareUpdate(deviceSoftwareVersion: offer.version, durationEstimate: offer.durationEstimate,
                                          requiredAt: offer.requiredAt, size: offer.size)
        install = Install(update: update, offer: offer, duringConnect: duringConnect, ticket: ticket)
        timers[.install] = now + Self.installSilence
        outputs.append(.installStarted(update))
        request(.admin, body: ["ServiceIdentification": "InstallUpdate"], purpose: .installUpdate)
    }

    /// The app cancels the update installing (ignored once the reader restarts into it).
    public func cancelUpdate() {
        guard let i = install, !i.restarting, liveLink != nil else { return }
        request(.admin, body: ["ServiceIdentification": "CancelUpdate"])
    }

    func finishInstall(_ r: Result<Void, PaymentError>, now: Instant) {
        guard let i = install else { return }
        install = nil
        timers[.install] = nil
        switch r {
        case .success: outputs.append(.installFinished(i.update, nil))
        case .failure(let e): outputs.append(.installFinished(i.update, e))
        }
        if let connect = i.duringConnect {
            switch r {
            case .success:
                setState(.ready)
                finish(connect, .success(.done))
            case .failure(let e):
                // A required update that does not install leaves a reader we cannot use.
                let error = e.code == .updateCanceled ? PaymentError(.unsupportedReaderVersion, "required update canceled") : e
                phase = .idle
                dropLink(now: now)
                info = nil
                setState(.failed(error.code))
                finish(connect, .failure(error))
            }
        }
        if let ticket = i.ticket { finish(ticket, r.map { .done }) }
    }

    // MARK: Disconnect

    /// Logs out and lets the link go (reason disconnectRequested); a reconnect in progress ends.
    public func disconnect(now: Instant) {
        explicitDisconnect = true
        if case .reconnecting = phase { endEpisode(.failure(PaymentError(.connectionLost, "disconnected")), now: now) }
        guard liveLink != nil else { return }
        request(.logout, body: [:])
        phase = .idle
        dropLink(now: now)
        info = nil
        failInFlight(PaymentError(.connectionLost, "disconnected"))
        finishInstall(.failure(PaymentError(.connectionLost, "disconnected")), now: now)
        outputs.append(.disconnected(.disconnectRequested))
        if !state.isIdle { setState(.ready) }
    }
}
