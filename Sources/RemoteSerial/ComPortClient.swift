/// The client side of a serial port on a telnet connection (RFC 2217, on RFC 854/855): what a
/// device server sends is split into the serial line's bytes, which go on to PPP, and telnet's
/// commands, which are answered here; what we write is escaped for telnet. Sans-IO: bytes in,
/// bytes and events out.
///
/// Hostile input: a server may send anything. Commands split across reads are kept in the
/// parser's state; a subnegotiation longer than `subnegotiationLimit` is dropped up to its
/// end and counted; each option has a budget of answers (`TelnetOptionTable`), so no stream
/// of requests makes us answer without end; unknown commands and options are counted and
/// refused or ignored, never trapped on.
public struct ComPortClient: Sendable {
    public enum Event: Sendable, Equatable {
        /// The server took COM-PORT-OPTION; the settings were sent.
        case comPortAccepted
        /// The server refused COM-PORT-OPTION: the line runs at whatever the server has set.
        case comPortRefused
        /// The carrier (NOTIFY-MODEMSTATE's Receive Line Signal Detect) was seen and then lost:
        /// the terminal's end hung up, as a tty's carrier drop says.
        case carrierLost
        /// FLOWCONTROL-SUSPEND or -RESUME from the server (RFC 2217 §3): stop or go on sending.
        case outputSuspended(Bool)
    }

    public struct Counters: Sendable, Equatable {
        /// Option requests we refused (options we do not do).
        public var optionsRefused = 0
        /// Option requests ignored once the option's answers were spent.
        public var optionsIgnored = 0
        /// Subnegotiations longer than `subnegotiationLimit`, dropped.
        public var subnegotiationsTooLong = 0
        /// Subnegotiations we do not act on (other options, unknown or short COM-PORT ones).
        public var subnegotiationsIgnored = 0
        /// Commands with no meaning on a serial line (NOP, Go-Ahead, Are-You-There, ...) and
        /// unknown ones.
        public var commandsIgnored = 0
        public init() {}
    }

    /// The longest subnegotiation we keep: RFC 2217's longest is a 4-byte baud rate; a
    /// SIGNATURE may carry text, of which we keep what fits.
    public static let subnegotiationLimit = 64

    public let settings: ComPortSettings
    public private(set) var report = ComPortReport()
    public private(set) var counters = Counters()
    /// FLOWCONTROL-SUSPEND is in force: the owner should not send data until RESUME.
    public private(set) var outputSuspended = false

    private var options = TelnetOptionTable(ours: [.binary, .suppressGoAhead, .comPort], his: [.binary, .suppressGoAhead])
    private var parser = ParserState.data
    private var subnegotiation: [UInt8] = []
    private var subnegotiationOverflowed = false
    private var comPortSent = false
    private var comPortRefused = false
    private var carrierSeen = false
    private var output: [UInt8] = []
    private var events: [Event] = []

    private enum ParserState: Sendable {
        case data
        /// After a CR while the server sends in NVT mode (RFC 854: CR is followed by NUL or LF;
        /// the NUL is not data).
        case carriageReturn
        case iac
        case option(TelnetCommand)
        case subnegotiation
        case subnegotiationIAC
    }

    public init(settings: ComPortSettings) {
        self.settings = settings
    }

    /// The opening negotiation: binary both ways, no Go-Ahead, and COM-PORT-OPTION on our side
    /// (RFC 2217 §2: the client sends WILL). The settings follow once the server says DO.
    public mutating func start() {
        for option in [TelnetOption.binary, .suppressGoAhead, .comPort] {
            if let c = options.requestOurs(option) { command(c, option.rawValue) }
        }
        for option in [TelnetOption.binary, .suppressGoAhead] {
            if let c = options.requestHis(option) { command(c, option.rawValue) }
        }
    }

    /// Whether our data goes unrewritten (BINARY on our side, RFC 856).
    public var sendsBinary: Bool { options.isOn(ours: .binary) }
    /// Whether the server's data comes unrewritten (BINARY on its side).
    public var receivesBinary: Bool { options.isOn(his: .binary) }

    /// Telnet's answers and requests to write, ahead of more data (appended to `into`).
    public mutating func takeOutput(into out: inout [UInt8]) {
        guard !output.isEmpty else { return }
        out += output
        output.removeAll(keepingCapacity: true)
    }

    public var hasOutput: Bool { !output.isEmpty }

    public mutating func takeEvents() -> [Event] {
        defer { events.removeAll() }
        return events
    }

