import Channel
import Crypto
import Glibc
import NetStack
import PPP
import Payment
import PaymentKit

/// A simulated payment terminal as a real program: our stack in the terminal role on a pty (the
/// far end of the PPP link), the reader protocol on `readerPort` inside the link, the gateway
/// reached through the host's SOCKS proxy, and a JSON-lines control socket (Unix, mode 0600, in
/// the user's runtime directory) through which tests put cards and PINs "inside the pad", drop
/// the link, drain the battery.
/// It survives its own reboots: the core (keys, counter, stored results) outlives each boot,
/// while each boot is a fresh PPP link on a fresh pty at the same path.
public final class TerminalSimulator: @unchecked Sendable {
    public struct Configuration: Sendable {
        /// Where the pty's name is linked (what the host opens).
        public var linkPath: String
        public var core = TerminalCore.Configuration()
        public var readerPort: UInt16 = 6000
        /// The host's SOCKS5 proxy port inside the link.
        public var socksPort: UInt16 = 1080
        /// The gateway as the proxy should reach it (an IPv4 literal: no name lookups).
        public var gateway: TCPEndpoint
        /// The control socket's path; nil: `terminal-SERIAL.control` in `UnixSocket.runtimeDirectory()`.
        public var controlPath: String?
        /// The state file (keys and KSN counter, mode 0600) loaded at start and written before
        /// every request to the gateway; nil keeps the state in memory only.
        public var statePath: String?
        public var link: LinkConfiguration = .terminal()
        /// Publish an advertisement beside the line (`linkPath.advert`) for discovery.
        public var advertises = true
        /// The advertised peripheral UUID (nil: derived from the serial number).
        public var peripheralUUID: String?
        /// The advertised signal strength (nil: a wired line).
        public var rssi: Int? = -48

        public init(linkPath: String, gateway: TCPEndpoint) {
            self.linkPath = linkPath
            self.gateway = gateway
            core.gatewayAddress = "\(gateway)"
        }
    }

    public let configuration: Configuration
    public let loop: EventLoop
    public let core: TerminalCore
    private var terminal: SimulatedTerminal?
    private var service: ReaderService?
    private var control: StreamListener?
    private var controlClients: [ObjectIdentifier: ControlClient] = [:]
    private struct ControlClient {
        var connection: StreamConnection
        var lines = LineAssembler(limit: TerminalSimulator.controlLineLimit)
    }
    /// Control clients at once; one more is closed at once.
    static let controlClientLimit = 8
    /// A control line longer than this (no newline yet) is answered with an error and skipped
    /// up to its newline; the client stays.
    static let controlLineLimit = 64 * 1024
    /// Answers a control client has not read beyond this close it.
    static let controlOutputLimit = 1 << 20
    /// Control clients closed for going beyond either limit.
    public private(set) var controlClientsRefused = 0
    private var restartTimer: Int?
    private var stopped = false
    /// Every byte of the reader connection (tests search it for card data).
    public private(set) var readerBytes: [UInt8] = []
    public var recordsReaderBytes = false
    /// Boots so far (1 after `start`).
    public private(set) var boots = 0
    private var rssi: Int?

    public init(configuration: Configuration, security: TerminalSecurity = .testDevice(), loop: EventLoop = .shared) {
        self.configuration = configuration
        self.loop = loop
        rssi = configuration.rssi
        core = loop.sync { TerminalCore(configuration: configuration.core, security: security, now: loop.now, wallClock: WallTime.current()) }
    }

    /// The state file, when there is one.
    public var statePath: String? { configuration.statePath }
    /// What the state file holds now.
    private var savedState: JSONValue?
    /// Requests not sent because the state could not be written first.
    public private(set) var stateWriteFailures = 0

    /// Writes the security module's state when it changed since the last write; false when it
    /// could not be written (the request that would use the new counter must not leave).
    private func saveState() -> Bool {
        guard let path = configuration.statePath else { return true }
        let security = core.security
        guard savedState != security.state else { return true }
        do throws(TerminalStateFile.StateError) {
            try TerminalStateFile(path: path).save(security)
        } catch {
            stateWriteFailures += 1
            core.note("state not written, request held back: \(error)")
            return false
        }
        savedState = security.state
        return true
    }

    /// Loads the state file (when configured), opens the control socket and boots.
    public func start() throws(SystemError) {
        let result: SystemError? = loop.sync {
            do throws(SystemError) {
                if let path = configuration.statePath {
                    do throws(TerminalStateFile.StateError) {
                        if let saved = try TerminalStateFile(path: path).load() {
                            core.security = saved
                            savedState = saved.state
                        } else if !saveState() {
                            throw TerminalStateFile.StateError(description: "\(path): cannot be written")
                        }
                    } catch {
                        throw SystemError("state file \(error)", errno: Errno(EINVAL))
                    }
                }
                var path = configuration.controlPath ?? ""
                if path.isEmpty { path = try UnixSocket.runtimeDirectory() + "/terminal-\(configuration.core.serialNumber).control" }
                control = try StreamListener(unixPath: path, mode: 0o600, loop: loop) { [weak self] c in
                    self?.controlConnected(c)
                }
                try boot()
                return nil
            } catch {
                return error
            }
        }
        if let result { throw result }
    }

