import Channel
import Service
import Crypto
import Dispatch
import Glibc
import NetStack
import Payment
import PaymentKit

/// How the payment commands reach a reader: the line (given, or discovered), the gateway and
/// the merchant's login, pairing, capture.
struct ReaderOptions {
    var device: String?
    var pattern = ReaderLines.defaultPattern
    var proximity = false
    var discoveryTimeout: UInt = 10
    var allowed: [String]?
    var serial: String?
    var gateway: TCPEndpoint?
    var location = "pppbridge-cli"
    var environment = "int"
    var licence = "LIC-TEST-0001"
    var user = "merchant"
    var password = "secret"
    var readerPort: UInt16 = 6000
    var pcap: String?
    var autoPair = false
    var acceptPasskey = false
    var bonds: String?

    static let usage = """
    reader (one of):
      --device PATH          the reader's serial line or pty
      (default) discover it on the lines matching --pattern (default \(ReaderLines.defaultPattern)):
      --pattern GLOB         the lines to scan (ptys/serial ports; a terminal's advertisement
                             sits beside its line as LINE.advert)
      --proximity            take the one reader held close (≥ -50 dBm) instead of the strongest
      --timeout S            give up discovering after S seconds (default 10; 0: never)
      --allow UUID           only readers with this peripheral UUID (repeatable)
      --serial S             only the reader with this serial number
    gateway and merchant:
      --gateway ADDR:PORT    the gateway (required; an IPv4 address)
      --location ID          the location id the reader logs in with (default pppbridge-cli)
      --environment E        des, int, ccal or real (default int)
      --licence L --user U --password P   the merchant's login (defaults: the simulator's)
    link:
      --reader-port N        the reader protocol's port inside the link (default 6000)
      --pcap FILE            write the PPP link's frames to FILE
    pairing:
      --auto-pair            pair with a reader that requires it (the passkey is asked for
                             on the terminal: type y if the reader shows the same digits)
      --accept-passkey       confirm the passkey without asking
      --bonds DIR            keep bonds with paired readers in DIR (default: for this run only)
    """

    enum Parsed { case mine, notMine, bad(String) }

    mutating func parse(_ a: String, _ it: inout ArgumentCursor) -> Parsed {
        func value() -> String? { it.next() }
        switch a {
        case "--device":
            guard let v = value() else { return .bad("--device needs a path") }
            device = v
        case "--pattern":
            guard let v = value() else { return .bad("--pattern needs a glob") }
            pattern = v
        case "--proximity": proximity = true
        case "--timeout":
            guard let v = value(), let n = decimal(v, as: UInt.self) else { return .bad("--timeout takes whole seconds") }
            discoveryTimeout = n
        case "--allow":
            guard let v = value(), DiscoveredReader.isUUID(v) else { return .bad("--allow takes a UUID (8-4-4-4-12 hex digits)") }
            allowed = (allowed ?? []) + [v.uppercased()]
        case "--serial":
            guard let v = value() else { return .bad("--serial needs a serial number") }
            serial = v
        case "--gateway":
            guard let v = value(), let e = ReaderOptions.endpoint(v) else { return .bad("--gateway takes ADDR:PORT with an IPv4 address") }
            gateway = e
        case "--location":
            guard let v = value(), PaymentRules.isLocationID(v) else { return .bad("--location takes [A-Za-z0-9_-]{1,64}") }
            location = v
        case "--environment":
            guard let v = value(), ["des", "int", "ccal", "real"].contains(v) else { return .bad("--environment takes des, int, ccal or real") }
            environment = v
        case "--licence", "--license":
            guard let v = value() else { return .bad("--licence needs a value") }
            licence = v
        case "--user":
            guard let v = value() else { return .bad("--user needs a name") }
            user = v
        case "--password":
            guard let v = value() else { return .bad("--password needs a value") }
            password = v
        case "--reader-port":
            guard let v = value(), let n = decimal(v, as: UInt16.self), n > 0 else { return .bad("--reader-port takes a port") }
            readerPort = n
        case "--pcap":
            guard let v = value() else { return .bad("--pcap needs a file") }
            pcap = v
        case "--auto-pair": autoPair = true
        case "--accept-passkey": acceptPasskey = true
        case "--bonds":
            guard let v = value() else { return .bad("--bonds needs a directory") }
            bonds = v
        default:
            return .notMine
        }
        return .mine
    }

