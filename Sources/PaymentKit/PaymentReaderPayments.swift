import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// Payments and refunds, cancel, signatures and reversals.
extension PaymentReader {
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

    func paymentOnLoop(type: String, amount: Int64, currency: Currency, transactionID: String, original: String?,
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

    func paymentAnswered(_ body: JSONValue, recovered: Bool) {
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

    func reversal(_ outcome: PaymentOutcome, reason: String, on l: ReaderLink, finish: @escaping (Result<PaymentOutcome, PaymentError>) -> Void) {
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
}
