import Crypto
import Payment
import Wire

/// Diagnosis, reboot, software updates (offer, chunks, signature check) and shutdown.
extension TerminalCore {
    func diagnosis(_ m: PaymentMessage, now: Instant) {
        if m.body["HostDiagnosisFlag"]?.bool == true {
            enqueueGateway(.ping(m.header), ["Type": "Ping"], timeout: .seconds(3), now: now)
        } else {
            answerDiagnosis(m.header, reachable: nil)
        }
    }

    func answerDiagnosis(_ h: PaymentMessage.Header, reachable: Bool?) {
        var body: JSONValue = [
            "Response": PaymentResponseStatus.success.json,
            "POIStatus": ["GlobalStatus": "OK", "CommunicationOKFlag": .bool(reachable ?? true)],
            "Ext": ["Battery": ["Level": .number(PaymentRules.fraction(configuration.battery)), "Charging": false],
                    "SoftwareVersion": .string(configuration.softwareVersion),
                    "KeyProfile": ["Scheme": "AES128-DUKPT", "TransactionsRemaining": .integer(security.transactionsRemaining)]],
        ]
        if let reachable { body = body.setting("HostStatus", [["AcquirerID": "SIMGW", "IsReachableFlag": .bool(reachable)]]) }
        respond(h, body: body)
    }

    // MARK: Admin: reboot and updates

    func adminRequest(_ m: PaymentMessage, now: Instant) {
        let h = m.header
        switch m.body["ServiceIdentification"]?.string {
        case "Reboot":
            respond(h, body: ["Response": PaymentResponseStatus.success.json])
            shutdown(reason: "rebootRequested", restartAfter: configuration.rebootDuration, now: now)
        case "CheckUpdate":
            respond(h, body: ["Response": PaymentResponseStatus.success.json, "Ext": ["AvailableUpdate": availableUpdate?.json ?? .null]])
        case "InstallUpdate":
            guard let offer = availableUpdate else { return fail(h, .notFound, [("reason", "NoUpdate")]) }
            admin = AdminOperation(header: h, offer: offer)
            respond(h, body: ["Response": PaymentResponseStatus.success.json])
            record("installing \(offer.version)")
            notify("BeginMaintenance", details: [("version", offer.version)], now: now)
            notify("ExtUpdateProgress", ext: ["Progress": .number("0.0")], now: now)
            requestNextChunk(now: now)
        default:
            fail(h, .notAllowed, [("reason", "UnknownService")])
        }
    }

    func cancelUpdate(_ m: PaymentMessage, now: Instant) {
        guard admin != nil else { return fail(m.header, .notFound) }
        admin?.canceled = true
        respond(m.header, body: ["Response": PaymentResponseStatus.success.json])
    }

    func requestNextChunk(now: Instant) {
        guard let a = admin else { return }
        if a.canceled { return endUpdate(result: "updateCanceled", now: now) }
        if a.image.count >= a.offer.size {
            guard a.offer.verify(image: a.image, publicKey: configuration.updatePublicKey) else {
                return endUpdate(result: "updateIntegrity", now: now)
            }
            notify("ExtUpdateProgress", ext: ["Progress": .number("1.0")], now: now)
            return endUpdate(result: "ok", now: now)
        }
        enqueueGateway(.updateChunk, ["Type": "UpdateChunk", "Version": .string(a.offer.version), "Offset": .integer(Int64(a.image.count)),
                                      "Length": .integer(Int64(configuration.updateChunkSize))], timeout: configuration.transmitTimeout, now: now)
    }

    func chunkAnswered(_ r: JSONValue?, now: Instant) {
        guard var a = admin else { return }
        guard let r, r["Offset"]?.integer == Int64(a.image.count), let data = r["Data"]?.string.flatMap(Base64.decode), !data.isEmpty,
              a.image.count + data.count <= a.offer.size else {
            return endUpdate(result: "updateIntegrity", now: now)
        }
        a.image += data
        admin = a
        let progress = min(0.99, Double(a.image.count) / Double(max(1, a.offer.size)))
        notify("ExtUpdateProgress", ext: ["Progress": .number(PaymentRules.fraction(progress))], now: now)
        requestNextChunk(now: now)
    }

    func endUpdate(result: String, now: Instant) {
        guard let a = admin else { return }
        admin = nil
        record("update \(a.offer.version): \(result)")
        notify("EndMaintenance", details: [("result", result), ("version", a.offer.version)], now: now)
        if result == "ok" {
            configuration.softwareVersion = a.offer.version
            availableUpdate = nil
            shutdown(reason: "updateRestart", restartAfter: configuration.rebootDuration, now: now)
        }
    }

    func shutdown(reason: String, restartAfter: Duration?, now: Instant) {
        record("shutdown: \(reason)")
        notify("Shutdown", details: [("reason", reason)], now: now)
        if transaction != nil { finishPayment(status: .failure(.unavailableDevice, [("reason", reason)]), now: now) }
        if hostConnected { outputs.append(.closeHost) }
        hostConnected = false
        session = nil
        outputs.append(.shutdown(reason: reason, restartAfter: restartAfter))
    }
}
