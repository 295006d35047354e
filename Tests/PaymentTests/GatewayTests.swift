import Crypto
import Payment
import Simulation
import Testing

let now = WallTime(rfc3339: "2026-11-01T10:00:00Z")!

func fields(_ id: String = "0001ABC", amount: Int64 = 1050, cvm: String = "OnlinePIN", type: String = "Normal",
            original: String? = nil, token: String = "", merchant: String = "999008881") -> TerminalSecurity.AuthoriseFields {
    .init(merchantID: merchant, terminalID: "001", environment: "int", transactionID: id, amountMinor: amount,
          currencyNumeric: "978", paymentType: type, entryMode: "ICC", cvm: cvm, originalOperationID: original, sessionToken: token)
}

/// A merchant session at `gw` (the default merchant unless told): its token.
func session(_ gw: GatewayCore, user: String = "merchant", password: String = "secret", licence: String = "LIC-TEST-0001") throws -> String {
    try #require(try ask(gw, ["Type": "Login", "Environment": "int", "Licence": .string(licence), "User": .string(user),
                              "Password": .string(password)])?["SessionToken"]?.string)
}

/// Six digits.
func isApprovalCode(_ s: String?) -> Bool { s.map { $0.utf8.count == 6 && $0.utf8.allSatisfy { (0x30...0x39).contains($0) } } ?? false }

let testCard = CardData(pan: "4111111111111111", expiry: "3012", serviceCode: "201")

func ask(_ gw: GatewayCore, _ request: JSONValue) throws -> JSONValue? {
    try gw.handle(request.serialized, now: now).map { try JSONParser.parse($0) }
}

@Suite struct GatewayTests {
    @Test func firstPaymentReproducesThePublishedVectorsEndToEnd() throws {
        var terminal = TerminalSecurity.testDevice()
        terminal.fixedPINFill = Hex.decode("2F69ADDE2E9E7ACE")
        #expect(terminal.transactionsRemaining == 2_448_023_842)
        var keys = try terminal.nextTransaction()
        #expect(keys.ksn.description == "123456789012345600000001")
        #expect(terminal.transactionsRemaining == 2_448_023_841)
        let gw = GatewayCore(configuration: .testKeys)
        let token = try session(gw)
        let request = try terminal.authorise(fields(token: token), card: testCard, pin: "1234", keys: keys)
        // The ciphertexts are the published vectors (D); the MAC covers our length-prefixed
        // encoding (docs/PAYMENTS.md), so it is not E3's: VectorTests checks E3 and E4 themselves.
        #expect(request["EncCardData"]?.string == "87D45DC64A786FCC6B44187CFD2DFA79B7FFCE3DE57D30ED96F2C549B03B126733DEEDD3F3ED3BDD7E13E04C97E3BD7F")
        #expect(request["EncPinBlock"]?.string == "A912150391AB65A67E52883D81CE2D15")
        #expect(request["MAC"]?.string != "B88DCAB3D757EFCE0E3C469B24502092")
        // No clear PAN or PIN anywhere in what leaves the terminal.
        let wire = request.text
        #expect(!wire.contains("4111111111111111") && !wire.contains("1234\""))

        let answer = try #require(try ask(gw, request))
        #expect(answer["Result"]?.string == "approved")
        let operation = try #require(answer["OperationID"]?.string)
        #expect(operation.hasPrefix("OP-") && operation.utf8.count == 19)
        #expect(isApprovalCode(answer["ApprovalCode"]?.string))
        #expect(answer["AuthenticatedByPin"]?.bool == true)
        #expect(TerminalSecurity.verifyResponse(answer, canonical: GatewayCanonical.authoriseResult(answer), keys: keys))

        // A forged approval (any field changed) fails the terminal's check: 4006 there.
        for (field, value) in [("Result", JSONValue.string("approved")), ("ApprovalCode", "999999"), ("AmountMinor", 1),
                               ("SignatureRequired", true)] {
            let forged = answer.setting(field, value)
            if forged == answer { continue }
            #expect(!TerminalSecurity.verifyResponse(forged, canonical: GatewayCanonical.authoriseResult(forged), keys: keys))
        }
        var macBytes = Hex.decode(answer["MAC"]!.string!)!
        macBytes[15] ^= 1
        let badMAC = answer.setting("MAC", .string(Hex.encode(macBytes)))
        #expect(!TerminalSecurity.verifyResponse(badMAC, canonical: GatewayCanonical.authoriseResult(badMAC), keys: keys))

        // The same request again is a replay.
        #expect(try ask(gw, request)?["Error"]?.string == "4002")
        keys.wipe()
    }

