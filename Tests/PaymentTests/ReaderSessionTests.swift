import Crypto
import NetStack
@testable import Payment
@testable import PaymentKit
@testable import Simulation
import Testing

/// The host's reader session against the terminal's application and the gateway, all sans-IO
/// on virtual time (`ReaderSessionRig`): connect, payments, refunds, signatures, reversals,
/// reboot, updates, pairing, and the reconnects with their recoveries. Each runs in
/// milliseconds; the pty suites keep a smaller set of the same flows end to end.
@Suite struct ReaderSessionTests {
    func connected(_ rig: ReaderSessionRig = ReaderSessionRig()) throws -> ReaderSessionRig {
        let t = rig.connect()
        guard case .success(.done)? = rig.result(t) else {
            Issue.record("connect: \(String(describing: rig.result(t)))")
            throw PaymentError(.connectTimedOut)
        }
        return rig
    }

    // MARK: Connect

    @Test func aConnectLogsInAndTheReaderIsReady() throws {
        let rig = try connected()
        #expect(rig.session.phase == .connected && rig.session.isConnected)
        #expect(rig.session.info?.serialNumber == "SIM-00000001" && rig.session.info?.softwareVersion == "1.0.0")
        #expect(rig.states == [.connecting, .ready])
        #expect(rig.now == .zero, "no time passed: nothing waited")
        // A second connect while connected changes nothing.
        let again = rig.connect()
        #expect(rig.error(again) == .busy && rig.session.phase == .connected && rig.linksOpened == 1)
    }

    @Test func aLineAwayForAMomentIsWaitedForAndOneAwayForASecondIsNotThere() throws {
        let rig = ReaderSessionRig()
        rig.linePresent = false
        let t = rig.connect()
        rig.run(.milliseconds(300))
        #expect(rig.result(t) == nil && rig.session.state == .connecting && rig.linksOpened == 0)
        rig.linePresent = true
        rig.run(.milliseconds(60))
        #expect(rig.result(t) == .success(.done))

        let gone = ReaderSessionRig()
        gone.linePresent = false
        let u = gone.connect()
        gone.run(.seconds(2))
        #expect(gone.error(u) == .readerNotFound && gone.session.state == .failed(.readerNotFound) && gone.session.phase == .idle)
    }

    @Test func aLineThatKeepsHangingUpIsTriedUntilTheConnectTimeout() throws {
        let rig = ReaderSessionRig()
        rig.terminalOn = false
        let t = rig.connect()
        rig.run(.seconds(11))
        #expect(rig.error(t) == .connectTimedOut && rig.everyTicketFinishedOnce)
        // Every 100 ms, never faster: about a hundred tries in ten seconds.
        #expect((95...101).contains(rig.linksOpened), "\(rig.linksOpened)")
        #expect(rig.session.nextDeadline == nil, "nothing left running")
    }

    @Test func cancelEndsAConnectWaitingForItsLine() throws {
        let rig = ReaderSessionRig()
        rig.linePresent = false
        let t = rig.connect()
        rig.session.cancel(now: rig.now)
        rig.run(.milliseconds(100))
        #expect(rig.error(t) == .canceled && rig.session.phase == .idle && rig.linksOpened == 0)
    }

    // MARK: Payments

    @Test func aPaymentIsApprovedAndRefundedByItsApprovalCode() throws {
        let rig = try connected()
        let sale = rig.pay("1001", amount: 1050)
        let outcome = try #require(rig.outcome(sale))
        #expect(outcome.result == .approved && outcome.authenticatedByPin && outcome.maskedPAN == "411111******1111")
        let code = try #require(outcome.approvalCode)
        #expect(rig.states.suffix(3) == [.interaction, .authorizing, .finished])
        #expect(rig.events.contains { if case .report(.receipt) = $0 { return true }; return false })
        let refund = rig.call { $0.pay($1, type: .refund, amountMinor: 500, currency: .eur, transactionID: "1002", original: code, now: rig.now) }
        #expect(rig.outcome(refund)?.result == .approved)
        let tooMuch = rig.call { $0.pay($1, type: .refund, amountMinor: 600, currency: .eur, transactionID: "1003", original: code, now: rig.now) }
        #expect(rig.outcome(tooMuch)?.result == .declined || rig.error(tooMuch) != nil, "more than what is left of the original")
        #expect(rig.everyTicketFinishedOnce)
    }

