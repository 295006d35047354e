import Crypto
import NetStack
@testable import Payment
@testable import PaymentKit
@testable import Simulation

/// The host's reader session, the terminal's application and the gateway, all three sans-IO
/// and wired together in memory on virtual time: every SDK flow end to end in milliseconds.
/// The "line" is a flag (present or not), the terminal is on or off, and the link between the
/// two is the session's `openLink` meeting the terminal's `hostDidConnect`.
final class ReaderSessionRig {
    let wall = WallTime(rfc3339: "2026-11-01T10:00:00Z")!
    var now = Instant.zero
    let session: ReaderSession
    let terminal: TerminalCore
    let gateway: GatewayCore
    let sessionToken: String
    let path = "/dev/SIM-00000001"

    /// The line is there (a terminal re-arming its line is away for a moment).
    var linePresent = true
    /// The terminal runs; when off, links to it cannot open.
    var terminalOn = true
    var restartAt: Instant?
    /// The link the terminal is connected to, if any.
    var connectedLink: Int?
    /// Authorisations and chunks the gateway has not answered yet (`holdsGateway`).
    var holdsGateway = false
    var heldGatewayRequests: [[UInt8]] = []
    /// The next opens fail as if the line hung up while they ran.
    var refusesOpens = 0
    /// Relayed authorisations wait for `answerRelays` instead of going at once.
    var holdsRelays = false
    var heldRelays: [(id: Int, payload: [UInt8])] = []
    /// A stand-in on the line: links open, but reach no terminal; what the session sends there
    /// is kept in `standInHeard`, and the test speaks for the stand-in with `fromStandIn`.
    var standIn = false
    var standInLink: Int?
    var standInHeard: [PaymentMessage] = []
    /// The terminal hears nothing the host sends (a reader that stopped listening).
    var terminalDeaf = false
    /// The terminal hears no Admin request (an update that is never started or canceled).
    var adminDeaf = false
    /// The categories of the service requests the terminal received, in order.
    var requestsHeard: [PaymentMessage.Category] = []
    var confirmsPasskey = true
    var submitsRelays = true
    var bonds: [String: [UInt8]] = [:]

    var results: [Int: [Result<ReaderSession.Answer, PaymentError>]] = [:]
    /// Every output but frames and link requests, in order.
    var events: [ReaderSession.Output] = []
    var linksOpened = 0
    var nextTicket = 0
    var passkeysShown: [String] = []

    init(terminal configuration: TerminalCore.Configuration = TerminalCore.Configuration(), gateway gatewayConfiguration: GatewayCore.Configuration = .testKeys,
         updatePublicKey: [UInt8] = []) {
        var c = configuration
        if !updatePublicKey.isEmpty { c.updatePublicKey = updatePublicKey }
        terminal = TerminalCore(configuration: c, security: .testDevice(), now: .zero, wallClock: wall)
        gateway = GatewayCore(configuration: gatewayConfiguration)
        let login: JSONValue = ["Type": "Login", "Environment": "int", "Licence": "LIC-TEST-1", "User": "merchant", "Password": "secret"]
        sessionToken = gateway.handle(login.serialized, now: wall).flatMap { try? JSONParser.parse($0) }?["SessionToken"]?.string ?? ""
        var n: UInt8 = 0
        // Deterministic "randomness": the tests are about the flows, not the keys.
        session = ReaderSession(now: .zero, wallClock: wall, random: { count in
            (0..<count).map { _ in n &+= 37; return n }
        })
    }

    var settings: ReaderSession.Settings {
        var s = ReaderSession.Settings(locationID: "tml_1", hostID: "00112233445566778899aabbccddeeff")
        s.sessionToken = sessionToken
        s.backoffScale = 0.01
        s.reconnectTimeout = .seconds(5)
        return s
    }

    // MARK: Calls

    @discardableResult
    func call(_ body: (ReaderSession, Int) -> Void) -> Int {
        nextTicket += 1
        body(session, nextTicket)
        pump()
        return nextTicket
    }

