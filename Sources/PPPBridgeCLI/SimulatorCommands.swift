import Channel
import Service
import Crypto
import Dispatch
import Glibc
import NetStack
import Payment
import PaymentKit
import Simulation

/// Runs `body` on a fresh loop thread and waits for SIGINT/SIGTERM; `stop` runs after.
func serveUntilSignalled(_ name: String, error: @escaping (String) -> Void, _ start: (EventLoop) throws -> Void,
                                 tick: (() -> Void)? = nil, stop: @escaping @Sendable () async -> Void) -> Int32 {
    let loop: EventLoop
    do {
        loop = try EventLoop()
        try loop.startThread()
    } catch let e {
        error("pppbridge \(name): \(e)")
        return 1
    }
    let done = DispatchSemaphore(value: 0)
    let watcher: SignalWatcher
    do {
        let made: Result<SignalWatcher, SystemError> = loop.sync {
            do throws(SystemError) {
                return .success(try SignalWatcher(signals: [SIGINT, SIGTERM], loop: loop) { signo in
                    error("pppbridge \(name): stopping (\(signo == SIGINT ? "SIGINT" : "SIGTERM"))")
                    done.signal()
                })
            } catch { return .failure(error) }
        }
        watcher = try made.get()
        try start(loop)
    } catch let e {
        error("pppbridge \(name): \(e)")
        return 1
    }
    while done.wait(timeout: .now() + .milliseconds(200)) == .timedOut { tick?() }
    loop.sync { watcher.cancel() }
    return runAsync {
        await stop()
        return 0
    }
}