    /// The control socket's path (for `TerminalControl` and `pppbridge control`).
    public var controlPath: String? { loop.sync { control?.path } }

    /// Waits for the current boot's link to come up.
    public func waitUntilUp() async -> IPCPResult? {
        guard let t = await loop.perform({ [self] in terminal }) else { return nil }
        return await t.waitUntilUp()
    }

    /// Powers down for good: the link is closed, the control socket too.
    public func stop() async {
        let t: SimulatedTerminal? = await loop.perform { [self] in
            stopped = true
            if configuration.advertises { ReaderLines.withdraw(path: configuration.linkPath) }
            if let restartTimer { loop.cancelTimer(restartTimer) }
            control?.close()
            for c in controlClients.values { c.connection.close() }
            controlClients = [:]
            let t = terminal
            terminal = nil
            service = nil
            return t
        }
        await t?.stop()
    }

    // MARK: Boots

    private func boot(powerCycle: Bool = true) throws(SystemError) {
        let t = try SimulatedTerminal(line: .pty(linkedAt: configuration.linkPath), link: configuration.link, loop: loop)
        let reader = ReaderService(port: configuration.readerPort, core: core, gatewayExchange: { [weak self, weak t] payload, completion in
            guard let self, let t, let up = t.linkResult else { return completion(nil) }
            // The counter this request used is on disk before the request leaves.
            guard self.saveState() else { return completion(nil) }
            let socks = TCPEndpoint(up.peerAddress, self.configuration.socksPort)
            t.beginTransfer(to: self.configuration.gateway, via: socks, payload: payload) { result in
                completion(result.received.isEmpty ? nil : result.received)
            }
        }, onShutdown: { [weak self] reason, after in
            self?.shutdown(reason: reason, restartAfter: after, graceful: reason != "dropLink")
        })
        reader.currentNow = { [unowned loop] in loop.now }
        reader.persist = { [weak self] in self?.saveState() ?? false }
        reader.observer = { [weak self] (_: Bool, bytes: [UInt8]) in
            guard let self, self.recordsReaderBytes else { return }
            self.readerBytes += bytes
        }
        t.add(reader)
        // The host ended the link (a disconnect, a login it gave up on): like a real terminal
        // the simulator waits for the next one, on a fresh line at the same path.
        t.onDown = { [weak self, weak t] _ in
            guard let self, let t, self.terminal === t, !self.stopped else { return }
            self.terminal = nil
            self.service = nil
            self.restartTimer = self.loop.schedule(at: self.loop.now) { [weak self] in
                guard let self, !self.stopped, self.terminal == nil else { return }
                self.restartTimer = nil
                try? self.boot(powerCycle: false)
            }
        }
        terminal = t
        service = reader
        if powerCycle {
            boots += 1
            core.powerOn(now: loop.now)
        }
        try t.start()
        advertise(force: true)
    }

    /// The advertisement as the terminal's state says now.
    public var advertisement: DiscoveredReader {
        let c = core.configuration
        let uuid = configuration.peripheralUUID ?? DiscoveredReader.uuidText(Digest.hash(.sha256, Array(("pppbridge-reader|" + c.serialNumber).utf8)) ?? [])
        return DiscoveredReader(path: configuration.linkPath, peripheralUUID: uuid.uppercased(), name: c.serialNumber, serialNumber: c.serialNumber,
                                rssi: rssi, requiresPairing: c.requiresPairing, batteryLevel: c.battery, softwareVersion: c.softwareVersion)
    }

    private var published: DiscoveredReader?

    /// Publishes the advertisement when it changed (or the line is new).
    private func advertise(force: Bool = false) {
        guard configuration.advertises, !stopped else { return }
        let now = advertisement
        guard force || now != published else { return }
        published = now
        ReaderLines.publish(now)
    }

    /// Goes down now; boots again after `restartAfter` (nil: stays down until `powerOn`).
    private func shutdown(reason: String, restartAfter: Duration?, graceful: Bool = true) {
        guard let t = terminal else { return }
        let s = service
        terminal = nil
        service = nil
        t.kick()
        if graceful {
            // Its last words (progress, the Shutdown event) reach the host before the link goes:
            // what TCP still holds is sent and acknowledged first (for at most five seconds). The
            // next boot counts from the old link's end, so the two never share the core.
            whenFlushed(t, s, deadline: loop.now + .seconds(5)) { [weak self] in
                // All on the loop: nothing here waits for a thread of the task pool.
                t.close { self?.scheduleBoot(after: restartAfter) }
            }
        } else {
            t.hangUp()
            scheduleBoot(after: restartAfter)
        }
    }