    /// Escapes `data` for the connection and appends it to `out`: IAC doubled (RFC 854), and,
    /// unless we send binary, CR followed by NUL (RFC 854's NVT end-of-line rule for a bare CR).
    public func encode(_ data: UnsafeRawBufferPointer, into out: inout [UInt8]) {
        let binary = sendsBinary
        var start = 0
        var i = 0
        let count = data.count
        out.reserveCapacity(out.count + count + 8)
        while i < count {
            let b = data[i]
            if b == TelnetCommand.iac.rawValue || (!binary && b == 13) {
                out.append(contentsOf: UnsafeRawBufferPointer(rebasing: data[start...i]))
                out.append(b == 13 ? 0 : TelnetCommand.iac.rawValue)
                start = i + 1
            }
            i += 1
        }
        if start < count { out.append(contentsOf: UnsafeRawBufferPointer(rebasing: data[start..<count])) }
    }

    public func encode(_ data: [UInt8], into out: inout [UInt8]) {
        data.withUnsafeBytes { encode($0, into: &out) }
    }

    /// Takes what the server sent in `buffer[0..<count]`: the serial line's bytes are moved to
    /// the front of `buffer`, and their count returned; telnet's commands are acted on.
    public mutating func receive(_ buffer: UnsafeMutableRawBufferPointer, count: Int) -> Int {
        let n = min(max(0, count), buffer.count)
        var w = 0
        var r = 0
        while r < n {
            let b = buffer[r]
            r += 1
            switch parser {
            case .data:
                if b == TelnetCommand.iac.rawValue {
                    parser = .iac
                } else {
                    buffer[w] = b
                    w += 1
                    if b == 13 && !receivesBinary { parser = .carriageReturn }
                }
            case .carriageReturn:
                if b == TelnetCommand.iac.rawValue {
                    parser = .iac
                } else {
                    parser = .data
                    if b != 0 {
                        buffer[w] = b
                        w += 1
                        if b == 13 && !receivesBinary { parser = .carriageReturn }
                    }
                }
            case .iac:
                switch TelnetCommand(rawValue: b) {
                case .iac:
                    buffer[w] = b
                    w += 1
                    parser = .data
                case .will, .wont, .do, .dont:
                    parser = .option(TelnetCommand(rawValue: b)!)
                case .sb:
                    subnegotiation.removeAll(keepingCapacity: true)
                    subnegotiationOverflowed = false
                    parser = .subnegotiation
                default:
                    // NOP, Go-Ahead, Data Mark, ..., and a stray SE: nothing for a serial line.
                    counters.commandsIgnored += 1
                    parser = .data
                }
            case let .option(c):
                parser = .data
                optionReceived(c, b)
            case .subnegotiation:
                if b == TelnetCommand.iac.rawValue {
                    parser = .subnegotiationIAC
                } else {
                    keepSubnegotiation(b)
                }
            case .subnegotiationIAC:
                switch TelnetCommand(rawValue: b) {
                case .iac:
                    keepSubnegotiation(b)
                    parser = .subnegotiation
                case .se:
                    parser = .data
                    subnegotiationEnded()
                default:
                    // RFC 855 allows only IAC IAC and IAC SE inside; anything else ends the
                    // subnegotiation unread, and the byte is taken as a command after IAC.
                    counters.subnegotiationsIgnored += 1
                    parser = .iac
                    r -= 1
                }
            }
        }
        return w
    }

    public mutating func receive(_ buffer: inout [UInt8], count: Int) -> Int {
        buffer.withUnsafeMutableBytes { receive($0, count: count) }
    }

    // MARK: Options

    private mutating func optionReceived(_ c: TelnetCommand, _ option: UInt8) {
        let (answer, _) = options.received(c, option: option)
        if let answer {
            command(answer, option)
            if (answer == .dont && c == .will) || (answer == .wont && c == .do) { counters.optionsRefused += 1 }
        }
        counters.optionsIgnored = options.ignored
        // A suspend is the option's: with the option off it cannot be resumed, so it ends.
        if outputSuspended && !options.isOn(ours: .comPort) {
            outputSuspended = false
            events.append(.outputSuspended(false))
        }
        guard !comPortSent else { return }
        if options.isOn(ours: .comPort) {
            comPortSent = true
            sendSettings()
            events.append(.comPortAccepted)
        } else if option == TelnetOption.comPort.rawValue && c == .dont && !comPortRefused {
            comPortRefused = true
            events.append(.comPortRefused)
        }
    }

    private mutating func command(_ c: TelnetCommand, _ option: UInt8) {
        output += [TelnetCommand.iac.rawValue, c.rawValue, option]
    }

