import Crypto
import NetStack

/// The pad's inputs in a simulation ("inside the terminal": cards, PINs, the battery, the
/// clock) as JSON commands, for the simulator's control socket.
extension TerminalCore {
    // MARK: The control interface (test-only, "inside the pad")

    /// nexo's EntryMode values.
    static let entryModes = ["ICC", "MagStripe", "Contactless", "Tapped", "Keyed", "Manual", "SynchroICC", "RFID", "Mobile", "Scanned", "File"]

    /// How long a control command takes the link down: whole or fractional seconds, at most a
    /// day (a longer or non-finite time would overflow the clock's arithmetic).
    public static func downTime(_ v: JSONValue) -> Duration? {
        if let i = v.integer { return (0...86_400).contains(i) ? .seconds(i) : nil }
        guard case .number(let t) = v, let d = Double(t), d.isFinite, (0...86_400).contains(d),
              let ms = Int64(exactly: (d * 1000).rounded()) else { return nil }
        return .milliseconds(ms)
    }

    /// Handles one control command; returns its answer.
    public func control(_ command: JSONValue, now: Instant) -> JSONValue {
        func ok(_ extra: [(String, JSONValue)] = []) -> JSONValue { .object([("ok", true)] + extra) }
        func no(_ why: String) -> JSONValue { ["ok": false, "error": .string(why)] }
        switch command["cmd"]?.string ?? "" {
        case "presentCard":
            guard let pan = command["pan"]?.string, CardData.isValidPAN(pan) else { return no("pan must be 12-19 digits with a valid check digit") }
            // What the card says is repeated to the host and the gateway: only the known forms.
            let expiry = command["expiry"]?.string ?? "3012", serviceCode = command["serviceCode"]?.string ?? "201"
            let entry = command["entry"]?.string ?? "ICC", cvm = command["cvm"]?.string ?? "OnlinePIN"
            guard PaymentRules.isDigits(expiry, 4...4), PaymentRules.isDigits(serviceCode, 3...3) else {
                return no("expiry is YYMM, serviceCode 3 digits")
            }
            guard TerminalCore.entryModes.contains(entry) else { return no("entry is one of \(TerminalCore.entryModes.joined(separator: ", "))") }
            guard ["OnlinePIN", "Signature", "NoCVM"].contains(cvm) else { return no("cvm is OnlinePIN, Signature or NoCVM") }
            let card = PresentedCard(data: CardData(pan: pan, expiry: expiry, serviceCode: serviceCode), entryMode: entry, cvm: cvm,
                                     pin: command["pin"]?.string)
            if let p = card.pin, !PaymentRules.isDigits(p, 4...12) { return no("pin must be 4-12 digits") }
            if transaction?.phase == .waitingForCard { cardPresented(card, now: now) } else { pendingCard = card }
            return ok()
        case "enterPin":
            guard let pin = command["pin"]?.string, PaymentRules.isDigits(pin, 4...12) else { return no("pin must be 4-12 digits") }
            guard transaction?.phase == .pinEntry else { return no("not waiting for a PIN") }
            transaction?.card?.pin = pin
            pinEntered(now: now)
            return ok()
        case "removeCard":
            pendingCard = nil
            notify("CardRemoved", now: now)
            return ok()
        case "pressCancel":
            guard let t = transaction, t.phase != .authorizing else { return no("nothing to cancel") }
            finishPayment(status: .failure(.cancel), now: now)
            return ok()
        case "setBattery":
            guard let level = PaymentRules.fraction(command["level"]) else { return no("level is a number in [0,1]") }
            configuration.battery = level
            if level < 0.05 { shutdown(reason: "criticallyLowBattery", restartAfter: nil, now: now) }
            return ok()
        case "dropLinkAfterAuthorise":
            guard let downFor = TerminalCore.downTime(command["downFor"] ?? 1) else { return no("downFor is 0...86400 seconds") }
            dropAfterAuthorise = downFor
            return ok()
        case "setClock":
            guard let t = command["now"]?.string.flatMap({ WallTime(rfc3339: $0) }) else { return no("now is RFC 3339 UTC") }
            wallOffset += t.seconds - wall(now).seconds
            return ok()
        case "powerOff":
            poweredOn = false
            shutdown(reason: "poweredOff", restartAfter: nil, now: now)
            return ok()
        case "provisionKey":
            guard let block = command["tr31"]?.string, let kbpk = command["kbpk"]?.string.flatMap(Hex.decode) else { return no("tr31 and kbpk") }
            do {
                security = try TerminalSecurity(keyBlock: block, kbpk: kbpk, testKeys: command["testKeys"]?.bool ?? false)
                return ok()
            } catch {
                return no("\(error)")
            }
        case "erasePairing":
            bonds.removeAll()
            record("bonds erased")
            return ok()
        case "status":
            return ok([("pairing", .bool(displayedPasskey != nil)), ("bonds", .integer(Int64(bonds.count))), ("serial", .string(configuration.serialNumber)), ("version", .string(configuration.softwareVersion)),
                       ("loggedIn", .bool(session != nil)), ("busy", .bool(transaction != nil || admin != nil)),
                       ("phase", transaction.map { .string($0.phase.rawValue) } ?? .null),
                       ("ksnCounter", .integer(Int64(security.counter))), ("battery", .number(TerminalCore.fraction(configuration.battery)))])
        default:
            return no("unknown command")
        }
    }
}
