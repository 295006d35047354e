// libFuzzer target: the host's reader session (`ReaderSession`) driven by a hostile reader.
//
// The first byte sets the scene (a reader that requires pairing, a bond held, auto-reconnect);
// a connect starts. The rest is a script of records, `op, length (2 bytes, big-endian),
// payload`: answer the session's latest request with the payload as its body (the header echoed
// as a real reader would, so mutations reach the answer handlers instead of dying at the
// ServiceID), send a reader event or device request with the payload as its body, feed the
// payload as one frame or as raw stream bytes, let time pass, make a call (pay, refund,
// cancel, signature, reversal, reboot, diagnosis, update, disconnect), lose or fail the link,
// answer a relay or gateway request. Every call must end exactly once (after the script, time
// runs out and the app disconnects: nothing may still wait), the outputs of one step are
// bounded, and nothing may trap. Build and run with Tools/fuzz.sh.
import FuzzSupport
import Glibc
import NetStack
import Payment

final class SessionDriver {
    let session: ReaderSession
    var now = Instant.zero
    var ticket = 0
    var finished: [Int: Int] = [:]
    var link: ReaderSession.LinkID?
    /// The latest service request the session sent: what an answer echoes.
    var lastRequest: PaymentMessage.Header?
    var relays: [Int] = []
    var gatewayCalls: [Int] = []
    var episodes: [Int] = []
    var lastOutcome: PaymentOutcome?
    let bondKey: [UInt8]?
    var confirms = true

    init(scene: UInt8) {
        var n: UInt8 = scene
        session = ReaderSession(now: .zero, wallClock: WallTime(seconds: 1_793_000_000), random: { count in
            (0..<count).map { _ in n &+= 101; return n }
        })
        bondKey = scene & 2 != 0 ? [UInt8](repeating: 0x42, count: 16) : nil
        var settings = ReaderSession.Settings(locationID: "tml_1", hostID: "00112233445566778899aabbccddeeff")
        settings.sessionToken = "0011223344556677"
        settings.autoReconnect = scene & 4 == 0
        settings.autoPair = scene & 1 != 0
        settings.backoffScale = 0.01
        let peripheral = scene & 1 != 0
            ? DiscoveredReader(path: "/dev/SIM-1", peripheralUUID: "7D4F2C1A-0B3E-4F5A-9C8D-112233445566", name: "SIM", serialNumber: "SIM-1",
                               rssi: nil, requiresPairing: true)
            : nil
        call { session.connect($0, to: ReaderSession.Target(path: "/dev/SIM-1", peripheral: peripheral), settings: settings, now: now) }
    }

    func call(_ body: (Int) -> Void) {
        ticket += 1
        body(ticket)
        drain()
    }

    func drain() {
        var steps = 0
        while true {
            let outputs = session.takeOutputs()
            if outputs.isEmpty { return }
            steps += outputs.count
            precondition(steps < 10_000, "a step without end")
            for o in outputs { perform(o) }
        }
    }

    func perform(_ o: ReaderSession.Output) {
        switch o {
        case .probeLine:
            session.lineProbed(present: true, advert: nil, bondKey: bondKey, now: now)
        case .openLink(let id, _):
            link = id
            FuzzDepth.count("links-opened")
            session.linkOpened(id, now: now)
        case .send(let id, let frame):
            precondition(id == link && frame.count <= PaymentFrame.maximumLength + 4, "a frame for no link, or oversize")
            var decoder = PaymentFrameDecoder()
            for payload in (try? decoder.feed(frame)) ?? [] {
                guard let m = try? PaymentMessage.decode(payload) else { preconditionFailure("the session sent a message it cannot decode") }
                if m.header.messageClass == .service, m.header.type == .request { lastRequest = m.header }
            }
        case .closeLink(let id):
            if link == id { link = nil }
        case .gateway(let id, _): gatewayCalls.append(id)
        case .relay(let id, _, _, _):
            relays.append(id)
            FuzzDepth.count("relays")
        case .confirmPairing:
            FuzzDepth.count("passkeys")
            session.pairingConfirmed(confirms, now: now)
        case .reconnectStarted(let episode, _):
            episodes.append(episode)
            FuzzDepth.count("reconnects")
        case .reconnectSucceeded: FuzzDepth.count("reconnected")
        case .installFinished(_, nil): FuzzDepth.count("updates-installed")
        case .finished(let t, let result):
            if getenv("FUZZ_TRACE") != nil { print("finished", t, result) }
            finished[t, default: 0] += 1
            precondition(finished[t] == 1, "call \(t) finished twice")
            if case .success(.outcome(let outcome)) = result {
                lastOutcome = outcome
                FuzzDepth.count(outcome.recovered ? "outcomes-recovered" : "outcomes")
            }
            if case .success = result, t == 1 { FuzzDepth.count("connected") }
        default:
            break
        }
    }

    func message(_ header: PaymentMessage.Header, _ payload: [UInt8], direction: PaymentMessage.Direction) -> [UInt8] {
        let body = (try? JSONParser.parse(payload)) ?? .object([])
        return PaymentMessage(direction: direction, header: header, body: body).encoded
    }