    func result(_ ticket: Int) -> Result<ReaderSession.Answer, PaymentError>? { results[ticket]?.first }

    func outcome(_ ticket: Int) -> PaymentOutcome? {
        if case .success(.outcome(let o))? = result(ticket) { return o }
        return nil
    }

    func error(_ ticket: Int) -> PaymentErrorCode? {
        if case .failure(let e)? = result(ticket) { return e.code }
        return nil
    }

    func connect(peripheral: DiscoveredReader? = nil, settings custom: ReaderSession.Settings? = nil) -> Int {
        call { $0.connect($1, to: ReaderSession.Target(path: path, peripheral: peripheral), settings: custom ?? settings, now: now) }
    }

    /// Presents a card "inside the pad".
    func present(pan: String = "4111111111111111", cvm: String = "OnlinePIN", pin: String? = "1234") {
        var command: JSONValue = ["cmd": "presentCard", "entry": "ICC", "pan": .string(pan), "expiry": "3012", "serviceCode": "201", "cvm": .string(cvm)]
        if let pin { command = command.setting("pin", .string(pin)) }
        _ = TerminalControlCommands.handle(core: terminal, command, now: now)
        pump()
    }

    func pay(_ id: String, amount: Int64 = 1050, cvm: String = "OnlinePIN", pin: String? = "1234") -> Int {
        let ticket = call { $0.pay($1, type: .normal, amountMinor: amount, currency: .eur, transactionID: id, now: now) }
        present(cvm: cvm, pin: pin)
        return ticket
    }

    // MARK: The line

    /// The line drops under both: the terminal loses its host, the session its link.
    func dropLine(echoTimeout: Bool = false) {
        guard let id = connectedLink else { return }
        connectedLink = nil
        terminal.hostDidDisconnect(now: now)
        session.linkLost(id, echoTimeout: echoTimeout, lineLost: true, now: now)
        pump()
    }

    /// Gives the held gateway requests their answers.
    func releaseGateway() {
        let held = heldGatewayRequests
        heldGatewayRequests = []
        for payload in held { answerGateway(payload) }
        pump()
    }

    func answerGateway(_ payload: [UInt8]) {
        if let answer = gateway.handle(payload, now: wall) {
            terminal.receive(gatewayPayload: answer, now: now)
        } else {
            terminal.gatewayDidFail(now: now)
        }
    }

    /// Runs both cores until neither has anything to say.
    func pump() {
        var quiet = false
        while !quiet {
            quiet = true
            for o in session.takeOutputs() {
                quiet = false
                hostOutput(o)
            }
            for o in terminal.takeOutputs() {
                quiet = false
                terminalOutput(o)
            }
        }
    }

    func hostOutput(_ o: ReaderSession.Output) {
        switch o {
        case .probeLine:
            session.lineProbed(present: linePresent, advert: nil, bondKey: session.target?.peripheral.flatMap { bonds[$0.peripheralUUID] }, now: now)
        case .openLink(let id, _):
            linksOpened += 1
            if standIn {
                standInLink = id
                return session.linkOpened(id, now: now)
            }
            let refused = refusesOpens > 0
            if refused { refusesOpens -= 1 }
            guard !refused, linePresent, terminalOn, connectedLink == nil else {
                return session.linkFailed(id, PaymentError(.pppNegotiationFailed, "no terminal"), lineLost: !linePresent || !terminalOn, now: now)
            }
            connectedLink = id
            terminal.hostDidConnect(now: now)
            session.linkOpened(id, now: now)
        case .send(let id, let frame):
            var decoder = PaymentFrameDecoder()
            let payloads = (try? decoder.feed(frame)) ?? []
            if id == standInLink { standInHeard += payloads.compactMap { try? PaymentMessage.decode($0) } }
            guard id == connectedLink, !terminalDeaf else { return }
            for payload in payloads {
                if let m = try? PaymentMessage.decode(payload), m.header.messageClass == .service {
                    if adminDeaf && m.header.category == .admin { continue }
                    requestsHeard.append(m.header.category)
                }
                terminal.receive(hostPayload: payload, now: now)
            }
        case .closeLink(let id):
            if id == standInLink { standInLink = nil }
            guard id == connectedLink else { return }
            connectedLink = nil
            terminal.hostDidDisconnect(now: now)
        case .gateway(let id, let request):
            session.gatewayAnswered(id, gateway.handle(request.serialized, now: wall).flatMap { try? JSONParser.parse($0) })
        case .relay(let id, let payload, _, _):
            if holdsRelays { return heldRelays.append((id, payload)) }
            session.relayAnswered(id, submitsRelays ? .answer(gateway.handle(payload, now: wall)) : .declined, now: now)
        case .confirmPairing(let passkey):
            passkeysShown.append(passkey)
            events.append(o)
            session.pairingConfirmed(confirmsPasskey && passkey == terminal.displayedPasskey, now: now)
        case .storeBond(let uuid, let key):
            bonds[uuid] = key
            events.append(o)
        case .removeBond(let uuid):
            bonds[uuid] = nil
            events.append(o)
        case .finished(let ticket, let result):
            results[ticket, default: []].append(result)
            events.append(o)
        default:
            events.append(o)
        }
    }