    static func endpoint(_ text: String) -> TCPEndpoint? {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]), port > 0,
              let address = IPv4Address(String(text[..<colon])) else { return nil }
        return TCPEndpoint(address, port)
    }

    func connection(gateway: TCPEndpoint) -> ReaderConnectionConfiguration {
        var c = ReaderConnectionConfiguration(locationID: location, gateway: gateway)
        c.environment = environment
        c.licence = licence
        c.readerPort = readerPort
        c.pcapPath = pcap
        c.autoPair = autoPair
        c.bonds = BondStore(directory: bonds)
        return c
    }
}

/// A reader session for a person at a terminal: every state change, what the reader shows,
/// discovery's findings and update progress are printed as they happen.
final class ReaderCommandSession: PaymentReaderDelegate, @unchecked Sendable {
    let reader: PaymentReader
    let options: ReaderOptions
    let say: (String) -> Void
    private let found = Locked<[DiscoveredReader]>([])
    private let reports = Locked<Int>(0)
    private let lastProgress = Locked<Int>(-1)

    init(options: ReaderOptions, say: @escaping (String) -> Void) throws {
        let loop = try EventLoop()
        try loop.startThread()
        reader = PaymentReader(loop: loop)
        self.options = options
        self.say = say
        reader.delegate = self
    }

    /// Logs in at the gateway, finds the reader and connects to it.
    func open() async throws(PaymentError) {
        guard let gateway = options.gateway else { throw PaymentError(.gatewayUnreachable, "--gateway ADDR:PORT is required") }
        let merchant = try await reader.login(gateway: gateway, environment: options.environment, licence: options.licence,
                                              user: options.user, password: options.password)
        say("gateway: logged in as merchant \(merchant)")
        let configuration = options.connection(gateway: gateway)
        if let device = options.device {
            try await reader.connect(path: device, serialNumber: options.serial, configuration: configuration)
        } else {
            let chosen = try await discover()
            say("connecting: \(chosen)")
            try await reader.connect(chosen, configuration: configuration)
        }
        if let info = reader.info {
            say("reader: \(shown(info.serialNumber)), software \(shown(info.softwareVersion)), battery \(shown(info.batteryLevel ?? "?")), location \(shown(info.locationID))"
                + (info.transactionsRemaining.map { ", \($0) transactions left on its key" } ?? ""))
            if let u = info.availableUpdate {
                say("reader: update \(shown(u.deviceSoftwareVersion)) available (\(u.size) B\(u.requiredAt.map { ", required from \($0)" } ?? ""))")
            }
        }
    }

    /// Discovers until a reader the options accept shows up (proximity: its second report,
    /// with the battery level).
    func discover() async throws(PaymentError) -> DiscoveredReader {
        let method: DiscoveryConfiguration.Method = options.proximity ? .proximity : .scan(timeout: options.discoveryTimeout)
        let failure = Locked<PaymentError?>(nil)
        let reader = self.reader, pattern = options.pattern, allowed = options.allowed
        say("discovery: \(options.proximity ? "hold the reader close" : "scanning") on \(pattern)")
        let task = Task {
            do throws(PaymentError) {
                try await reader.discoverReaders(DiscoveryConfiguration(method: method, allowedPeripheralUUIDs: allowed), pattern: pattern)
            } catch {
                failure.set(error)
            }
        }
        let started = ContinuousClock.now
        while true {
            if let e = failure.get() { throw e }
            let readers = found.get().filter { options.serial == nil || $0.serialNumber == options.serial }
            // Proximity reports its reader twice (serial, then battery): the second is the one.
            if let first = readers.first, !options.proximity || reports.get() >= 2 { return first }
            // Proximity has no timeout of its own; the command's applies.
            if options.proximity, options.discoveryTimeout > 0, ContinuousClock.now - started > .seconds(Int64(options.discoveryTimeout)) {
                reader.cancel()
                _ = await task.value
                throw PaymentError(.discoveryTimedOut, "no reader held close within \(options.discoveryTimeout) s")
            }
            try? await Task.sleep(for: .milliseconds(50))
        }
    }