    func feed(_ payload: [UInt8]) {
        guard let link else { return }
        // The length prefix fixed up, so the payload reaches the message decoder.
        let n = UInt32(payload.count)
        session.received(link, [UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)] + payload, now: now)
        drain()
    }

    func step(_ op: UInt8, _ payload: [UInt8]) {
        let b = payload.first ?? 0
        switch op % 16 {
        case 0, 1:
            // The answer to the latest request, the header echoed.
            guard let request = lastRequest else { return }
            feed(message(request.response(), payload, direction: .response))
        case 2:
            let h = PaymentMessage.Header(protocolVersion: nil, messageClass: .event, category: .event, type: .notification,
                                          identifier: String(b), saleID: "HOST-1", poiID: "SIM-1")
            feed(message(h, payload, direction: .request))
        case 3:
            let categories: [PaymentMessage.Category] = [.display, .print, .transmit, .payment]
            let h = PaymentMessage.Header(protocolVersion: nil, messageClass: .device, category: categories[Int(b % 4)], type: .request,
                                          identifier: String(b), saleID: "HOST-1", poiID: "SIM-1")
            feed(message(h, Array(payload.dropFirst()), direction: .request))
        case 4:
            feed(payload)
        case 5:
            guard let link else { return }
            session.received(link, payload, now: now)
            drain()
        case 6:
            let ms = Int64(payload.prefix(2).reduce(0) { $0 << 8 | Int($1) })
            now = now + .milliseconds(ms)
            session.poll(now: now)
            drain()
        case 7:
            let amount = Int64(payload.prefix(5).reduce(0) { $0 << 8 | Int($1) })
            let original = b & 1 == 0 ? nil : String(decoding: payload.dropFirst(5).prefix(32), as: UTF8.self)
            call { session.pay($0, type: original == nil ? .normal : .refund, amountMinor: amount, currency: .eur, transactionID: String(1000 + ticket),
                               original: original, now: now) }
        case 8:
            session.cancel(now: now)
            drain()
        case 9:
            switch b % 3 {
            case 0: call { session.submitSignature($0, image: [0x42, 0x4D] + payload, format: 1) }
            case 1: call { session.declineSignature($0, now: now) }
            default:
                if let outcome = lastOutcome { call { session.reverse($0, outcome, now: now) } }
            }
        case 10:
            switch b % 4 {
            case 0: call { session.reboot($0, now: now) }
            case 1: call { session.diagnose($0, host: true, now: now) }
            case 2: call { session.installAvailableUpdate($0, now: now) }
            default:
                session.cancelUpdate()
                drain()
            }
        case 11:
            guard let id = link else { return }
            link = nil
            session.linkLost(id, echoTimeout: b & 1 != 0, lineLost: b & 2 != 0, now: now)
            drain()
        case 12:
            guard let id = link else { return }
            link = nil
            session.linkFailed(id, PaymentError(.pppNegotiationFailed), lineLost: b & 1 != 0, now: now)
            drain()
        case 13:
            if let id = relays.first {
                relays.removeFirst()
                session.relayAnswered(id, b & 1 == 0 ? .answer(Array(payload.dropFirst())) : .declined, now: now)
            } else if let id = gatewayCalls.first {
                gatewayCalls.removeFirst()
                session.gatewayAnswered(id, try? JSONParser.parse(payload))
            }
            drain()
        case 14:
            switch b % 3 {
            case 0: session.disconnect(now: now)
            case 1: if let e = episodes.last { session.cancelReconnect(episode: e, now: now) }
            default: confirms.toggle()
            }
            drain()
        default:
            // Connect again (refused while connected; after a failure, a new connect).
            call { session.connect($0, to: ReaderSession.Target(path: "/dev/SIM-1"), settings: session.settings, now: now) }
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReaderSession(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 1 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let driver = SessionDriver(scene: input[0])
    var offset = 1
    while offset + 3 <= input.count {
        let op = input[offset]
        let length = Int(input[offset + 1]) << 8 | Int(input[offset + 2])
        let end = min(input.count, offset + 3 + length)
        driver.step(op, Array(input[(offset + 3)..<end]))
        offset = end
    }
    // The shell's own exchanges end (they have timeouts), then time runs out, then the app
    // disconnects: nothing may still be waiting. Every call ends, exactly once.
    for id in driver.relays { driver.session.relayAnswered(id, .answer(nil), now: driver.now) }
    for id in driver.gatewayCalls { driver.session.gatewayAnswered(id, nil) }
    driver.relays = []
    driver.gatewayCalls = []
    driver.drain()
    for round in 0..<8 {
        if round == 4 {
            driver.session.disconnect(now: driver.now)
            driver.drain()
        }
        driver.now = driver.now + .seconds(120)
        driver.session.poll(now: driver.now)
        driver.drain()
        for id in driver.relays { driver.session.relayAnswered(id, .answer(nil), now: driver.now) }
        for id in driver.gatewayCalls { driver.session.gatewayAnswered(id, nil) }
        driver.relays = []
        driver.gatewayCalls = []
        driver.drain()
    }
    for t in 1...driver.ticket {
        precondition(driver.finished[t] == 1, "call \(t) never ended")
    }
    precondition(driver.session.nextDeadline == nil || driver.session.phase != .idle, "a timer outlives the session")
    return 0
}

#if FUZZING
@_cdecl("FuzzReaderSession_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzReaderSession)
}
#else
@main struct Replay {
    static func main() { replay(fuzzReaderSession) }
}
#endif
