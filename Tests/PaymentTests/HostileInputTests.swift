import Crypto
import NetStack
@testable import Payment
@testable import PaymentKit
@testable import Simulation
import Testing

/// A hostile peer against the payment layer's cores, sans-IO: nothing it sends may trap, grow a
/// container without bound, or come back larger than a frame.
@Suite struct HostileInputTests {
    let wall = WallTime(rfc3339: "2026-11-01T10:00:00Z")!

    /// The JSON text of `value` with every `\u0008` written as `\b`: the same value in a third
    /// of the bytes, the peer's cheapest way to make a reply outgrow its request.
    func compact(_ value: JSONValue) -> [UInt8] {
        let long = Array("\\u0008".utf8), short = Array("\\b".utf8)
        let bytes = value.serialized
        var out = [UInt8]()
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            if bytes[i] == 0x5C, i + 6 <= bytes.count, Array(bytes[i..<(i + 6)]) == long {
                out += short
                i += 6
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return out
    }

    func backspaces(_ n: Int) -> String { String(repeating: "\u{8}", count: n) }

    // MARK: Frames

    @Test func frameEncodingRefusesEmptyAndOversizePayloadsInsteadOfTrapping() throws {
        #expect(throws: FrameError.emptyFrame) { try PaymentFrame.encode([]) }
        #expect(throws: FrameError.oversizeFrame(1_048_577)) { try PaymentFrame.encode([UInt8](repeating: 0x20, count: 1_048_577)) }
        #expect(try PaymentFrame.encode([UInt8](repeating: 0x20, count: 1_048_576)).count == 1_048_580)
        #expect(!PaymentFrame.fits([]) && PaymentFrame.fits([0x7B]))
    }

    // MARK: Gateway

    @Test func gatewayRepeatsAnUnknownTypeEscapedAndShort() throws {
        let gw = GatewayCore(configuration: .testKeys)
        let request = compact(["Type": .string(backspaces(400_000))])
        #expect(request.count < PaymentFrame.maximumLength)
        let answer = try #require(gw.handle(request, now: wall))
        #expect(answer.count < 1024)
        let reason = try #require(try JSONParser.parse(answer)["Reason"]?.string)
        #expect(reason.hasPrefix("unknown request type \\x08\\x08") && reason.hasSuffix("...(+399936 bytes)"))
        #expect(gw.log.last?.utf8.count ?? 0 < 1024)
    }

    @Test func gatewayAnswerThatWouldOutgrowAFrameBecomesAnError() throws {
        var terminal = TerminalSecurity.testDevice()
        let gw = GatewayCore(configuration: .testKeys)
        // A correctly MACed reversal whose operation ID is 400,000 backspaces: 800 KB as sent,
        // 2.4 MB once the answer repeats it.
        let reversal = try terminal.reverse(operationID: backspaces(400_000), reason: "MerchantCancel", keys: terminal.nextTransaction())
        let request = compact(reversal)
        #expect(request.count < PaymentFrame.maximumLength)
        let answer = try #require(gw.handle(request, now: wall))
        #expect(PaymentFrame.fits(answer))
        let parsed = try JSONParser.parse(answer)
        #expect(parsed["Type"]?.string == "ReverseResult" && parsed["Error"]?.string == "2012")
        #expect(gw.oversizeAnswers == 1)
    }

    @Test func gatewayKeepsAnInitialKeyOnlyOnceARequestsMACVerifies() throws {
        let gw = GatewayCore(configuration: .testKeys)
        for _ in 0..<50 {
            let ksn = "12345678" + Hex.encode(try SecureBytes.random(4)) + "00000001"
            let answer = try #require(try ask(gw, ["Type": "Reverse", "OperationID": "OP-000001", "Reason": "x", "KSN": .string(ksn),
                                                   "MAC": .string(String(repeating: "0", count: 32))]))
            #expect(answer["Error"]?.string == "4001")
        }
        #expect(gw.initialKeys.count == 0)
        var terminal = TerminalSecurity.testDevice()
        _ = try ask(gw, try terminal.reverse(operationID: "OP-000001", reason: "MerchantCancel", keys: terminal.nextTransaction()))
        #expect(gw.initialKeys.count == 1)
    }

    @Test func gatewayLogKeepsTheLatestThousandLinesAndCountsAll() throws {
        let gw = GatewayCore(configuration: .testKeys)
        for i in 0..<1500 { _ = gw.handle(Array("{\"Type\":\"T\(i)\"}".utf8), now: wall) }
        #expect(gw.log.count == 1000)
        #expect(gw.journal.total == 1500 && gw.journal.dropped == 500)
        #expect(gw.log.last == "Error error 2012: unknown request type T1499")
        #expect(Array(gw.journal.after(1497)) == ["Error error 2012: unknown request type T1497", "Error error 2012: unknown request type T1498",
                                                  "Error error 2012: unknown request type T1499"])
    }

    @Test func gatewaySessionsExpireAndAreCapped() throws {
        let gw = GatewayCore(configuration: .testKeys)
        let login: JSONValue = ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-1", "User": "merchant", "Password": "secret"]
        for _ in 0..<1100 { #expect(try ask(gw, login)?["Result"]?.string == "ok") }
        #expect(gw.sessionCount == 1024 && gw.sessionsEvicted == 76)
        _ = gw.handle(login.serialized, now: wall.adding(gw.configuration.sessionLifetime + 1))
        #expect(gw.sessionCount == 1)
    }

    // MARK: Terminal

    /// A terminal logged in by a host, its gateway answered by `gateway` (the real core by
    /// default), on virtual time.
    final class Rig {
        let t: TerminalCore
        let gw: GatewayCore
        var gateway: ([UInt8]) -> [UInt8]?
        var now = Instant.zero
        var host: [[UInt8]] = []
        var gatewayRequests: [[UInt8]] = []
        let wall: WallTime
        var serviceID = 1
        /// A request the gateway does not answer stays unanswered (the terminal's own timeout
        /// ends it) instead of failing at once like a broken connection.
        var unansweredIsSilence = false
        /// The merchant's gateway session, which the host's login hands the terminal.
        let sessionToken: String

        init(wall: WallTime, random: @escaping @Sendable (Int) throws -> [UInt8] = { try SecureBytes.random($0) }) {
            self.wall = wall
            t = TerminalCore(security: .testDevice(), now: .zero, wallClock: wall, random: random)
            let core = GatewayCore(configuration: .testKeys)
            gw = core
            gateway = { core.handle($0, now: wall) }
            let login: JSONValue = ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-1", "User": "merchant", "Password": "secret"]
            sessionToken = core.handle(login.serialized, now: wall).flatMap { try? JSONParser.parse($0) }?["SessionToken"]?.string ?? ""
            t.hostDidConnect(now: now)
        }

        func pump() {
            while true {
                let outputs = t.takeOutputs()
                if outputs.isEmpty { return }
                for o in outputs {
                    switch o {
                    case .host(let bytes): host.append(bytes)
                    case .gateway(let payload):
                        gatewayRequests.append(payload)
                        if let answer = gateway(payload) {
                            t.receive(gatewayPayload: answer, now: now)
                        } else if !unansweredIsSilence {
                            t.gatewayDidFail(now: now)
                        }
                    default: break
                    }
                }
            }
        }

        /// The payload of a service request (the next ServiceID unless given).
        func request(_ category: PaymentMessage.Category, id: String? = nil, body: JSONValue) -> [UInt8] {
            let sid = id ?? String(serviceID)
            serviceID += 1
            let h = PaymentMessage.Header(protocolVersion: category == .login || category == .diagnosis ? "3.1" : nil, messageClass: .service,
                                          category: category, type: .request, identifier: sid, saleID: "HOST-1", poiID: "SIM-00000001")
            return PaymentMessage(direction: .request, header: h, body: body).encoded
        }

        /// Feeds `payload`; returns the service answers it brought.
        @discardableResult
        func send(_ payload: [UInt8]) -> [PaymentMessage] {
            let before = host.count
            t.receive(hostPayload: payload, now: now)
            pump()
            return host[before...].compactMap { try? PaymentMessage.decode($0) }.filter { $0.header.messageClass == .service }
        }

        func login(ext: JSONValue = [:]) -> PaymentResponseStatus? {
            var e: JSONValue = ["LocationID": "tml_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001",
                                "SessionToken": .string(sessionToken)]
            if case .object(let pairs) = ext { for (k, v) in pairs { e = e.setting(k, v) } }
            return PaymentResponseStatus(json: send(request(.login, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": e])).first?.body["Response"])
        }

        func payment(_ id: String, amount: Int64 = 1050, timeStamp: String = "2026-11-01T10:00:06Z") -> [UInt8] {
            request(.payment, body: [
                "SaleData": ["SaleTransactionID": ["TransactionID": .string(id), "TimeStamp": .string(timeStamp)]],
                "PaymentTransaction": ["AmountsReq": ["Currency": "EUR", "CurrencyNumeric": "978", "RequestedAmountMinor": .integer(amount)]],
                "PaymentData": ["PaymentType": "Normal"],
            ])
        }

        var everyHostMessageFits: Bool { host.allSatisfy(PaymentFrame.fits) }
    }

    func status(_ m: PaymentMessage?) -> PaymentResponseStatus? { PaymentResponseStatus(json: m?.body["Response"]) }

    @Test func anAbortReasonIsRepeatedEscapedAndShort() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        rig.send(rig.payment("0001"))
        let abort = rig.request(.abort, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(String(rig.serviceID - 1)),
                                                                    "SaleID": "HOST-1"],
                                               "AbortReason": .string(backspaces(400_000))])
        let message = try JSONParser.parse(abort)
        let bytes = compact(message)
        #expect(bytes.count < PaymentFrame.maximumLength)
        let answers = rig.send(bytes)
        #expect(rig.everyHostMessageFits)
        let reason = try #require(status(answers.first { $0.header.category == .payment })?.value("reason"))
        #expect(reason.utf8.count <= 64 * 4 + 32 && reason.hasPrefix("\\x08\\x08"))
    }

    @Test func aSaleTimeStampMustBeARFC3339Time() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        let answer = rig.send(rig.payment("0001", timeStamp: "yesterday, " + String(repeating: "x", count: 1000)))
        #expect(status(answer.first)?.errorCondition == .messageFormat && status(answer.first)?.value("reason") == "InvalidTimeStamp")
        // Refused before it counted: the same transaction ID with a real time is a new payment.
        #expect(rig.send(rig.payment("0001")).isEmpty)
        #expect(TerminalControlCommands.handle(core: rig.t, ["cmd": "status"], now: rig.now)["phase"]?.string == "WaitingForCard")
    }

    @Test func aReversalReasonReachesTheGatewayShort() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        #expect(TerminalControlCommands.handle(core: rig.t, ["cmd": "presentCard", "pan": "4111111111111111", "pin": "1234"], now: rig.now)["ok"]?.bool == true)
        let paid = rig.send(rig.payment("0001"))
        let poiTx = try #require(paid.first?.body["POIData"]?["POITransactionID"]?["TransactionID"]?.string)
        let reversal = rig.request(.reversal, body: ["OriginalPOITransaction": ["POITransactionID": ["TransactionID": .string(poiTx)]],
                                                     "ReversalReason": .string(backspaces(400_000))])
        let answers = rig.send(compact(try JSONParser.parse(reversal)))
        #expect(status(answers.first)?.result == .success)
        let sent = try JSONParser.parse(try #require(rig.gatewayRequests.last))
        #expect(sent["Type"]?.string == "Reverse")
        #expect((sent["Reason"]?.string?.utf8.count ?? .max) <= 64 * 4 + 32)
        #expect(rig.gatewayRequests.allSatisfy(PaymentFrame.fits) && rig.everyHostMessageFits)
    }

    @Test func aGatewayErrorCodeIsRepeatedOnlyAsFourDigits() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        let refusal: JSONValue = ["Type": "AuthoriseResult", "Result": "error", "Error": .string(String(repeating: "%", count: 500_000))]
        rig.gateway = { _ in refusal.serialized }
        #expect(TerminalControlCommands.handle(core: rig.t, ["cmd": "presentCard", "pan": "4111111111111111", "pin": "1234"], now: rig.now)["ok"]?.bool == true)
        let answer = rig.send(rig.payment("0001"))
        #expect(rig.everyHostMessageFits)
        #expect(status(answer.first)?.value("code") == "" && status(answer.first)?.value("reason") == "Gateway")
    }

    @Test func aHostIDMustBeShortAndPrintable() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login(ext: ["HostID": .string(String(repeating: "A", count: 65))])?.value("reason") == "InvalidHostID")
        #expect(rig.login(ext: ["HostID": "HOST\u{1B}[2J"])?.value("reason") == "InvalidHostID")
        #expect(rig.login(ext: ["HostID": "00112233445566778899AABBCCDDEEFF"])?.result == .success)
    }

    @Test func serviceIDsAreRememberedOnlyForTheLatestThousand() throws {
        let rig = Rig(wall: wall)
        #expect(rig.login()?.result == .success)
        let ask: JSONValue = ["MessageReference": ["MessageCategory": "Payment", "ServiceID": "99999"]]
        #expect(status(rig.send(rig.request(.transactionStatus, id: "5", body: ask)).first)?.errorCondition == .notFound)
        #expect(status(rig.send(rig.request(.transactionStatus, id: "5", body: ask)).first)?.value("reason") == "DuplicateServiceID")
        for i in 0..<1100 { rig.send(rig.request(.transactionStatus, id: String(1000 + i), body: ask)) }
        // Forgotten, so accepted again; the session's memory stayed at its cap.
        #expect(status(rig.send(rig.request(.transactionStatus, id: "5", body: ask)).first)?.errorCondition == .notFound)
    }

    @Test func theTerminalJournalKeepsTheLatestThousandLines() throws {
        let rig = Rig(wall: wall)
        for _ in 0..<1500 { rig.send(Array("{}".utf8)) }
        #expect(rig.t.journal.count == 1000 && rig.t.trace.total == 1501)
        #expect(rig.t.trace.after(1500) == ["message format: expected one SaleToPOIRequest or SaleToPOIResponse object"])
    }

    @Test func aMessageTooLargeForAFrameIsDroppedAndAServiceRequestToldSo() throws {
        let rig = Rig(wall: wall)
        let h = PaymentMessage.Header(messageClass: .service, category: .diagnosis, type: .response, identifier: "7", saleID: "HOST-1", poiID: "SIM-00000001")
        rig.t.send(PaymentMessage(direction: .response, header: h, body: ["Big": .string(String(repeating: "x", count: PaymentFrame.maximumLength))]))
        let e = PaymentMessage.Header(protocolVersion: nil, messageClass: .event, category: .event, type: .notification, identifier: nil, saleID: "HOST-1",
                                      poiID: "SIM-00000001")
        rig.t.send(PaymentMessage(direction: .request, header: e, body: ["Big": .string(String(repeating: "x", count: PaymentFrame.maximumLength))]))
        rig.pump()
        #expect(rig.t.oversizeMessages == 2)
        #expect(rig.host.count == 1 && rig.everyHostMessageFits)
        let answer = try PaymentMessage.decode(rig.host[0])
        #expect(answer.header.identifier == "7" && status(answer)?.value("reason") == "ResponseTooLarge")
    }

    @Test func gatewayUpdateOffersCarryOnlyTheirOwnForms() throws {
        let offer: JSONValue = ["Version": "1.1.0", "Size": 10, "SHA256": .string(String(repeating: "A", count: 64)),
                                "Signature": .string(String(repeating: "B", count: 128)), "DurationEstimate": "lessThanOneMinute"]
        #expect(UpdateOffer(json: offer) != nil)
        #expect(UpdateOffer(json: offer.setting("Version", "1.1\u{1B}[2J")) == nil)
        #expect(UpdateOffer(json: offer.setting("Signature", .string(backspaces(128)))) == nil)
        #expect(UpdateOffer(json: offer.setting("DurationEstimate", .string(String(repeating: "a", count: 100_000)))) == nil)
        #expect(UpdateOffer(json: offer.setting("Size", -1)) == nil)
    }

    // MARK: The pad's control commands

    @Test func batteryLevelsOutsideZeroToOneAreRefused() throws {
        let t = TerminalCore(now: .zero, wallClock: wall)
        for level: JSONValue in [.number("1e300"), .number("-0.5"), .number("1.01"), .integer(100_000_000_000_000_000), .integer(-1), "0.5"] {
            #expect(TerminalControlCommands.handle(core: t, ["cmd": "setBattery", "level": level], now: .zero)["ok"]?.bool == false, "\(level.text)")
        }
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "setBattery", "level": .number("0.5")], now: .zero)["ok"]?.bool == true)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "setBattery", "level": 1], now: .zero)["ok"]?.bool == true)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "status"], now: .zero)["battery"] == .number("1.00"))
        #expect(PaymentRules.fraction(.infinity) == "1.00" && PaymentRules.fraction(.nan) == "0.00" && PaymentRules.fraction(-3) == "0.00")
    }

    @Test func linkDownTimesBeyondADayOrNotFiniteAreRefused() throws {
        #expect(TerminalControlCommands.downTime(.number("1e300")) == nil)
        #expect(TerminalControlCommands.downTime(.number("-0.5")) == nil)
        #expect(TerminalControlCommands.downTime(.integer(.max)) == nil)
        #expect(TerminalControlCommands.downTime(.integer(86_401)) == nil)
        #expect(TerminalControlCommands.downTime("2") == nil)
        #expect(TerminalControlCommands.downTime(.integer(2)) == .seconds(2))
        #expect(TerminalControlCommands.downTime(.number("1.5")) == .milliseconds(1500))
        let t = TerminalCore(now: .zero, wallClock: wall)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "dropLinkAfterAuthorise", "downFor": .integer(.max)], now: .zero)["ok"]?.bool == false)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "dropLinkAfterAuthorise"], now: .zero)["ok"]?.bool == true)
    }

    @Test func presentedCardFieldsMustHaveTheirForms() throws {
        let t = TerminalCore(now: .zero, wallClock: wall)
        let card: JSONValue = ["cmd": "presentCard", "pan": "4111111111111111"]
        #expect(TerminalControlCommands.handle(core: t, card, now: .zero)["ok"]?.bool == true)
        #expect(TerminalControlCommands.handle(core: t, card.setting("entry", .string(String(repeating: "E", count: 100_000))), now: .zero)["ok"]?.bool == false)
        #expect(TerminalControlCommands.handle(core: t, card.setting("cvm", "Offline\u{1B}"), now: .zero)["ok"]?.bool == false)
        #expect(TerminalControlCommands.handle(core: t, card.setting("expiry", "30-1"), now: .zero)["ok"]?.bool == false)
        #expect(TerminalControlCommands.handle(core: t, card.setting("serviceCode", "2011"), now: .zero)["ok"]?.bool == false)
    }

    // MARK: Key blocks, adverts, JSON

    @Test func keyBlockNumbersAreDigitsOnly() throws {
        #expect(throws: TR31Error.malformed("optional block count")) { try TR31.parseHeader("D0016P0AE00E-100") }
        #expect(throws: TR31Error.malformed("optional block count")) { try TR31.parseHeader("D0016P0AE00E+100") }
        #expect(throws: TR31Error.malformed("length field does not match")) { try TR31.parseHeader("D+016P0AE00E0000") }
        #expect(throws: TR31Error.malformed("optional block")) { try TR31.parseHeader("D0020P0AE00E0100KS+4") }
        let t = TerminalCore(now: .zero, wallClock: wall)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "provisionKey", "tr31": "D0016P0AE00E-100", "kbpk": "00"], now: .zero)["ok"]?.bool == false)
    }

    @Test func advertBatteryLevelsOutsideZeroToOneAreNoLevel() throws {
        let advert: JSONValue = ["PeripheralUUID": "00112233-4455-6677-8899-AABBCCDDEEFF", "SerialNumber": "SIM-1"]
        for level: JSONValue in [.number("1e300"), .number("-1e300"), .number("1.5"), .integer(.max), .integer(-1)] {
            #expect(DiscoveredReader(advert: advert.setting("BatteryLevel", level), path: "/x")?.batteryLevel == nil, "\(level.text)")
        }
        let r = try #require(DiscoveredReader(advert: advert.setting("BatteryLevel", .number("0.42")), path: "/x"))
        #expect(r.batteryPercent == 42 && r.description.contains("battery 42%"))
        var odd = r
        odd.batteryLevel = .infinity
        #expect(odd.batteryPercent == 100)
        odd.batteryLevel = .nan
        #expect(odd.batteryPercent == 0)
    }

    @Test func aDuplicateMemberErrorCarriesAShortEscapedName() throws {
        let name = String(repeating: "\u{1B}", count: 100_000)
        let text = "{\"" + name + "\":1,\"" + name + "\":2}"
        let escaped = Array(text.utf8).flatMap { $0 == 0x1B ? Array("\\u001b".utf8) : [$0] }
        do {
            _ = try JSONParser.parse(escaped)
            Issue.record("a duplicate member parsed")
        } catch let error as JSONError {
            #expect(error.reason.utf8.count < 256 && error.reason.hasPrefix("duplicate member \"\\x1B"))
        }
    }

    // MARK: Bounded memories

    @Test func recentMapEvictsTheOldestBeyondItsCapacityAndCountsIt() {
        var m = RecentMap<String, Int>(capacity: 3)
        for (i, k) in ["a", "b", "c", "a", "d"].enumerated() { m.insert(k, i) }
        #expect(m.count == 3 && m.evicted == 1)
        #expect(!m.contains("a") && m["b"] == 1 && m["d"] == 4)
        m.remove { _, v in v < 3 }
        #expect(m.count == 1 && m["d"] == 4)
        m.insert("e", 5)
        m.insert("f", 6)
        m.insert("g", 7)
        #expect(m.count == 3 && m.evicted == 2 && !m.contains("d"))
    }

    @Test func recentLinesCutLongLinesAndTellWhatIsNew() {
        var log = RecentLines(capacity: 2, lineLimit: 4)
        log.append("one")
        log.append("second")
        log.append("3")
        #expect(log.lines == ["seco...", "3"] && log.total == 3 && log.dropped == 1)
        #expect(Array(log.after(0)) == ["seco...", "3"] && Array(log.after(2)) == ["3"] && log.after(3).isEmpty && log.after(9).isEmpty)
    }
}
