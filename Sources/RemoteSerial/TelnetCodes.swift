/// Telnet's command bytes (RFC 854, "Telnet Command Structure"): each follows an IAC.
public enum TelnetCommand: UInt8, Sendable {
    /// End of subnegotiation parameters (RFC 855).
    case se = 240
    case nop = 241
    case dataMark = 242
    case `break` = 243
    case interruptProcess = 244
    case abortOutput = 245
    case areYouThere = 246
    case eraseCharacter = 247
    case eraseLine = 248
    case goAhead = 249
    /// Start of subnegotiation (RFC 855).
    case sb = 250
    case will = 251
    case wont = 252
    case `do` = 253
    case dont = 254
    /// Interpret As Command; doubled, a data byte 255.
    case iac = 255
}

/// The telnet options a serial line over the network negotiates.
public enum TelnetOption: UInt8, Sendable {
    /// RFC 856: eight-bit data with no NVT end-of-line rewriting.
    case binary = 0
    case echo = 1
    /// RFC 858: no Go-Ahead after each transmission.
    case suppressGoAhead = 3
    /// RFC 2217: the serial port's settings and signals.
    case comPort = 44
}

/// RFC 2217 §3's commands, as a client sends them; the server answers with the same code
/// plus 100.
public enum ComPortCommand: UInt8, Sendable {
    case signature = 0
    case setBaudRate = 1
    case setDataSize = 2
    case setParity = 3
    case setStopSize = 4
    case setControl = 5
    case notifyLineState = 6
    case notifyModemState = 7
    case flowControlSuspend = 8
    case flowControlResume = 9
    case setLineStateMask = 10
    case setModemStateMask = 11
    case purgeData = 12

    /// The code the server uses for this command (RFC 2217 §3: client code + 100).
    public var serverCode: UInt8 { rawValue + 100 }
}

/// RFC 2217 §3, NOTIFY-MODEMSTATE: the modem state byte's bits.
public enum ModemState {
    /// Receive Line Signal Detect (carrier detect).
    public static let carrierDetect: UInt8 = 0x80
    /// Delta Receive Line Signal Detect.
    public static let carrierDetectChanged: UInt8 = 0x08
}