    private func whenFlushed(_ t: SimulatedTerminal, _ s: ReaderService?, deadline: Instant, _ then: @escaping () -> Void) {
        if s?.isFlushed ?? true || loop.now >= deadline { return then() }
        t.kick()
        _ = loop.schedule(at: loop.now + .milliseconds(10)) { [weak self] in
            guard let self else { return then() }
            self.whenFlushed(t, s, deadline: deadline, then)
        }
    }

    private func scheduleBoot(after: Duration?) {
        guard let after, !stopped else { return }
        restartTimer = loop.schedule(at: loop.now + after) { [weak self] in
            guard let self, !self.stopped, self.terminal == nil else { return }
            self.restartTimer = nil
            try? self.boot()
        }
    }

    // MARK: Control socket

    private func controlConnected(_ c: StreamConnection) {
        guard controlClients.count < TerminalSimulator.controlClientLimit else {
            controlClientsRefused += 1
            return c.close()
        }
        let key = ObjectIdentifier(c)
        controlClients[key] = ControlClient(connection: c)
        c.onData = { [weak self] bytes in
            guard let self, var entry = self.controlClients[key] else { return }
            let pieces = entry.lines.feed(bytes)
            self.controlClients[key] = entry
            for piece in pieces {
                let answer: JSONValue
                switch piece {
                case .tooLong:
                    // Answered at once; the rest of the line is dropped, never held.
                    self.controlClientsRefused += 1
                    answer = ["ok": false, "error": .string("line longer than \(TerminalSimulator.controlLineLimit) bytes: skipped")]
                case let .line(line):
                    answer = self.handleControl(line)
                    // The command may have closed the control socket (a stop).
                    guard self.controlClients[key] != nil else { return }
                }
                entry.connection.send(answer.serialized + [0x0A])
                // The client may be gone (the send failed and closed it): nothing more for it.
                guard entry.connection.isOpen, self.controlClients[key] != nil else {
                    self.controlClients[key] = nil
                    return
                }
                // A client that sends commands and never reads the answers is let go.
                guard entry.connection.queuedBytes <= TerminalSimulator.controlOutputLimit else {
                    self.controlClients[key] = nil
                    self.controlClientsRefused += 1
                    return entry.connection.close()
                }
            }
        }
        c.onClose = { [weak self] _ in self?.controlClients[key] = nil }
    }

    /// One control command (loop thread).
    func handleControl(_ line: [UInt8]) -> JSONValue {
        guard let command = try? JSONParser.parse(line), let name = command["cmd"]?.string else {
            return ["ok": false, "error": "expected a JSON object with cmd"]
        }
        let now = loop.now
        switch name {
        case "dropLink":
            guard terminal != nil else { return ["ok": false, "error": "link is down"] }
            let mode = command["mode"]?.string ?? "rst"
            var downFor: Duration?
            if let v = command["downFor"], !v.isNull {
                guard let d = TerminalControlCommands.downTime(v) else { return ["ok": false, "error": "downFor is 0...86400 seconds"] }
                downFor = d
            }
            if mode == "silent" {
                // A frozen terminal: the line stays, nothing answers; the host finds out by LCP echo.
                // Forgotten first, so that its link going quiet is not taken for a host leaving.
                let t = terminal
                terminal = nil
                t?.freeze()
                service?.stop()
                service = nil
                if let downFor {
                    restartTimer = loop.schedule(at: now + downFor) { [weak self] in
                        t?.hangUp()
                        guard let self, !self.stopped, self.terminal == nil else { return }
                        try? self.boot()
                    }
                }
            } else {
                shutdown(reason: "dropLink", restartAfter: downFor, graceful: false)
            }
            return ["ok": true]
        case "setRSSI":
            if command["rssi"] == .null { rssi = nil } else {
                guard let v = command["rssi"]?.integer, (-127...0).contains(v) else { return ["ok": false, "error": "rssi is -127...0 dBm or null (wired)"] }
                rssi = Int(v)
            }
            advertise()
            return ["ok": true]
        case "powerOn":
            guard terminal == nil else { return ["ok": false, "error": "already on"] }
            if let restartTimer { loop.cancelTimer(restartTimer) }
            do { try boot() } catch { return ["ok": false, "error": .string("\(error)")] }
            return ["ok": true]
        default:
            guard let service else {
                // Between two lines (re-arming after a host left) the pad still answers.
                return name == "status" || core.isPoweredOn ? TerminalControlCommands.handle(core: core, command, now: now) : ["ok": false, "error": "terminal is off"]
            }
            let answer = service.withCore(now: now) { TerminalControlCommands.handle(core: $0, command, now: now) }
            // New keys (provisionKey) are kept at once.
            _ = saveState()
            terminal?.kick()
            advertise()
            return answer
        }
    }

    /// The current boot's stack, as lines for a person.
    public func report() -> [String] { loop.sync { terminal?.report() ?? ["terminal off"] } }
}