/// `pppbridge gateway`: the gateway simulator on loopback.
struct GatewayCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge gateway [--port N] [--merchant LICENCE:USER:PASSWORD]...
                             [--offer-update VERSION [--required] [--update-size N] [--signing-key FILE]]

    The payment gateway simulator on 127.0.0.1 (test keys; deterministic rules: amounts ending
    in 05 decline, 51 insufficient funds, 91 no answer; wrong PIN 55; expired card 54): merchant
    logins, E2EE authorisations (AES DUKPT, MAC checked before decrypting, replays refused),
    reversals, signatures, refunds by authorisation code, and signed software update offers.
    Prints what it decides until SIGINT/SIGTERM.

      --port N             listen on 127.0.0.1:N (default 0: a free port, printed)
      --merchant L:U:P     another merchant beside the default (any LIC-TEST- licence, user
                           merchant, password secret, MerchantID 999008881): logins naming licence
                           L, user U and password P (the rest of the argument, colons included).
                           Each gets the next MerchantID (999008882, ...), printed. Operations
                           are kept per merchant: one merchant's session cannot refund, reverse,
                           sign or look up another's (3008). Visible to local users in ps: a
                           simulator's credentials, not real ones
      --offer-update V     offer version V (a random image, signed with Ed25519)
      --required           the update is required (installed during connect)
      --update-size N      the image's size in bytes (default 65536)
      --signing-key FILE   the Ed25519 private key (hex) that signs offers; created when missing.
                           Its public key is printed: give it to `pppbridge terminal --update-key`
    """

    func run(_ arguments: [String]) -> Int32 {
        var port: UInt16 = 0, version: String?, required = false, size = 65536, keyFile: String?
        var merchants = [GatewayCore.Merchant.standard]
        var it = ArgumentCursor(arguments)
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(GatewayCommand.usage)
                return 0
            case "--port":
                guard let v = it.next(), let n = decimal(v, as: UInt16.self) else { error("pppbridge gateway: --port takes a port"); return 2 }
                port = n
            case "--offer-update":
                guard let v = it.next(), UpdateOffer.isVersion(v) else { error("pppbridge gateway: --offer-update needs a version of dotted digits"); return 2 }
                version = v
            case "--merchant":
                guard let v = it.next() else { error("pppbridge gateway: --merchant needs LICENCE:USER:PASSWORD"); return 2 }
                switch GatewayCommand.merchant(v, number: merchants.count, existing: merchants) {
                case .success(let m): merchants.append(m)
                case .failure(let e):
                    error("pppbridge gateway: --merchant: \(e.text)")
                    return 2
                }
            case "--required": required = true
            case "--update-size":
                guard let v = it.next(), let n = decimal(v, as: Int.self), (1...(64 << 20)).contains(n) else { error("pppbridge gateway: --update-size takes 1 B to 64 MiB"); return 2 }
                size = n
            case "--signing-key":
                guard let v = it.next() else { error("pppbridge gateway: --signing-key needs a file"); return 2 }
                keyFile = v
            default:
                error("pppbridge gateway: unknown option \(a)")
                return 2
            }
        }
        var configuration = GatewayCore.Configuration.testKeys
        configuration.merchants = merchants
        for m in merchants.dropFirst() { output("gateway: merchant \(PeerText.escaped(m.user)) (\(PeerText.escaped(m.licence ?? ""))) has MerchantID \(m.merchantID)") }
        if let version {
            do {
                let key = try GatewayCommand.signingKey(keyFile)
                output("gateway: update public key \(Hex.encode(try Ed25519.publicKey(privateKey: key)))")
                let image = try SecureBytes.random(size)
                let sha = Hex.encode(Digest.hash(.sha256, image) ?? [])
                let requiredAt: WallTime? = required ? WallTime.current() : nil
                let signed = UpdateOffer.signedString(version: version, sha256: sha, size: size, requiredAt: requiredAt)
                let offer = UpdateOffer(version: version, requiredAt: requiredAt, size: size, sha256: sha,
                                        signature: Hex.encode(try Ed25519.sign(privateKey: key, Array(signed.utf8))))
                configuration.update = (offer, image)
                output("gateway: offering \(version) (\(size) B, sha256 \(sha.prefix(16))…\(required ? ", required" : ""))")
            } catch let e {
                error("pppbridge gateway: \(e)")
                return 1
            }
        }
        nonisolated(unsafe) var server: GatewayServer?
        nonisolated(unsafe) var printed = 0
        let out = output
        return serveUntilSignalled("gateway", error: error, { loop in
            let s = GatewayServer(configuration: configuration, loop: loop)
            try s.start(port: port)
            server = s
            out("gateway: listening on \(s.endpoint!)")
        }, tick: {
            guard let log = server?.journal, log.total > printed else { return }
            for line in log.after(printed) { out("gateway: \(line)") }
            printed = log.total
        }, stop: {
            server?.stop()
        })
    }

    struct MerchantError: Error { var text: String }

    /// `LICENCE:USER:PASSWORD` as the `number`th merchant (MerchantID 999008881 + number).
    static func merchant(_ spec: String, number: Int, existing: [GatewayCore.Merchant]) -> Result<GatewayCore.Merchant, MerchantError> {
        let parts = spec.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, !parts[1].isEmpty, !parts[2].isEmpty else { return .failure(MerchantError(text: "give LICENCE:USER:PASSWORD")) }
        guard parts[0].hasPrefix("LIC-TEST-"), parts[0].utf8.count <= 64 else {
            return .failure(MerchantError(text: "the simulator takes test licences only (LIC-TEST-...)"))
        }
        guard !existing.contains(where: { $0.user == parts[1] && ($0.licence == nil || $0.licence == parts[0]) }) else {
            return .failure(MerchantError(text: "user \(PeerText.escaped(parts[1])) already logs in with that licence"))
        }
        guard number < 1000 else { return .failure(MerchantError(text: "at most 1000 merchants")) }
        return .success(GatewayCore.Merchant(licence: parts[0], user: parts[1], password: parts[2], merchantID: String(999_008_881 + number)))
    }

    /// The signing key from `file` (hex), created there when missing; a fresh one without a file.
    static func signingKey(_ file: String?) throws -> [UInt8] {
        guard let file else { return try SecureBytes.random(32) }
        if let bytes = readWholeFile(file), let key = Hex.decode(String(decoding: bytes, as: UTF8.self).trimmingWhitespace), key.count == 32 {
            return key
        }
        let key = try SecureBytes.random(32)
        let fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SystemError("create \(file)") }
        let text = Array((Hex.encode(key) + "\n").utf8)
        _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        return key
    }
}

extension String {
    var trimmingWhitespace: String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !$0.properties.isWhitespace }),
              let last = scalars.lastIndex(where: { !$0.properties.isWhitespace }) else { return "" }
        return String(scalars[first...last])
    }
}

/// `pppbridge terminal`: the payment terminal simulator on a pty.
struct TerminalCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge terminal --gateway ADDR:PORT [--link PATH] [options]

    A simulated payment terminal as a real program: our stack in the terminal role on a pty
    (the far end of the PPP link), the reader protocol on its reader port, the gateway reached
    through the host's SOCKS proxy, test keys (AES DUKPT). It advertises itself beside its line
    for discovery, and takes cards and PINs through a JSON-lines control socket, a Unix socket
    of mode 0600 in the runtime directory (`pppbridge control`). Its KSN counter is kept in a
    state file (mode 0600) so that a restart goes on counting. A pairing's passkey is printed
    here, as the terminal's display would show it. Runs until SIGINT/SIGTERM.

      --link PATH          where to link the pty (default \(ReaderLines.defaultDirectory)/SERIAL)
      --gateway ADDR:PORT  the gateway, as the host's proxy should reach it (required)
      --serial S           serial number (default SIM-00000001)
      --reader-port N      the reader protocol's port inside the link (default 6000)
      --control PATH       the control socket (default $XDG_RUNTIME_DIR/pppbridge/terminal-SERIAL.control,
                           printed as `control on PATH`)
      --state FILE         the keys' and KSN counter's state file, mode 0600 (default
                           $XDG_STATE_HOME/pppbridge/terminal-SERIAL.state, which outlives a
                           reboot, unlike the runtime directory)
      --rssi DBM|wired     the advertised signal strength (default -48)
      --battery F          battery level 0...1 (default 0.82)
      --requires-pairing   hosts must pair before they log in
      --update-key HEX     the gateway's Ed25519 public key for software updates
      --card PAN[:PIN]     present this card whenever a payment waits for one (an unattended
                           terminal for demos; without it, use `pppbridge control`)
    """

    func run(_ arguments: [String]) -> Int32 {
        var link: String?, gateway: TCPEndpoint?, serial = "SIM-00000001", readerPort: UInt16 = 6000, controlPath: String?, statePath: String?
        var rssi: Int? = -48, battery = 0.82, pairing = false, updateKey: [UInt8] = [], card: (String, String?)?
        var it = ArgumentCursor(arguments)
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(TerminalCommand.usage)
                return 0
            case "--link":
                guard let v = it.next() else { error("pppbridge terminal: --link needs a path"); return 2 }
                link = v
            case "--gateway":
                guard let v = it.next(), let e = ReaderOptions.endpoint(v) else { error("pppbridge terminal: --gateway takes ADDR:PORT"); return 2 }
                gateway = e
            case "--serial":
                guard let v = it.next(), !v.isEmpty, !v.contains("/") else { error("pppbridge terminal: --serial needs a name"); return 2 }
                serial = v
            case "--reader-port":
                guard let v = it.next(), let n = decimal(v, as: UInt16.self), n > 0 else { error("pppbridge terminal: --reader-port takes a port"); return 2 }
                readerPort = n
            case "--control":
                guard let v = it.next(), !v.isEmpty else { error("pppbridge terminal: --control needs a path"); return 2 }
                controlPath = v
            case "--state":
                guard let v = it.next(), !v.isEmpty else { error("pppbridge terminal: --state needs a file"); return 2 }
                statePath = v
            case "--rssi":
                guard let v = it.next() else { error("pppbridge terminal: --rssi takes dBm or wired"); return 2 }
                if v == "wired" { rssi = nil } else {
                    guard let n = Int(v), (-127...0).contains(n) else { error("pppbridge terminal: --rssi takes -127...0 or wired"); return 2 }
                    rssi = n
                }
            case "--battery":
                guard let v = it.next(), let f = Double(v), (0...1).contains(f) else { error("pppbridge terminal: --battery takes 0...1"); return 2 }
                battery = f
            case "--requires-pairing": pairing = true
            case "--update-key":
                guard let v = it.next(), let k = Hex.decode(v), k.count == 32 else { error("pppbridge terminal: --update-key takes 64 hex digits"); return 2 }
                updateKey = k
            case "--card":
                guard let v = it.next() else { error("pppbridge terminal: --card takes PAN[:PIN]"); return 2 }
                let parts = v.split(separator: ":").map(String.init)
                guard let pan = parts.first, CardData.isValidPAN(pan), parts.count <= 2 else {
                    error("pppbridge terminal: --card takes a PAN with a valid check digit, then :PIN")
                    return 2
                }
                card = (pan, parts.count == 2 ? parts[1] : nil)
            default:
                error("pppbridge terminal: unknown option \(a)")
                return 2
            }
        }
        guard let gateway else {
            error("pppbridge terminal: --gateway ADDR:PORT is required")
            return 2
        }
        let path = link ?? ReaderLines.defaultDirectory + "/" + serial
        if link == nil { ReaderLines.makeDefaultDirectory() }
        var c = TerminalSimulator.Configuration(linkPath: path, gateway: gateway)
        c.core.serialNumber = serial
        c.core.battery = battery
        c.core.requiresPairing = pairing
        c.core.updatePublicKey = updateKey
        c.readerPort = readerPort
        c.controlPath = controlPath
        if statePath == nil {
            do { statePath = try TerminalStateFile.defaultDirectory() + "/terminal-\(serial).state" } catch let e {
                error("pppbridge terminal: \(e)")
                return 1
            }
        }
        c.statePath = statePath
        c.rssi = rssi
        nonisolated(unsafe) var simulator: TerminalSimulator?
        nonisolated(unsafe) var pad: TerminalControl?
        nonisolated(unsafe) var printed = 0
        let out = output, configuration = c
        return serveUntilSignalled("terminal", error: error, { loop in
            let s = TerminalSimulator(configuration: configuration, loop: loop)
            try s.start()
            simulator = s
            out("terminal: \(serial) on \(path) (reader port \(readerPort)), control on \(s.controlPath ?? "?")")
            if let state = s.statePath { out("terminal: KSN counter \(s.loop.sync { s.core.security.counter }) kept in \(state)") }
            if card != nil, let controlPath = s.controlPath { pad = try TerminalControl(path: controlPath) }
        }, tick: {
            guard let s = simulator else { return }
            let journal = s.loop.sync { s.core.trace }
            if journal.total > printed {
                for line in journal.after(printed) { out("terminal: \(line)") }
                printed = journal.total
            }
            // The unattended card: presented when a payment waits for one.
            if let pad, let card, (try? pad.send(["cmd": "status"]))?["phase"]?.string == "WaitingForCard" {
                var command: JSONValue = ["cmd": "presentCard", "entry": "ICC", "pan": .string(card.0), "expiry": "3012", "serviceCode": "201",
                                          "cvm": card.1 == nil ? "NoCVM" : "OnlinePIN"]
                if let pin = card.1 { command = command.setting("pin", .string(pin)) }
                _ = try? pad.send(command)
            }
        }, stop: {
            await simulator?.stop()
        })
    }
}