    func terminalOutput(_ o: TerminalCore.Output) {
        switch o {
        case .host(let payload):
            guard let id = connectedLink, let frame = try? PaymentFrame.encode(payload) else { return }
            session.received(id, frame, now: now)
        case .closeHost:
            guard let id = connectedLink else { return }
            connectedLink = nil
            session.linkLost(id, echoTimeout: false, lineLost: false, now: now)
        case .gateway(let payload):
            if holdsGateway { heldGatewayRequests.append(payload) } else { answerGateway(payload) }
        case .shutdown(_, let restartAfter):
            terminalOn = false
            if let id = connectedLink {
                connectedLink = nil
                session.linkLost(id, echoTimeout: false, lineLost: true, now: now)
            }
            restartAt = restartAfter.map { now + $0 }
        }
    }

    // MARK: Time

    /// Lets virtual time run `duration`, stopping at every deadline on the way.
    func run(_ duration: Duration) {
        let end = now + duration
        pump()
        while true {
            let next = [session.nextDeadline, terminal.pollAt, restartAt].compactMap { $0 }.min()
            guard let next, next <= end else { break }
            now = max(now, next)
            if let r = restartAt, r <= now {
                restartAt = nil
                terminalOn = true
                terminal.powerOn(now: now)
            }
            terminal.poll(now: now)
            session.poll(now: now)
            pump()
        }
        now = end
    }

    /// The outputs of one kind, in order.
    func count(_ match: (ReaderSession.Output) -> Bool) -> Int { events.filter(match).count }
    var reconnectsStarted: Int { count { if case .reconnectStarted = $0 { return true }; return false } }
    var reconnectsSucceeded: Int { count { $0 == .reconnectSucceeded } }
    var reconnectsFailed: Int { count { $0 == .reconnectFailed } }
    var states: [PaymentState] { events.compactMap { if case .state(let s) = $0 { return s }; return nil } }
    /// Every call made so far has ended, and exactly once.
    var everyTicketFinishedOnce: Bool { (1...max(1, nextTicket)).allSatisfy { results[$0]?.count == 1 } || nextTicket == 0 }

    /// The stand-in says `body` as a `type` message of `category` (a response echoes `request`).
    func fromStandIn(_ category: PaymentMessage.Category, _ messageClass: PaymentMessage.MessageClass = .service,
                     type: PaymentMessage.MessageType, identifier: String, body: JSONValue) {
        guard let id = standInLink else { return }
        let h = PaymentMessage.Header(protocolVersion: category == .login || category == .diagnosis ? "3.1" : nil, messageClass: messageClass,
                                      category: category, type: type, identifier: identifier, saleID: "HOST-1", poiID: "SIM-00000001")
        let m = PaymentMessage(direction: type == .response ? .response : .request, header: h, body: body)
        session.received(id, (try? PaymentFrame.encode(m.encoded)) ?? [], now: now)
        pump()
    }
}
