import Crypto
@testable import Payment
@testable import Simulation
import Testing

/// The gateway keeps every operation under the merchant whose session asked for it.
@Suite struct MerchantScopeTests {
    static func twoMerchants() -> GatewayCore {
        var c = GatewayCore.Configuration.testKeys
        c.merchants.append(GatewayCore.Merchant(licence: "LIC-TEST-B", user: "bob", password: "hunter2", merchantID: "999008882"))
        return GatewayCore(configuration: c)
    }

    @Test func anotherMerchantsOperationCannotBeRefundedReversedSignedOrLookedUp() throws {
        let gw = Self.twoMerchants()
        var terminal = TerminalSecurity.testDevice()
        let alice = try session(gw)
        let bob = try session(gw, user: "bob", password: "hunter2", licence: "LIC-TEST-B")
        let sale = try #require(try ask(gw, try terminal.authorise(fields("A1", amount: 2000, cvm: "Signature", token: alice), card: testCard, pin: nil,
                                                                   keys: terminal.nextTransaction())))
        #expect(sale["Result"]?.string == "approved")
        let op = try #require(sale["OperationID"]?.string)
        let code = try #require(sale["ApprovalCode"]?.string)

        // Bob names Alice's operation, by ID and by approval code: not found, as if it did not exist.
        let asBob = fields("B1", amount: 100, cvm: "NoCVM", type: "Refund", original: op, token: bob, merchant: "999008882")
        #expect(try ask(gw, try terminal.authorise(asBob, card: nil, pin: nil, keys: terminal.nextTransaction()))?["Error"]?.string == "3008")
        var byCode = asBob
        byCode.originalOperationID = code
        byCode.transactionID = "B2"
        #expect(try ask(gw, try terminal.authorise(byCode, card: nil, pin: nil, keys: terminal.nextTransaction()))?["Error"]?.string == "3008")
        // Bob's session with Alice's merchant ID: refused (the session says who asks).
        var impostor = asBob
        impostor.merchantID = "999008881"
        impostor.transactionID = "B3"
        #expect(try ask(gw, try terminal.authorise(impostor, card: nil, pin: nil, keys: terminal.nextTransaction()))?["Error"]?.string == "3005")
        // No session at all: refused.
        var anonymous = fields("B4", amount: 100, cvm: "NoCVM", type: "Refund", original: op)
        anonymous.sessionToken = ""
        #expect(try ask(gw, try terminal.authorise(anonymous, card: nil, pin: nil, keys: terminal.nextTransaction()))?["Error"]?.string == "3005")

        let reverseKeys = try terminal.nextTransaction()
        let reversal = try #require(try ask(gw, try terminal.reverse(operationID: op, reason: "MerchantCancel", sessionToken: bob, keys: reverseKeys)))
        #expect(reversal["Result"]?.string == "error" && reversal["Error"]?.string == "3008")
        #expect(TerminalSecurity.verifyResponse(reversal, canonical: GatewayCanonical.reverseResult(reversal), keys: reverseKeys))

        let gif = Array("GIF89a".utf8) + [UInt8](repeating: 7, count: 40)
        let signature: JSONValue = ["Type": "Signature", "OperationID": .string(op), "ImageFormat": 4, "Image": .string(Base64.encode(gif)),
                                    "SHA256": .string(Hex.encode(Digest.hash(.sha256, gif)!))]
        #expect(try ask(gw, signature.setting("SessionToken", .string(bob)))?["Error"]?.string == "3008")
        #expect(try ask(gw, ["Type": "Status", "SessionToken": .string(bob), "OperationID": .string(op)])?["Error"]?.string == "3008")

        // Alice herself may do all of it; nothing Bob tried changed her operation.
        let status = try #require(try ask(gw, ["Type": "Status", "SessionToken": .string(alice), "OperationID": .string(op)]))
        #expect(status["Result"]?.string == "ok" && status["RefundedMinor"]?.integer == 0 && status["Reversed"]?.bool == false)
        #expect(try ask(gw, signature.setting("SessionToken", .string(alice)))?["Result"]?.string == "ok")
        var refund = fields("A2", amount: 500, cvm: "NoCVM", type: "Refund", original: code, token: alice)
        refund.entryMode = "Keyed"
        #expect(try ask(gw, try terminal.authorise(refund, card: nil, pin: nil, keys: terminal.nextTransaction()))?["Result"]?.string == "approved")
        #expect(try ask(gw, ["Type": "Status", "SessionToken": .string(alice), "OperationID": .string(op)])?["RefundedMinor"]?.integer == 500)
    }

    @Test func operationIDsAndApprovalCodesAreRandomAndUnique() throws {
        let gw = GatewayCore(configuration: .testKeys)
        var terminal = TerminalSecurity.testDevice()
        let token = try session(gw)
        var operations = Set<String>(), codes: [String] = []
        for i in 0..<200 {
            let answer = try #require(try ask(gw, try terminal.authorise(fields("T\(i)", amount: 1000, cvm: "NoCVM", token: token), card: testCard,
                                                                         pin: nil, keys: terminal.nextTransaction())))
            #expect(answer["Result"]?.string == "approved")
            operations.insert(try #require(answer["OperationID"]?.string))
            codes.append(try #require(answer["ApprovalCode"]?.string))
        }
        #expect(operations.count == 200 && Set(codes).count == 200)
        #expect(codes.allSatisfy(isApprovalCode))
        // Not a sequence: consecutive payments rarely get consecutive codes (a sequence always would).
        let consecutive = zip(codes, codes.dropFirst()).filter { Int($1) == Int($0)! + 1 }.count
        #expect(consecutive < 5, "\(consecutive) consecutive codes in 200")
    }

    @Test func aRandomSourceThatFailsGivesAnErrorNeverAnEmptyToken() throws {
        let gw = GatewayCore(configuration: .testKeys, random: { _ in throw CryptoError("RAND_bytes") })
        let answer = try #require(try ask(gw, ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-1", "User": "merchant", "Password": "secret"]))
        #expect(answer["Result"]?.string == "error" && answer["Error"]?.string == "5001")
        #expect(answer["SessionToken"] == nil && gw.sessionCount == 0)
        // A source that gives fewer bytes than asked is a failure too.
        let short = GatewayCore(configuration: .testKeys, random: { _ in [1, 2, 3] })
        #expect(try ask(short, ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-1", "User": "merchant", "Password": "secret"])?["Error"]?.string == "5001")
    }

    @Test func oneMerchantsLoginsCannotPushOutAnothersSessions() throws {
        let gw = Self.twoMerchants()
        let bob = try session(gw, user: "bob", password: "hunter2", licence: "LIC-TEST-B")
        for _ in 0..<1100 { _ = try session(gw) }
        #expect(gw.sessionsEvicted == 76 && gw.sessionCount == 1025)
        var terminal = TerminalSecurity.testDevice()
        let sale = try ask(gw, try terminal.authorise(fields("B9", amount: 100, cvm: "NoCVM", token: bob, merchant: "999008882"), card: testCard,
                                                      pin: nil, keys: terminal.nextTransaction()))
        #expect(sale?["Result"]?.string == "approved")
    }

    @Test func operationsBeyondTheLimitAreForgottenOldestFirstAndCounted() throws {
        var c = GatewayCore.Configuration.testKeys
        c.operationLimit = 3
        let gw = GatewayCore(configuration: c)
        var terminal = TerminalSecurity.testDevice()
        let token = try session(gw)
        var operations: [String] = []
        for i in 0..<4 {
            let sale = try #require(try ask(gw, try terminal.authorise(fields("L\(i)", amount: 1000, cvm: "NoCVM", token: token), card: testCard,
                                                                       pin: nil, keys: terminal.nextTransaction())))
            operations.append(try #require(sale["OperationID"]?.string))
        }
        #expect(gw.operationsForgotten == 1)
        // The oldest is gone (not found), the newest three are there.
        #expect(try ask(gw, ["Type": "Status", "SessionToken": .string(token), "OperationID": .string(operations[0])])?["Error"]?.string == "3008")
        for op in operations.dropFirst() {
            #expect(try ask(gw, ["Type": "Status", "SessionToken": .string(token), "OperationID": .string(op)])?["Result"]?.string == "ok")
        }
        // A refund keeps its original's place; the refund itself takes one.
        let refund = try ask(gw, try terminal.authorise(fields("L9", amount: 100, cvm: "NoCVM", type: "Refund", original: operations[3], token: token),
                                                        card: nil, pin: nil, keys: terminal.nextTransaction()))
        #expect(refund?["Result"]?.string == "approved" && gw.operationsForgotten == 2)
        #expect(try ask(gw, ["Type": "Status", "SessionToken": .string(token), "OperationID": .string(operations[3])])?["RefundedMinor"]?.integer == 100)
    }

    @Test func credentialsMatchWholeAndPerLicence() throws {
        let gw = Self.twoMerchants()
        func login(_ licence: String, _ user: String, _ password: String) throws -> JSONValue? {
            try ask(gw, ["Type": "Login", "Environment": "int", "Licence": .string(licence), "User": .string(user), "Password": .string(password)])
        }
        #expect(try login("LIC-TEST-B", "bob", "hunter2")?["MerchantID"]?.string == "999008882")
        #expect(try login("LIC-TEST-OTHER", "bob", "hunter2")?["Error"]?.string == "3005")
        #expect(try login("LIC-TEST-B", "bob", "hunter")?["Error"]?.string == "3005")
        #expect(try login("LIC-TEST-B", "bob", "hunter22")?["Error"]?.string == "3005")
        #expect(try login("LIC-TEST-B", "bo", "hunter2")?["Error"]?.string == "3005")
        #expect(try login("LIC-TEST-B", "merchant", "hunter2")?["Error"]?.string == "3005")
        #expect(try login("LIC-TEST-ANY", "merchant", "secret")?["MerchantID"]?.string == "999008881")
    }

    @Test func theMACInputIsLengthPrefixedSoFieldsCannotShiftIntoEachOther() {
        // With `|` joining, these two would MAC the same string ("1|2|3").
        let a: JSONValue = ["OperationID": "1|2", "Reason": "3", "KSN": "", "SessionToken": ""]
        let b: JSONValue = ["OperationID": "1", "Reason": "2|3", "KSN": "", "SessionToken": ""]
        #expect(GatewayCanonical.reverse(a) != GatewayCanonical.reverse(b))
        // Each message type has its own tag, so one message's fields are never another's.
        #expect(GatewayCanonical.reverse(a) != GatewayCanonical.encode("ReverseResult", a, ["OperationID", "Reason", "KSN", "SessionToken"]))
        let encoded = GatewayCanonical.encode("Reverse", ["OperationID": "OP-1"], ["OperationID", "KSN"])
        #expect(encoded == [0, 0, 0, 16] + Array("pppbridge-mac-v3".utf8) + [0, 0, 0, 7] + Array("Reverse".utf8)
                + [UInt8(ascii: "s"), 0, 0, 0, 4] + Array("OP-1".utf8) + [UInt8(ascii: "-"), 0, 0, 0, 0])
        // The JSON type is part of it: a relay turning `true` into `"true"` breaks the MAC.
        let answer: JSONValue = ["OperationID": "OP-1", "Result": "approved", "SignatureRequired": true, "AmountMinor": 5, "KSN": "", "TransactionID": "1"]
        #expect(GatewayCanonical.authoriseResult(answer) != GatewayCanonical.authoriseResult(answer.setting("SignatureRequired", "true")))
        #expect(GatewayCanonical.authoriseResult(answer) != GatewayCanonical.authoriseResult(answer.setting("AmountMinor", "5")))
    }
}
