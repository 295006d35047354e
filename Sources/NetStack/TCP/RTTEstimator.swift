import Wire

/// Round-trip samples and the retransmission timeout they set (RFC 6298): one sample per
/// round trip, from the echoed timestamp when there is one (valid across retransmissions),
/// else from the one timed segment, which Karn's rule discards once anything was resent.
/// Sampling every ACK instead would let RTTVAR collapse while a serial line's queue keeps
/// growing, and the timer fire spuriously.
struct RTTEstimator: Sendable {
    private(set) var timer: RetransmissionTimer
    /// The segment being timed: its sequence number, when it left, and whether anything was
    /// resent since.
    private(set) var timing: (sequence: SequenceNumber, sent: Instant, retransmitted: Bool)?

    init(timer: RetransmissionTimer) { self.timer = timer }

    var timeout: Duration { timer.timeout }

    /// Times the segment at `sequence` unless one is timed already.
    mutating func time(_ sequence: SequenceNumber, now: Instant) {
        if timing == nil { timing = (sequence, now, false) }
    }

    /// Something was resent: the timed segment's sample would be ambiguous (Karn).
    mutating func retransmitted() {
        timing?.retransmitted = true
    }

    /// Stops timing without a sample.
    mutating func forget() {
        timing = nil
    }

    /// The handshake completed; `clean` when the SYN was never resent.
    mutating func handshakeDone(clean: Bool, now: Instant) {
        if clean, let t = timing { timer.sample(now - t.sent) }
        timing = nil
    }

    /// An ACK up to `ack`; `echoed` is the round trip its timestamp echo gives, if any.
    mutating func acknowledged(_ ack: SequenceNumber, echoed: Duration?, now: Instant) {
        guard let t = timing, ack > t.sequence else { return }
        if let echoed {
            if echoed >= .zero { timer.sample(echoed) }
        } else if !t.retransmitted {
            timer.sample(now - t.sent)
        }
        timing = nil
    }

    /// The retransmission timer expired: back off (RFC 6298 §5.5).
    mutating func expired() { timer.expired() }
}
