import Crypto
import NetStack
@testable import Payment
@testable import PaymentKit
@testable import Simulation
import Testing

/// The terminal's flows against the real gateway core, sans-IO on virtual time: a payment, its
/// refusals, refunds, a signature and reversal, a lost host recovering the result, a gateway
/// that never answers, an abort. Each runs in milliseconds; the pty suites keep the same flows
/// end to end.
@Suite struct TerminalFlowTests {
    let wall = WallTime(rfc3339: "2026-11-01T10:00:00Z")!
    typealias Rig = HostileInputTests.Rig

    func loggedIn() throws -> Rig {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        return rig
    }

    /// Presents a card "inside the pad".
    func present(_ rig: Rig, pan: String = "4111111111111111", cvm: String = "OnlinePIN", pin: String? = "1234") {
        var command: JSONValue = ["cmd": "presentCard", "entry": "ICC", "pan": .string(pan), "expiry": "3012", "serviceCode": "201", "cvm": .string(cvm)]
        if let pin { command = command.setting("pin", .string(pin)) }
        #expect(TerminalControlCommands.handle(core: rig.t, command, now: rig.now)["ok"]?.bool == true)
        rig.pump()
    }

    /// The service answers (payments, reversals, ...) the host has received so far, by category.
    func answers(_ rig: Rig, _ category: PaymentMessage.Category) -> [PaymentMessage] {
        rig.host.compactMap { try? PaymentMessage.decode($0) }.filter { $0.header.messageClass == .service && $0.header.category == category }
    }

    func status(_ m: PaymentMessage?) -> PaymentResponseStatus? { PaymentResponseStatus(json: m?.body["Response"]) }

    func pay(_ rig: Rig, _ id: String, amount: Int64, pin: String? = "1234", cvm: String = "OnlinePIN") -> PaymentMessage? {
        let before = answers(rig, .payment).count
        present(rig, cvm: cvm, pin: pin)
        rig.send(rig.payment(id, amount: amount))
        return answers(rig, .payment).dropFirst(before).first
    }

    func refund(_ rig: Rig, _ id: String, amount: Int64, original: String) -> PaymentMessage? {
        let before = answers(rig, .payment).count
        rig.send(rig.request(.payment, body: [
            "SaleData": ["SaleTransactionID": ["TransactionID": .string(id), "TimeStamp": "2026-11-01T10:00:06Z"]],
            "PaymentTransaction": ["AmountsReq": ["Currency": "EUR", "CurrencyNumeric": "978", "RequestedAmountMinor": .integer(amount)]],
            "PaymentData": ["PaymentType": "Refund"], "Ext": ["OriginalOperationID": .string(original)],
        ]))
        return answers(rig, .payment).dropFirst(before).first
    }

    @Test func anApprovedPaymentCarriesItsCodeMaskedCardAndReceipt() throws {
        let rig = try loggedIn()
        let answer = try #require(pay(rig, "1001", amount: 1050))
        #expect(status(answer)?.result == .success)
        let acquirer = answer.body["PaymentResult"]?["PaymentAcquirerData"]
        let code = try #require(acquirer?["ApprovalCode"]?.string)
        #expect(code.utf8.count == 6 && acquirer?["MerchantID"]?.string == "999008881")
        #expect(answer.body["PaymentResult"]?["PaymentInstrumentData"]?["CardData"]?["MaskedPan"]?.string == "411111******1111")
        #expect(answer.body["Ext"]?["AuthenticatedByPin"]?.bool == true)
        // One authorisation at the gateway, no clear card number in anything that left.
        #expect(rig.gatewayRequests.count == 1 + 1, "the login's update check and the Authorise")
        let everything = (rig.host + rig.gatewayRequests).map { String(decoding: $0, as: UTF8.self) }.joined()
        #expect(!everything.contains("4111111111111111"))
        // A receipt went to the host's printer.
        #expect(rig.host.compactMap { try? PaymentMessage.decode($0) }.contains { $0.header.messageClass == .device && $0.header.category == .print })
    }

    @Test func declinedWrongPINAndTheSameTransactionIDTwice() throws {
        let rig = try loggedIn()
        let declined = try #require(pay(rig, "2001", amount: 105))
        #expect(status(declined)?.result == .failure && declined.body["Ext"]?["ResponseCode"]?.string == "05")
        let wrongPIN = try #require(pay(rig, "2002", amount: 200, pin: "9999"))
        #expect(wrongPIN.body["Ext"]?["ResponseCode"]?.string == "55" && wrongPIN.body["Ext"]?["AuthenticatedByPin"]?.bool == false)
        let again = try #require(pay(rig, "2001", amount: 300))
        #expect(status(again)?.value("reason") == "DuplicateTransactionID")
    }