    @Test func declinesWrongPINBusyAndAnAbortWhileWaitingForTheCard() throws {
        let rig = try connected()
        let declined = rig.pay("2001", amount: 105)
        #expect(rig.outcome(declined)?.result == .declined && rig.outcome(declined)?.responseCode == "05")
        let wrongPIN = rig.pay("2002", amount: 200, pin: "9999")
        #expect(rig.outcome(wrongPIN)?.responseCode == "55")
        // Waiting for a card: a second call is busy and changes nothing; cancel aborts.
        let waiting = rig.call { $0.pay($1, type: .normal, amountMinor: 300, currency: .eur, transactionID: "2003", now: rig.now) }
        #expect(rig.result(waiting) == nil && rig.session.state == .interaction)
        let second = rig.call { $0.pay($1, type: .normal, amountMinor: 300, currency: .eur, transactionID: "2004", now: rig.now) }
        #expect(rig.error(second) == .busy && rig.session.state == .interaction)
        rig.session.cancel(now: rig.now)
        rig.pump()
        #expect(rig.error(waiting) == .canceled && rig.everyTicketFinishedOnce)
        // Refused before anything is sent: amounts, currencies, transaction IDs.
        let zero = rig.call { $0.pay($1, type: .normal, amountMinor: 0, currency: .eur, transactionID: "2005", now: rig.now) }
        let odd = rig.call { $0.pay($1, type: .normal, amountMinor: 100, currency: Currency(code: "XXX", numeric: "999", exponent: 2), transactionID: "2006", now: rig.now) }
        let badID = rig.call { $0.pay($1, type: .normal, amountMinor: 100, currency: .eur, transactionID: "no spaces allowed", now: rig.now) }
        #expect(rig.error(zero) == .invalidAmount && rig.error(odd) == .unsupportedCurrency && rig.error(badID) == .invalidTransactionID)
    }

    @Test func aSignatureIsSubmittedAndARefusedSignatureReversesThePayment() throws {
        let rig = try connected()
        let signed = rig.pay("3001", amount: 2000, cvm: "Signature", pin: nil)
        #expect(rig.outcome(signed)?.signatureRequired == true && rig.session.state == .signature)
        let notAnImage = rig.call { $0.submitSignature($1, image: [1, 2, 3], format: 1) }
        #expect(rig.error(notAnImage) == .invalidSignatureImage && rig.session.state == .signature)
        let submitted = rig.call { $0.submitSignature($1, image: [0x42, 0x4D] + [UInt8](repeating: 7, count: 64), format: 1) }
        #expect(rig.result(submitted) == .success(.done) && rig.session.state == .finished)

        let refused = rig.pay("3002", amount: 2500, cvm: "Signature", pin: nil)
        #expect(rig.outcome(refused)?.signatureRequired == true)
        let busy = rig.pay("3003", amount: 100)
        #expect(rig.error(busy) == .busy, "a payment waiting for its signature holds the reader")
        let reversed = rig.call { $0.declineSignature($1, now: rig.now) }
        #expect(rig.outcome(reversed)?.result == .reversed && rig.session.state == .finished && rig.everyTicketFinishedOnce)
    }

    @Test func aReversalOfThisSessionsPayment() throws {
        let rig = try connected()
        let sale = try #require(rig.outcome(rig.pay("4001", amount: 700)))
        let reversed = rig.call { $0.reverse($1, sale, now: rig.now) }
        #expect(rig.outcome(reversed)?.result == .reversed)
        let twice = rig.call { $0.reverse($1, sale, now: rig.now) }
        guard case .failure(let e)? = rig.result(twice) else { Issue.record("a second reversal went through"); return }
        #expect(e.detail.contains("AlreadyReversed"), "a reversal reverses once")
    }

