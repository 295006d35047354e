import Channel
import ChannelTestSupport
import Crypto
import Glibc
import NetStack
import Payment
import PaymentKit
import Simulation
import Testing
import TestSupport

/// Everything a payment needs, for real: the gateway server on loopback, the terminal simulator
/// on a pty (its own PPP link and stack), and the host SDK opening that pty through the channel.
final class PaymentWorld: @unchecked Sendable {
    let directory: String
    let linkPath: String
    let gateway: GatewayServer
    let terminal: TerminalSimulator
    let control: TerminalControl
    /// A loop of the world's own, so that other suites' traffic on the shared loop does not
    /// delay this world's timers.
    let loop: EventLoop
    /// The terminal's own loop: it is another device, and the SDK's delegate may ask it
    /// things (its display) while the SDK's loop waits.
    let terminalLoop: EventLoop
    /// Both loops' time: real, and moved ahead at once where a test shows that nothing
    /// happens for a while (`leap`), so no test waits for our own timers.
    let clock = LeapingClock()
    let reader: PaymentReader
    let recorder = Recorder()
    let signingKey: [UInt8]
    var configuration: ReaderConnectionConfiguration
    let pcapPath: String
    /// A man in the middle between the terminal's proxied connections and the gateway, when asked.
    let relay: FrameRelay?

    struct Update {
        var version = "1.1.0"
        var required = false
        var size = 40_000
        var tamper = false
    }

    init(update: Update? = nil, relay relayMode: FrameRelay.Mode? = nil, terminalSetup: (inout TerminalSimulator.Configuration) -> Void = { _ in }) throws {
        directory = try TemporaryDirectory.make("pay")
        linkPath = directory + "/SIM-00000001"
        pcapPath = directory + "/session.pcap"
        signingKey = try SecureBytes.random(32)
        loop = try EventLoop(clock: clock)
        try loop.startThread()
        terminalLoop = try EventLoop(clock: clock)
        try terminalLoop.startThread()
        reader = PaymentReader(loop: loop)
        var gatewayConfig = GatewayCore.Configuration.testKeys
        if let update {
            let image = try SecureBytes.random(update.size)
            let sha = Hex.encode(Digest.hash(.sha256, image)!)
            let requiredAt: WallTime? = update.required ? WallTime(seconds: 1_000_000_000) : nil
            let signed = UpdateOffer.signedString(version: update.version, sha256: sha, size: image.count, requiredAt: requiredAt)
            let offer = UpdateOffer(version: update.version, requiredAt: requiredAt, size: image.count, sha256: sha,
                                    signature: Hex.encode(try Ed25519.sign(privateKey: signingKey, Array(signed.utf8))))
            var served = image
            if update.tamper { served[100] ^= 0x01 }
            gatewayConfig.update = (offer, served)
        }
        gateway = GatewayServer(configuration: gatewayConfig, loop: loop)
        gateway.recordsBytes = true
        try gateway.start()
        let gatewayEndpoint = gateway.endpoint!
        if let relayMode {
            relay = try FrameRelay(mode: relayMode, upstream: gatewayEndpoint, loop: loop)
        } else {
            relay = nil
        }
        var t = TerminalSimulator.Configuration(linkPath: linkPath, gateway: relay?.endpoint ?? gatewayEndpoint)
        t.readerPort = Host.freePort()
        t.core.updatePublicKey = try Ed25519.publicKey(privateKey: signingKey)
        t.core.rebootDuration = .milliseconds(500)
        t.core.transmitTimeout = .seconds(3)
        t.controlPath = directory + "/control"
        terminalSetup(&t)
        terminal = TerminalSimulator(configuration: t, loop: terminalLoop)
        terminal.recordsReaderBytes = true
        try terminal.start()
        control = try TerminalControl(path: terminal.controlPath!)
        // With a relay, the host's proxy lets the terminal reach only the relay.
        configuration = ReaderConnectionConfiguration(locationID: "tml_test_1", gateway: relay?.endpoint ?? gatewayEndpoint)
        configuration.readerPort = t.readerPort
        configuration.backoffScale = 0.05
        configuration.reconnectTimeout = .seconds(20)
        configuration.pcapPath = pcapPath
        // Three missed echoes at 2 s: a loaded CI machine must not look like a lost reader.
        configuration.echoInterval = .seconds(2)
        reader.delegate = recorder
        reader.recordsBytes = true
    }

    /// Logs in to the gateway and connects the SDK to the terminal.
    func connect() async throws {
        try await login()
        try await reader.connect(path: linkPath, configuration: configuration)
    }

    /// The merchant's gateway login (the session token goes into the connection configuration).
    func login() async throws {
        let login = try await GatewayClient.login(gateway: configuration.gateway, environment: "int", licence: "LIC-TEST-0001",
                                                  user: "merchant", password: "secret", loop: loop)
        configuration.sessionToken = login["SessionToken"]?.string
    }

