import Crypto
import Payment
import Wire

/// The terminal's login: location, environment and merchant checks, the update check, the
/// session token that binds the reader session to its host, and pairing (numeric comparison
/// and bonds).
extension TerminalCore {
    // MARK: A second host


    /// Whether `payload`, the first message of a second connection while a host is connected,
    /// may take the session over: a Login that presents this session's token.
    public func mayTakeOver(with payload: [UInt8]) -> Bool {
        guard let token = readerSessionToken, let m = try? PaymentMessage.decode(payload),
              m.header.messageClass == .service, m.header.type == .request, m.header.category == .login,
              let presented = m.body["Ext"]?["ReaderSession"]?.string else { return false }
        return SecureBytes.equal(Array(token.utf8), Array(presented.utf8))
    }

    /// The answer to a second connection's first message when it may not take over (counted);
    /// the connected host's session goes on. nil when the message asks nothing.
    public func refusalOfSecondHost(_ payload: [UInt8]) -> [UInt8]? {
        refusedSecondHosts += 1
        record("a second host connection refused: the reader session is in use")
        guard let m = try? PaymentMessage.decode(payload), m.header.messageClass == .service, m.header.type == .request else { return nil }
        let body: JSONValue = ["Response": PaymentResponseStatus.failure(.busy, [("reason", "SessionInUse")]).json]
        let answer = PaymentMessage(direction: .response, header: m.header.response(), body: body).encoded
        return PaymentFrame.fits(answer) ? answer : nil
    }


    // MARK: Login

