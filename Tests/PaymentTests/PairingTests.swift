import Crypto
import NetStack
import Payment
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
        let dateTime = "2026-11-01T10:00:05Z"

        // No pairing and no bond: refused.
        let bare = try exchange(t, login(ext: [:], dateTime: dateTime), at: &now)
        #expect(status(bare.first)?.value("reason") == "PairingRequired")

        // Pairing: our key in, the terminal's key out; the passkey on its display matches ours.
        let host = try SecureBytes.random(32), hostPublic = try X25519.publicKey(privateKey: host)
        let paired = try exchange(t, login(ext: ["Pairing": ["HostPublicKey": .string(Hex.encode(hostPublic))]], dateTime: dateTime), at: &now)
        #expect(status(paired.first)?.result == .success)
        let terminalPublic = try #require(paired.first?.body["Ext"]?["Pairing"]?["TerminalPublicKey"]?.string.flatMap(Hex.decode))
        let passkey = Pairing.passkey(hostPublicKey: hostPublic, terminalPublicKey: terminalPublic)
        #expect(t.control(["cmd": "status"], now: now)["passkey"]?.string == passkey)
        let key = try Pairing.linkKey(sharedSecret: try X25519.sharedSecret(privateKey: host, peerPublicKey: terminalPublic),
                                      hostPublicKey: hostPublic, terminalPublicKey: terminalPublic)
        // Anything but the confirmation is refused while the pairing waits.
        let early = try exchange(t, request(.diagnosis, id: "2", body: ["HostDiagnosisFlag": false]), at: &now)
        #expect(status(early.first)?.value("reason") == "PairingPending")
        let confirmed = try exchange(t, request(.admin, id: "3", body: ["ServiceIdentification": "ConfirmPairing",
                                                                       "Ext": ["Confirmation": .string(Pairing.confirmation(linkKey: key, passkey: passkey))]]), at: &now)
        #expect(status(confirmed.first)?.result == .success)
        #expect(t.control(["cmd": "status"], now: now)["bonds"]?.integer == 1)

        // The bond lets the host in; the same proof again is a replay; a stale time too.
        t.hostDidDisconnect(now: now)
        t.hostDidConnect(now: now)
        let nonce = "00112233445566778899AABBCCDDEEFF"
        let bonded = login(ext: ["Bond": ["Nonce": .string(nonce), "Proof": .string(Pairing.proof(linkKey: key, hostID: "HOST-1", poiID: "SIM-00000001",
                                                                                                 dateTime: dateTime, nonce: nonce))]], dateTime: dateTime)
        #expect(status(try exchange(t, bonded, at: &now).first)?.result == .success)
        t.hostDidDisconnect(now: now)
        t.hostDidConnect(now: now)
        #expect(status(try exchange(t, bonded, at: &now).first)?.value("reason") == "BondProofReplayed")
        let stale = "2026-11-01T09:00:00Z", other = "FFEEDDCCBBAA99887766554433221100"
        let old = login(ext: ["Bond": ["Nonce": .string(other), "Proof": .string(Pairing.proof(linkKey: key, hostID: "HOST-1", poiID: "SIM-00000001",
                                                                                              dateTime: stale, nonce: other))]], dateTime: stale)
        #expect(status(try exchange(t, old, at: &now).first)?.value("reason") == "BondProofReplayed")
        // A proof under another key is a lost bond.
        let wrong = login(ext: ["Bond": ["Nonce": .string(other), "Proof": .string(Pairing.proof(linkKey: [UInt8](repeating: 7, count: 16), hostID: "HOST-1",
                                                                                                poiID: "SIM-00000001", dateTime: dateTime, nonce: other))]], dateTime: dateTime)
        #expect(status(try exchange(t, wrong, at: &now).first)?.value("reason") == "PairingLost")
    }
}
