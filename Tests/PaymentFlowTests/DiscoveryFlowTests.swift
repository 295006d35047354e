import Channel
import ChannelTestSupport
import Crypto
import Glibc
import NetStack
import Payment
import PaymentKit
import Simulation
import Testing

/// Discovery over the lines this machine offers (three terminal simulators on ptys in one
/// directory, each advertising beside its line) and pairing over the real link.
@Suite(.serialized, .timeLimit(.minutes(10))) struct DiscoveryFlowTests {
    @Test func scanProximityAndFilterOverTheLines() async throws {
        let world = try PaymentWorld()
        let near = try world.addTerminal(serial: "SIM-00000002", rssi: -40)
        let far = try world.addTerminal(serial: "SIM-00000003", rssi: -70)
        let pattern = world.directory + "/SIM-*"
        // The merchant's login through the SDK: a bad licence fails it (3004), a good one opens
        // the session later connections log the reader in with.
        do {
            try await world.reader.login(gateway: world.gateway.endpoint!, environment: "int", licence: "LIC-NOPE", user: "merchant", password: "secret")
            Issue.record("a bad licence logged in")
        } catch { #expect(error.code == .licenceInvalid) }
        #expect(world.reader.state == .failed(.licenceInvalid))
        let merchant = try await world.reader.login(gateway: world.gateway.endpoint!, environment: "int", licence: "LIC-TEST-0001",
                                                    user: "merchant", password: "secret")
        #expect(merchant.count == 9)

        // A scan with a 1 s timeout: every reader, strongest first; then discoveryTimedOut.
        do {
            try await world.reader.discoverReaders(.init(method: .scan(timeout: 1)), pattern: pattern)
            Issue.record("the scan did not time out")
        } catch { #expect(error.code == .discoveryTimedOut) }
        let times = world.recorder.stateTimes.value
        let began = try #require(times.last { $0.0 == "discovery" }?.1), ended = try #require(times.last { $0.0 == "failed(1002)" }?.1)
        #expect(ended - began >= .milliseconds(950) && ended - began < .seconds(3), "timed out after \(ended - began)")
        #expect(world.recorder.discovered.value.last?.map(\.serialNumber) == ["SIM-00000002", "SIM-00000001", "SIM-00000003"])
        #expect(world.reader.state == .failed(.discoveryTimedOut))

        // The allowed-peripheral filter: [] admits nobody (the timeout still ends it), a list
        // only those listed.
        world.recorder.discovered.mutate { $0 = [] }
        do {
            try await world.reader.discoverReaders(.init(method: .scan(timeout: 1), allowedPeripheralUUIDs: []), pattern: pattern)
        } catch { #expect(error.code == .discoveryTimedOut) }
        #expect(world.recorder.discovered.value.isEmpty)
        let farUUID = far.advertisement.peripheralUUID
        let filtered = Task { try await world.reader.discoverReaders(.init(method: .scan(timeout: 0), allowedPeripheralUUIDs: [farUUID]), pattern: pattern) }
        #expect(await world.eventually("the filtered reader") { !world.recorder.discovered.value.isEmpty })
        #expect(world.recorder.discovered.value.allSatisfy { $0.map(\.serialNumber) == ["SIM-00000003"] })
        // Timeout 0 runs until cancelled (a minute on, it still runs); a second discovery
        // meanwhile is busy and changes nothing.
        await world.leap(.seconds(60))
        do {
            try await world.reader.discoverReaders(.init(method: .proximity), pattern: pattern)
            Issue.record("a second discovery ran")
        } catch { #expect(error.code == .busy) }
        #expect(world.reader.state == .discovery)
        world.reader.cancel()
        do {
            _ = try await filtered.value
            Issue.record("the cancelled discovery succeeded")
        } catch { #expect((error as? PaymentError)?.code == .canceled) }

        // Proximity: exactly one reader, the nearest; first its serial only, then with battery.
        world.recorder.discovered.mutate { $0 = [] }
        let proximity = Task { try await world.reader.discoverReaders(.init(method: .proximity), pattern: pattern) }
        #expect(await world.eventually("two proximity reports") { world.recorder.discovered.value.count == 2 })
        let reports = world.recorder.discovered.value
        #expect(reports.allSatisfy { $0.count == 1 && $0[0].serialNumber == "SIM-00000002" })
        #expect(reports.first?.first?.batteryLevel == nil && reports.last?.first?.batteryLevel == 0.82)
        await world.leap(.seconds(30))
        #expect(world.recorder.discovered.value.count == 2, "never reported again")
        // Connecting to it completes the discovery with that reader.
        let chosen = try #require(reports.last?.first)
        try await world.reader.connect(chosen, configuration: world.configuration)
        #expect(try await proximity.value == chosen)
        #expect(world.reader.info?.serialNumber == "SIM-00000002")
        #expect(world.reader.isConnected)
        // The state map as the delegate saw it for this stretch: discovery hands over to
        // connecting; a payment then runs interaction → authorizing → finished.
        let nearPad = try TerminalControl(path: near.controlPath!)
        #expect(try nearPad.send(["cmd": "presentCard", "entry": "ICC", "pan": "4111111111111111", "expiry": "3012", "cvm": "OnlinePIN",
                                  "pin": "1234"])["ok"]?.bool == true)
        let paid = try await world.reader.startPayment(amount: "1.00", currency: .eur, transactionID: "9001")
        #expect(paid.result == .approved)
        let states = world.recorder.lines.value.filter { $0.hasPrefix("state ") }.map { String($0.dropFirst(6)) }
        let tail = Array(states.suffix(6))
        #expect(tail == ["discovery", "connecting", "ready", "interaction", "authorizing", "finished"], "\(states)")
        #expect(states.prefix(4) == ["login", "failed(3004)", "login", "ready"], "\(states)")
        await world.reader.disconnect()

        // No lines directory: the "radio" is off.
        do {
            try await world.reader.discoverReaders(.init(method: .scan(timeout: 1)), pattern: world.directory + "/missing/*")
        } catch { #expect(error.code == .bluetoothDisabled) }

        async let nearStopped: Void = near.stop()
        async let farStopped: Void = far.stop()
        async let worldStopped: Void = world.shutdown()
        _ = await (nearStopped, farStopped, worldStopped)
    }

    @Test func pairingRequiredRejectedConfirmedAndLost() async throws {
        let world = try PaymentWorld { $0.core.requiresPairing = true }
        try await world.login()
        let uuid = world.terminal.advertisement.peripheralUUID
        #expect(world.terminal.advertisement.requiresPairing)

        // No bond and no autoPair: refused before anything crosses the line.
        do {
            try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
            Issue.record("connected without pairing")
        } catch { #expect(error.code == .pairingRequired) }
        #expect(world.terminal.readerBytes.isEmpty)

        // autoPair, and the person says the passkeys differ: rejected, no bond on either side.
        world.configuration.autoPair = true
        world.recorder.confirmPairing = { _ in false }
        do {
            try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
            Issue.record("connected with a rejected pairing")
        } catch { #expect(error.code == .pairingRejected) }
        #expect(world.configuration.bonds.key(for: uuid) == nil)
        #expect(try world.command(["cmd": "status"])["bonds"]?.integer == 0)

        // The passkey the SDK derived is the one on the terminal's display: confirmed, bonded.
        world.recorder.confirmPairing = { passkey in
            world.terminal.loop.sync { world.terminal.core.displayedPasskey } == passkey
        }
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        #expect(world.reader.isConnected)
        #expect(world.configuration.bonds.key(for: uuid)?.count == 16)
        #expect(try world.command(["cmd": "status"])["bonds"]?.integer == 1)
        #expect(world.recorder.passkeys.value.count == 2)
        try world.presentCard()
        let paid = try await world.reader.startPayment(amountMinor: 1050, currency: .eur, transactionID: "8001")
        #expect(paid.result == .approved)
        await world.reader.disconnect()

        // The bond alone lets it in again, with no pairing and nobody asked.
        world.configuration.autoPair = false
        try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        #expect(world.reader.isConnected && world.recorder.passkeys.value.count == 2)
        await world.reader.disconnect()

        // The terminal forgets its bonds: pairingLost, and the host drops its bond too.
        let erased = try world.command(["cmd": "erasePairing"])
        #expect(erased["ok"]?.bool == true, "\(erased.text)")
        do {
            try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
            Issue.record("connected with an erased bond")
        } catch { #expect(error.code == .pairingLost) }
        #expect(world.configuration.bonds.key(for: uuid) == nil)
        do {
            try await world.reader.connect(path: world.linkPath, configuration: world.configuration)
        } catch { #expect(error.code == .pairingRequired) }
        await world.shutdown()
    }
}
