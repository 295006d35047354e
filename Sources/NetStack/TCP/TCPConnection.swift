/// RFC 9293 §3.3.2.
public enum TCPState: String, Sendable, Equatable {
    case synSent = "SYN-SENT", synReceived = "SYN-RECEIVED", established = "ESTABLISHED"
    case finWait1 = "FIN-WAIT-1", finWait2 = "FIN-WAIT-2", closeWait = "CLOSE-WAIT"
    case closing = "CLOSING", lastAck = "LAST-ACK", timeWait = "TIME-WAIT", closed = "CLOSED"

    /// States after the three-way handshake in which our data may still flow out.
    var canSendData: Bool { self == .established || self == .closeWait || self == .finWait1 || self == .closing || self == .lastAck }
    /// States in which the peer's data is still accepted.
    var canReceiveData: Bool { self == .established || self == .finWait1 || self == .finWait2 }
}

/// Why a connection ended.
public enum TCPCloseReason: String, Sendable, Equatable {
    /// Both FINs exchanged and acknowledged.
    case closed = "closed"
    /// The peer reset the connection.
    case reset = "reset by peer"
    /// The peer answered our SYN with a reset.
    case refused = "connection refused"
    case retransmissionTimeout = "retransmission timeout"
    case userTimeout = "user timeout"
    case keepAliveTimeout = "keep-alive timeout"
    /// We closed; the peer acknowledged our FIN but never sent its own.
    case finWait2Timeout = "FIN-WAIT-2 timeout"
    /// The application aborted, or closed with unread data (RFC 1122 §4.2.2.13).
    case aborted = "aborted"
}

/// What a connection tells its owner. Nothing calls back into the owner: events are taken.
public enum TCPEvent: Sendable, Equatable {
    case established
    /// New in-order data can be read.
    case readable
    /// Send buffer space came free after a write was cut short.
    case writable
    /// The peer sent FIN: once the buffered data is read, reads return end of stream.
    case peerFinished
    /// The connection is gone; no more events follow.
    case closed(TCPCloseReason)
}

/// A segment to send: header (checksum computed when emitted) and payload.
public struct TCPSegment: Sendable {
    public var header: TCPHeader
    public var payload: [UInt8]
}

/// A segment as the connection queues it: its payload (`payloadLength` bytes from the header's
/// sequence number) stays in the send buffer until the stack builds the packet around it, so
/// each byte is copied once on its way out, from the buffer into the packet.
struct QueuedSegment: Sendable {
    var header: TCPHeader
    var payloadLength: Int
}

public struct TCPConnectionCounters: Sendable, Equatable {
    public var segmentsSent = 0
    public var segmentsReceived = 0
    public var bytesSent = 0
    public var bytesReceived = 0
    public var retransmittedSegments = 0
    public var fastRetransmits = 0
    public var timeouts = 0
    public var outOfOrderSegments = 0
    public var outOfOrderDropped = 0
    public var duplicateSegments = 0
    public var challengeAcks = 0
    public var zeroWindowProbes = 0
    public var keepAliveProbes = 0
    public init() {}
}

/// One TCP connection (RFC 9293), sans-IO: segments and `now` in; segments, events and the
/// next deadline out. Its parts: `TCPCongestionControl` (NewReno, RFC 5681 and 6582, and
/// RFC 6675 SACK recovery), `TCPReassembler` (segments beyond a hole, SACK blocks),
/// `RTTEstimator` (RFC 6298 samples and timeout) and `TCPTimer` (its timers, one enum).
public struct TCPConnection: Sendable {
    public let local: TCPEndpoint
    public let remote: TCPEndpoint
    public internal(set) var configuration: TCPConfiguration
    public internal(set) var state: TCPState
    public internal(set) var counters = TCPConnectionCounters()