    func login(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        // A transaction survives a new login (the host reconnecting to recover it); an update
        // or another login in progress does not allow one.
        if admin != nil || pendingLogin != nil { return fail(h, .busy) }
        guard h.poiID == configuration.serialNumber else { return fail(h, .notAllowed, [("reason", "UnknownPOIID")]) }
        let ext = m.body["Ext"]
        let location = ext?["LocationID"]?.string ?? ""
        let environment = ext?["Environment"]?.string ?? ""
        let merchant = ext?["MerchantID"]?.string ?? ""
        let terminal = ext?["TerminalID"]?.string ?? ""
        guard PaymentRules.isLocationID(location) else {
            return fail(h, .messageFormat, [("reason", "InvalidLocationID")])
        }
        guard ["des", "int", "ccal", "real"].contains(environment) else { return fail(h, .messageFormat, [("reason", "InvalidEnvironment")]) }
        if environment == "real" && security.testKeys { return fail(h, .notAllowed, [("reason", "TestKeysInProduction")]) }
        guard PaymentRules.isDigits(merchant, 9...9), PaymentRules.isDigits(terminal, 1...3) else {
            return fail(h, .messageFormat, [("reason", "InvalidMerchantOrTerminal")])
        }
        var s = Session(saleID: h.saleID, merchantID: merchant, terminalID: terminal, environment: environment, locationID: location)
        // Passed on to the gateway, never shown: hex of a sensible length or nothing.
        if let token = ext?["SessionToken"]?.string, (1...128).contains(token.utf8.count), Hex.decode(token) != nil { s.gatewaySession = token }
        s.usedServiceIDs.insert(h.identifier ?? "")
        var pairingExt: JSONValue?, bondExt: JSONValue?
        let hostID = ext?["HostID"]?.string ?? h.saleID
        // The bond's key and a journal word: printable and short.
        guard (1...64).contains(hostID.utf8.count), hostID.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            return fail(h, .messageFormat, [("reason", "InvalidHostID")])
        }
        s.hostID = hostID
        if configuration.requiresPairing {
            if let pairing = ext?["Pairing"] {
                guard let hostKey = pairing["HostPublicKey"]?.string.flatMap(Hex.decode), hostKey.count == 32,
                      let commitment = pairing["Commitment"]?.string, commitment.utf8.count == 64,
                      let ours = try? random(32), ours.count == 32, let publicKey = try? X25519.publicKey(privateKey: ours),
                      let shared = try? X25519.sharedSecret(privateKey: ours, peerPublicKey: hostKey),
                      let nonce = try? random(16), nonce.count == 16 else {
                    return fail(h, .messageFormat, [("reason", "PairingKeyInvalid")])
                }
                s.pairing = PendingPairing(hostID: hostID, hostKey: hostKey, terminalKey: publicKey, sharedSecret: shared,
                                           commitment: commitment, terminalNonce: nonce)
                pairingExt = ["TerminalPublicKey": .string(Hex.encode(publicKey)), "TerminalNonce": .string(Hex.encode(nonce))]
                record("pairing with \(hostID) begins")
            } else if let proof = ext?["Bond"]?["Proof"]?.string {
                let dateTime = m.body["DateTime"]?.string ?? "", nonce = ext?["Bond"]?["Nonce"]?.string ?? ""
                guard let key = bonds[hostID],
                      Pairing.matches((try? Pairing.proof(linkKey: key, hostID: hostID, poiID: configuration.serialNumber, dateTime: dateTime, nonce: nonce)) ?? "", proof) else {
                    return fail(h, .notAllowed, [("reason", "PairingLost")])
                }
                // A proof seen recently, or from another time, is a replay.
                guard let sent = WallTime(rfc3339: dateTime), abs(sent.seconds - wall(now).seconds) <= 300,
                      nonce.utf8.count >= 16, !bondNonces.contains(nonce) else {
                    record("bond proof from \(hostID) replayed or stale: refused")
                    return fail(h, .notAllowed, [("reason", "BondProofReplayed")])
                }
                bondNonces.append(nonce)
                if bondNonces.count > 1024 { bondNonces.removeFirst() }
                // Our answer proves we hold the same key.
                guard let answer = try? Pairing.readerProof(linkKey: key, hostID: hostID, poiID: configuration.serialNumber, nonce: nonce) else {
                    return fail(h, .messageFormat, [("reason", "PairingKeyInvalid")])
                }
                bondExt = ["Proof": .string(answer)]
            } else {
                return fail(h, .notAllowed, [("reason", "PairingRequired")])
            }
        }
        record("login from \(PeerText.escaped(h.saleID)) at \(location) (\(environment))")
        // Ask the gateway for updates first; answer when it replies or after a short wait.
        pendingLogin = PendingLogin(header: h, session: s, deadline: now + configuration.loginUpdateCheckTimeout, pairing: pairingExt, bond: bondExt)
        enqueueGateway(.updateCheck, ["Type": "UpdateCheck", "Version": .string(configuration.softwareVersion),
                                      "SerialNumber": .string(configuration.serialNumber)],
                       timeout: configuration.loginUpdateCheckTimeout, now: now)
    }

    func completeLogin(now: Instant) {
        guard let pending = pendingLogin else { return }
        pendingLogin = nil
        // A fresh token for every login: the one a taken-over session had is spent.
        guard let token = try? random(16), token.count == 16 else {
            return fail(pending.header, .unavailableDevice, [("reason", "NoRandomBytes")])
        }
        session = pending.session
        readerSessionToken = Hex.encode(token)
        var ext: JSONValue = [
            "ReaderSession": .string(Hex.encode(token)),
            "LocationID": .string(pending.session.locationID),
            "Battery": ["Level": .number(PaymentRules.fraction(configuration.battery)), "Charging": false],
            "KeyProfile": ["Scheme": "AES128-DUKPT", "TransactionsRemaining": .integer(security.transactionsRemaining)],
        ]
        if let offer = availableUpdate { ext = ext.setting("AvailableUpdate", offer.json) }
        if let pairing = pending.pairing { ext = ext.setting("Pairing", pairing) }
        if let bond = pending.bond { ext = ext.setting("Bond", bond) }
        respond(pending.header, body: [
            "Response": PaymentResponseStatus.success.json,
            "POISystemData": [
                "DateTime": .string(wall(now).description),
                "POISoftware": ["ProviderIdentification": "pppbridge", "ApplicationName": "SimTelium",
                                "SoftwareVersion": .string(configuration.softwareVersion), "CertificationCode": "none"],
                "POITerminalData": ["TerminalEnvironment": "Attended", "POISerialNumber": .string(configuration.serialNumber),
                                    "POICapabilities": ["CashierDisplay", "CustomerDisplay", "CustomerInput", "ICC", "MagStripe", "EMVContactless"]],
                "POIStatus": ["GlobalStatus": "OK", "SecurityOKFlag": true, "PEDOKFlag": true, "CardReaderOKFlag": true, "CommunicationOKFlag": true],
            ],
            "Ext": ext,
        ])
    }



    /// The host reveals the nonce it committed to: both passkeys can now be derived, and ours
    /// goes on the display.
    func pairingNonce(_ m: PaymentMessage) {
        guard var pairing = session?.pairing, pairing.passkey == nil else { return fail(m.header, .notFound) }
        guard let nonce = m.body["Ext"]?["HostNonce"]?.string.flatMap(Hex.decode), nonce.count == 16,
              let commitment = try? Pairing.commitment(hostPublicKey: pairing.hostKey, hostNonce: nonce),
              Pairing.matches(commitment, pairing.commitment),
              let passkey = try? Pairing.passkey(hostPublicKey: pairing.hostKey, terminalPublicKey: pairing.terminalKey,
                                                 hostNonce: nonce, terminalNonce: pairing.terminalNonce),
              let key = try? Pairing.linkKey(sharedSecret: pairing.sharedSecret, hostPublicKey: pairing.hostKey,
                                             terminalPublicKey: pairing.terminalKey, hostNonce: nonce, terminalNonce: pairing.terminalNonce) else {
            session = nil
            record("pairing with \(PeerText.escaped(m.header.saleID)): the nonce does not match its commitment")
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        pairing.passkey = passkey
        pairing.linkKey = key
        session?.pairing = pairing
        display("pairing", "PAIRING CODE \(passkey)")
        record("pairing with \(pairing.hostID): passkey \(passkey) on the display")
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }

    /// The host's person confirmed the passkey: the bond is kept if ours did too.
    func confirmPairing(_ m: PaymentMessage) {
        guard let pairing = session?.pairing, let key = pairing.linkKey, let passkey = pairing.passkey else { return fail(m.header, .notFound) }
        guard let given = m.body["Ext"]?["Confirmation"]?.string,
              Pairing.matches((try? Pairing.confirmation(linkKey: key, passkey: passkey)) ?? "", given) else {
            session = nil
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        guard configuration.confirmsPairing else {
            session = nil
            record("pairing with \(pairing.hostID) rejected at the terminal")
            return fail(m.header, .notAllowed, [("reason", "PairingRejected")])
        }
        bonds.insert(pairing.hostID, key)
        session?.pairing = nil
        record("paired with \(pairing.hostID)")
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }
}