    @Test func aHostRelayedAuthorisationAskedOfTheAppAndDeclinedByIt() throws {
        // The terminal routes by its own choice; the relay path is the session's either way:
        // an authorisation the reader hands the host goes as sent, or is declined by the app.
        let rig = try connected()
        rig.submitsRelays = false
        let request: JSONValue = ["Type": "Authorise", "KSN": "FFFF0000000000000001", "AmountMinor": 100, "CurrencyNumeric": "978"]
        let answers = rig.feedTransmit(request)
        #expect(answers.first.flatMap { PaymentResponseStatus(json: $0.body["Response"]) }?.errorCondition == .aborted)
    }

    @Test func aRelayGoesAsSentAndMoreThanFourWaitingAreRefused() throws {
        let rig = try connected()
        rig.holdsRelays = true
        let request: JSONValue = ["Type": "Ping"]
        for _ in 0..<6 { _ = rig.feedTransmit(request) }
        #expect(rig.heldRelays.count == 4 && rig.session.relaysRefused == 2 && rig.session.relaysInFlight == 4)
        // The gateway's answer goes back to the reader as it came.
        let first = try #require(rig.heldRelays.first)
        rig.session.relayAnswered(first.id, .answer(Array("{\"Type\":\"Pong\"}".utf8)), now: rig.now)
        let answer = rig.session.takeOutputs().compactMap { o -> PaymentMessage? in
            guard case .send(_, let frame) = o else { return nil }
            var d = PaymentFrameDecoder()
            return ((try? d.feed(frame)) ?? []).compactMap { try? PaymentMessage.decode($0) }.first
        }.first
        #expect(answer?.body["Message"]?.string.flatMap(Base64.decode) == Array("{\"Type\":\"Pong\"}".utf8))
        // The link's going forgets what waited on it: the next link's relays are not refused.
        rig.dropLine()
        #expect(rig.session.relaysInFlight == 0)
    }

    // MARK: A stand-in on the line