    // Send sequence space (RFC 9293 §3.3.1).
    public let initialSendSequence: SequenceNumber
    public internal(set) var sendUnacknowledged: SequenceNumber
    public internal(set) var sendNext: SequenceNumber
    /// The highest sequence number sent so far (SND.NXT before a go-back-N rewind).
    var sendMax: SequenceNumber
    public internal(set) var sendWindow = 0
    var maxSendWindow = 0
    var sendWL1 = SequenceNumber(0)
    var sendWL2 = SequenceNumber(0)
    /// Queued data, starting at the first unacknowledged data byte.
    var sendBuffer = ByteQueue()
    /// The sequence number of our FIN once the application shut down writing.
    var finSequence: SequenceNumber?
    public internal(set) var peerMaximumSegmentSize = 536
    public internal(set) var sendShift: UInt8 = 0
    public internal(set) var receiveShift: UInt8 = 0
    public internal(set) var windowScalingNegotiated = false
    public internal(set) var sackPermitted = false
    public internal(set) var timestampsEnabled = false

    var congestion: TCPCongestionControl
    public var congestionWindow: Int { congestion.congestionWindow }
    public var slowStartThreshold: Int { congestion.slowStartThreshold }

    // Timers.
    var rtt: RTTEstimator
    public var retransmissionTimer: RetransmissionTimer { rtt.timer }
    var timers = TCPArmedTimers()
    var retransmissions = 0
    var persistBackoff = 0
    var unansweredProbes = 0
    var ackNow = false
    /// An ACK due now waits for the stack's collection (see `IPStackConfiguration.acknowledgeAtCollection`);
    /// the instant it became due.
    var ackHeldSince: Instant?
    /// This ACK goes at once even while ACKs are held: a duplicate ACK for a hole, or the one
    /// that fills it (each duplicate counts for the peer's fast retransmit, RFC 5681 §3.2).
    var ackUnheld = false
    /// The largest segment text the peer has sent (Linux's rcv_mss): what "full-sized" means
    /// for the delayed-ACK rule.
    var largestSegmentReceived = 0
    var lastReceived: Instant
    var keepAliveProbesSent = 0
    var unacknowledgedSince: Instant?
    /// When FIN-WAIT-2 began: the peer acknowledged our FIN.
    var finWait2Since: Instant?
    var challengeWindowStart: Instant
    var challengeAcksInWindow = 0

    // Receive sequence space.
    public internal(set) var initialReceiveSequence = SequenceNumber(0)
    public internal(set) var receiveNext = SequenceNumber(0)
    /// The right edge of the window we advertised; never moved left (RFC 9293 §3.8.6.2.2).
    var advertisedEdge = SequenceNumber(0)
    var receiveBuffer = ByteQueue()
    var outOfOrder: TCPReassembler
    var timestampRecent: UInt32 = 0
    var lastAckSent = SequenceNumber(0)
    let timestampOffset: UInt32

    var outgoing: [QueuedSegment] = []
    /// Queued segments that carry data (their bytes are read from `sendBuffer` when collected).
    var queuedPayloadSegments = 0
    /// Acknowledged bytes still at the head of `sendBuffer`, because a queued segment may
    /// carry them (an ACK taken in the same batch as the segments, before they were collected);
    /// dropped when the queue is emptied. `heldFrom` is the sequence number of the buffer's
    /// first byte while any are held.
    var acknowledgedHeld = 0
    var heldFrom: SequenceNumber?
    /// The connection ended with segments queued: the send buffer goes once they are built.
    var discardSendBufferWhenCollected = false
    var events: [TCPEvent] = []
    var writeBlocked = false
    /// The application called `close`: it reads no more.
    var applicationClosed = false

    // MARK: Opening

    /// Active open: sends SYN.
    public init(local: TCPEndpoint, remote: TCPEndpoint, initialSequence: SequenceNumber, configuration: TCPConfiguration, now: Instant) {
        self.init(local: local, remote: remote, iss: initialSequence, configuration: configuration, state: .synSent, now: now)
        sendSyn(now: now)
    }

    /// Passive open from a SYN that reached a listening port: sends SYN-ACK.
    public init(local: TCPEndpoint, remote: TCPEndpoint, initialSequence: SequenceNumber, configuration: TCPConfiguration, syn: TCPHeader, now: Instant) {
        self.init(local: local, remote: remote, iss: initialSequence, configuration: configuration, state: .synReceived, now: now)
        counters.segmentsReceived += 1
        acceptSyn(syn)
        sendWindow = Int(syn.window)
        maxSendWindow = sendWindow
        sendWL1 = syn.sequenceNumber
        sendWL2 = initialSendSequence
        sendSyn(now: now)
    }

