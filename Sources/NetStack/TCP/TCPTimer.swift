import Wire

/// A connection's timers, in the order `poll` serves them when several are due.
public enum TCPTimer: Sendable, CaseIterable, CustomStringConvertible {
    /// 2 MSL in TIME-WAIT (RFC 9293 §3.6).
    case timeWait
    /// FIN-WAIT-2 after a full close (Linux's tcp_fin_timeout).
    case finWait2
    /// Data unacknowledged too long (RFC 5482).
    case userTimeout
    /// RFC 6298's retransmission timer.
    case retransmit
    /// Zero-window probes (RFC 9293 §3.8.6.1).
    case persist
    /// Keep-alive probes (RFC 1122 §4.2.3.6).
    case keepAlive
    /// A delayed ACK (RFC 9293 §3.8.6.3).
    case delayedAck

    public var description: String {
        switch self {
        case .timeWait: return "TIME-WAIT"
        case .finWait2: return "FIN-WAIT-2"
        case .userTimeout: return "user timeout"
        case .retransmit: return "retransmission"
        case .persist: return "persist"
        case .keepAlive: return "keep-alive"
        case .delayedAck: return "delayed ACK"
        }
    }
}

/// The deadlines a connection arms and disarms; the others (keep-alive, user timeout,
/// FIN-WAIT-2) follow from its state and are computed by the connection.
struct TCPArmedTimers: Sendable {
    private var retransmit: Instant?
    private var persist: Instant?
    private var delayedAck: Instant?
    private var timeWait: Instant?

    subscript(_ timer: TCPTimer) -> Instant? {
        get {
            switch timer {
            case .retransmit: return retransmit
            case .persist: return persist
            case .delayedAck: return delayedAck
            case .timeWait: return timeWait
            case .finWait2, .userTimeout, .keepAlive: return nil
            }
        }
        set {
            switch timer {
            case .retransmit: retransmit = newValue
            case .persist: persist = newValue
            case .delayedAck: delayedAck = newValue
            case .timeWait: timeWait = newValue
            case .finWait2, .userTimeout, .keepAlive:
                // Computed from the connection's state: nothing to arm.
                break
            }
        }
    }

    mutating func disarmAll() {
        retransmit = nil
        persist = nil
        delayedAck = nil
        timeWait = nil
    }
}
