import Channel
import Service
import Crypto
import Glibc
import NetStack
import Payment
import PaymentKit
import Simulation

/// The payment half of `pppbridge demo`: a gateway simulator on loopback, a terminal simulator
/// on a pty, and the host SDK over our channel. The merchant logs in, the reader is found by
/// proximity and connected, a card pays 10.50 EUR with its PIN inside the pad, half of it is
/// refunded by authorisation code, and the link's capture is searched for the card number.
enum PaymentDemo {
    final class Narrator: PaymentReaderDelegate, @unchecked Sendable {
        let say: (String) -> Void
        let states = Locked<[String]>([])
        let found = Locked<DiscoveredReader?>(nil)
        let reports = Locked<Int>(0)
        init(say: @escaping (String) -> Void) { self.say = say }
        func reader(_ reader: PaymentReader, didChangeState state: PaymentState) { states.set(states.get() + ["\(state)"]) }
        func reader(_ reader: PaymentReader, didReport event: ReaderEvent) {
            if case let .display(_, text) = event { say("  reader shows: \(shown(text))") }
        }
        func reader(_ reader: PaymentReader, didUpdateDiscoveredReaders readers: [DiscoveredReader]) {
            guard let r = readers.first else { return }
            say("  found: \(r.serialNumber), \(r.rssi.map { "\($0) dBm" } ?? "wired")\(r.batteryPercent.map { ", battery \($0)%" } ?? " (serial only)")")
            reports.set(reports.get() + 1)
            // Proximity's second report (with the battery, when the reader tells it) is the one.
            if reports.get() >= 2 { found.set(r) }
        }
    }

    static func run(pcap: String?, output: @escaping (String) -> Void) async -> Bool {
        var template = Array("/tmp/pppbridge-demo-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            output("payment: cannot make a temporary directory")
            return false
        }
        let directory = String(cString: made)
        defer {
            for name in ["SIM-00000001", "SIM-00000001.advert", "payment.pcap", "control"] { unlink(directory + "/" + name) }
            rmdir(directory)
        }
        let capture = pcap.map { p in p.hasSuffix(".pcap") ? String(p.dropLast(5)) + "-payment.pcap" : p + "-payment" } ?? directory + "/payment.pcap"
        do {
            let hostLoop = try EventLoop(), deviceLoop = try EventLoop()
            try hostLoop.startThread()
            try deviceLoop.startThread()
            let gateway = GatewayServer(configuration: .testKeys, loop: deviceLoop)
            try gateway.start()
            defer { gateway.stop() }
            var t = TerminalSimulator.Configuration(linkPath: directory + "/SIM-00000001", gateway: gateway.endpoint!)
            t.rssi = -42
            t.controlPath = directory + "/control"
            let terminal = TerminalSimulator(configuration: t, loop: deviceLoop)
            try terminal.start()
            let pad = try TerminalControl(path: terminal.controlPath!)
            output("payment: gateway simulator on \(gateway.endpoint!), terminal simulator SIM-00000001 on a pty in \(directory)")

            let reader = PaymentReader(loop: hostLoop)
            let narrator = Narrator(say: output)
            reader.delegate = narrator
            let merchant = try await reader.login(gateway: gateway.endpoint!, environment: "int", licence: "LIC-TEST-0001", user: "merchant", password: "secret")
            output("payment: merchant \(merchant) logged in at the gateway; discovering the reader held close")
            let discovery = Task { try await reader.discoverReaders(DiscoveryConfiguration(method: .proximity), pattern: directory + "/*") }
            var waited = 0
            while narrator.found.get() == nil && waited < 200 {
                try await Task.sleep(for: .milliseconds(50))
                waited += 1
            }
            guard let chosen = narrator.found.get() else {
                reader.cancel()
                _ = try? await discovery.value
                output("payment: no reader found")
                return false
            }
            var configuration = ReaderConnectionConfiguration(locationID: "demo_shop_1", gateway: gateway.endpoint!)
            configuration.pcapPath = capture
            var started = ContinuousClock.now
            try await reader.connect(chosen, configuration: configuration)
            _ = try await discovery.value
            let info = reader.info
            output("payment: connected over PPP in \(ms(ContinuousClock.now - started)) ms: \(info?.serialNumber ?? "?"), software \(info?.softwareVersion ?? "?"), battery \(info?.batteryLevel ?? "?")")

            // The customer's card and PIN go into the pad (the terminal's control socket).
            _ = try pad.send(["cmd": "presentCard", "entry": "ICC", "pan": "4111111111111111", "expiry": "3012", "serviceCode": "201",
                              "cvm": "OnlinePIN", "pin": "1234"])
            narrator.states.set([])
            started = ContinuousClock.now
            let sale = try await reader.startPayment(amount: "10.50", currency: .eur, transactionID: "0001DEMO")
            output("payment: \(describe(sale)) (\(ms(ContinuousClock.now - started)) ms)")
            output("payment: states \(narrator.states.get().joined(separator: " → "))")
            let refund = try await reader.startRefund(amount: "4.50", currency: .eur, transactionID: "0002DEMO", originalOperationID: sale.approvalCode ?? "")
            output("payment: refund by authorisation code \(sale.approvalCode ?? "?"): \(describe(refund))")
            await reader.disconnect()
            await terminal.stop()

            let bytes = readWholeFile(capture) ?? []
            let panFound = contains(bytes, Array("4111111111111111".utf8))
            output("payment: the link's capture (\(capture), \(bytes.count) B) \(panFound ? "HOLDS THE CLEAR PAN" : "holds no clear card number"); the PIN travelled as an AES DUKPT format-4 block")
            if pcap == nil { unlink(capture) }
            return sale.result == .approved && refund.result == .approved && !panFound && bytes.count > 0
        } catch {
            output("payment: FAILED: \(error)")
            return false
        }
    }

    static func contains(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
        guard hay.count >= needle.count, let first = needle.first else { return false }
        var i = 0
        while i <= hay.count - needle.count {
            if hay[i] == first && Array(hay[i..<(i + needle.count)]) == needle { return true }
            i += 1
        }
        return false
    }

    static func ms(_ d: Duration) -> Int64 { d.nanoseconds / 1_000_000 }
}