    /// What a free slot of the stack's connection table holds (`ConnectionTable`): a closed
    /// connection between no endpoints, holding no buffers.
    static let vacant = TCPConnection(local: TCPEndpoint(.any, 0), remote: TCPEndpoint(.any, 0), iss: SequenceNumber(0),
                                      configuration: TCPConfiguration(), state: .closed, now: .zero)

    private init(local: TCPEndpoint, remote: TCPEndpoint, iss: SequenceNumber, configuration: TCPConfiguration, state: TCPState, now: Instant) {
        self.local = local
        self.remote = remote
        self.configuration = configuration
        self.state = state
        initialSendSequence = iss
        sendUnacknowledged = iss
        sendNext = iss
        sendMax = iss
        congestion = TCPCongestionControl(initialSequence: iss)
        rtt = RTTEstimator(timer: RetransmissionTimer(initial: configuration.initialRetransmissionTimeout,
                                                      minimum: configuration.minimumRetransmissionTimeout,
                                                      maximum: configuration.maximumRetransmissionTimeout))
        outOfOrder = TCPReassembler(capacity: configuration.maximumOutOfOrderSegments)
        lastReceived = now
        challengeWindowStart = now
        timestampOffset = iss.rawValue &* 2654435761
    }

    mutating func acceptSyn(_ syn: TCPHeader) {
        initialReceiveSequence = syn.sequenceNumber
        receiveNext = initialReceiveSequence + 1
        advertisedEdge = receiveNext
        lastAckSent = receiveNext
        var peerShift: UInt8?
        var peerSack = false
        var peerTimestamp: UInt32?
        for option in syn.options {
            switch option {
            case let .maximumSegmentSize(m): peerMaximumSegmentSize = max(Int(m), 64)
            case let .windowScale(s): peerShift = min(s, 14)
            case .sackPermitted: peerSack = true
            case let .timestamps(value, _): peerTimestamp = value
            default: break
            }
        }
        // RFC 7323 §2.2: scaling only when both sides sent the option.
        if configuration.windowScaling, let s = peerShift {
            windowScalingNegotiated = true
            sendShift = s
            receiveShift = configuration.receiveWindowShift
        }
        sackPermitted = configuration.selectiveAcknowledgments && peerSack
        congestion.sack = sackPermitted
        if configuration.timestamps, let value = peerTimestamp {
            timestampsEnabled = true
            timestampRecent = value
        }
        congestion.start(mss: effectiveSendMSS)
    }

    /// The largest payload we put in a segment: the peer's MSS, our link's, minus option bytes.
    public var effectiveSendMSS: Int {
        min(peerMaximumSegmentSize, configuration.maximumSegmentSize) - (timestampsEnabled ? 12 : 0)
    }

    // MARK: Application interface

    /// Bytes the application can read now.
    public var readableBytes: Int { receiveBuffer.count }
    /// True when the peer's FIN has been received and every byte before it read.
    public var atEndOfStream: Bool { receiveBuffer.isEmpty && finReceived }
    /// Bytes `write` accepts now.
    /// Inlined: asked of connections in place (`ConnectionTable.inspect`) on every turn, a
    /// getter that is called rather than inlined is handed a copy of the whole connection.
    @inline(__always) public var writableBytes: Int {
        guard finSequence == nil, state == .established || state == .closeWait || state == .synSent || state == .synReceived else { return 0 }
        // Acknowledged bytes held for queued segments count too: the buffer never grows past
        // its size because of them.
        return max(0, configuration.sendBufferSize - sendBuffer.count)
    }
    /// Bytes written and not yet acknowledged.
    public var unacknowledgedBytes: Int { queuedBytes }
    /// The send buffer less what it holds only for queued segments (`acknowledgedHeld`).
    @inline(__always) var queuedBytes: Int { sendBuffer.count - acknowledgedHeld }
    /// Bytes held out of order, awaiting a hole to fill.
    public var outOfOrderBytes: Int { outOfOrder.bytes }
    public var outOfOrderSegmentCount: Int { outOfOrder.count }
    var finReceived = false

