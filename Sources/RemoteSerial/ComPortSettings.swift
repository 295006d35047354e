/// A serial port's settings as RFC 2217 §3 sets them (SET-BAUDRATE, SET-DATASIZE,
/// SET-PARITY, SET-STOPSIZE, SET-CONTROL).
public struct ComPortSettings: Sendable, Equatable {
    public enum Parity: UInt8, Sendable { case none = 1, odd = 2, even = 3, mark = 4, space = 5 }
    public enum StopBits: UInt8, Sendable { case one = 1, two = 2, oneAndAHalf = 3 }
    /// SET-CONTROL's outbound flow control values.
    public enum FlowControl: UInt8, Sendable { case none = 1, xonXoff = 2, hardware = 3 }

    public var baudRate: UInt32 = 115_200
    public var dataBits: UInt8 = 8
    public var parity = Parity.none
    public var stopBits = StopBits.one
    public var flowControl = FlowControl.none
    public init() {}

    /// As pppd and stty write it: `115200 8N1`, with `RTS/CTS` or `XON/XOFF` after.
    public var description: String {
        let p: String
        switch parity {
        case .none: p = "N"
        case .odd: p = "O"
        case .even: p = "E"
        case .mark: p = "M"
        case .space: p = "S"
        }
        let s: String
        switch stopBits {
        case .one: s = "1"
        case .two: s = "2"
        case .oneAndAHalf: s = "1.5"
        }
        let f: String
        switch flowControl {
        case .none: f = ""
        case .xonXoff: f = " XON/XOFF"
        case .hardware: f = " RTS/CTS"
        }
        return "\(baudRate) \(dataBits)\(p)\(s)\(f)"
    }
}

/// What the server answered to each setting (RFC 2217 §3: the value it now uses, which may
/// differ from what was asked). nil: not answered (yet).
public struct ComPortReport: Sendable, Equatable {
    public var baudRate: UInt32?
    public var dataBits: UInt8?
    public var parity: UInt8?
    public var stopBits: UInt8?
    public var control: UInt8?
    /// The last NOTIFY-MODEMSTATE byte.
    public var modemState: UInt8?
    public init() {}
}