    @Test func tamperingUnknownKeysAndCountersAreRefusedBeforeDecrypting() throws {
        var terminal = TerminalSecurity.testDevice()
        let gw = GatewayCore(configuration: .testKeys)
        let token = try session(gw)
        let keys = try terminal.nextTransaction()
        let request = try terminal.authorise(fields(token: token), card: testCard, pin: "1234", keys: keys)
        // The session token is MACed too: another one (another merchant's) does not verify.
        #expect(try ask(gw, request.setting("SessionToken", .string(try session(gw))))?["Error"]?.string == "4001")
        // A flipped ciphertext bit: MAC failure (4001), and the counter is not consumed.
        var cipher = Array(request["EncCardData"]!.string!)
        cipher[0] = cipher[0] == "8" ? "9" : "8"
        #expect(try ask(gw, request.setting("EncCardData", .string(String(cipher))))?["Error"]?.string == "4001")
        #expect(try ask(gw, request.setting("AmountMinor", 1))?["Error"]?.string == "4001")
        #expect(try ask(gw, request)?["Result"]?.string == "approved")
        // Unknown BDK ID.
        let stranger = TerminalSecurity(initialKey: [UInt8](repeating: 1, count: 16), initialKeyID: Hex.decode("AABBCCDD00000001")!)
        var s = stranger
        let sk = try s.nextTransaction()
        #expect(try ask(gw, try s.authorise(fields(token: token), card: testCard, pin: "1234", keys: sk))?["Error"]?.string == "4003")
        // An invalid counter (17 bits) and a malformed KSN.
        #expect(try ask(gw, request.setting("KSN", "12345678901234560001FFFF"))?["Error"]?.string == "4004")
        #expect(try ask(gw, request.setting("KSN", "XYZ"))?["Error"]?.string == "2012")
        // An older counter after a newer one was accepted: replay.
        var t2 = TerminalSecurity.testDevice()
        let k1 = try t2.nextTransaction()
        let k2 = try t2.nextTransaction()
        let gw2 = GatewayCore(configuration: .testKeys)
        let token2 = try session(gw2)
        let late = try t2.authorise(fields("0002", token: token2), card: testCard, pin: "1234", keys: k1)
        #expect(try ask(gw2, try t2.authorise(fields("0003", token: token2), card: testCard, pin: "1234", keys: k2))?["Result"]?.string == "approved")
        #expect(try ask(gw2, late)?["Error"]?.string == "4002")
    }