    /// Queues as much of `bytes` as the send buffer takes; returns the count taken. A short
    /// count arms a `.writable` event for when space frees up.
    /// Inlinable so that a caller in another module gets it specialized: unspecialized,
    /// `count` and `prefix` went through the generic witnesses, some 1,500 instructions a write.
    @inlinable
    public mutating func write<C: Collection<UInt8>>(_ bytes: C, now: Instant) -> Int {
        if let n = bytes.withContiguousStorageIfAvailable({ write(UnsafeRawBufferPointer($0), now: now) }) { return n }
        return Array(bytes).withUnsafeBytes { write($0, now: now) }
    }

    /// `write` with the bytes put straight into the send buffer by `fill` (a read from a
    /// descriptor): it is offered at most `writableBytes`, as one contiguous piece, and
    /// returns how many it wrote there. Returns that count. It never arms `.writable`: a caller
    /// that finds no room asks for it (`notifyWhenWritable`). `fill` runs inside the stack's
    /// access to the connection and must not call back into the stack.
    public mutating func write(now: Instant, filling fill: (UnsafeMutableRawBufferPointer) -> Int) -> Int {
        let n = sendBuffer.append(upTo: writableBytes, fill)
        if n > 0 { output(now: now) }
        return n
    }

    /// `read` with the bytes handed straight from the receive buffer to `body` (a write to a
    /// descriptor), which returns how many it took; at most `maximum`, in one contiguous piece.
    public mutating func read(maximum: Int = .max, now: Instant, taking body: (UnsafeRawBufferPointer) -> Int) -> Int {
        let n = receiveBuffer.removeFirst(upTo: maximum, body)
        if n > 0 { didRead(now: now) }
        return n
    }

    public mutating func write(_ bytes: UnsafeRawBufferPointer, now: Instant) -> Int {
        let n = min(writableBytes, bytes.count)
        if n > 0 { sendBuffer.append(UnsafeRawBufferPointer(rebasing: bytes.prefix(n))) }
        if n < bytes.count { writeBlocked = true }
        output(now: now)
        return n
    }

    /// Asks for a `.writable` event once a quarter of the send buffer is free, as a short
    /// `write` does (for a writer that only ever writes what `writableBytes` allows).
    public mutating func notifyWhenWritable() {
        if writableBytes == 0 { writeBlocked = true }
    }

    /// Removes up to `maximum` bytes of in-order data. Opening the window enough sends a
    /// window update (receiver silly-window avoidance, RFC 9293 §3.8.6.2.2).
    public mutating func read(maximum: Int = .max, now: Instant) -> [UInt8] {
        let bytes = receiveBuffer.take(maximum)
        if !bytes.isEmpty { didRead(now: now) }
        return bytes
    }

    /// `read` onto the end of the caller's buffer; returns how many bytes came.
    @discardableResult
    public mutating func read(maximum: Int = .max, appendingTo out: inout [UInt8], now: Instant) -> Int {
        let n = receiveBuffer.take(maximum, appendingTo: &out)
        if n > 0 { didRead(now: now) }
        return n
    }

    /// The application took bytes: a window grown by enough is said at once (RFC 9293
    /// §3.8.6.2.2, receiver's silly window avoidance).
    private mutating func didRead(now: Instant) {
        guard state.canReceiveData else { return }
        let current = advertisedEdge - receiveNext
        let possible = configuration.receiveBufferSize - receiveBuffer.count
        if possible - current >= min(configuration.receiveBufferSize / 2, 2 * effectiveSendMSS) { ackNow = true }
        output(now: now)
    }