    /// A payment held at the gateway, the line dropped, and a stand-in on it that has heard the
    /// reconnect's login (and not answered it yet).
    func standInAfterADrop(_ rig: ReaderSessionRig, paying id: String) throws -> (sale: Int, login: PaymentMessage) {
        rig.holdsGateway = true
        let sale = rig.pay(id, amount: 1500)
        rig.standIn = true
        rig.dropLine()
        rig.run(.milliseconds(10))
        return (sale, try #require(rig.standInHeard.first { $0.header.category == .login }))
    }

    @Test func aStandInThatHasNotLoggedUsInCannotReportAPaymentOrAnythingElse() throws {
        let rig = try connected()
        let (sale, login) = try standInAfterADrop(rig, paying: "9101")
        // Before answering the login it claims the payment, prints, and asks for a relay.
        let approved: JSONValue = ["Response": ["Result": "Success"], "PaymentResult": ["PaymentAcquirerData": ["ApprovalCode": "999999"]]]
        for sid in 1...4 { rig.fromStandIn(.payment, type: .response, identifier: String(sid), body: approved) }
        rig.fromStandIn(.print, .device, type: .request, identifier: "7", body: ["PrintOutput": ["OutputContent": ["OutputText": [["Text": "APPROVED"]]]]])
        rig.fromStandIn(.transmit, .device, type: .request, identifier: "8", body: ["Message": .string(Base64.encode(Array("{}".utf8)))])
        #expect(rig.result(sale) == nil && rig.session.relaysInFlight == 0)
        #expect(!rig.events.contains { if case .report(.receipt(let lines)) = $0 { return lines == ["APPROVED"] }; return false })
        // Its login answer fails (it cannot echo what a real reader would, or refuses): the
        // attempt fails and the episode goes on.
        rig.fromStandIn(.login, type: .response, identifier: login.header.identifier ?? "", body: ["Response": ["Result": "Failure", "ErrorCondition": "Refusal"]])
        #expect(rig.reconnectsFailed == 0)
        // The real reader comes back: the payment's own result, recovered once.
        rig.standIn = false
        rig.holdsGateway = false
        rig.releaseGateway()
        rig.run(.seconds(2))
        let outcome = try #require(rig.outcome(sale))
        #expect(outcome.recovered && outcome.approvalCode != "999999" && rig.everyTicketFinishedOnce)
    }

    @Test func aStandInThatCannotProveTheBondIsRefusedAfterItsLogin() throws {
        var c = TerminalCore.Configuration()
        c.requiresPairing = true
        let rig = ReaderSessionRig(terminal: c)
        let reader = DiscoveredReader(path: rig.path, peripheralUUID: "7D4F2C1A-0B3E-4F5A-9C8D-112233445566", name: "SIM", serialNumber: "SIM-00000001",
                                      rssi: nil, requiresPairing: true)
        rig.bonds[reader.peripheralUUID] = [UInt8](repeating: 0x5A, count: 16)
        rig.standIn = true
        let t = rig.connect(peripheral: reader)
        let login = try #require(rig.standInHeard.first { $0.header.category == .login })
        #expect(login.body["Ext"]?["Bond"]?["Proof"]?.string != nil)
        rig.fromStandIn(.login, type: .response, identifier: login.header.identifier ?? "", body: [
            "Response": ["Result": "Success"], "Ext": ["Bond": ["Proof": .string(String(repeating: "00", count: 32))]]])
        #expect(rig.error(t) == .readerLoginFailed && rig.standInLink == nil && rig.session.info == nil)
    }

    @Test func aLinkLostOrCanceledDuringTheLoginEndsTheConnectOnce() throws {
        let rig = ReaderSessionRig()
        rig.standIn = true
        let canceled = rig.connect()
        #expect(rig.standInHeard.contains { $0.header.category == .login })
        rig.session.cancel(now: rig.now)
        rig.pump()
        #expect(rig.error(canceled) == .canceled && rig.standInLink == nil)

        let lost = rig.connect()
        let id = try #require(rig.standInLink)
        rig.session.linkLost(id, echoTimeout: false, lineLost: false, now: rig.now)
        rig.pump()
        #expect(rig.error(lost) == .connectionLost)

        // A line that hangs up during the login is tried again until the connect timeout.
        let retried = rig.connect()
        for _ in 0..<3 {
            guard let id = rig.standInLink else { break }
            rig.standInLink = nil
            rig.session.linkLost(id, echoTimeout: false, lineLost: true, now: rig.now)
            rig.run(.milliseconds(150))
        }
        #expect(rig.result(retried) == nil && rig.linksOpened == 2 + 4)
        rig.run(.seconds(11))
        #expect(rig.error(retried) == .connectTimedOut && rig.everyTicketFinishedOnce)
    }

    @Test func aReaderThatNeverAnswersTheLoginCostsOneAttemptNotTheEpisode() throws {
        let rig = ReaderSessionRig()
        var settings = rig.settings
        settings.reconnectTimeout = .seconds(60)
        #expect(rig.result(rig.connect(settings: settings)) == .success(.done))
        rig.standIn = true
        rig.dropLine()
        rig.run(.milliseconds(10))
        #expect(rig.standInHeard.contains { $0.header.category == .login })
        rig.run(.seconds(3))
        #expect(rig.reconnectsSucceeded == 0 && rig.linksOpened == 2, "the attempt waits for its login answer")
        // The real reader is back; the stand-in's silence ends its attempt at the connect timeout.
        rig.standIn = false
        rig.run(.seconds(12))
        #expect(rig.reconnectsSucceeded == 1 && rig.reconnectsFailed == 0 && rig.session.isConnected)
    }

    @Test func aReaderThatStopsAnsweringEndsRebootDiagnosisAndUpdateCallsInTime() throws {
        let rig = try connected()
        rig.terminalDeaf = true
        let diagnosis = rig.call { $0.diagnose($1, host: false, now: rig.now) }
        let reboot = rig.call { $0.reboot($1, now: rig.now) }
        rig.run(.seconds(29))
        #expect(rig.result(diagnosis) == nil && rig.result(reboot) == nil)
        rig.run(.seconds(2))
        #expect(rig.error(diagnosis) == .connectionLost && rig.error(reboot) == .connectionLost && rig.session.isConnected)

        // A reboot cut off by the link's loss (no Shutdown first) is not a reboot.
        rig.terminalDeaf = false
        let cut = rig.call { $0.reboot($1, now: rig.now) }
        #expect(rig.result(cut) == .success(.done), "answered before it went")
        let again = try connected()
        again.terminalDeaf = true
        let unanswered = again.call { $0.reboot($1, now: again.now) }
        again.dropLine()
        #expect(again.error(unanswered) == .connectionLost)

        // A required update the reader never starts: the connect ends when nothing moved for
        // two minutes, not never.
        let (gateway, key) = try Self.update(version: "3.0.0", size: 9000, required: true)
        let stuck = ReaderSessionRig(gateway: gateway, updatePublicKey: key)
        stuck.adminDeaf = true
        let t = stuck.connect()
        stuck.session.cancel(now: stuck.now)
        stuck.run(.seconds(119))
        #expect(stuck.result(t) == nil && stuck.session.state == .connecting)
        stuck.run(.seconds(2))
        #expect(stuck.error(t) == .updateIntegrity && stuck.session.phase == .idle && stuck.everyTicketFinishedOnce)
    }

    // MARK: Reconnects

    @Test func aDropMidAuthorisationIsRecoveredOnceWithTransactionStatus() throws {
        let rig = try connected()
        rig.holdsGateway = true
        let sale = rig.pay("5001", amount: 1200)
        #expect(rig.heldGatewayRequests.count == 1 && rig.session.state == .authorizing)
        rig.dropLine()
        #expect(rig.reconnectsStarted == 1 && rig.result(sale) == nil)
        // The gateway answers the terminal meanwhile; the host is away.
        rig.holdsGateway = false
        rig.releaseGateway()
        rig.run(.seconds(1))
        let outcome = try #require(rig.outcome(sale))
        #expect(outcome.result == .approved && outcome.recovered && outcome.approvalCode != nil)
        #expect(rig.reconnectsStarted == 1 && rig.reconnectsSucceeded == 1 && rig.reconnectsFailed == 0)
        #expect(rig.everyTicketFinishedOnce && rig.session.state == .finished && rig.session.isConnected)
    }

    /// Connected with a 2 s recovery limit, a payment in flight, the line dropped, and a
    /// stand-in that logged the host in answering for the reader.
    func recoveringFromAStandIn() throws -> (ReaderSessionRig, sale: Int) {
        let rig = ReaderSessionRig()
        var settings = rig.settings
        settings.recoveryLimit = .seconds(2)
        let t = rig.connect(settings: settings)
        guard case .success(.done)? = rig.result(t) else { throw PaymentError(.connectTimedOut) }
        let (sale, login) = try standInAfterADrop(rig, paying: "5002")
        rig.fromStandIn(.login, type: .response, identifier: login.header.identifier ?? "", body: ["Response": ["Result": "Success"]])
        #expect(rig.reconnectsSucceeded == 1)
        return (rig, sale)
    }

    func heard(_ rig: ReaderSessionRig, _ category: PaymentMessage.Category) -> [PaymentMessage] {
        rig.standInHeard.filter { $0.header.category == category }
    }

    @Test func aReaderThatSaysInProgressForEverHasThePaymentAbortedAndItsOutcomeUnknown() throws {
        let (rig, sale) = try recoveringFromAStandIn()
        // Every status check (one per 50 ms at this backoff scale) is answered InProgress.
        var answered = 0
        while rig.result(sale) == nil && rig.now < .seconds(10) {
            for check in heard(rig, .transactionStatus).dropFirst(answered) {
                answered += 1
                rig.fromStandIn(.transactionStatus, type: .response, identifier: check.header.identifier ?? "",
                                body: ["Response": PaymentResponseStatus.failure(.inProgress, [("message", "Uncompleted transaction")]).json])
            }
            rig.run(.milliseconds(10))
        }
        #expect(rig.error(sale) == .unknownOutcome, "not connectionLost: it may have been charged")
        #expect(rig.now >= .seconds(2) && rig.now < .seconds(3) && answered >= 30, "the limit, not sooner (\(answered) checks)")
        let abort = try #require(heard(rig, .abort).first, "the reader is asked to abort it")
        let checked = try #require(heard(rig, .transactionStatus).first)
        #expect(abort.body["MessageReference"]?["ServiceID"] == checked.body["MessageReference"]?["ServiceID"])
        let checks = heard(rig, .transactionStatus).count
        rig.run(.seconds(5))
        #expect(heard(rig, .transactionStatus).count == checks, "no check after giving up")
        #expect(rig.everyTicketFinishedOnce)
    }

    @Test func aReaderThatNeverAnswersTheCheckCannotHoldThePaymentEither() throws {
        let (rig, sale) = try recoveringFromAStandIn()
        #expect(heard(rig, .transactionStatus).count == 1)
        rig.run(.seconds(29))
        #expect(rig.result(sale) == nil, "the check's answer is awaited 30 s")
        rig.run(.seconds(2))
        #expect(rig.error(sale) == .unknownOutcome && heard(rig, .abort).count == 1 && rig.everyTicketFinishedOnce)
    }

    @Test func aReconnectStormIsOneEpisodePerDropAndEndsConnected() throws {
        let rig = try connected()
        for round in 1...50 {
            rig.dropLine(echoTimeout: round % 2 == 0)
            // Some attempts fail as the line hangs up again while they open.
            rig.refusesOpens = round % 5
            rig.run(.seconds(1))
            #expect(rig.reconnectsStarted == round && rig.reconnectsSucceeded == round, "round \(round)")
        }
        #expect(rig.reconnectsFailed == 0 && rig.session.isConnected && rig.session.nextDeadline == nil)
        let reasons = rig.events.compactMap { if case .reconnectStarted(_, let r) = $0 { return r }; return nil }
        #expect(reasons.filter { $0 == .linkTimeout }.count == 25 && reasons.filter { $0 == .unknown }.count == 25)
        #expect(rig.outcome(rig.pay("6001", amount: 100))?.result == .approved)
    }

    @Test func dropsDuringTheRecoveryItselfStillFinishThePaymentOnce() throws {
        let rig = try connected()
        rig.holdsGateway = true
        let sale = rig.pay("6101", amount: 900)
        rig.dropLine()
        // Every reconnect is lost again before the TransactionStatus answer can come.
        for _ in 0..<5 {
            rig.run(.milliseconds(5))
            rig.dropLine()
        }
        rig.holdsGateway = false
        rig.releaseGateway()
        rig.run(.seconds(2))
        #expect(rig.outcome(sale)?.recovered == true && rig.everyTicketFinishedOnce)
        #expect(rig.reconnectsStarted == rig.reconnectsSucceeded + rig.reconnectsFailed)
    }

    @Test func aReconnectThatTimesOutFailsThePaymentInFlightOnce() throws {
        let rig = try connected()
        rig.holdsGateway = true
        let sale = rig.pay("7001", amount: 800)
        rig.terminalOn = false
        rig.dropLine()
        rig.run(.seconds(6))
        #expect(rig.error(sale) == .reconnectTimeout && rig.reconnectsStarted == 1 && rig.reconnectsFailed == 1 && rig.reconnectsSucceeded == 0)
        #expect(rig.session.state == .failed(.reconnectTimeout) && rig.session.phase == .idle && rig.everyTicketFinishedOnce)
        let tries = rig.linksOpened
        rig.run(.seconds(10))
        #expect(rig.linksOpened == tries, "nothing tries after the episode ended")
    }

    @Test func aCanceledReconnectEndsOnceAndTriesNoMore() throws {
        let rig = try connected()
        rig.terminalOn = false
        rig.dropLine()
        let episode = try #require(rig.events.compactMap { if case .reconnectStarted(let e, _) = $0 { return e }; return nil }.first)
        rig.run(.milliseconds(50))
        rig.session.cancelReconnect(episode: episode + 1, now: rig.now)
        rig.pump()
        #expect(rig.reconnectsFailed == 0, "another episode's cancel does nothing")
        rig.session.cancelReconnect(episode: episode, now: rig.now)
        rig.session.cancelReconnect(episode: episode, now: rig.now)
        rig.pump()
        #expect(rig.reconnectsFailed == 1 && rig.session.phase == .idle)
        let tries = rig.linksOpened
        rig.terminalOn = true
        rig.run(.seconds(10))
        #expect(rig.linksOpened == tries)
    }

    @Test func aRebootAndALowBatteryEachEndTheSessionTheirOwnWay() throws {
        let rig = try connected()
        let reboot = rig.call { $0.reboot($1, now: rig.now) }
        #expect(rig.result(reboot) == .success(.done))
        #expect(rig.events.contains(.disconnected(.rebootRequested)) && rig.reconnectsStarted == 0)
        rig.run(.seconds(5))
        #expect(rig.linksOpened == 1, "a reboot the app asked for is not reconnected")

        let low = try connected()
        _ = TerminalControlCommands.handle(core: low.terminal, ["cmd": "setBattery", "level": .number("0.01")], now: low.now)
        low.pump()
        #expect(low.events.contains(.reconnectStarted(episode: 1, reason: .criticallyLowBattery)))
        low.run(.seconds(6))
        #expect(low.reconnectsFailed == 1 && low.session.phase == .idle)
    }

    @Test func disconnectLogsOutAndNothingReconnects() throws {
        let rig = try connected()
        rig.session.disconnect(now: rig.now)
        rig.pump()
        #expect(rig.events.contains(.disconnected(.disconnectRequested)) && rig.connectedLink == nil && rig.session.phase == .idle)
        #expect(rig.requestsHeard.last == .logout, "the reader heard the logout before the link went")
        rig.run(.seconds(5))
        #expect(rig.linksOpened == 1 && rig.reconnectsStarted == 0)
        #expect(rig.error(rig.pay("8001")) == .notConnected)
    }

    // MARK: Updates

    static func update(version: String, size: Int, required: Bool) throws -> (GatewayCore.Configuration, [UInt8]) {
        let signingKey = try SecureBytes.random(32)
        let image = try SecureBytes.random(size)
        let sha = Hex.encode(Digest.hash(.sha256, image) ?? [])
        let requiredAt: WallTime? = required ? WallTime(seconds: 1_000_000_000) : nil
        let signed = UpdateOffer.signedString(version: version, sha256: sha, size: size, requiredAt: requiredAt)
        let offer = UpdateOffer(version: version, requiredAt: requiredAt, size: size, sha256: sha,
                                signature: Hex.encode(try Ed25519.sign(privateKey: signingKey, Array(signed.utf8))))
        var c = GatewayCore.Configuration.testKeys
        c.update = (offer, image)
        return (c, try Ed25519.publicKey(privateKey: signingKey))
    }

    @Test func anOptionalUpdateInstallsThroughASilentRestart() throws {
        let (gateway, key) = try Self.update(version: "1.1.0", size: 20_000, required: false)
        let rig = try connected(ReaderSessionRig(gateway: gateway, updatePublicKey: key))
        #expect(rig.events.contains(.updateAvailable(ReaderSoftwareUpdate(deviceSoftwareVersion: "1.1.0", durationEstimate: "lessThanOneMinute",
                                                                           requiredAt: nil, size: 20_000))))
        let install = rig.call { $0.installAvailableUpdate($1, now: rig.now) }
        rig.run(.seconds(5))
        #expect(rig.result(install) == .success(.done) && rig.session.info?.softwareVersion == "1.1.0")
        let progress = rig.events.compactMap { if case .installProgress(let p) = $0 { return p }; return nil }
        #expect(progress.first == 0 && progress.last == 1 && progress == progress.sorted())
        #expect(rig.reconnectsStarted == 0, "the restart into the new version is not the app's business")
        #expect(rig.count { if case .installFinished(_, nil) = $0 { return true }; return false } == 1)
    }

    @Test func aRequiredUpdateInstallsBeforeTheConnectReturnsAndCancelingItFailsTheConnect() throws {
        let (gateway, key) = try Self.update(version: "2.0.0", size: 9000, required: true)
        let rig = ReaderSessionRig(gateway: gateway, updatePublicKey: key)
        let t = rig.connect()
        #expect(rig.result(t) == nil && rig.session.state == .connecting)
        rig.run(.seconds(5))
        #expect(rig.result(t) == .success(.done) && rig.session.info?.softwareVersion == "2.0.0" && rig.session.state == .ready)

        let (gateway2, key2) = try Self.update(version: "2.0.0", size: 200_000, required: true)
        let canceled = ReaderSessionRig(gateway: gateway2, updatePublicKey: key2)
        canceled.holdsGateway = true
        let u = canceled.connect()
        canceled.releaseGateway()
        canceled.session.cancel(now: canceled.now)
        canceled.holdsGateway = false
        canceled.releaseGateway()
        canceled.run(.seconds(5))
        #expect(canceled.error(u) == .unsupportedReaderVersion && canceled.session.phase == .idle && canceled.everyTicketFinishedOnce)
    }

    // MARK: Pairing

    @Test func pairingByPasskeyThenTheBondOnEveryReconnect() throws {
        var c = TerminalCore.Configuration()
        c.requiresPairing = true
        let rig = ReaderSessionRig(terminal: c)
        let reader = DiscoveredReader(path: rig.path, peripheralUUID: "7D4F2C1A-0B3E-4F5A-9C8D-112233445566", name: "SIM", serialNumber: "SIM-00000001",
                                      rssi: nil, requiresPairing: true)
        var settings = rig.settings
        let refused = rig.connect(peripheral: reader, settings: settings)
        #expect(rig.error(refused) == .pairingRequired && rig.linksOpened == 0, "no bond and no autoPair: not even a link")
        settings.autoPair = true
        rig.confirmsPasskey = false
        let rejected = rig.connect(peripheral: reader, settings: settings)
        #expect(rig.error(rejected) == .pairingRejected && rig.bonds.isEmpty)
        rig.confirmsPasskey = true
        let paired = rig.connect(peripheral: reader, settings: settings)
        #expect(rig.result(paired) == .success(.done) && rig.bonds[reader.peripheralUUID]?.count == 16)
        #expect(rig.passkeysShown.count == 2 && rig.passkeysShown.allSatisfy { $0.utf8.count == 6 })
        // The bond, not a new pairing, on every reconnect.
        rig.dropLine()
        rig.run(.seconds(1))
        #expect(rig.reconnectsSucceeded == 1 && rig.passkeysShown.count == 2)
    }
}

extension ReaderSessionRig {
    /// The reader asks the host to relay `request`; returns what the host answered the reader.
    func feedTransmit(_ request: JSONValue) -> [PaymentMessage] {
        guard let id = connectedLink else { return [] }
        var answers: [PaymentMessage] = []
        let h = PaymentMessage.Header(protocolVersion: nil, messageClass: .device, category: .transmit, type: .request,
                                      identifier: "901", saleID: "HOST-1", poiID: "SIM-00000001")
        let message = PaymentMessage(direction: .request, header: h, body: ["Message": .string(Base64.encode(request.serialized)), "MaximumTransmitTime": 5])
        session.received(id, (try? PaymentFrame.encode(message.encoded)) ?? [], now: now)
        var holding = true
        while holding {
            holding = false
            for o in session.takeOutputs() {
                if case .send(_, let frame) = o {
                    var d = PaymentFrameDecoder()
                    answers += ((try? d.feed(frame)) ?? []).compactMap { try? PaymentMessage.decode($0) }
                } else {
                    holding = true
                    hostOutput(o)
                }
            }
        }
        return answers
    }
}
