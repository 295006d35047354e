import Crypto
@testable import Payment
import Testing

/// The terminal binds the reader session to the token its login answer carried.
@Suite struct ReaderSessionTokenTests {
    let wall = WallTime(rfc3339: "2026-11-01T10:00:00Z")!

    @Test func onlyALoginPresentingTheSessionsTokenMayTakeItOver() throws {
        let rig = HostileInputTests.Rig(wall: wall)
        #expect(rig.t.readerSessionToken == nil, "no token before a login")
        let answers = rig.send(rig.request(.login, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": [
            "LocationID": "tml_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001", "SessionToken": .string(rig.sessionToken)]]))
        let token = try #require(answers.first?.body["Ext"]?["ReaderSession"]?.string)
        #expect(token.utf8.count == 32 && rig.t.readerSessionToken == token)

        func login(_ presented: String?) -> [UInt8] {
            var ext: JSONValue = ["LocationID": "tml_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001"]
            if let presented { ext = ext.setting("ReaderSession", .string(presented)) }
            return rig.request(.login, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": ext])
        }
        #expect(rig.t.mayTakeOver(with: login(token)))
        #expect(!rig.t.mayTakeOver(with: login(nil)))
        #expect(!rig.t.mayTakeOver(with: login(String(token.reversed()))))
        #expect(!rig.t.mayTakeOver(with: login(token + "00")))
        #expect(!rig.t.mayTakeOver(with: rig.request(.diagnosis, body: ["HostDiagnosisFlag": false, "Ext": ["ReaderSession": .string(token)]])))
        #expect(!rig.t.mayTakeOver(with: Array("not a message".utf8)))

        // A refusal answers the intruder's own request and counts it.
        let refusal = try #require(rig.t.refusalOfSecondHost(login(nil)))
        let message = try PaymentMessage.decode(refusal)
        #expect(message.header.category == .login && message.header.type == .response)
        #expect(PaymentResponseStatus(json: message.body["Response"])?.value("reason") == "SessionInUse")
        #expect(rig.t.refusedSecondHosts == 1)

        // The host leaving spends the token; the next login gets a new one.
        rig.t.hostDidDisconnect(now: rig.now)
        #expect(rig.t.readerSessionToken == nil && !rig.t.mayTakeOver(with: login(token)))
        rig.t.hostDidConnect(now: rig.now)
        let again = rig.send(rig.request(.login, body: ["DateTime": "2026-11-01T10:00:05Z", "Ext": [
            "LocationID": "tml_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001"]]))
        let second = try #require(again.first?.body["Ext"]?["ReaderSession"]?.string)
        #expect(second != token)
    }

    @Test func aFailingRandomSourceRefusesTheLoginInsteadOfGivingAGuessableToken() throws {
        struct NoEntropy: Error {}
        let rig = HostileInputTests.Rig(wall: wall, random: { _ in throw NoEntropy() })
        let status = rig.login()
        #expect(status?.result == .failure && status?.value("reason") == "NoRandomBytes")
        #expect(rig.t.readerSessionToken == nil)
        // A short read is as bad as none.
        let short = HostileInputTests.Rig(wall: wall, random: { n in [UInt8](repeating: 7, count: n / 2) })
        #expect(short.login()?.value("reason") == "NoRandomBytes" && short.t.readerSessionToken == nil)
    }
}
