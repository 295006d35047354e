import Crypto
import NetStack
import Payment
@testable import PaymentKit
@testable import Simulation
import Testing

/// The terminal's side of pairing, sans-IO on virtual time: pair by passkey, log in again with
/// the bond, and a replayed bonded login refused.
@Suite struct PairingTests {
    let wall = WallTime(rfc3339: "2026-11-01T10:00:00Z")!

    func terminal() -> TerminalCore {
        var c = TerminalCore.Configuration()
        c.requiresPairing = true
        return TerminalCore(configuration: c, security: .testDevice(), now: .zero, wallClock: wall)
    }

    func request(_ category: PaymentMessage.Category, id: String, body: JSONValue) -> [UInt8] {
        let h = PaymentMessage.Header(protocolVersion: category == .login || category == .diagnosis ? "3.1" : nil, messageClass: .service, category: category,
                                      type: .request, identifier: id, saleID: "HOST-1", poiID: "SIM-00000001")
        return PaymentMessage(direction: .request, header: h, body: body).encoded
    }

    func login(ext: JSONValue, dateTime: String) -> [UInt8] {
        let base: JSONValue = ["LocationID": "tml_1", "Environment": "int", "MerchantID": "999008881", "TerminalID": "001"]
        var e = base
        if case .object(let pairs) = ext { for (k, v) in pairs { e = e.setting(k, v) } }
        return request(.login, id: "1", body: ["DateTime": .string(dateTime), "OperatorLanguage": "en", "Ext": e])
    }

    /// Feeds a host payload; answers the login's update check as "no gateway"; returns the
    /// answers to the host.
    func exchange(_ t: TerminalCore, _ payload: [UInt8], at now: inout Instant) throws -> [PaymentMessage] {
        t.receive(hostPayload: payload, now: now)
        var answers: [PaymentMessage] = []
        for _ in 0..<3 {
            for o in t.takeOutputs() {
                switch o {
                case .host(let bytes): answers.append(try PaymentMessage.decode(bytes))
                case .gateway: t.gatewayDidFail(now: now)
                default: break
                }
            }
            now = now + .seconds(4)
            t.poll(now: now)
        }
        return answers.filter { $0.header.messageClass == .service }
    }

    func status(_ m: PaymentMessage?) -> PaymentResponseStatus? { PaymentResponseStatus(json: m?.body["Response"]) }

