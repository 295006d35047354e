import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// Connecting to a reader: the link, the reader's login with the merchant's session, pairing
/// and bonds, a required update during connect.
extension PaymentReader {
    // MARK: Connect

    /// Connects to the reader whose line is at `path` (its name is the reader's serial number),
    /// logs in with the location, and installs a required update before returning.
    public func connect(path: String, serialNumber: String? = nil, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        let _: Bool = try await run { [self] finish in
            connectOnLoop(path: path, serial: serialNumber, configuration: configuration) { r in finish(r.map { true }) }
        }
    }

    /// Connects to a discovered reader; a discovery still running completes with it.
    public func connect(_ reader: DiscoveredReader, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        let _: Bool = try await run { [self] finish in
            // Discovery hands over to connecting directly (no idle state in between); a connect
            // refused at once leaves the discovery running.
            if discovery != nil {
                guard PaymentRules.isLocationID(configuration.locationID) else {
                    return finish(.failure(PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}")))
                }
                guard link == nil else { return finish(.failure(PaymentError(.busy, "already connected"))) }
                endDiscovery(.success(reader), state: nil)
            }
            connectOnLoop(path: reader.path, serial: reader.serialNumber, peripheral: reader, configuration: configuration) { r in finish(r.map { true }) }
        }
    }

    func connectOnLoop(path: String, serial: String?, peripheral known: DiscoveredReader? = nil, configuration c: ReaderConnectionConfiguration,
                               linePolls: Int = 0, finish: @escaping (Result<Void, PaymentError>) -> Void) {
        if linePolls == 0, busy(finish) { return }
        guard PaymentRules.isLocationID(c.locationID) else {
            return finish(.failure(PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}")))
        }
        guard link == nil else { return finish(.failure(PaymentError(.busy, "already connected"))) }
        guard episode == nil else { return finish(.failure(PaymentError(.busy, "reconnecting"))) }
        // The line may be missing for a moment (a terminal re-arming it); gone for a second, it is not there.
        if linePolls > 0, connectCanceled {
            connectCanceled = false
            setState(.failed(.canceled))
            return finish(.failure(PaymentError(.canceled, "connect canceled")))
        }
        if access(path, F_OK) != 0 {
            if linePolls == 0 { connectCanceled = false }
            guard linePolls < 20 else {
                setState(.failed(.readerNotFound))
                return finish(.failure(PaymentError(.readerNotFound, path)))
            }
            setState(.connecting)
            _ = loop.schedule(at: loop.now + .milliseconds(50)) { [weak self] in
                self?.connectOnLoop(path: path, serial: serial, peripheral: known, configuration: c, linePolls: linePolls + 1, finish: finish)
            }
            return
        }
        let peripheral = known ?? ReaderLines.advert(at: path)
        if let peripheral, peripheral.requiresPairing, c.bonds.key(for: peripheral.peripheralUUID) == nil, !c.autoPair {
            setState(.failed(.pairingRequired))
            return finish(.failure(PaymentError(.pairingRequired, "\(peripheral.serialNumber) must be paired first (autoPair)")))
        }
        self.peripheral = peripheral
        self.path = path
        self.serial = serial ?? peripheral?.serialNumber ?? String(path.split(separator: "/").last ?? "")
        self.configuration = c
        explicitDisconnect = false
        setState(.connecting)
        let done: (Result<Void, PaymentError>) -> Void = { [weak self] r in
            guard let self else { return }
            if let t = self.connectTimer { self.loop.cancelTimer(t) }
            self.connectTimer = nil
            self.connectAbort = nil
            switch r {
            case .success: self.setState(.ready)
            case .failure(let e):
                self.link?.teardown()
                // A link still being opened (not adopted yet) goes too.
                if self.link == nil { self.lastChannel?.requestClose() }
                self.link = nil
                self.infoValue = nil
                self.setState(.failed(e.code))
            }
            finish(r)
        }
        var finished = false
        let once: (Result<Void, PaymentError>) -> Void = { r in
            guard !finished else { return }
            finished = true
            done(r)
        }
        connectAbort = { e in once(.failure(e)) }
        connectTimer = loop.schedule(at: loop.now + c.connectTimeout) { [weak self] in
            guard let self, self.install == nil else { return }
            self.connectTimer = nil
            once(.failure(PaymentError(.connectTimedOut, "no reader login within \(c.connectTimeout)")))
        }
        // A line that hangs up while we open it (a terminal re-arming its line after the last
        // host left) is tried again until the connect timeout.
        func attempt() {
            establish { [weak self] r in
                guard let self else { return }
                switch r {
                case .failure(let e):
                    guard self.lastLineLost, !finished, self.connectTimer != nil else { return once(.failure(e)) }
                    _ = self.loop.schedule(at: self.loop.now + .milliseconds(100)) {
                        if !finished && self.connectTimer != nil { attempt() }
                    }
                case .success(let l):
                    // Cancelled or timed out meanwhile: this link is not wanted.
                    guard !finished else { return l.teardown() }
                    self.connected(l, once)
                }
            }
        }
        attempt()
    }

    func connected(_ l: ReaderLink, _ once: @escaping (Result<Void, PaymentError>) -> Void) {
        adopt(l)
        if let offer, offer.isRequired(at: Self.wallNow()) {
            if let t = connectTimer { loop.cancelTimer(t) }
            connectTimer = nil
            startInstall(offer, duringConnect: once, finish: nil)
        } else {
            if let update = infoValue?.availableUpdate { delegate?.reader(self, didReportAvailableUpdate: update) }
            once(.success(()))
        }
    }

    static func wallNow() -> WallTime { WallTime.current() }


    /// A link given up (a failed login, a rejected pairing) may still be saying goodbye on the
    /// line; a new one on the same line waits until it is down.
    func previousLinkClosed() async {
        guard let previous = await loop.perform({ [self] in link == nil && stateValue.isIdle && episode == nil && install == nil ? lastChannel : nil }) else { return }
        await previous.close()
    }

    /// Opens a link and logs in; the link is handed over only when the login succeeded.
    func establish(_ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        guard let path, let configuration else { return completion(.failure(PaymentError(.notConnected))) }
        let l = ReaderLink(path: path, configuration: configuration, loop: loop)
        lastChannel = l.channel
        l.setPOIID(serial ?? "UNKNOWN")
        l.observer = { [weak self] bytes in
            guard let self, self.recordsBytes else { return }
            self.wire += bytes
        }
        if episode != nil { episode?.candidate = l }
        lastLineLost = false
        l.open { [weak self, l] error in
            guard let self else { return }
            if let error {
                self.lastLineLost = l.lineLost
                return completion(.failure(error))
            }
            self.login(l, completion)
        }
    }

    func login(_ l: ReaderLink, _ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        guard let c = configuration else { return }
        var ext: JSONValue = ["LocationID": .string(c.locationID), "Environment": .string(c.environment), "AppLicence": .string(c.licence),
                              "MerchantID": .string(c.sessionToken == nil ? gatewayMerchantID ?? c.merchantID : c.merchantID),
                              "TerminalID": .string(c.terminalID)]
        if let token = c.sessionToken ?? sessionToken { ext = ext.setting("SessionToken", .string(token)) }
        let dateTime = Self.wallNow().description
        ext = ext.setting("HostID", .string(c.bonds.hostID))
        // Only to the reader that gave it (another reader must not learn it).
        if let readerSession, readerSession.path == l.path { ext = ext.setting("ReaderSession", .string(readerSession.token)) }
        // What this login does about pairing: nothing, prove a bond, or begin a pairing.
        var bondNonce: String?, pairing: (key: [UInt8], nonce: [UInt8])?
        if let p = peripheral, p.requiresPairing {
            if let key = c.bonds.key(for: p.peripheralUUID) {
                let nonce = Hex.encode((try? SecureBytes.random(16)) ?? [])
                guard let proof = try? Pairing.proof(linkKey: key, hostID: c.bonds.hostID, poiID: l.poiID, dateTime: dateTime, nonce: nonce) else {
                    l.teardown()
                    return completion(.failure(PaymentError(.readerLoginFailed, "cannot prove the bond")))
                }
                bondNonce = nonce
                ext = ext.setting("Bond", ["Nonce": .string(nonce), "Proof": .string(proof)])
            } else if c.autoPair, let ours = try? SecureBytes.random(32), let pub = try? X25519.publicKey(privateKey: ours),
                      let nonce = try? SecureBytes.random(16), let commitment = try? Pairing.commitment(hostPublicKey: pub, hostNonce: nonce) {
                pairing = (ours, nonce)
                ext = ext.setting("Pairing", ["HostPublicKey": .string(Hex.encode(pub)), "Commitment": .string(commitment)])
            } else {
                l.teardown()
                return completion(.failure(PaymentError(.pairingRequired, "\(p.serialNumber) must be paired first")))
            }
        }
        l.request(.login, body: [
            "DateTime": .string(dateTime),
            "SaleSoftware": ["ProviderIdentification": "pppbridge", "ApplicationName": "pppbridge", "SoftwareVersion": "0.1.0", "CertificationCode": "none"],
            "SaleTerminalData": ["TerminalEnvironment": "Attended", "SaleCapabilities": ["CashierDisplay", "CashierStatus", "PrinterReceipt"]],
            "OperatorLanguage": "en",
            "Ext": ext,
        ]) { [weak self, l] response in
            guard let self else { return }
            let status = PaymentResponseStatus(json: response.body["Response"])
            guard response.header.poiID == l.poiID, response.header.saleID == c.saleID else {
                l.teardown()
                return completion(.failure(PaymentError(.messageFormat, "login answer does not echo SaleID/POIID")))
            }
            guard status?.result == .success else {
                l.teardown()
                switch status?.value("reason") {
                case "TestKeysInProduction"?:
                    return completion(.failure(PaymentError(.environmentMismatch, "the reader holds test keys")))
                case "PairingRequired"?:
                    return completion(.failure(PaymentError(.pairingRequired, "the reader requires pairing")))
                case "PairingLost"?:
                    if let p = self.peripheral { c.bonds.remove(p.peripheralUUID) }
                    return completion(.failure(PaymentError(.pairingLost, "the reader no longer knows this host; the bond was deleted")))
                case "BondProofReplayed"?:
                    return completion(.failure(PaymentError(.readerLoginFailed, "the reader took the bond proof for a replay (are both clocks right?)")))
                case "PairingKeyInvalid"?:
                    return completion(.failure(PaymentError(.pairingRejected, "the reader refused our pairing key")))
                default: break
                }
                return completion(.failure(PaymentError(.readerLoginFailed, status.map { PeerText.escaped($0.json.text, limit: 512) } ?? "no status")))
            }
            let system = response.body["POISystemData"]
            let ext = response.body["Ext"]
            if let token = ext?["ReaderSession"]?.string, (1...64).contains(token.utf8.count), Hex.decode(token) != nil { self.readerSession = (l.path, token) }
            let offer = UpdateOffer(json: ext?["AvailableUpdate"])
            self.offer = offer
            self.infoValue = Info(serialNumber: system?["POITerminalData"]?["POISerialNumber"]?.string ?? l.poiID,
                                  softwareVersion: system?["POISoftware"]?["SoftwareVersion"]?.string ?? "",
                                  batteryLevel: { if case .number(let t)? = ext?["Battery"]?["Level"] { return t }; return nil }(),
                                  transactionsRemaining: ext?["KeyProfile"]?["TransactionsRemaining"]?.integer,
                                  availableUpdate: offer.map { ReaderSoftwareUpdate(deviceSoftwareVersion: $0.version, durationEstimate: $0.durationEstimate,
                                                                                     requiredAt: $0.requiredAt, size: $0.size) },
                                  locationID: ext?["LocationID"]?.string ?? c.locationID)
            if let bondNonce, let p = self.peripheral, let key = c.bonds.key(for: p.peripheralUUID) {
                // The reader proves it holds the same link key: a stand-in that does not is refused.
                let expected = (try? Pairing.readerProof(linkKey: key, hostID: c.bonds.hostID, poiID: l.poiID, nonce: bondNonce)) ?? ""
                guard Pairing.matches(expected, ext?["Bond"]?["Proof"]?.string ?? "") else {
                    l.teardown()
                    return completion(.failure(PaymentError(.readerLoginFailed, "the reader could not prove our bond")))
                }
            }
            guard let pairing else { return completion(.success(l)) }
            self.completePairing(l, ours: pairing.key, hostNonce: pairing.nonce, answer: ext?["Pairing"], completion)
        }
    }

    /// Numeric comparison with commitments: we reveal the nonce we committed to, both sides
    /// derive the passkey from both keys and both nonces, the person confirms it matches the
    /// reader's display (the connect timeout waits meanwhile), and the confirmation commits the
    /// reader's bond.
    func completePairing(_ l: ReaderLink, ours: [UInt8], hostNonce: [UInt8], answer: JSONValue?,
                                 _ completion: @escaping (Result<ReaderLink, PaymentError>) -> Void) {
        let fail: (String) -> Void = { why in
            l.teardown()
            completion(.failure(PaymentError(.pairingRejected, why)))
        }
        guard let c = configuration, let p = peripheral, let terminalKey = answer?["TerminalPublicKey"]?.string.flatMap(Hex.decode),
              let terminalNonce = answer?["TerminalNonce"]?.string.flatMap(Hex.decode), terminalNonce.count == 16,
              let hostKey = try? X25519.publicKey(privateKey: ours), let shared = try? X25519.sharedSecret(privateKey: ours, peerPublicKey: terminalKey),
              let linkKey = try? Pairing.linkKey(sharedSecret: shared, hostPublicKey: hostKey, terminalPublicKey: terminalKey,
                                                 hostNonce: hostNonce, terminalNonce: terminalNonce),
              let passkey = try? Pairing.passkey(hostPublicKey: hostKey, terminalPublicKey: terminalKey, hostNonce: hostNonce, terminalNonce: terminalNonce),
              let confirmation = try? Pairing.confirmation(linkKey: linkKey, passkey: passkey) else {
            return fail("the reader's pairing answer is missing or unusable")
        }
        l.request(.admin, body: ["ServiceIdentification": "PairingNonce", "Ext": ["HostNonce": .string(Hex.encode(hostNonce))]], answer: { [weak self] response in
            guard let self else { return }
            guard PaymentResponseStatus(json: response.body["Response"])?.result == .success else { return fail("the reader refused our nonce") }
            // A person takes their time: the connect timeout starts again after the answer.
            if let t = self.connectTimer { self.loop.cancelTimer(t) }
            let confirmed = self.delegate?.reader(self, confirmPairing: passkey) == true
            if self.connectTimer != nil, let abort = self.connectAbort {
                self.connectTimer = self.loop.schedule(at: self.loop.now + c.connectTimeout) { [weak self] in
                    self?.connectTimer = nil
                    abort(PaymentError(.connectTimedOut, "no reader login within \(c.connectTimeout)"))
                }
            }
            guard confirmed else { return fail("passkey \(passkey) not confirmed") }
            l.request(.admin, body: ["ServiceIdentification": "ConfirmPairing", "Ext": ["Confirmation": .string(confirmation)]]) { response in
                guard PaymentResponseStatus(json: response.body["Response"])?.result == .success else { return fail("the reader rejected the pairing") }
                c.bonds.store(linkKey, for: p.peripheralUUID)
                completion(.success(l))
            }
        })
    }
}