    /// Another terminal on a line in the same directory, on the terminal loop.
    func addTerminal(serial: String, rssi: Int?, setup: (inout TerminalSimulator.Configuration) -> Void = { _ in }) throws -> TerminalSimulator {
        var t = TerminalSimulator.Configuration(linkPath: directory + "/" + serial, gateway: gateway.endpoint!)
        t.core.serialNumber = serial
        t.core.updatePublicKey = terminal.configuration.core.updatePublicKey
        t.readerPort = configuration.readerPort
        t.rssi = rssi
        t.controlPath = directory + "/" + serial + ".control"
        setup(&t)
        let sim = TerminalSimulator(configuration: t, loop: terminalLoop)
        try sim.start()
        return sim
    }

    func command(_ c: JSONValue) throws -> JSONValue { try control.send(c) }

    func presentCard(pan: String = "4111111111111111", cvm: String = "OnlinePIN", pin: String? = "1234") throws {
        var c: JSONValue = ["cmd": "presentCard", "entry": "ICC", "pan": .string(pan), "expiry": "3012", "serviceCode": "201", "cvm": .string(cvm)]
        if let pin { c = c.setting("pin", .string(pin)) }
        let answer = try command(c)
        #expect(answer["ok"]?.bool == true, "\(answer.text)")
    }

    /// Waits until the terminal itself is in `phase` (its control socket's status).
    func terminalPhase(_ phase: String) async -> Bool {
        await eventually("terminal phase \(phase)") {
            (try? command(["cmd": "status"]))?["phase"]?.string == phase
        }
    }

    /// Waits (bounded) until `condition` holds. The bound is wide: while the VM suites hold the
    /// test runner's threads, this task (or one it waits for) may not run for a minute.
    func eventually(_ what: String, timeout: Duration = .seconds(150), _ condition: () -> Bool) async -> Bool {
        if await TestSupport.eventually(within: timeout, condition) { return true }
        Issue.record("timed out waiting for \(what)")
        return false
    }

    /// Moves both loops' time ahead by `duration` and returns once each has taken the turns
    /// that fell due: every timer of the SDK, the terminal and their links within that time
    /// has fired (and what it did on its own loop is done) when this returns.
    func leap(_ duration: Duration) async {
        clock.leap(by: duration)
        // Three rounds of whole turns: a timer on one loop may post work to the other, or put
        // work off to the next turn.
        for _ in 0..<3 {
            await loop.fullTurn()
            await terminalLoop.fullTurn()
        }
    }

    /// Disconnects and stops everything; the capture stays readable until `removeFiles`.
    func shutdown(keepFiles: Bool = false) async {
        await reader.disconnect()
        await terminal.stop()
        gateway.stop()
        if let relay { await loop.perform { relay.close() } }
        // The loop's thread stays (idle in epoll): stopping it could strand a late `sync`
        // from an object let go after the test.
        if !keepFiles { removeFiles() }
    }

    func removeFiles() { try? FileManagerless.removeTree(directory) }

    /// The bytes of a file (the capture).
    func contents(_ path: String) -> [UInt8] {
        guard let f = fopen(path, "rb") else { return [] }
        defer { fclose(f) }
        var out = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, f)
            if n <= 0 { break }
            out += chunk[0..<n]
        }
        return out
    }
}

/// A man in the middle on loopback: the terminal's SOCKS target, forwarding each frame to the
/// real gateway and back. It keeps every request it saw; with `.forgeApprovals` it rewrites
/// declined authorisation answers into approvals (leaving the gateway's MAC as it was), the
/// forgery a compromised host would try.
final class FrameRelay: @unchecked Sendable {
    enum Mode { case record, forgeApprovals }
    let mode: Mode
    let upstream: TCPEndpoint
    let loop: EventLoop
    private var listener: StreamListener?
    private var pairs: [ObjectIdentifier: StreamConnection] = [:]
    /// Every request frame's payload, in order (loop-confined; read through `requests`).
    private var seen: [[UInt8]] = []
    private var rewritten = 0

    init(mode: Mode, upstream: TCPEndpoint, loop: EventLoop) throws {
        self.mode = mode
        self.upstream = upstream
        self.loop = loop
        let error: SystemError? = loop.sync {
            do throws(SystemError) {
                listener = try StreamListener(on: TCPEndpoint(IPv4Address(127, 0, 0, 1), 0), loop: loop) { [weak self] c in self?.accepted(c) }
                return nil
            } catch { return error }
        }
        if let error { throw error }
    }

    var endpoint: TCPEndpoint { loop.sync { listener!.endpoint! } }
    var requests: [JSONValue] { get async { await loop.perform { self.seen.compactMap { try? JSONParser.parse($0) } } } }
    var forged: Int { get async { await loop.perform { self.rewritten } } }

    /// Stops listening and closes every relayed connection (on the loop).
    func close() {
        listener?.close()
        listener = nil
        for s in pairs.values { s.close() }
        pairs = [:]
    }