    @Test func deterministicDecisions() throws {
        var terminal = TerminalSecurity.testDevice()
        let gw = GatewayCore(configuration: .testKeys)
        let token = try session(gw)
        func run(_ f: TerminalSecurity.AuthoriseFields, pin: String = "1234", card: CardData? = testCard) throws -> JSONValue? {
            let keys = try terminal.nextTransaction()
            var f = f
            f.sessionToken = token
            let answer = try ask(gw, try terminal.authorise(f, card: card, pin: pin, keys: keys))
            if let answer, answer["Result"]?.string != "error" {
                #expect(TerminalSecurity.verifyResponse(answer, canonical: GatewayCanonical.authoriseResult(answer), keys: keys))
            }
            return answer
        }
        #expect(try run(fields("1001", amount: 105))?["ResponseCode"]?.string == "05")
        #expect(try run(fields("1002", amount: 151))?["ResponseCode"]?.string == "51")
        #expect(try run(fields("1003", amount: 191)) == nil)
        let wrong = try run(fields("1004", amount: 200), pin: "9999")
        #expect(wrong?["ResponseCode"]?.string == "55" && wrong?["AuthenticatedByPin"]?.bool == false)
        let expired = try run(fields("1005", amount: 200), card: CardData(pan: "4111111111111111", expiry: "2401"))
        #expect(expired?["ResponseCode"]?.string == "54")
        let signed = try #require(try run(fields("1006", amount: 2000, cvm: "Signature")))
        #expect(signed["Result"]?.string == "approved" && signed["SignatureRequired"]?.bool == true)
        #expect(isApprovalCode(signed["ApprovalCode"]?.string))
        let op = signed["OperationID"]!.string!
        // Refunds by operation: within the original, exceeding it, unknown.
        #expect(try run(fields("1007", amount: 500, cvm: "NoCVM", type: "Refund", original: op), card: nil)?["Result"]?.string == "approved")
        #expect(try run(fields("1008", amount: 1600, cvm: "NoCVM", type: "Refund", original: op), card: nil)?["Error"]?.string == "3007")
        #expect(try run(fields("1009", amount: 100, cvm: "NoCVM", type: "Refund", original: "OP-999999"), card: nil)?["Error"]?.string == "3008")
        let last = try run(fields("1010", amount: 1500, cvm: "NoCVM", type: "Refund", original: op), card: nil)
        #expect(isApprovalCode(last?["ApprovalCode"]?.string) && last?["ApprovalCode"] != signed["ApprovalCode"])

        // Signature intake: session, magic bytes, hash.
        let login = try #require(try ask(gw, ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-0001", "User": "merchant", "Password": "secret"]))
        #expect(login["MerchantID"]?.string == "999008881")
        let signingSession = login["SessionToken"]!
        let gif = Array("GIF89a".utf8) + [UInt8](repeating: 7, count: 40)
        func sign(_ image: [UInt8], _ format: Int64) throws -> JSONValue? {
            try ask(gw, ["Type": "Signature", "SessionToken": signingSession, "OperationID": .string(op), "ImageFormat": .integer(format),
                         "Image": .string(Base64.encode(image)), "SHA256": .string(Hex.encode(Digest.hash(.sha256, image)!))])
        }
        #expect(try sign(gif, 1)?["Error"]?.string == "2008")
        #expect(try sign(gif, 4)?["Result"]?.string == "ok")
        #expect(try sign(gif, 4)?["Error"]?.string == "3008")
        #expect(try ask(gw, ["Type": "Login", "Environment": "real", "Licence": "LIC-TEST-0001", "User": "merchant", "Password": "secret"])?["Error"]?.string == "3004")
        #expect(try ask(gw, ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-0001", "User": "merchant", "Password": "nope"])?["Error"]?.string == "3005")
    }

    @Test func reversalIsMACedBothWays() throws {
        var terminal = TerminalSecurity.testDevice()
        let gw = GatewayCore(configuration: .testKeys)
        let token = try session(gw)
        let keys = try terminal.nextTransaction()
        let approved = try #require(try ask(gw, try terminal.authorise(fields(cvm: "Signature", token: token), card: testCard, pin: nil, keys: keys)))
        let op = approved["OperationID"]!.string!
        let rk = try terminal.nextTransaction()
        let reversal = try terminal.reverse(operationID: op, reason: "MerchantCancel", sessionToken: token, keys: rk)
        #expect(try ask(gw, reversal.setting("Reason", "Malfunction"))?["Error"]?.string == "4001")
        let answer = try #require(try ask(gw, reversal))
        #expect(answer["Result"]?.string == "ok" && answer["ReversedAmountMinor"]?.integer == 1050)
        #expect(TerminalSecurity.verifyResponse(answer, canonical: GatewayCanonical.reverseResult(answer), keys: rk))
        let again = try terminal.nextTransaction()
        #expect(try ask(gw, try terminal.reverse(operationID: op, reason: "MerchantCancel", sessionToken: token, keys: again))?["Result"]?.string == "error")
    }