    /// Half-close: FIN after the queued data; reading goes on.
    public mutating func shutdownWrite(now: Instant) {
        guard finSequence == nil else { return }
        switch state {
        case .synSent:
            finish(.closed)
            return
        case .synReceived, .established, .closeWait:
            let dataStart = state == .synReceived ? initialSendSequence + 1 : sendUnacknowledged
            finSequence = dataStart + queuedBytes
            if state == .established { state = .finWait1 }
            if state == .closeWait { state = .lastAck }
        default:
            return
        }
        output(now: now)
    }

    /// Full close: no more writes or reads. Unread or later-arriving data resets the
    /// connection (RFC 1122 §4.2.2.13), so the peer learns it was not consumed.
    public mutating func close(now: Instant) {
        applicationClosed = true
        if !receiveBuffer.isEmpty && state != .closed {
            abort(now: now)
            return
        }
        shutdownWrite(now: now)
    }

    /// Sends RST (when synchronized) and drops the connection at once.
    public mutating func abort(now: Instant) {
        // Nothing to reset before the peer knows our sequence numbers, or after both FINs.
        if state != .closed && state != .timeWait && state != .synSent {
            emit(flags: [.rst, .ack], sequence: sendNext, now: now)
        }
        finish(.aborted)
    }

    public mutating func setNagle(_ on: Bool, now: Instant) {
        configuration.nagle = on
        output(now: now)
    }

    public mutating func setDelayedAck(_ delay: Duration?) { configuration.delayedAck = delay }
    public mutating func setKeepAlive(_ keepAlive: TCPKeepAlive?) { configuration.keepAlive = keepAlive }
    public mutating func setUserTimeout(_ timeout: Duration?) { configuration.userTimeout = timeout }

    /// The queued segments, each with its payload copied out of the send buffer: for a caller
    /// that drives a connection on its own (the stack builds its packets from the queue in
    /// place, `pendingSegments`).
    public mutating func takeSegments() -> [TCPSegment] {
        guard !outgoing.isEmpty else { return [] }
        let segments = outgoing.compactMap { s -> TCPSegment? in
            var payload: [UInt8] = []
            guard copyPayload(of: s, appendingTo: &payload) else { return nil }
            return TCPSegment(header: s.header, payload: payload)
        }
        outgoing = []
        releaseHeld()
        return segments
    }

    /// Appends the payload of `s` (a segment of `pendingSegments`) to `out`, read from the send
    /// buffer; false, with nothing appended, when the buffer no longer holds it (the connection
    /// was reset with the segment queued).
    @discardableResult
    func copyPayload(of s: QueuedSegment, appendingTo out: inout [UInt8]) -> Bool {
        guard s.payloadLength > 0 else { return true }
        let offset = s.header.sequenceNumber - (heldFrom ?? sendUnacknowledged)
        guard offset >= 0, offset <= sendBuffer.count - s.payloadLength else { return false }
        sendBuffer.copy(offset: offset, length: s.payloadLength, appendingTo: &out)
        return true
    }

    /// Drops the acknowledged bytes kept for queued segments, once those are gone.
    mutating func releaseHeld() {
        queuedPayloadSegments = 0
        if discardSendBufferWhenCollected {
            discardSendBufferWhenCollected = false
            sendBuffer.removeAll()
            acknowledgedHeld = 0
            heldFrom = nil
            return
        }
        guard acknowledgedHeld > 0 || heldFrom != nil else { return }
        sendBuffer.removeFirst(acknowledgedHeld)
        acknowledgedHeld = 0
        heldFrom = nil
    }

    public mutating func takeEvents() -> [TCPEvent] {
        guard !events.isEmpty else { return [] }
        defer { events = [] }
        return events
    }

    /// For a caller that reads the segments and events in place (the stack, every batch):
    /// once it has let go of them, `clearPending` empties both and keeps their storage, so a
    /// steady stream allocates no arrays for them.
    var pendingSegments: [QueuedSegment] { outgoing }
    var pendingEvents: [TCPEvent] { events }
    var hasPending: Bool { !outgoing.isEmpty || !events.isEmpty }

    mutating func clearPending() {
        outgoing.removeAll(keepingCapacity: true)
        releaseHeld()
        events.removeAll(keepingCapacity: true)
    }
}