    @Test func pairThenBondThenRefuseAReplay() throws {
        let t = terminal()
        var now = Instant.zero
        t.hostDidConnect(now: now)
        let dateTime = "2026-11-01T10:00:05Z", hostID = "00112233445566778899AABBCCDDEEFF"

        // No pairing and no bond: refused.
        let bare = try exchange(t, login(ext: ["HostID": .string(hostID)], dateTime: dateTime), at: &now)
        #expect(status(bare.first)?.value("reason") == "PairingRequired")

        // Pairing: our key and a commitment to our nonce in; the terminal's key and nonce out.
        let host = try SecureBytes.random(32), hostPublic = try X25519.publicKey(privateKey: host), hostNonce = try SecureBytes.random(16)
        let commitment = try Pairing.commitment(hostPublicKey: hostPublic, hostNonce: hostNonce)
        let paired = try exchange(t, login(ext: ["HostID": .string(hostID), "Pairing": ["HostPublicKey": .string(Hex.encode(hostPublic)),
                                                                                       "Commitment": .string(commitment)]], dateTime: dateTime), at: &now)
        #expect(status(paired.first)?.result == .success)
        let answer = paired.first?.body["Ext"]?["Pairing"]
        let terminalPublic = try #require(answer?["TerminalPublicKey"]?.string.flatMap(Hex.decode))
        let terminalNonce = try #require(answer?["TerminalNonce"]?.string.flatMap(Hex.decode))
        #expect(t.displayedPasskey == nil, "no passkey before our nonce")
        // Anything but the pairing's own steps is refused meanwhile.
        let early = try exchange(t, request(.diagnosis, id: "2", body: ["HostDiagnosisFlag": false]), at: &now)
        #expect(status(early.first)?.value("reason") == "PairingPending")
        // Our nonce, checked against the commitment: now the passkey shows, the same as ours.
        let revealed = try exchange(t, request(.admin, id: "3", body: ["ServiceIdentification": "PairingNonce",
                                                                      "Ext": ["HostNonce": .string(Hex.encode(hostNonce))]]), at: &now)
        #expect(status(revealed.first)?.result == .success)
        let passkey = try Pairing.passkey(hostPublicKey: hostPublic, terminalPublicKey: terminalPublic, hostNonce: hostNonce, terminalNonce: terminalNonce)
        #expect(t.displayedPasskey == passkey)
        // Shown on the terminal, never told to a control client (the host could be one).
        let reported = TerminalControlCommands.handle(core: t, ["cmd": "status"], now: now)
        #expect(reported["passkey"] == nil && reported["pairing"]?.bool == true && !reported.text.contains(passkey))
        let key = try Pairing.linkKey(sharedSecret: try X25519.sharedSecret(privateKey: host, peerPublicKey: terminalPublic),
                                      hostPublicKey: hostPublic, terminalPublicKey: terminalPublic, hostNonce: hostNonce, terminalNonce: terminalNonce)
        let confirmed = try exchange(t, request(.admin, id: "4", body: ["ServiceIdentification": "ConfirmPairing",
                                                                       "Ext": ["Confirmation": .string(try Pairing.confirmation(linkKey: key, passkey: passkey))]]), at: &now)
        #expect(status(confirmed.first)?.result == .success)
        #expect(TerminalControlCommands.handle(core: t, ["cmd": "status"], now: now)["bonds"]?.integer == 1)

        // The bond lets the host in, and the terminal proves it holds the key too.
        t.hostDidDisconnect(now: now)
        t.hostDidConnect(now: now)
        let nonce = "00112233445566778899AABBCCDDEEFF"
        func bondLogin(_ key: [UInt8], at time: String, nonce: String) throws -> [UInt8] {
            login(ext: ["HostID": .string(hostID), "Bond": ["Nonce": .string(nonce), "Proof": .string(try Pairing.proof(linkKey: key, hostID: hostID,
                                                                                                                       poiID: "SIM-00000001", dateTime: time, nonce: nonce))]],
                  dateTime: time)
        }
        let bonded = try bondLogin(key, at: dateTime, nonce: nonce)
        let welcome = try exchange(t, bonded, at: &now).first
        #expect(status(welcome)?.result == .success)
        #expect(Pairing.matches(try Pairing.readerProof(linkKey: key, hostID: hostID, poiID: "SIM-00000001", nonce: nonce),
                                welcome?.body["Ext"]?["Bond"]?["Proof"]?.string ?? ""))
        // The same proof again is a replay; a stale time too; another key is a lost bond.
        t.hostDidDisconnect(now: now)
        t.hostDidConnect(now: now)
        #expect(status(try exchange(t, bonded, at: &now).first)?.value("reason") == "BondProofReplayed")
        let other = "FFEEDDCCBBAA99887766554433221100"
        #expect(status(try exchange(t, try bondLogin(key, at: "2026-11-01T09:00:00Z", nonce: other), at: &now).first)?.value("reason") == "BondProofReplayed")
        #expect(status(try exchange(t, try bondLogin([UInt8](repeating: 7, count: 16), at: dateTime, nonce: other), at: &now).first)?.value("reason") == "PairingLost")
    }

    @Test func aNonceThatBreaksItsCommitmentEndsThePairing() throws {
        let t = terminal()
        var now = Instant.zero
        t.hostDidConnect(now: now)
        let host = try SecureBytes.random(32), hostPublic = try X25519.publicKey(privateKey: host)
        let committed = try SecureBytes.random(16), other = try SecureBytes.random(16)
        let paired = try exchange(t, login(ext: ["Pairing": ["HostPublicKey": .string(Hex.encode(hostPublic)),
                                                             "Commitment": .string(try Pairing.commitment(hostPublicKey: hostPublic, hostNonce: committed))]],
                                           dateTime: "2026-11-01T10:00:05Z"), at: &now)
        #expect(status(paired.first)?.result == .success)
        let revealed = try exchange(t, request(.admin, id: "2", body: ["ServiceIdentification": "PairingNonce", "Ext": ["HostNonce": .string(Hex.encode(other))]]), at: &now)
        #expect(status(revealed.first)?.value("reason") == "PairingRejected")
        #expect(t.displayedPasskey == nil && TerminalControlCommands.handle(core: t, ["cmd": "status"], now: now)["bonds"]?.integer == 0)
        // A key that is not 32 bytes of hex is refused as such.
        let bad = try exchange(t, login(ext: ["Pairing": ["HostPublicKey": "XYZ", "Commitment": .string(String(repeating: "0", count: 64))]],
                                        dateTime: "2026-11-01T10:00:05Z"), at: &now)
        #expect(status(bad.first)?.value("reason") == "PairingKeyInvalid")
    }
}