    @Test func updatesAreOfferedInChunksAndVerified() throws {
        let signing = try SecureBytes.random(32)
        let image = try SecureBytes.random(70_000)
        let sha = Hex.encode(Digest.hash(.sha256, image)!)
        let signed = UpdateOffer.signedString(version: "1.1.0", sha256: sha, size: image.count, requiredAt: nil)
        let offer = UpdateOffer(version: "1.1.0", requiredAt: nil, size: image.count, sha256: sha,
                                signature: Hex.encode(try Ed25519.sign(privateKey: signing, Array(signed.utf8))))
        var config = GatewayCore.Configuration.testKeys
        config.update = (offer, image)
        let gw = GatewayCore(configuration: config)
        #expect(try ask(gw, ["Type": "UpdateCheck", "Version": "1.1.0"])?["Available"]?.bool == false)
        let answer = try #require(try ask(gw, ["Type": "UpdateCheck", "Version": "1.0.0"]))
        let got = try #require(UpdateOffer(json: answer["Update"]))
        var fetched = [UInt8]()
        while fetched.count < got.size {
            let chunk = try #require(try ask(gw, ["Type": "UpdateChunk", "Version": "1.1.0", "Offset": .integer(Int64(fetched.count)), "Length": 32768]))
            fetched += Base64.decode(chunk["Data"]!.string!)!
        }
        let pub = try Ed25519.publicKey(privateKey: signing)
        #expect(got.verify(image: fetched, publicKey: pub))
        var tampered = fetched
        tampered[1000] ^= 0x40
        #expect(!got.verify(image: tampered, publicKey: pub))
        #expect(!got.verify(image: fetched, publicKey: try Ed25519.publicKey(privateKey: SecureBytes.random(32))))
        #expect(UpdateOffer.isNewer("1.10.0", than: "1.9.2") && !UpdateOffer.isNewer("1.0", than: "1.0.0"))
    }
}

@Suite struct MoneyTests {
    @Test func amountsAreParsedExactlyWithTheCurrencyExponent() {
        #expect(Currency.eur.parse("10.50") == 1050)
        #expect(Currency.eur.parse("10.5") == 1050)
        #expect(Currency.eur.parse("10") == 1000)
        #expect(Currency.eur.parse("0.07") == 7)
        #expect(Currency.eur.parse("10.505") == nil)
        #expect(Currency.jpy.parse("1050") == 1050)
        #expect(Currency.jpy.parse("10.5") == nil)
        #expect(Currency.kwd.parse("1.250") == 1250)
        #expect(Currency.kwd.parse("1.2505") == nil)
        for bad in ["", ".5", "5.", "-1", "1e3", "1,00", " 1", "0x10", "1.2.3", "9999999999999999"] {
            #expect(Currency.eur.parse(bad) == nil, "\(bad)")
        }
        #expect(Currency.eur.format(1050) == "10.50" && Currency.kwd.format(5) == "0.005" && Currency.jpy.format(1050) == "1050")
        // 0.1 + 0.2 style inputs stay exact.
        #expect(Currency.usd.parse("0.29") == 29 && Currency.usd.parse("1234567890.99") == 123_456_789_099)
    }

    @Test func timeAndCards() {
        #expect(now.description == "2026-11-01T10:00:00Z" && now.yymm == "2611")
        #expect(WallTime(seconds: 0).description == "1970-01-01T00:00:00Z")
        #expect(WallTime(rfc3339: "2000-02-29T23:59:59Z")!.adding(1).description == "2000-03-01T00:00:00Z")
        #expect(WallTime(rfc3339: "2026-13-01T00:00:00Z") == nil)
        #expect(CardData.isValidPAN("4111111111111111") && !CardData.isValidPAN("4111111111111112"))
        #expect(CardData.mask("4111111111111111") == "411111******1111")
        #expect(CardData(track2: testCard.track2) == testCard)
        #expect(testCard.track2 == "4111111111111111=30122011000000000000")
    }

    @Test func provisioningFromATR31Block() throws {
        let kbpk = try SecureBytes.random(16)
        let header = TR31Header(keyUsage: "B1", algorithm: "A", modeOfUse: "X", optionalBlocks: [.init(id: "IK", data: "1234567890123456")])
        let block = try TR31.wrapD(header: header, key: Hex.decode("1273671EA26AC29AFA4D1084127652A1")!, kbpk: kbpk)
        var provisioned = try TerminalSecurity(keyBlock: block, kbpk: kbpk)
        var reference = TerminalSecurity.testDevice()
        provisioned.fixedPINFill = [0, 1, 2, 3, 4, 5, 6, 7]
        reference.fixedPINFill = provisioned.fixedPINFill
        let a = try provisioned.authorise(fields(), card: testCard, pin: "1234", keys: provisioned.nextTransaction())
        let b = try reference.authorise(fields(), card: testCard, pin: "1234", keys: reference.nextTransaction())
        #expect(a == b)
        #expect(throws: TR31Error.macMismatch) { try TerminalSecurity(keyBlock: block, kbpk: SecureBytes.random(16)) }
    }
}
