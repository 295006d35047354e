import Crypto
import Wire

/// Connecting to a reader: waiting for its line, the link, the reader's login with the
/// merchant's session, pairing and bonds (SPEC §4.5), a required update during connect.
extension ReaderSession {
    // MARK: Connect

    /// Connects to `target` and logs in with `settings`; a required update installs before the
    /// connect finishes.
    public func connect(_ ticket: Int, to target: Target, settings: Settings, now: Instant) {
        if refusedAsBusy(ticket) { return }
        guard PaymentRules.isLocationID(settings.locationID) else {
            return finish(ticket, .failure(PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}")))
        }
        switch phase {
        case .connected: return finish(ticket, .failure(PaymentError(.busy, "already connected")))
        case .reconnecting: return finish(ticket, .failure(PaymentError(.busy, "reconnecting")))
        case .connecting: return finish(ticket, .failure(PaymentError(.busy, "connecting")))
        case .idle: break
        }
        var t = target
        t.serial = target.serial ?? target.peripheral?.serialNumber ?? String(target.path.split(separator: "/").last ?? "")
        self.target = t
        self.settings = settings
        phase = .connecting(Connecting(ticket: ticket))
        outputs.append(.probeLine(path: t.path))
    }

    /// The answer to `probeLine`: whether the line is there, the advertisement beside it, and
    /// the bond with the reader (the target's peripheral, else the advertised one), if any.
    public func lineProbed(present: Bool, advert: DiscoveredReader?, bondKey: [UInt8]?, now: Instant) {
        guard case .connecting(var c) = phase, c.setup == .waitingForLine, var t = target else { return }
        // The line may be missing for a moment (a terminal re-arming it); gone for a second, it is not there.
        if c.linePolls > 0, c.canceled {
            return connectFailed(PaymentError(.canceled, "connect canceled"), now: now)
        }
        guard present else {
            guard c.linePolls < 20 else { return connectFailed(PaymentError(.readerNotFound, t.path), now: now) }
            c.linePolls += 1
            phase = .connecting(c)
            setState(.connecting)
            timers[.linePoll] = now + .milliseconds(50)
            return
        }
        t.peripheral = t.peripheral ?? advert
        t.bondKey = bondKey ?? t.bondKey
        target = t
        if let p = t.peripheral, p.requiresPairing, t.bondKey == nil, !settings.autoPair {
            return connectFailed(PaymentError(.pairingRequired, "\(p.serialNumber) must be paired first (autoPair)"), now: now)
        }
        explicitDisconnect = false
        setState(.connecting)
        timers[.connect] = now + settings.connectTimeout
        openLink(now: now)
    }

    func probeLine() {
        guard case .connecting(let c) = phase, c.setup == .waitingForLine, let target else { return }
        outputs.append(.probeLine(path: target.path))
    }

    func connectTimedOut(now: Instant) {
        guard install == nil else { return }
        connectFailed(PaymentError(.connectTimedOut, "no reader login within \(settings.connectTimeout)"), now: now)
    }

    /// The connect call ends in failure: whatever link it had goes.
    func connectFailed(_ e: PaymentError, now: Instant) {
        guard case .connecting(let c) = phase else { return }
        let ticket = c.ticket
        timers[.connect] = nil
        timers[.linePoll] = nil
        timers[.lineRetry] = nil
        phase = .idle
        dropLink(now: now)
        info = nil
        setState(.failed(e.code))
        finish(ticket, .failure(e))
    }

    /// A setup step failed: a connect tries a lost line again until its timeout, a reconnect
    /// tries again after its backoff.
    func setupFailed(_ e: PaymentError, lineLost: Bool, now: Instant) {
        switch phase {
        case .connecting(var c):
            // A line that hangs up while we open it (a terminal re-arming its line after the
            // last host left) is tried again until the connect timeout.
            guard lineLost, timers[.connect] != nil else { return connectFailed(e, now: now) }
            c.setup = .waiting
            phase = .connecting(c)
            timers[.lineRetry] = now + .milliseconds(100)
        case .reconnecting:
            scheduleAttempt(now: now)
        case .idle, .connected:
            break
        }
    }

    // MARK: The reader's login

    func sendLogin(now: Instant) {
        guard let l = link, let target else { return }
        let s = settings
        var ext: JSONValue = ["LocationID": .string(s.locationID), "Environment": .string(s.environment), "AppLicence": .string(s.licence),
                              "MerchantID": .string(s.sessionToken == nil ? gatewayMerchantID ?? s.merchantID : s.merchantID),
                              "TerminalID": .string(s.terminalID)]
        if let token = s.sessionToken ?? sessionToken { ext = ext.setting("SessionToken", .string(token)) }
        let dateTime = wall(now).description
        ext = ext.setting("HostID", .string(s.hostID))
        // Only to the reader that gave it (another reader must not learn it).
        if let readerSession, readerSession.path == l.path { ext = ext.setting("ReaderSession", .string(readerSession.token)) }
        var plan = PairingPlan()
        if let p = target.peripheral, p.requiresPairing {
            if let key = target.bondKey {
                guard let nonceBytes = try? random(16), nonceBytes.count == 16,
                      let proof = try? Pairing.proof(linkKey: key, hostID: s.hostID, poiID: l.poiID, dateTime: dateTime, nonce: Hex.encode(nonceBytes)) else {
                    return setupEnded(PaymentError(.readerLoginFailed, "cannot prove the bond"), now: now)
                }
                plan.bondNonce = Hex.encode(nonceBytes)
                ext = ext.setting("Bond", ["Nonce": .string(Hex.encode(nonceBytes)), "Proof": .string(proof)])
            } else if s.autoPair, let ours = try? random(32), ours.count == 32, let pub = try? X25519.publicKey(privateKey: ours),
                      let nonce = try? random(16), nonce.count == 16, let commitment = try? Pairing.commitment(hostPublicKey: pub, hostNonce: nonce) {
                plan.ours = (ours, nonce)
                ext = ext.setting("Pairing", ["HostPublicKey": .string(Hex.encode(pub)), "Commitment": .string(commitment)])
            } else {
                return setupEnded(PaymentError(.pairingRequired, "\(p.serialNumber) must be paired first"), now: now)
            }
        }
        pairingPlan = plan
        setSetup(.loggingIn(l.id))
        request(.login, body: [
            "DateTime": .string(dateTime),
            "SaleSoftware": ["ProviderIdentification": "pppbridge", "ApplicationName": "pppbridge", "SoftwareVersion": "0.1.0", "CertificationCode": "none"],
            "SaleTerminalData": ["TerminalEnvironment": "Attended", "SaleCapabilities": ["CashierDisplay", "CashierStatus", "PrinterReceipt"]],
            "OperatorLanguage": "en",
            "Ext": ext,
        ], purpose: .login, answerWithin: settings.connectTimeout, now: now)
    }

    /// This link will not do: it goes, and the connect or the reconnect attempt has failed.
    func setupEnded(_ e: PaymentError, now: Instant) {
        dropLink(now: now)
        setupFailed(e, lineLost: false, now: now)
    }

    func loginAnswered(_ response: PaymentMessage, now: Instant) {
        guard let l = link, let target else { return }
        let status = PaymentResponseStatus(json: response.body["Response"])
        guard response.header.poiID == l.poiID, response.header.saleID == settings.saleID else {
            return setupEnded(PaymentError(.messageFormat, "login answer does not echo SaleID/POIID"), now: now)
        }
        guard status?.result == .success else {
            switch status?.value("reason") {
            case "TestKeysInProduction"?:
                return setupEnded(PaymentError(.environmentMismatch, "the reader holds test keys"), now: now)
            case "PairingRequired"?:
                return setupEnded(PaymentError(.pairingRequired, "the reader requires pairing"), now: now)
            case "PairingLost"?:
                if let p = target.peripheral {
                    outputs.append(.removeBond(peripheralUUID: p.peripheralUUID))
                    self.target?.bondKey = nil
                }
                return setupEnded(PaymentError(.pairingLost, "the reader no longer knows this host; the bond was deleted"), now: now)
            case "BondProofReplayed"?:
                return setupEnded(PaymentError(.readerLoginFailed, "the reader took the bond proof for a replay (are both clocks right?)"), now: now)
            case "PairingKeyInvalid"?:
                return setupEnded(PaymentError(.pairingRejected, "the reader refused our pairing key"), now: now)
            default:
                return setupEnded(PaymentError(.readerLoginFailed, status.map { PeerText.escaped($0.json.text, limit: 512) } ?? "no status"), now: now)
            }
        }
        let system = response.body["POISystemData"]
        let ext = response.body["Ext"]
        if let bondNonce = pairingPlan?.bondNonce, let key = target.bondKey {
            // The reader proves it holds the same link key: a stand-in that does not is refused.
            let expected = (try? Pairing.readerProof(linkKey: key, hostID: settings.hostID, poiID: l.poiID, nonce: bondNonce)) ?? ""
            guard Pairing.matches(expected, ext?["Bond"]?["Proof"]?.string ?? "") else {
                return setupEnded(PaymentError(.readerLoginFailed, "the reader could not prove our bond"), now: now)
            }
        }
        if let token = ext?["ReaderSession"]?.string, (1...64).contains(token.utf8.count), Hex.decode(token) != nil { readerSession = (l.path, token) }
        let offer = UpdateOffer(json: ext?["AvailableUpdate"])
        self.offer = offer
        info = Info(serialNumber: system?["POITerminalData"]?["POISerialNumber"]?.string ?? l.poiID,
                    softwareVersion: system?["POISoftware"]?["SoftwareVersion"]?.string ?? "",
                    batteryLevel: { if case .number(let t)? = ext?["Battery"]?["Level"] { return t }; return nil }(),
                    transactionsRemaining: ext?["KeyProfile"]?["TransactionsRemaining"]?.integer,
                    availableUpdate: offer.map { ReaderSoftwareUpdate(deviceSoftwareVersion: $0.version, durationEstimate: $0.durationEstimate,
                                                                       requiredAt: $0.requiredAt, size: $0.size) },
                    locationID: ext?["LocationID"]?.string ?? settings.locationID)
        guard let ours = pairingPlan?.ours else { return setupSucceeded(now: now) }
        beginPairing(ours: ours.key, hostNonce: ours.nonce, answer: ext?["Pairing"], now: now)
    }

    // MARK: Pairing

    /// Numeric comparison with commitments: we reveal the nonce we committed to, both sides
    /// derive the passkey from both keys and both nonces, the person confirms it matches the
    /// reader's display (the connect timeout waits meanwhile), and the confirmation commits the
    /// reader's bond.
    func beginPairing(ours: [UInt8], hostNonce: [UInt8], answer: JSONValue?, now: Instant) {
        guard let l = link, let terminalKey = answer?["TerminalPublicKey"]?.string.flatMap(Hex.decode),
              let terminalNonce = answer?["TerminalNonce"]?.string.flatMap(Hex.decode), terminalNonce.count == 16,
              let hostKey = try? X25519.publicKey(privateKey: ours), let shared = try? X25519.sharedSecret(privateKey: ours, peerPublicKey: terminalKey),
              let linkKey = try? Pairing.linkKey(sharedSecret: shared, hostPublicKey: hostKey, terminalPublicKey: terminalKey,
                                                 hostNonce: hostNonce, terminalNonce: terminalNonce),
              let passkey = try? Pairing.passkey(hostPublicKey: hostKey, terminalPublicKey: terminalKey, hostNonce: hostNonce, terminalNonce: terminalNonce),
              let confirmation = try? Pairing.confirmation(linkKey: linkKey, passkey: passkey) else {
            return setupEnded(PaymentError(.pairingRejected, "the reader's pairing answer is missing or unusable"), now: now)
        }
        pairingPlan?.linkKey = linkKey
        pairingPlan?.passkey = passkey
        pairingPlan?.confirmation = confirmation
        setSetup(.pairing(l.id))
        request(.admin, body: ["ServiceIdentification": "PairingNonce", "Ext": ["HostNonce": .string(Hex.encode(hostNonce))]], purpose: .pairingNonce,
                answerWithin: settings.connectTimeout, now: now)
    }

    func pairingNonceAnswered(_ status: PaymentResponseStatus?, now: Instant) {
        guard status?.result == .success else { return setupEnded(PaymentError(.pairingRejected, "the reader refused our nonce"), now: now) }
        guard let l = link, let plan = pairingPlan else { return }
        // A person takes their time: the connect timeout starts again after their answer.
        timers[.connect] = nil
        setSetup(.confirmingPasskey(l.id))
        outputs.append(.confirmPairing(plan.passkey))
    }

    /// The person's answer to `confirmPairing`.
    public func pairingConfirmed(_ confirmed: Bool, now: Instant) {
        guard case .confirmingPasskey(let id)? = setup, link?.id == id, let plan = pairingPlan else { return }
        if case .connecting = phase { timers[.connect] = now + settings.connectTimeout }
        guard confirmed else { return setupEnded(PaymentError(.pairingRejected, "passkey \(plan.passkey) not confirmed"), now: now) }
        setSetup(.pairing(id))
        request(.admin, body: ["ServiceIdentification": "ConfirmPairing", "Ext": ["Confirmation": .string(plan.confirmation)]], purpose: .confirmPairing,
                answerWithin: settings.connectTimeout, now: now)
    }

    func pairingConfirmationAnswered(_ status: PaymentResponseStatus?, now: Instant) {
        guard status?.result == .success else { return setupEnded(PaymentError(.pairingRejected, "the reader rejected the pairing"), now: now) }
        guard let plan = pairingPlan, let p = target?.peripheral else { return }
        outputs.append(.storeBond(peripheralUUID: p.peripheralUUID, key: plan.linkKey))
        target?.bondKey = plan.linkKey
        setupSucceeded(now: now)
    }

    // MARK: Logged in

    /// The reader logged us in on the current link.
    func setupSucceeded(now: Instant) {
        link?.loggedIn = true
        pairingPlan = nil
        switch phase {
        case .connecting(let c):
            phase = .connected
            timers[.connect] = nil
            if let offer, offer.isRequired(at: wall(now)) {
                startInstall(offer, duringConnect: c.ticket, ticket: nil, now: now)
            } else {
                if let update = info?.availableUpdate { outputs.append(.updateAvailable(update)) }
                setState(.ready)
                finish(c.ticket, .success(.done))
            }
        case .reconnecting:
            endEpisode(.success(()), now: now)
        case .idle, .connected:
            break
        }
    }
}