    @Test func refundsByOperationAndByCodeWithinTheOriginal() throws {
        let rig = try loggedIn()
        let sale = try #require(pay(rig, "3001", amount: 5000))
        let operation = try #require(sale.body["Ext"]?["OperationID"]?.string)
        let code = try #require(sale.body["PaymentResult"]?["PaymentAcquirerData"]?["ApprovalCode"]?.string)
        #expect(status(refund(rig, "3002", amount: 2000, original: operation))?.result == .success)
        #expect(status(refund(rig, "3003", amount: 3001, original: code))?.value("code") == "3007")
        #expect(status(refund(rig, "3004", amount: 3000, original: code))?.result == .success)
        #expect(status(refund(rig, "3005", amount: 1, original: "OP-0000000000000000"))?.value("code") == "3008")
    }

    @Test func aSignaturePaymentThenItsReversal() throws {
        let rig = try loggedIn()
        let sale = try #require(pay(rig, "4001", amount: 2000, pin: nil, cvm: "Signature"))
        #expect(status(sale)?.result == .success && sale.body["Ext"]?["SignatureRequired"]?.bool == true)
        let poi = try #require(sale.body["POIData"]?["POITransactionID"]?["TransactionID"]?.string)
        func reverse() -> PaymentMessage? {
            let before = answers(rig, .reversal).count
            rig.send(rig.request(.reversal, body: ["OriginalPOITransaction": ["POITransactionID": ["TransactionID": .string(poi)]],
                                                   "ReversalReason": "SignatureDeclined"]))
            return answers(rig, .reversal).dropFirst(before).first
        }
        let reversed = try #require(reverse())
        #expect(status(reversed)?.result == .success && reversed.body["Ext"]?["ReversedAmountMinor"]?.integer == 2000)
        #expect(status(reverse())?.value("reason") == "AlreadyReversed")
        // The gateway reversed it once, under the MAC both ways.
        #expect(rig.gw.log.filter { $0.hasPrefix("Reverse ") && $0.hasSuffix(" ok") }.count == 1)
    }

    @Test func aHostThatLostTheLinkRecoversTheResultOnce() throws {
        let rig = try loggedIn()
        present(rig)
        // The gateway's answer reaches the terminal after the host is gone.
        let request = rig.payment("5001", amount: 4200)
        let serviceID = try #require(try PaymentMessage.decode(request).header.identifier)
        rig.t.receive(hostPayload: request, now: rig.now)
        rig.t.hostDidDisconnect(now: rig.now)
        rig.pump()
        #expect(answers(rig, .payment).isEmpty)
        // The host comes back, logs in again and asks for the transaction's status.
        rig.t.hostDidConnect(now: rig.now)
        #expect(rig.login()?.result == .success)
        let recovered = rig.send(rig.request(.transactionStatus, body: ["MessageReference": ["MessageCategory": "Payment",
                                                                                            "ServiceID": .string(serviceID), "SaleID": "HOST-1"]]))
        let repeated = recovered.first?.body["RepeatedMessageResponse"]?["RepeatedResponseMessageBody"]?["PaymentResponse"]
        #expect(status(recovered.first)?.result == .success && PaymentResponseStatus(json: repeated?["Response"])?.result == .success)
        #expect(rig.gw.log.filter { $0.hasPrefix("Authorise 5001") }.count == 1, "charged once")
    }

    @Test func aGatewayThatNeverAnswersEndsThePaymentAtTheTimeout() throws {
        let rig = try loggedIn()
        rig.unansweredIsSilence = true
        present(rig)
        rig.send(rig.payment("6001", amount: 191))   // the gateway's rule: no answer
        #expect(answers(rig, .payment).isEmpty)
        // Virtual time: just before the transmit timeout nothing happens, just after it fails.
        rig.now = rig.now + (rig.t.configuration.transmitTimeout - .milliseconds(1))
        rig.t.poll(now: rig.now)
        rig.pump()
        #expect(answers(rig, .payment).isEmpty)
        rig.now = rig.now + .milliseconds(2)
        rig.t.poll(now: rig.now)
        rig.pump()
        #expect(status(answers(rig, .payment).first)?.errorCondition == .unreachableHost)
    }

    @Test func anAbortWhileWaitingForTheCardEndsThePayment() throws {
        let rig = try loggedIn()
        rig.send(rig.payment("7001", amount: 100))
        let sid = String(rig.serviceID - 1)
        rig.send(rig.request(.abort, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(sid), "SaleID": "HOST-1"],
                                            "AbortReason": "MerchantAbort"]))
        #expect(status(answers(rig, .payment).first)?.errorCondition == .aborted)
        #expect(rig.gatewayRequests.count == 1, "no authorisation, only the login's update check")
    }

    @Test func aSecondOperationWhileOneRunsIsBusy() throws {
        let rig = try loggedIn()
        rig.send(rig.payment("8001", amount: 100))
        let busy = rig.send(rig.payment("8002", amount: 100))
        #expect(status(busy.first)?.errorCondition == .busy)
    }
}