/// `pppbridge control PORT JSON`: one command to a terminal simulator's control socket.
struct ControlCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge control PATH JSON

    Sends one command to a terminal simulator's control socket (the Unix socket it printed as
    `control on PATH`; mode 0600, so only its user reaches it) and prints the answer. Commands: {"cmd":"status"}, {"cmd":"presentCard","pan":"4111111111111111",
    "pin":"1234","cvm":"OnlinePIN"|"Signature"|"NoCVM","entry":"ICC"|"MagStripe"|"Contactless"},
    {"cmd":"enterPin","pin":"1234"}, {"cmd":"pressCancel"}, {"cmd":"removeCard"},
    {"cmd":"setBattery","level":0.04}, {"cmd":"setRSSI","rssi":-40}, {"cmd":"dropLink",
    "mode":"rst"|"silent","downFor":2}, {"cmd":"powerOff"}, {"cmd":"powerOn"},
    {"cmd":"erasePairing"}, {"cmd":"dropLinkAfterAuthorise","downFor":1}.
    """

    func run(_ arguments: [String]) -> Int32 {
        if arguments.first == "-h" || arguments.first == "--help" {
            output(ControlCommand.usage)
            return 0
        }
        guard arguments.count == 2, !arguments[0].isEmpty, let command = try? JSONParser.parse(Array(arguments[1].utf8)) else {
            error("pppbridge control: expected PATH and a JSON object (see `pppbridge control --help`)")
            return 2
        }
        do {
            let answer = try TerminalControl(path: arguments[0]).send(command)
            output(answer.text)
            return answer["ok"]?.bool == true ? 0 : 1
        } catch {
            self.error("pppbridge control: \(error)")
            return 1
        }
    }
}