    private func accepted(_ client: StreamConnection) {
        guard let server = try? StreamConnection.connect(to: upstream, loop: loop) else { return client.close(reset: true) }
        pairs[ObjectIdentifier(client)] = server
        var fromClient = PaymentFrameDecoder(), fromServer = PaymentFrameDecoder()
        client.onData = { [weak self] bytes in
            guard let self, let frames = try? fromClient.feed(bytes) else { return client.close(reset: true) }
            for f in frames {
                self.seen.append(f)
                if let frame = try? PaymentFrame.encode(f) { server.send(frame) }
            }
        }
        server.onData = { [weak self] bytes in
            guard let self, let frames = try? fromServer.feed(bytes) else { return client.close(reset: true) }
            for f in frames {
                guard self.mode == .forgeApprovals, var answer = try? JSONParser.parse(f), answer["Type"]?.string == "AuthoriseResult",
                      answer["Result"]?.string == "declined" else {
                    if let frame = try? PaymentFrame.encode(f) { client.send(frame) }
                    continue
                }
                answer = answer.setting("Result", "approved").setting("ResponseCode", "00").setting("ApprovalCode", "123456")
                self.rewritten += 1
                if let frame = try? PaymentFrame.encode(answer) { client.send(frame) }
            }
        }
        client.onEndOfStream = { server.shutdownWrite() }
        server.onEndOfStream = { client.shutdownWrite() }
        client.onClose = { [weak self] _ in
            server.close()
            self?.pairs[ObjectIdentifier(client)] = nil
        }
        server.onClose = { _ in client.shutdownWrite() }
    }
}

/// Removes a directory tree of plain files (the test's own temporary directory).
enum FileManagerless {
    static func removeTree(_ path: String) throws {
        guard let d = opendir(path) else { return }
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name == "." || name == ".." { continue }
            unlink(path + "/" + name)
        }
        closedir(d)
        rmdir(path)
    }
}

/// Every delegate callback, in order, as text.
final class Recorder: PaymentReaderDelegate, @unchecked Sendable {
    let lines = Locked<[String]>([])
    let progress = Locked<[Float]>([])
    let cancelables = Locked<[Cancelable]>([])
    var shouldCancelUpdate = false
    var cancelReconnect = false
    let discovered = Locked<[[DiscoveredReader]]>([])
    /// Answers pairing requests (default: no).
    var confirmPairing: (String) -> Bool = { _ in false }
    let passkeys = Locked<[String]>([])

    func reader(_ reader: PaymentReader, didUpdateDiscoveredReaders readers: [DiscoveredReader]) { discovered.mutate { $0.append(readers) } }
    func reader(_ reader: PaymentReader, confirmPairing passkey: String) -> Bool {
        passkeys.mutate { $0.append(passkey) }
        return confirmPairing(passkey)
    }

    func add(_ s: String) { lines.mutate { $0.append(s) } }
    func count(_ prefix: String) -> Int { lines.value.filter { $0.hasPrefix(prefix) }.count }

    /// When each state was entered, stamped on the SDK's loop (not the test's task).
    let stateTimes = Locked<[(String, ContinuousClock.Instant)]>([])
    func reader(_ reader: PaymentReader, didChangeState state: PaymentState) {
        add("state \(state)")
        stateTimes.mutate { $0.append(("\(state)", ContinuousClock.now)) }
    }
    func reader(_ reader: PaymentReader, didReport event: ReaderEvent) { add("event \(event)") }
    func reader(_ reader: PaymentReader, didStartReconnect cancelable: Cancelable, disconnectReason: DisconnectReason) {
        add("didStartReconnect \(disconnectReason)")
        cancelables.mutate { $0.append(cancelable) }
        if cancelReconnect { cancelable.cancel() }
    }
    func readerDidSucceedReconnect(_ reader: PaymentReader) { add("didSucceedReconnect") }
    func readerDidFailReconnect(_ reader: PaymentReader) { add("didFailReconnect") }
    func reader(_ reader: PaymentReader, didDisconnect reason: DisconnectReason) { add("didDisconnect \(reason)") }
    func reader(_ reader: PaymentReader, didReportAvailableUpdate update: ReaderSoftwareUpdate) { add("availableUpdate \(update.deviceSoftwareVersion)") }
    func reader(_ reader: PaymentReader, didStartInstallingUpdate update: ReaderSoftwareUpdate, cancelable: Cancelable) {
        add("startInstalling \(update.deviceSoftwareVersion)")
        cancelables.mutate { $0.append(cancelable) }
        if shouldCancelUpdate { cancelable.cancel() }
    }
    func reader(_ reader: PaymentReader, didReportReaderSoftwareUpdateProgress p: Float) { progress.mutate { $0.append(p) } }
    func reader(_ reader: PaymentReader, didFinishInstallingUpdate update: ReaderSoftwareUpdate?, error: PaymentError?) {
        add("finishInstalling \(error.map { "\($0.code.rawValue)" } ?? "ok")")
    }
}