    // MARK: COM-PORT-OPTION

    /// RFC 2217 §3: the settings, then DTR and RTS raised (a terminal may wait for DTR, as on
    /// a local port pppd opens), then which modem signals to hear of: the carrier and its
    /// changes.
    private mutating func sendSettings() {
        var baud = [UInt8](repeating: 0, count: 4)
        for i in 0..<4 { baud[i] = UInt8(truncatingIfNeeded: settings.baudRate >> (24 - 8 * i)) }
        comPort(.setBaudRate, baud)
        comPort(.setDataSize, [settings.dataBits])
        comPort(.setParity, [settings.parity.rawValue])
        comPort(.setStopSize, [settings.stopBits.rawValue])
        comPort(.setControl, [settings.flowControl.rawValue])
        // SET-CONTROL 8: DTR on; 11: RTS on.
        comPort(.setControl, [8])
        if settings.flowControl != .hardware { comPort(.setControl, [11]) }
        comPort(.setModemStateMask, [ModemState.carrierDetect | ModemState.carrierDetectChanged])
    }

    /// The line is let go: DTR dropped (SET-CONTROL 9), as pppd hangs up a local port when it
    /// closes, so a terminal or modem that watches DTR sees the end rather than a server that
    /// keeps the port as it was. Once, and only with COM-PORT-OPTION on.
    public mutating func hangUp() {
        guard options.isOn(ours: .comPort), !hungUp else { return }
        hungUp = true
        comPort(.setControl, [9])
    }

    private var hungUp = false

    private mutating func comPort(_ c: ComPortCommand, _ value: [UInt8]) {
        output += [TelnetCommand.iac.rawValue, TelnetCommand.sb.rawValue, TelnetOption.comPort.rawValue, c.rawValue]
        for b in value {
            output.append(b)
            if b == TelnetCommand.iac.rawValue { output.append(b) }
        }
        output += [TelnetCommand.iac.rawValue, TelnetCommand.se.rawValue]
    }

    private mutating func keepSubnegotiation(_ b: UInt8) {
        if subnegotiation.count < Self.subnegotiationLimit {
            subnegotiation.append(b)
        } else {
            subnegotiationOverflowed = true
        }
    }

    private mutating func subnegotiationEnded() {
        guard !subnegotiationOverflowed else {
            counters.subnegotiationsTooLong += 1
            return
        }
        let s = subnegotiation
        guard s.count >= 2, s[0] == TelnetOption.comPort.rawValue, options.isOn(ours: .comPort) else {
            counters.subnegotiationsIgnored += 1
            return
        }
        let value = s[2...]
        switch s[1] {
        case ComPortCommand.setBaudRate.serverCode where value.count == 4:
            report.baudRate = value.reduce(0) { $0 << 8 | UInt32($1) }
        case ComPortCommand.setDataSize.serverCode where value.count == 1:
            report.dataBits = value.first
        case ComPortCommand.setParity.serverCode where value.count == 1:
            report.parity = value.first
        case ComPortCommand.setStopSize.serverCode where value.count == 1:
            report.stopBits = value.first
        case ComPortCommand.setControl.serverCode where value.count == 1:
            // SET-CONTROL's answers share one code: outbound flow control is 1–3 (DTR's and
            // RTS's states, 7–12, are answers to our raising them).
            if let v = value.first, (1...3).contains(v) { report.control = v }
        case ComPortCommand.notifyModemState.serverCode where value.count == 1:
            let state = value.first ?? 0
            report.modemState = state
            if state & ModemState.carrierDetect != 0 {
                carrierSeen = true
            } else if carrierSeen {
                // Only a carrier we saw can be lost: a server on a port with no modem lines
                // (ser2net's `local`, a pty) reports it off from the start.
                carrierSeen = false
                events.append(.carrierLost)
            }
        case ComPortCommand.flowControlSuspend.serverCode where value.isEmpty:
            if !outputSuspended { events.append(.outputSuspended(true)) }
            outputSuspended = true
        case ComPortCommand.flowControlResume.serverCode where value.isEmpty:
            if outputSuspended { events.append(.outputSuspended(false)) }
            outputSuspended = false
        case ComPortCommand.notifyLineState.serverCode, ComPortCommand.setLineStateMask.serverCode,
             ComPortCommand.setModemStateMask.serverCode, ComPortCommand.purgeData.serverCode,
             ComPortCommand.signature.serverCode:
            break
        default:
            counters.subnegotiationsIgnored += 1
        }
    }
}