    func close() async { await reader.disconnect() }

    // Delegate: what a person sees.
    func reader(_ reader: PaymentReader, didChangeState state: PaymentState) { say("state: \(state)") }
    func reader(_ reader: PaymentReader, didReport event: ReaderEvent) {
        switch event {
        case let .display(_, text): say("reader shows: \(shown(text))")
        case let .phase(p): say("phase: \(shown(p))")
        case .cardInserted: say("reader: card inserted")
        case .cardRemoved: say("reader: card removed")
        case let .receipt(lines): for l in lines { say("receipt: \(shown(l))") }
        case .notification: break
        }
    }
    func reader(_ reader: PaymentReader, didUpdateDiscoveredReaders readers: [DiscoveredReader]) {
        found.set(readers)
        reports.set(reports.get() + 1)
        for r in readers { say("found: \(r)") }
    }
    func reader(_ reader: PaymentReader, confirmPairing passkey: String) -> Bool {
        if options.acceptPasskey {
            say("pairing: passkey \(passkey), confirmed (--accept-passkey)")
            return true
        }
        say("pairing: does the reader show \(passkey)? [y/N]")
        return readLine()?.lowercased().hasPrefix("y") == true
    }
    func reader(_ reader: PaymentReader, didStartReconnect cancelable: Cancelable, disconnectReason: DisconnectReason) {
        say("link: lost (\(disconnectReason)), reconnecting")
    }
    func readerDidSucceedReconnect(_ reader: PaymentReader) { say("link: reconnected") }
    func readerDidFailReconnect(_ reader: PaymentReader) { say("link: reconnect failed") }
    func reader(_ reader: PaymentReader, didDisconnect reason: DisconnectReason) { say("link: disconnected (\(reason))") }
    func reader(_ reader: PaymentReader, didStartInstallingUpdate update: ReaderSoftwareUpdate, cancelable: Cancelable) {
        say("update: installing \(update.deviceSoftwareVersion) (\(update.durationEstimate))")
    }
    func reader(_ reader: PaymentReader, didReportReaderSoftwareUpdateProgress progress: Float) {
        // The reader's number: only a finite fraction in 0...1 becomes a percentage.
        let percent = progress.isFinite ? Int(min(1, max(0, progress)) * 100) : 0
        guard percent / 10 > lastProgress.get() / 10 || percent == 100 && lastProgress.get() != 100 else { return }
        lastProgress.set(percent)
        say("update: \(percent)%")
    }
    func reader(_ reader: PaymentReader, didFinishInstallingUpdate update: ReaderSoftwareUpdate?, error: PaymentError?) {
        say(error.map { "update: failed (\($0))" } ?? "update: installed \(update?.deviceSoftwareVersion ?? "")")
    }
}

/// Runs an async body from a synchronous command and returns its status.
func runAsync(_ body: @escaping @Sendable () async -> Int32) -> Int32 {
    let result = Locked<Int32>(1)
    let done = DispatchSemaphore(value: 0)
    Task {
        result.set(await body())
        done.signal()
    }
    done.wait()
    return result.get()
}

/// Exit statuses of the payment commands.
enum PaymentStatus {
    static let approved: Int32 = 0
    /// Declined, refused, or the operation failed (the error says which, with its code).
    static let declined: Int32 = 1
    static let usage: Int32 = 2
    /// No connection: discovery, the gateway login, pairing or the reader's login failed.
    static let unreachable: Int32 = 3
}

/// What the reader said, as it may reach a person's terminal: escaped (no control sequences)
/// and cut short.
func shown(_ s: String) -> String { PeerText.escaped(s, limit: 256) }

func describe(_ o: PaymentOutcome) -> String {
    var s = "\(o.result) \(o.currency.format(o.amountMinor)) \(o.currency.code)"
    if let a = o.approvalCode, !a.isEmpty { s += ", authorisation code \(shown(a))" }
    if let op = o.operationID { s += ", operation \(shown(op))" }
    s += ", response \(shown(o.responseCode))"
    if let pan = o.maskedPAN { s += ", card \(shown(pan))" }
    if o.authenticatedByPin { s += ", PIN verified" }
    if o.signatureRequired { s += ", signature" }
    if o.recovered { s += " (recovered after a reconnect)" }
    return s
}

