import Crypto
import Payment
import Wire

/// Payments and refunds (card, PIN, the gateway's authorisation and its MAC check, receipt),
/// abort, TransactionStatus recovery and reversal.
extension TerminalCore {
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
        guard transaction != nil, let s = transaction?.origin ?? session ?? lastSession else { return }
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
            let request = try security.authorise(fields, card: t.card?.data, pin: t.card?.pin, keys: keys, pinFill: try random(8))
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
                "MerchantID": .string((t.origin ?? session ?? lastSession)?.merchantID ?? ""),
                "AcquirerPOIID": .string((t.origin ?? session ?? lastSession)?.terminalID ?? ""),
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
}
