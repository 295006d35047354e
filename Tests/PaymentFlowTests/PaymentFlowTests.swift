import Channel
import ChannelTestSupport
import Crypto
import Glibc
import NetStack
import Payment
@testable import PaymentKit
import Testing

/// End to end over the real stack: terminal simulator ↔ PPP on a pty ↔ channel ↔ host SDK, the
/// terminal reaching the gateway through the channel's SOCKS proxy. The time limits are wide
/// because the VM interop suites hold test-runner threads while their guests boot; each world's
/// own event loop keeps its timers exact meanwhile.
@Suite(.serialized, .timeLimit(.minutes(10))) struct PaymentFlowTests {
    @Test func approvedPaymentCarriesNoClearCardDataAnywhere() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        #expect(world.reader.info?.serialNumber == "SIM-00000001")
        #expect(world.reader.info?.locationID == "tml_test_1")
        try world.presentCard()
        let outcome = try await world.reader.startPayment(amount: "10.50", currency: .eur, transactionID: "0001ABC")
        #expect(outcome.result == .approved)
        let code = try #require(outcome.approvalCode)
        let operation = try #require(outcome.operationID)
        #expect(code.utf8.count == 6 && code.allSatisfy(\.isNumber))
        #expect(operation.hasPrefix("OP-") && operation.utf8.count == 19)
        #expect(outcome.amountMinor == 1050 && outcome.authenticatedByPin)
        #expect(outcome.maskedPAN == "411111******1111")
        #expect(world.reader.state == .finished)
        #expect(world.gateway.log.contains { $0.contains("0001ABC Normal 1050 978 → approved 00 \(operation)") })
        await world.shutdown(keepFiles: true)
        let capture = world.contents(world.pcapPath)
        world.removeFiles()

        // Nothing that crossed carries the PAN: not the PPP link's capture, not the bytes the
        // host, the reader service or the gateway saw.
        let pan = Array("4111111111111111".utf8)
        func contains(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
            guard hay.count >= needle.count else { return false }
            return (0...(hay.count - needle.count)).contains { Array(hay[$0..<($0 + needle.count)]) == needle }
        }
        let sdk = world.reader.recorded, reader = world.terminal.readerBytes, gw = world.gateway.recorded
        #expect(sdk.count > 500 && reader.count > 500 && gw.count > 200)
        #expect(contains(reader, Array("411111******1111".utf8)), "the masked PAN is what the host sees")
        #expect(capture.count > 2000, "the PPP link's capture")
        #expect(contains(capture, Array("SaleToPOIRequest".utf8)), "the capture holds the reader protocol")
        for (name, bytes) in [("sdk", sdk), ("reader", reader), ("gateway", gw), ("pcap", capture)] {
            #expect(!contains(bytes, pan), "clear PAN in \(name) bytes")
        }
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct PaymentScenarioTests {
    @Test func declinesWrongPINAndAmountRules() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        try world.presentCard()
        let declined = try await world.reader.startPayment(amountMinor: 105, currency: .eur, transactionID: "0002")
        #expect(declined.result == .declined && declined.responseCode == "05" && declined.approvalCode == nil)
        #expect(world.reader.state == .finished)
        try world.presentCard(pin: "9999")
        let wrongPIN = try await world.reader.startPayment(amountMinor: 200, currency: .eur, transactionID: "0003")
        #expect(wrongPIN.result == .declined && wrongPIN.responseCode == "55" && !wrongPIN.authenticatedByPin)
        // Rejected before anything is sent.
        await #expect(throws: PaymentError(.invalidAmount, "\"10.505\" is not an amount in EUR (2 decimals)")) {
            _ = try await world.reader.startPayment(amount: "10.505", currency: .eur, transactionID: "0004")
        }
        await #expect(throws: PaymentError(.invalidAmount, "0")) {
            _ = try await world.reader.startPayment(amountMinor: 0, currency: .eur, transactionID: "0004")
        }
        do {
            _ = try await world.reader.startPayment(amountMinor: 100, currency: .eur, transactionID: "0003")
            Issue.record("a duplicate transaction ID was accepted")
        } catch {
            #expect(error.code == .invalidTransactionID)
        }
        // JPY has no decimals; the terminal and gateway take it in whole yen.
        try world.presentCard()
        let yen = try await world.reader.startPayment(amount: "1050", currency: .jpy, transactionID: "0005")
        #expect(yen.result == .approved && yen.amountMinor == 1050)
        await world.shutdown()
    }

    @Test func signatureCapturedOrDeclinedIntoAReversal() async throws {
        let world = try PaymentWorld()
        // The merchant logs in through the SDK: its session is what the signature goes with.
        try await world.reader.login(gateway: world.gateway.endpoint!, environment: "int", licence: "LIC-TEST-0001", user: "merchant", password: "secret")
        #expect(world.configuration.sessionToken == nil)
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        try world.presentCard(cvm: "Signature", pin: nil)
        let first = try await world.reader.startPayment(amountMinor: 2000, currency: .eur, transactionID: "1001")
        #expect(first.result == .approved && first.signatureRequired)
        #expect(world.reader.state == .signature)
        // A second operation is refused while the signature is pending.
        do {
            _ = try await world.reader.startPayment(amountMinor: 100, currency: .eur, transactionID: "1002")
            Issue.record("busy not reported")
        } catch { #expect(error.code == .busy) }
        // A JPEG declared as a GIF is refused by the SDK; the real GIF is accepted by the gateway.
        let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF, 0xE0] + [UInt8](repeating: 1, count: 100)
        do {
            try await world.reader.submitSignature(image: jpeg, format: 4)
            Issue.record("mismatched signature accepted")
        } catch { #expect(error.code == .invalidSignatureImage) }
        try await world.reader.submitSignature(image: jpeg, format: 2)
        #expect(world.reader.state == .finished)
        #expect(world.gateway.log.contains { $0.hasPrefix("Signature OP-") && $0.hasSuffix("format 2)") })

        try world.presentCard(cvm: "Signature", pin: nil)
        let second = try await world.reader.startPayment(amountMinor: 3000, currency: .eur, transactionID: "1003")
        #expect(second.signatureRequired)
        let reversed = try await world.reader.declineSignature()
        #expect(reversed.result == .reversed)
        #expect(world.gateway.log.contains { $0 == "Reverse \(second.operationID!) ok" })
        await world.shutdown()
    }

    @Test func locationEnvironmentDiagnosisCanceledUpdateAndLowBattery() async throws {
        let world = try PaymentWorld(update: .init(required: false, size: 400_000))
        world.configuration.reconnectTimeout = .seconds(1)
        try await world.login()
        // A location id that breaks the rule is refused before anything crosses the line.
        var badLocation = world.configuration
        badLocation.locationID = "not a location"
        do {
            try await world.reader.connect(path: world.linkPath, configuration: badLocation)
            Issue.record("connected with an invalid location id")
        } catch { #expect(error.code == .invalidLocationId) }
        #expect(world.terminal.readerBytes.isEmpty)
        // A reader holding test keys does not log in to the production environment.
        var production = world.configuration
        production.environment = "real"
        do {
            try await world.reader.connect(path: world.linkPath, configuration: production)
            Issue.record("test keys logged in to production")
        } catch { #expect(error.code == .environmentMismatch) }

        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        let diagnosis = try await world.reader.diagnose(host: true)
        #expect(diagnosis["POIStatus"]?["GlobalStatus"]?.string == "OK", "\(diagnosis.text)")
        // The optional update cancelled as it starts: 2009, the old version kept, still connected.
        world.recorder.shouldCancelUpdate = true
        do {
            try await world.reader.installAvailableUpdate()
            Issue.record("a cancelled update installed")
        } catch { #expect(error.code == .updateCanceled) }
        #expect(world.recorder.count("finishInstalling 2009") == 1)
        #expect(try world.command(["cmd": "status"])["version"]?.string == "1.0.0")
        #expect(await world.eventually("connected after the cancelled update") { world.reader.isConnected })

        // A critically low battery switches the reader off: an unexpected disconnect, so the
        // SDK tries to reconnect, once, and gives up at the timeout.
        #expect(try world.command(["cmd": "setBattery", "level": .number("0.03")])["ok"]?.bool == true)
        #expect(await world.eventually("reconnect started") { world.recorder.count("didStartReconnect criticallyLowBattery") == 1 })
        #expect(await world.eventually("reconnect failed") { world.recorder.count("didFailReconnect") == 1 })
        #expect(world.recorder.count("didSucceedReconnect") == 0)
        await world.shutdown()
    }

    @Test func refundByOperationOrAuthorisationCode() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        try world.presentCard()
        let sale = try await world.reader.startPayment(amountMinor: 5000, currency: .eur, transactionID: "2001")
        let refund = try await world.reader.startRefund(amountMinor: 2000, currency: .eur, transactionID: "2002", originalOperationID: sale.operationID!)
        #expect(refund.result == .approved && refund.approvalCode != nil && refund.approvalCode != sale.approvalCode)
        do {
            _ = try await world.reader.startRefund(amountMinor: 3001, currency: .eur, transactionID: "2003", originalOperationID: sale.operationID!)
            Issue.record("refund above the original accepted")
        } catch { #expect(error.code == .refundExceedsOriginal) }
        do {
            _ = try await world.reader.startRefund(amountMinor: 1, currency: .eur, transactionID: "2004", originalOperationID: "OP-424242")
            Issue.record("refund of an unknown operation accepted")
        } catch { #expect(error.code == .originalNotFound) }
        // By the authorisation code on the receipt: what remains, and not a cent more.
        let saleCode = try #require(sale.approvalCode)
        let byCode = try await world.reader.startRefund(amountMinor: 3000, currency: .eur, transactionID: "2005", originalOperationID: saleCode)
        #expect(byCode.result == .approved)
        do {
            _ = try await world.reader.startRefund(amountMinor: 1, currency: .eur, transactionID: "2006", originalOperationID: saleCode)
            Issue.record("a refund beyond the original accepted")
        } catch { #expect(error.code == .refundExceedsOriginal) }
        do {
            _ = try await world.reader.startRefund(amountMinor: 1, currency: .eur, transactionID: "2007", originalOperationID: saleCode == "424242" ? "424243" : "424242")
            Issue.record("a refund of an unknown authorisation code accepted")
        } catch { #expect(error.code == .originalNotFound) }
        await world.shutdown()
    }

    @Test func busyAndCancelDuringInteraction() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        let first = Task { try await world.reader.startPayment(amountMinor: 700, currency: .eur, transactionID: "3001") }
        #expect(await world.eventually("interaction") { world.reader.state == .interaction })
        do {
            _ = try await world.reader.startPayment(amountMinor: 100, currency: .eur, transactionID: "3002")
            Issue.record("busy not reported")
        } catch { #expect(error.code == .busy) }
        #expect(world.reader.state == .interaction, "the first payment is unaffected")
        try world.presentCard()
        #expect(try await first.value.result == .approved)

        let second = Task { try await world.reader.startPayment(amountMinor: 800, currency: .eur, transactionID: "3003") }
        #expect(await world.terminalPhase("WaitingForCard"))
        world.reader.cancel()
        do {
            _ = try await second.value
            Issue.record("cancel did not end the payment")
        } catch let e as PaymentError { #expect(e.code == .canceled) }
        #expect(world.reader.state == .failed(.canceled))
        // The PED's own cancel key too.
        let third = Task { try await world.reader.startPayment(amountMinor: 900, currency: .eur, transactionID: "3004") }
        #expect(await world.terminalPhase("WaitingForCard"))
        #expect(try world.command(["cmd": "pressCancel"])["ok"]?.bool == true)
        do {
            _ = try await third.value
            Issue.record("PED cancel did not end the payment")
        } catch let e as PaymentError { #expect(e.code == .canceled) }
        #expect(!world.gateway.log.contains { $0.contains("3003") || $0.contains("3004") }, "nothing reached the gateway")
        await world.shutdown()
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct ReconnectTests {
    @Test func linkDroppedDuringAuthorisationRecoversTheResultOnce() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        // The terminal goes down the moment the gateway's approval reaches it, before the host
        // hears of it; it is back after 1 s.
        #expect(try world.command(["cmd": "dropLinkAfterAuthorise", "downFor": 1])["ok"]?.bool == true)
        try world.presentCard()
        let outcome = try await world.reader.startPayment(amountMinor: 4200, currency: .eur, transactionID: "4001")
        #expect(outcome.result == .approved && outcome.recovered)
        let recoveredOperation = try #require(outcome.operationID)
        #expect(world.gateway.log.contains { $0.hasSuffix("→ approved 00 \(recoveredOperation)") })
        #expect(world.recorder.count("didStartReconnect") == 1 && world.recorder.count("didSucceedReconnect") == 1)
        #expect(world.recorder.count("didFailReconnect") == 0)
        // Charged once: one authorisation at the gateway.
        #expect(world.gateway.log.filter { $0.hasPrefix("Authorise 4001") }.count == 1)
        // The reader works on after the reconnect.
        try world.presentCard()
        let next = try await world.reader.startPayment(amountMinor: 100, currency: .eur, transactionID: "4002")
        #expect(next.result == .approved && next.approvalCode != outcome.approvalCode)
        await world.shutdown()
    }

    @Test func reconnectAfterAnIdleDrop() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        #expect(try world.command(["cmd": "dropLink", "mode": "rst", "downFor": 1])["ok"]?.bool == true)
        #expect(await world.eventually("reconnected") { world.recorder.count("didSucceedReconnect") == 1 })
        #expect(world.recorder.count("didStartReconnect") == 1 && world.recorder.count("didFailReconnect") == 0)
        #expect(world.reader.isConnected)
        try world.presentCard()
        #expect(try await world.reader.startPayment(amountMinor: 100, currency: .eur, transactionID: "5001").result == .approved)
        await world.shutdown()
    }

    @Test func reconnectCanceledAndTimingOutEachCallOnce() async throws {
        let world = try PaymentWorld()
        world.configuration.reconnectTimeout = .seconds(2)
        try await world.connect()
        // Stays down: the episode times out, once.
        #expect(try world.command(["cmd": "dropLink", "mode": "rst"])["ok"]?.bool == true)
        #expect(await world.eventually("reconnect failed") { world.recorder.count("didFailReconnect") == 1 })
        // A minute on: no second episode starts by itself.
        await world.leap(.seconds(60))
        #expect(world.recorder.count("didStartReconnect") == 1 && world.recorder.count("didFailReconnect") == 1)
        #expect(world.recorder.count("didSucceedReconnect") == 0)
        #expect(!world.reader.isConnected)

        // Power back on, connect again, drop again and cancel the episode at once.
        #expect(try world.command(["cmd": "powerOn"])["ok"]?.bool == true)
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        world.recorder.cancelReconnect = true
        #expect(try world.command(["cmd": "dropLink", "mode": "rst", "downFor": 1])["ok"]?.bool == true)
        #expect(await world.eventually("reconnect canceled") { world.recorder.count("didFailReconnect") == 2 })
        // The terminal is back after its second; a minute on, the canceled episode has not
        // resumed.
        await world.leap(.seconds(60))
        #expect(world.recorder.count("didStartReconnect") == 2 && world.recorder.count("didFailReconnect") == 2)
        #expect(world.recorder.count("didSucceedReconnect") == 0)
        await world.shutdown()
    }

    @Test func paymentInFlightWhenTheReconnectTimesOut() async throws {
        let world = try PaymentWorld()
        world.configuration.reconnectTimeout = .seconds(1)
        try await world.connect()
        let payment = Task { try await world.reader.startPayment(amountMinor: 300, currency: .eur, transactionID: "6001") }
        #expect(await world.terminalPhase("WaitingForCard"))
        #expect(try world.command(["cmd": "dropLink", "mode": "rst"])["ok"]?.bool == true)
        do {
            _ = try await payment.value
            Issue.record("the payment survived a reconnect timeout")
        } catch let e as PaymentError { #expect(e.code == .reconnectTimeout) }
        #expect(world.recorder.count("didStartReconnect") == 1 && world.recorder.count("didFailReconnect") == 1)
        await world.shutdown()
    }

    @Test func cancelStopsAConnectInProgress() async throws {
        let world = try PaymentWorld()
        // Wide: the cancel must come first even when this task waits long for a thread.
        world.configuration.connectTimeout = .seconds(120)
        try await world.login()
        // A terminal that has frozen (its line there, nothing answering) until it is powered on.
        #expect(try world.command(["cmd": "dropLink", "mode": "silent", "downFor": 600])["ok"]?.bool == true)
        let connecting = Task { try await world.reader.connect(path: world.linkPath, configuration: world.configuration) }
        #expect(await world.eventually("connecting") { world.reader.state == .connecting })
        // Some way into the connect: its retries and LCP restarts for the next second have run.
        await world.leap(.seconds(1))
        world.reader.cancel()
        do {
            try await connecting.value
            Issue.record("a cancelled connect completed")
        } catch { #expect((error as? PaymentError)?.code == .canceled) }
        #expect(world.reader.state == .failed(.canceled))
        // Every retry the connect had pending would have fired within ten seconds.
        await world.leap(.seconds(10))
        #expect(!world.reader.isConnected, "nothing adopted after the cancel")
        // Powered on again, the terminal takes a new connect.
        #expect(try world.command(["cmd": "powerOn"])["ok"]?.bool == true)
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        #expect(world.reader.isConnected)
        await world.shutdown()
    }

    @Test func rebootDisconnectsWithoutReconnecting() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        try await world.reader.rebootReader()
        #expect(await world.eventually("disconnect") { world.recorder.count("didDisconnect rebootRequested") == 1 })
        // The terminal is back after its boot; a minute on, still no reconnect.
        await world.leap(.seconds(60))
        #expect(world.recorder.count("didStartReconnect") == 0)
        #expect(!world.reader.isConnected)
        // Reachable again after the reboot: the app reconnects itself.
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        #expect(world.reader.isConnected)
        #expect(world.terminal.boots == 2)
        await world.shutdown()
    }
}

/// What an attacker between the terminal and the gateway (or holding the host) can try.
@Suite(.serialized, .timeLimit(.minutes(10))) struct PaymentAttackTests {
    /// A declined authorisation rewritten into an approval on its way back: the gateway's MAC
    /// no longer matches, the terminal refuses it and the SDK reports 4006, not an approval.
    @Test func forgedApprovalIsRefusedByTheTerminal() async throws {
        let world = try PaymentWorld(relay: .forgeApprovals)
        try await world.connect()
        try world.presentCard()
        do {
            let outcome = try await world.reader.startPayment(amountMinor: 105, currency: .eur, transactionID: "7001")
            Issue.record("a forged answer was delivered: \(outcome)")
        } catch {
            #expect(error.code == .responseMacInvalid)
        }
        let forged = await world.relay?.forged
        #expect(forged == 1, "the relay rewrote the gateway's decline")
        #expect(world.gateway.log.contains { $0.contains("7001 Normal 105 978 → declined 05") })
        #expect(world.reader.state == .failed(.responseMacInvalid))
        // The link and the terminal carry on: an honest approval goes through the same relay.
        try world.presentCard()
        let honest = try await world.reader.startPayment(amountMinor: 1050, currency: .eur, transactionID: "7002")
        let forgedAfter = await world.relay?.forged
        #expect(honest.result == .approved && forgedAfter == 1)
        await world.shutdown()
    }

    /// The SDK reaches the reader through our stack inside the process: nothing listens on the
    /// host. A second connection to the reader port through the same link (the only way there)
    /// is refused unless its Login presents the session's token, and the session goes on.
    @Test func aSecondConnectionCannotDisturbTheReaderSession() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        let port = world.configuration.readerPort
        if case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), timeout: 2) {
            close(fd)
            Issue.record("something listens on 127.0.0.1:\(port)")
        }
        let channel = try #require(world.reader.channel)

        /// Opens a second stream, sends one Login (with `token` in its Ext when given) and
        /// collects what comes back until the terminal ends the stream.
        func intrude(token: String?) async throws -> [PaymentMessage] {
            var ext: JSONValue = ["LocationID": "tml_evil", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001"]
            if let token { ext = ext.setting("ReaderSession", .string(token)) }
            let header = PaymentMessage.Header(protocolVersion: "3.1", messageClass: .service, category: .login, type: .request,
                                               identifier: "1", saleID: "INTRUDER", poiID: "SIM-00000001")
            let frame = try PaymentFrame.encode(PaymentMessage(direction: .request, header: header, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": ext]).encoded)
            let received = Locked<[UInt8]>([]), ended = Locked<Bool>(false)
            let holder = Locked<TerminalStream?>(nil)
            let opened: Bool = await world.loop.perform {
                guard let s = try? channel.openTerminalStream(port: port) else { return false }
                holder.mutate { $0 = s }
                s.onConnected = { s.send(frame) }
                s.onData = { bytes in received.mutate { $0 += bytes } }
                s.onEndOfStream = { ended.mutate { $0 = true } }
                s.onClose = { _ in ended.mutate { $0 = true } }
                return true
            }
            #expect(opened)
            #expect(await world.eventually("the terminal ends the second connection") { ended.value })
            await world.loop.perform { holder.value?.close() }
            var decoder = PaymentFrameDecoder()
            return try decoder.feed(received.value).compactMap { try? PaymentMessage.decode($0) }
        }

        for token in [nil, String(repeating: "0", count: 32)] {
            let answers = try await intrude(token: token)
            let status = PaymentResponseStatus(json: answers.first?.body["Response"])
            #expect(answers.count == 1 && answers.first?.header.category == .login && answers.first?.header.saleID == "INTRUDER")
            #expect(status?.errorCondition == .busy && status?.value("reason") == "SessionInUse", "\(answers.map(\.encoded))")
        }
        let refused = await world.terminal.loop.perform { world.terminal.core.refusedSecondHosts }
        #expect(refused == 2)
        // The SDK never noticed: still connected, and its next payment goes through.
        #expect(world.reader.isConnected && world.recorder.count("didDisconnect") == 0)
        try world.presentCard()
        let outcome = try await world.reader.startPayment(amountMinor: 1234, currency: .eur, transactionID: "7201")
        #expect(outcome.result == .approved)

        // Silent second connections: at most four wait for their first message; a fifth is
        // reset at once, and the waiting ones hold nothing of the session.
        let silent = Locked<[TerminalStream]>([]), ended = Locked<Int>(0)
        await world.loop.perform {
            for _ in 0..<5 {
                guard let s = try? channel.openTerminalStream(port: port) else { continue }
                s.onClose = { _ in ended.mutate { $0 += 1 } }
                s.onEndOfStream = { ended.mutate { $0 += 1 } }
                silent.mutate { $0.append(s) }
            }
        }
        #expect(await world.eventually("the fifth silent connection is reset") { ended.value == 1 })
        // The other four wait (for their first message, up to ten seconds): nine seconds on, not
        // one more is reset.
        await world.leap(.seconds(9))
        #expect(ended.value == 1)
        #expect(world.terminal.report().contains { $0.contains("second connections refused 2, reset 1") }, "\(world.terminal.report())")
        await world.loop.perform { for s in silent.value { s.close(reset: true) } }
        #expect(world.reader.isConnected)
        await world.shutdown()
    }

    /// The takeover itself, with a bare channel as the host (the SDK would end its link when it
    /// loses its connection): a second connection presenting the session's token takes the
    /// session over and the first is reset; one without it is refused and changes nothing.
    @Test func theSessionsOwnTokenTakesItOverAndNothingElseDoes() async throws {
        let world = try PaymentWorld()
        try await world.login()
        var c = ChannelConfiguration(line: .device(world.linkPath))
        var socks = SocksConfiguration(port: 1080)
        socks.allow = [SocksDestination(host: world.configuration.gateway.address.description, port: world.configuration.gateway.port)]
        c.socks = socks
        c.relayDNS = false
        let channel = Channel(configuration: c, loop: world.loop)
        _ = try await channel.open()
        let port = world.configuration.readerPort
        let token = try #require(world.configuration.sessionToken)

        /// A host connection: a stream, everything it received, whether it ended.
        final class HostConnection: @unchecked Sendable {
            var stream: TerminalStream?
            let received = Locked<[UInt8]>([])
            let ended = Locked<String?>(nil)
            var messages: [PaymentMessage] {
                var d = PaymentFrameDecoder()
                return ((try? d.feed(received.value)) ?? []).compactMap { try? PaymentMessage.decode($0) }
            }
        }
        func connect() async throws -> HostConnection {
            let h = HostConnection()
            let opened = Locked(false)
            await world.loop.perform {
                guard let s = try? channel.openTerminalStream(port: port) else { return }
                h.stream = s
                s.onConnected = { opened.mutate { $0 = true } }
                s.onData = { bytes in h.received.mutate { $0 += bytes } }
                s.onEndOfStream = { h.ended.mutate { $0 = $0 ?? "end of stream" } }
                s.onClose = { why in h.ended.mutate { $0 = $0 ?? (why ?? "closed") } }
            }
            #expect(await world.eventually("a connection to the reader port") { opened.value })
            return h
        }
        func login(_ h: HostConnection, id: String, readerSession: String?) async throws {
            var ext: JSONValue = ["LocationID": "tml_test_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001",
                                  "SessionToken": .string(token)]
            if let readerSession { ext = ext.setting("ReaderSession", .string(readerSession)) }
            let header = PaymentMessage.Header(protocolVersion: "3.1", messageClass: .service, category: .login, type: .request,
                                               identifier: id, saleID: "HOST-\(id)", poiID: "SIM-00000001")
            let frame = try PaymentFrame.encode(PaymentMessage(direction: .request, header: header, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": ext]).encoded)
            await world.loop.perform { h.stream?.send(frame) }
        }
        func loginAnswer(_ h: HostConnection) -> PaymentMessage? { h.messages.first { $0.header.category == .login && $0.header.messageClass == .service } }

        let first = try await connect()
        try await login(first, id: "1", readerSession: nil)
        #expect(await world.eventually("the first host's login") { loginAnswer(first) != nil })
        let issued = try #require(loginAnswer(first)?.body["Ext"]?["ReaderSession"]?.string)

        // A stranger: refused, and the first host keeps its session.
        let stranger = try await connect()
        try await login(stranger, id: "2", readerSession: String(repeating: "1", count: 32))
        #expect(await world.eventually("the stranger refused") { stranger.ended.value != nil })
        #expect(PaymentResponseStatus(json: loginAnswer(stranger)?.body["Response"])?.value("reason") == "SessionInUse")
        #expect(first.ended.value == nil)

        // The host itself, back on a new connection with its token: it takes over.
        let again = try await connect()
        try await login(again, id: "3", readerSession: issued)
        #expect(await world.eventually("the takeover's login") { loginAnswer(again) != nil })
        #expect(PaymentResponseStatus(json: loginAnswer(again)?.body["Response"])?.result == .success)
        #expect(await world.eventually("the old connection reset") { first.ended.value != nil })
        #expect(first.ended.value == "reset by peer", "\(first.ended.value ?? "")")
        let renewed = loginAnswer(again)?.body["Ext"]?["ReaderSession"]?.string
        #expect(renewed != nil && renewed != issued, "a new token for the new session")
        let refusedAfter = await world.terminal.loop.perform { world.terminal.core.refusedSecondHosts }
        #expect(refusedAfter == 1)

        await world.loop.perform { for h in [first, stranger, again] { h.stream?.close() } }
        await channel.close()
        await world.shutdown()
    }

    /// The encrypted card payload of an approved payment, captured on its way and sent to the
    /// gateway again over TCP: refused as a replay (4002), and no second approval is logged.
    @Test func replayedAuthorisationIsRejectedByTheGateway() async throws {
        let world = try PaymentWorld(relay: .record)
        try await world.connect()
        try world.presentCard()
        let outcome = try await world.reader.startPayment(amountMinor: 2500, currency: .eur, transactionID: "7101")
        #expect(outcome.result == .approved)
        let requests = await world.relay?.requests ?? []
        let captured = try #require(requests.first { $0["Type"]?.string == "Authorise" })
        #expect(captured["KSN"]?.string?.isEmpty == false && captured["MAC"]?.string?.isEmpty == false)
        let answer = await withCheckedContinuation { (c: CheckedContinuation<JSONValue?, Never>) in
            world.loop.enqueue {
                // As wide as the suite's other waits: under the full suite's load ten seconds
                // passed once with the gateway's answer still on its way.
                GatewayClient.exchange(captured, with: world.gateway.endpoint!, loop: world.loop, timeout: .seconds(120), observer: nil) {
                    c.resume(returning: $0)
                }
            }
        }
        #expect(answer?["Result"]?.string == "error" && answer?["Error"]?.string == "4002", "\(answer?.text ?? "no answer")")
        #expect(world.gateway.log.filter { $0.contains("7101 Normal 2500 978 → approved") }.count == 1)
        await world.shutdown()
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct UpdateTests {
    @Test func requiredUpdateInstallsDuringConnect() async throws {
        let world = try PaymentWorld(update: .init(required: true))
        try await world.connect()
        #expect(world.reader.info?.softwareVersion == "1.1.0")
        let progress = world.recorder.progress.value
        #expect(progress.count >= 5 && progress.first == 0 && progress.last == 1)
        #expect(zip(progress, progress.dropFirst()).allSatisfy { $0 <= $1 }, "monotone: \(progress)")
        #expect(world.recorder.count("startInstalling 1.1.0") == 1 && world.recorder.count("finishInstalling ok") == 1)
        #expect(world.recorder.count("didStartReconnect") == 0, "the update's restart is not a reconnect")
        await world.shutdown()
    }

    @Test func canceledRequiredUpdateFailsTheConnect() async throws {
        let world = try PaymentWorld(update: .init(required: true, size: 400_000))
        world.recorder.shouldCancelUpdate = true
        do {
            try await world.connect()
            Issue.record("connect succeeded without the required update")
        } catch let e as PaymentError {
            #expect(e.code == .unsupportedReaderVersion)
        }
        #expect(world.recorder.count("finishInstalling 2009") == 1)
        #expect((try world.command(["cmd": "status"]))["version"]?.string == "1.0.0")
        await world.shutdown()
    }

    @Test func optionalUpdateAndTamperedImage() async throws {
        let world = try PaymentWorld(update: .init(required: false))
        try await world.connect()
        #expect(world.recorder.count("availableUpdate 1.1.0") == 1)
        #expect(world.reader.info?.softwareVersion == "1.0.0")
        try await world.reader.installAvailableUpdate()
        #expect(world.reader.info?.softwareVersion == "1.1.0")
        let progress = world.recorder.progress.value
        #expect(progress.count >= 5 && progress.first == 0 && progress.last == 1)
        #expect(zip(progress, progress.dropFirst()).allSatisfy { $0 <= $1 })
        await world.shutdown()

        let tampered = try PaymentWorld(update: .init(required: false, tamper: true))
        try await tampered.connect()
        do {
            try await tampered.reader.installAvailableUpdate()
            Issue.record("a tampered image was installed")
        } catch { #expect(error.code == .updateIntegrity) }
        #expect((try tampered.command(["cmd": "status"]))["version"]?.string == "1.0.0")
        #expect(tampered.reader.isConnected)
        await tampered.shutdown()
    }
}
