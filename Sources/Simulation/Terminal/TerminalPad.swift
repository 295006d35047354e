import Crypto
import Payment
import Wire

/// What a person or the hardware does at the terminal ("inside the pad"): a card presented,
/// a PIN typed, Cancel pressed, the battery draining, the clock set, keys loaded. Typed and
/// checked here; the simulator's control socket (PaymentKit) turns its JSON lines into these.
extension TerminalCore {
    /// Why the pad did not take an input, for the one who gave it.
    public struct PadRefusal: Error, Equatable, CustomStringConvertible {
        public var description: String
        init(_ d: String) { description = d }
    }

    /// nexo's EntryMode values.
    public static let entryModes = ["ICC", "MagStripe", "Contactless", "Tapped", "Keyed", "Manual", "SynchroICC", "RFID", "Mobile", "Scanned", "File"]
    public static let cardholderMethods = ["OnlinePIN", "Signature", "NoCVM"]

    /// A card held to the reader: used by the payment waiting for one, or by the next.
    public func presentCard(_ data: CardData, entryMode: String = "ICC", cvm: String = "OnlinePIN", pin: String? = nil,
                            now: Instant) throws(PadRefusal) {
        // What the card says is repeated to the host and the gateway: only the known forms.
        guard CardData.isValidPAN(data.pan) else { throw PadRefusal("pan must be 12-19 digits with a valid check digit") }
        guard PaymentRules.isDigits(data.expiry, 4...4), PaymentRules.isDigits(data.serviceCode, 3...3) else {
            throw PadRefusal("expiry is YYMM, serviceCode 3 digits")
        }
        guard TerminalCore.entryModes.contains(entryMode) else { throw PadRefusal("entry is one of \(TerminalCore.entryModes.joined(separator: ", "))") }
        guard TerminalCore.cardholderMethods.contains(cvm) else { throw PadRefusal("cvm is OnlinePIN, Signature or NoCVM") }
        if let pin, !PaymentRules.isDigits(pin, 4...12) { throw PadRefusal("pin must be 4-12 digits") }
        let card = PresentedCard(data: data, entryMode: entryMode, cvm: cvm, pin: pin)
        if transaction?.phase == .waitingForCard { cardPresented(card, now: now) } else { pendingCard = card }
    }

    public func enterPIN(_ pin: String, now: Instant) throws(PadRefusal) {
        guard PaymentRules.isDigits(pin, 4...12) else { throw PadRefusal("pin must be 4-12 digits") }
        guard transaction?.phase == .pinEntry else { throw PadRefusal("not waiting for a PIN") }
        transaction?.card?.pin = pin
        pinEntered(now: now)
    }

    public func removeCard(now: Instant) {
        pendingCard = nil
        notify("CardRemoved", now: now)
    }

    public func pressCancel(now: Instant) throws(PadRefusal) {
        guard let t = transaction, t.phase != .authorizing else { throw PadRefusal("nothing to cancel") }
        finishPayment(status: .failure(.cancel), now: now)
    }

    /// The battery's level in 0...1; below 5% the terminal shuts down.
    public func setBattery(_ level: Double, now: Instant) throws(PadRefusal) {
        guard level.isFinite, (0...1).contains(level) else { throw PadRefusal("level is a number in [0,1]") }
        configuration.battery = level
        if level < 0.05 { shutdown(reason: "criticallyLowBattery", restartAfter: nil, now: now) }
    }

    /// A test's fault: the link drops the moment the next authorisation is answered, for `downFor`.
    public func dropLinkAfterAuthorise(downFor: Duration) { dropAfterAuthorise = downFor }

    public func setClock(_ time: WallTime, now: Instant) { clock = WallClock(time, at: now) }

    public func powerOff(now: Instant) {
        poweredOn = false
        shutdown(reason: "poweredOff", restartAfter: nil, now: now)
    }

    /// New keys from a TR-31 block under `kbpk`; the counter starts again at 0.
    public func provisionKey(block: String, kbpk: [UInt8], testKeys: Bool) throws(PadRefusal) {
        do { security = try TerminalSecurity(keyBlock: block, kbpk: kbpk, testKeys: testKeys) } catch { throw PadRefusal("\(error)") }
    }

    public func erasePairing() {
        bonds.removeAll()
        record("bonds erased")
    }

    /// What the terminal shows about itself (never the pairing passkey: that is for its display).
    public struct PadStatus: Sendable, Equatable {
        public var pairing: Bool
        public var bonds: Int
        public var serial: String
        public var version: String
        public var loggedIn: Bool
        public var busy: Bool
        public var phase: String?
        public var ksnCounter: UInt32
        public var battery: Double
    }

    public var padStatus: PadStatus {
        PadStatus(pairing: displayedPasskey != nil, bonds: bonds.count, serial: configuration.serialNumber, version: configuration.softwareVersion,
                  loggedIn: session != nil, busy: transaction != nil || admin != nil, phase: transaction?.phase.rawValue,
                  ksnCounter: security.counter, battery: configuration.battery)
    }
}