/// A transaction id from the clock when none is given: `^[0-9]{4}[0-9A-Za-z]{0,8}$`.
func defaultTransactionID() -> String {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    let n = (Int(ts.tv_sec) % 100_000_000) * 10 + Int(ts.tv_nsec / 100_000_000)
    let s = String(n)
    return String(repeating: "0", count: max(0, 9 - s.count)) + s
}

/// `pppbridge pay` and `pppbridge refund`.
struct PayCommand {
    var output: (String) -> Void
    var error: (String) -> Void
    var refund = false

    static let usage = """
    usage: pppbridge pay --amount DECIMAL --currency CODE --gateway ADDR:PORT [options]
           pppbridge refund --auth CODE --amount DECIMAL --currency CODE --gateway ADDR:PORT [options]

    Connects to a payment reader over PPP (our stack and channel; the reader reaches the gateway
    through the channel's SOCKS proxy), logs the merchant in and takes one payment, or refunds
    one earlier operation by its authorisation code (or operation id). The amount is decimal text
    taken exactly in the currency's minor units (EUR 10.50, JPY 1050, KWD 1.250); the card and
    PIN stay inside the reader (E2EE to the gateway). Prints each state and what the reader shows.

      --amount DECIMAL       the amount (no more decimals than the currency has)
      --currency CODE        ISO 4217 letters (EUR, USD, GBP, JPY, KWD, ...)
      --transaction-id ID    the merchant's reference, 4 digits then up to 8 letters/digits
                             (default: from the clock)
      --auth CODE            refund: the original's authorisation code (6 digits) or OP-id
      --signature FILE       pay: if the card asks for a signature, send this image (BMP, JPEG,
                             TIFF or GIF; checked by its magic bytes)
      --decline-signature    pay: refuse a signature (the approval is reversed)
    \(ReaderOptions.usage)

    Exit status: 0 approved, 1 declined or failed (the error's code is printed), 2 bad usage,
    3 no connection (discovery, gateway login, pairing or the reader's login failed).
    """

