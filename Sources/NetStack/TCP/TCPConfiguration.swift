/// Keep-alive per RFC 1122 §4.2.3.6: after `idle` without a segment from the peer, send a
/// probe every `interval`; after `count` unanswered probes the connection is dropped.
public struct TCPKeepAlive: Sendable, Equatable {
    public var idle: Duration
    public var interval: Duration
    public var count: Int

    public init(idle: Duration, interval: Duration, count: Int) {
        self.idle = idle
        self.interval = interval
        self.count = count
    }
}

/// Per-connection TCP settings. The defaults suit a serial PPP link and a fast local peer alike.
public struct TCPConfiguration: Sendable, Equatable {
    /// The largest segment we accept (advertised in the MSS option): the link MTU minus 40.
    public var maximumSegmentSize = 1460
    /// Receive buffer: bounds both in-order data the application has not read and
    /// out-of-order data held for reassembly; the advertised window never exceeds it.
    public var receiveBufferSize = 256 * 1024
    /// Bytes the application may queue beyond what the peer has acknowledged.
    public var sendBufferSize = 256 * 1024
    /// Offer window scaling (RFC 7323 §2).
    public var windowScaling = true
    /// Offer SACK (RFC 2018) and use the peer's SACK blocks in loss recovery (RFC 6675).
    public var selectiveAcknowledgments = true
    /// Offer timestamps (RFC 7323 §3); used for RTT samples.
    public var timestamps = true
    /// Nagle's algorithm (RFC 9293 §3.7.4).
    public var nagle = true
    /// Delayed ACK (RFC 9293 §3.8.6.3, RFC 5681 §4.2): nil acknowledges every segment at once.
    public var delayedAck: Duration? = .milliseconds(40)
    public var keepAlive: TCPKeepAlive?
    /// Abort when data stays unacknowledged this long (RFC 9293 §3.8.3, RFC 5482).
    public var userTimeout: Duration?
    /// TIME-WAIT (2 MSL). Short by default: our peers are one link away.
    public var timeWait: Duration = .seconds(2)
    /// How long a connection the application has fully closed waits in FIN-WAIT-2 for the
    /// peer's FIN (Linux's tcp_fin_timeout). RFC 9293 §3.6 lets it wait for ever, but then a
    /// peer that acknowledges our FIN and never sends its own holds the connection, and its
    /// place under the listener's and the stack's limits, for good. nil: wait for ever.
    public var finWait2Timeout: Duration? = .seconds(60)
    public var initialRetransmissionTimeout: Duration = .seconds(1)
    public var minimumRetransmissionTimeout: Duration = .milliseconds(200)
    public var maximumRetransmissionTimeout: Duration = .seconds(60)
    /// Retransmissions of one segment before the connection is dropped (RFC 1122 R2).
    public var maximumRetransmissions = 12
    /// Retransmissions of a SYN before an active open gives up.
    public var maximumSynRetransmissions = 6
    /// Out-of-order segments held at once (their bytes are bounded by the window too).
    public var maximumOutOfOrderSegments = 256
    /// Challenge ACKs per second (RFC 5961 §7).
    public var challengeAckLimit = 10

    public init() {}

    /// The window scale we offer: the least shift that lets the receive buffer be advertised.
    var receiveWindowShift: UInt8 {
        var shift: UInt8 = 0
        while shift < 14 && (receiveBufferSize >> Int(shift)) > 65535 { shift += 1 }
        return shift
    }
}