    func run(_ arguments: [String]) -> Int32 {
        var options = ReaderOptions()
        var amount: String?, currencyCode: String?, auth: String?, transactionID: String?, signature: String?
        var declineSignature = false
        var it = ArgumentCursor(arguments)
        let name = refund ? "refund" : "pay"
        while let a = it.next() {
            switch options.parse(a, &it) {
            case .mine: continue
            case .bad(let why):
                error("pppbridge \(name): \(why)")
                return PaymentStatus.usage
            case .notMine: break
            }
            switch a {
            case "-h", "--help":
                output(PayCommand.usage)
                return 0
            case "--amount", "--currency", "--transaction-id",
                 "--auth" where refund,
                 "--signature" where !refund:
                guard let v = it.next() else {
                    error("pppbridge \(name): \(a) needs a value")
                    return PaymentStatus.usage
                }
                switch a {
                case "--amount": amount = v
                case "--currency": currencyCode = v
                case "--transaction-id": transactionID = v
                case "--auth":
                    guard PaymentRules.isDigits(v, 6...6) || v.hasPrefix("OP-") else {
                        error("pppbridge refund: --auth takes the 6-digit authorisation code or the OP- operation id")
                        return PaymentStatus.usage
                    }
                    auth = v
                default: signature = v
                }
            case "--decline-signature" where !refund: declineSignature = true
            default:
                error("pppbridge \(name): unknown option \(a) (see `pppbridge \(name) --help`)")
                return PaymentStatus.usage
            }
        }
        guard let amount, let currencyCode else {
            error("pppbridge \(name): --amount and --currency are required")
            return PaymentStatus.usage
        }
        guard let currency = Currency.named(currencyCode) else {
            error("pppbridge \(name): unknown currency \(currencyCode) (ISO 4217 letters: \(Currency.known.map(\.code).joined(separator: ", ")))")
            return PaymentStatus.usage
        }
        guard let minor = currency.parse(amount) else {
            error("pppbridge \(name): \"\(amount)\" is not an amount in \(currency.code) (at most \(currency.exponent) decimals, no sign, no exponent)")
            return PaymentStatus.usage
        }
        guard options.gateway != nil else {
            error("pppbridge \(name): --gateway ADDR:PORT is required")
            return PaymentStatus.usage
        }
        if refund && auth == nil {
            error("pppbridge refund: --auth CODE is required (the original's authorisation code or operation id)")
            return PaymentStatus.usage
        }
        let id = transactionID ?? defaultTransactionID()
        guard PaymentRules.isTransactionID(id) else {
            error("pppbridge \(name): --transaction-id must be 4 digits then up to 8 letters or digits")
            return PaymentStatus.usage
        }
        var image: [UInt8]?
        if let signature {
            guard let bytes = readWholeFile(signature) else {
                error("pppbridge pay: cannot read \(signature)")
                return PaymentStatus.usage
            }
            guard SignatureFormat.detect(bytes) != nil, (1...(256 << 10)).contains(bytes.count) else {
                error("pppbridge pay: \(signature) is not a BMP, JPEG, TIFF or GIF image of at most 256 KiB")
                return PaymentStatus.usage
            }
            image = bytes
        }
        nonisolated(unsafe) let out = output, err = error
        let opts = options, isRefund = refund, original = auth, decline = declineSignature, signatureImage = image
        return runAsync {
            let session: ReaderCommandSession
            do { session = try ReaderCommandSession(options: opts, say: out) } catch {
                err("pppbridge \(name): \(error)")
                return PaymentStatus.unreachable
            }
            do throws(PaymentError) { try await session.open() } catch {
                err("pppbridge \(name): \(error)")
                await session.close()
                return PaymentStatus.unreachable
            }
            let status: Int32
            do throws(PaymentError) {
                var outcome: PaymentOutcome
                if isRefund {
                    out("refund: \(currency.format(minor)) \(currency.code) of \(original!), transaction \(id)")
                    outcome = try await session.reader.startRefund(amountMinor: minor, currency: currency, transactionID: id, originalOperationID: original!)
                } else {
                    out("payment: \(currency.format(minor)) \(currency.code), transaction \(id): present a card to the reader")
                    outcome = try await session.reader.startPayment(amountMinor: minor, currency: currency, transactionID: id)
                    if session.reader.state == .signature {
                        if let signatureImage, !decline, let format = SignatureFormat.detect(signatureImage) {
                            out("signature: sending \(signatureImage.count) B (format \(format))")
                            do throws(PaymentError) {
                                try await session.reader.submitSignature(image: signatureImage, format: format)
                            } catch {
                                // An approval nobody signed for does not stay open: it is reversed.
                                err("pppbridge pay: the signature was not taken (\(error)); reversing the approval")
                                outcome = try await session.reader.declineSignature()
                            }
                        } else {
                            out("signature: declined; reversing the approval")
                            outcome = try await session.reader.declineSignature()
                        }
                    }
                }
                out("result: \(describe(outcome))")
                status = outcome.result == .approved ? PaymentStatus.approved : PaymentStatus.declined
            } catch {
                err("pppbridge \(name): \(error)")
                status = PaymentStatus.declined
            }
            await session.close()
            return status
        }
    }
}

/// Signature image formats 1–4 by their magic bytes (SPEC §4.7).
enum SignatureFormat {
    static func detect(_ b: [UInt8]) -> Int? {
        if b.starts(with: [0x42, 0x4D]) { return 1 }
        if b.starts(with: [0xFF, 0xD8, 0xFF]) { return 2 }
        if b.starts(with: [0x49, 0x49, 0x2A, 0x00]) || b.starts(with: [0x4D, 0x4D, 0x00, 0x2A]) { return 3 }
        if b.starts(with: Array("GIF87a".utf8)) || b.starts(with: Array("GIF89a".utf8)) { return 4 }
        return nil
    }
}

func readWholeFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
    guard let f = fopen(path, "rb") else { return nil }
    defer { fclose(f) }
    var out = [UInt8]()
    var chunk = [UInt8](repeating: 0, count: 65536)
    while out.count <= limit {
        let n = fread(&chunk, 1, chunk.count, f)
        if n <= 0 { break }
        out += chunk[0..<n]
    }
    return out
}

/// `pppbridge reader discover|connect|reboot|update`.
struct ReaderCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge reader discover [--pattern GLOB] [--proximity] [--timeout S] [--allow UUID]
           pppbridge reader connect|reboot|update --gateway ADDR:PORT [options]

      discover   list the readers on the lines matching the pattern as they are found (scan:
                 until the timeout, default 10 s, 0 = until interrupted; proximity: the one
                 reader held close, reported with its serial and then with its battery)
      connect    connect, log in, print what the reader says about itself, disconnect
      reboot     connect and reboot the reader (it disconnects; no reconnect is attempted)
      update     connect and install the reader's available software update, with progress
    \(ReaderOptions.usage)
    """

    func run(_ arguments: [String]) -> Int32 {
        guard let sub = arguments.first, ["discover", "connect", "reboot", "update", "-h", "--help"].contains(sub) else {
            error("pppbridge reader: expected discover, connect, reboot or update (see `pppbridge reader --help`)")
            return PaymentStatus.usage
        }
        if sub == "-h" || sub == "--help" {
            output(ReaderCommand.usage)
            return 0
        }
        var options = ReaderOptions()
        var it = ArgumentCursor(Array(arguments.dropFirst()))
        while let a = it.next() {
            switch options.parse(a, &it) {
            case .mine: continue
            case .bad(let why):
                error("pppbridge reader \(sub): \(why)")
                return PaymentStatus.usage
            case .notMine:
                if a == "-h" || a == "--help" {
                    output(ReaderCommand.usage)
                    return 0
                }
                error("pppbridge reader \(sub): unknown option \(a)")
                return PaymentStatus.usage
            }
        }
        if sub != "discover" && options.gateway == nil {
            error("pppbridge reader \(sub): --gateway ADDR:PORT is required (the reader logs in through it)")
            return PaymentStatus.usage
        }
        nonisolated(unsafe) let out = output, err = error
        let opts = options
        return runAsync {
            let session: ReaderCommandSession
            do { session = try ReaderCommandSession(options: opts, say: out) } catch {
                err("pppbridge reader: \(error)")
                return PaymentStatus.unreachable
            }
            if sub == "discover" {
                let method: DiscoveryConfiguration.Method = opts.proximity ? .proximity : .scan(timeout: opts.discoveryTimeout)
                do throws(PaymentError) {
                    if opts.proximity {
                        _ = try await session.discover()
                        session.reader.cancel()
                    } else {
                        try await session.reader.discoverReaders(DiscoveryConfiguration(method: method, allowedPeripheralUUIDs: opts.allowed),
                                                                 pattern: opts.pattern)
                    }
                } catch {
                    // A scan ends at its timeout: that is how a listing finishes.
                    if error.code != .discoveryTimedOut || opts.proximity {
                        err("pppbridge reader discover: \(error)")
                        return PaymentStatus.unreachable
                    }
                    out("discovery: done (\(opts.discoveryTimeout) s)")
                }
                return 0
            }
            do throws(PaymentError) { try await session.open() } catch {
                err("pppbridge reader \(sub): \(error)")
                await session.close()
                return PaymentStatus.unreachable
            }
            var status: Int32 = 0
            do throws(PaymentError) {
                switch sub {
                case "reboot":
                    try await session.reader.rebootReader()
                    out("reader: rebooting")
                    try? await Task.sleep(for: .milliseconds(300))
                case "update":
                    guard session.reader.info?.availableUpdate != nil else {
                        out("reader: no update available")
                        break
                    }
                    try await session.reader.installAvailableUpdate()
                    out("reader: now running \(session.reader.info?.softwareVersion ?? "?")")
                default:
                    let d = try await session.reader.diagnose(host: true)
                    out("diagnosis: \(d.text)")
                }
            } catch {
                err("pppbridge reader \(sub): \(error)")
                status = PaymentStatus.declined
            }
            await session.close()
            return status
        }
    }
}
