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
    public private(set) var configuration: TCPConfiguration
    public private(set) var state: TCPState
    public private(set) var counters = TCPConnectionCounters()

    // Send sequence space (RFC 9293 §3.3.1).
    public let initialSendSequence: SequenceNumber
    public private(set) var sendUnacknowledged: SequenceNumber
    public private(set) var sendNext: SequenceNumber
    /// The highest sequence number sent so far (SND.NXT before a go-back-N rewind).
    private var sendMax: SequenceNumber
    public private(set) var sendWindow = 0
    private var maxSendWindow = 0
    private var sendWL1 = SequenceNumber(0)
    private var sendWL2 = SequenceNumber(0)
    /// Queued data, starting at the first unacknowledged data byte.
    private var sendBuffer = ByteQueue()
    /// The sequence number of our FIN once the application shut down writing.
    private var finSequence: SequenceNumber?
    public private(set) var peerMaximumSegmentSize = 536
    public private(set) var sendShift: UInt8 = 0
    public private(set) var receiveShift: UInt8 = 0
    public private(set) var windowScalingNegotiated = false
    public private(set) var sackPermitted = false
    public private(set) var timestampsEnabled = false

    private var congestion: TCPCongestionControl
    public var congestionWindow: Int { congestion.congestionWindow }
    public var slowStartThreshold: Int { congestion.slowStartThreshold }

    // Timers.
    private var rtt: RTTEstimator
    public var retransmissionTimer: RetransmissionTimer { rtt.timer }
    private var timers = TCPArmedTimers()
    private var retransmissions = 0
    private var persistBackoff = 0
    private var unansweredProbes = 0
    private var ackNow = false
    private var unacknowledgedSegments = 0
    private var lastReceived: Instant
    private var keepAliveProbesSent = 0
    private var unacknowledgedSince: Instant?
    /// When FIN-WAIT-2 began: the peer acknowledged our FIN.
    private var finWait2Since: Instant?
    private var challengeWindowStart: Instant
    private var challengeAcksInWindow = 0

    // Receive sequence space.
    public private(set) var initialReceiveSequence = SequenceNumber(0)
    public private(set) var receiveNext = SequenceNumber(0)
    /// The right edge of the window we advertised; never moved left (RFC 9293 §3.8.6.2.2).
    private var advertisedEdge = SequenceNumber(0)
    private var receiveBuffer = ByteQueue()
    private var outOfOrder: TCPReassembler
    private var timestampRecent: UInt32 = 0
    private var lastAckSent = SequenceNumber(0)
    private let timestampOffset: UInt32

    private var outgoing: [TCPSegment] = []
    private var events: [TCPEvent] = []
    private var writeBlocked = false
    /// The application called `close`: it reads no more.
    private var applicationClosed = false

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
        sendWL1 = SequenceNumber(syn.sequenceNumber)
        sendWL2 = initialSendSequence
        sendSyn(now: now)
    }

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

    private mutating func acceptSyn(_ syn: TCPHeader) {
        initialReceiveSequence = SequenceNumber(syn.sequenceNumber)
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
    public var writableBytes: Int {
        guard finSequence == nil, state == .established || state == .closeWait || state == .synSent || state == .synReceived else { return 0 }
        return max(0, configuration.sendBufferSize - sendBuffer.count)
    }
    /// Bytes written and not yet acknowledged.
    public var unacknowledgedBytes: Int { sendBuffer.count }
    /// Bytes held out of order, awaiting a hole to fill.
    public var outOfOrderBytes: Int { outOfOrder.bytes }
    public var outOfOrderSegmentCount: Int { outOfOrder.count }
    private var finReceived = false

    /// Queues as much of `bytes` as the send buffer takes; returns the count taken. A short
    /// count arms a `.writable` event for when space frees up.
    public mutating func write<C: Collection<UInt8>>(_ bytes: C, now: Instant) -> Int {
        let n = min(writableBytes, bytes.count)
        if n > 0 { sendBuffer.append(contentsOf: bytes.prefix(n)) }
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
        if !bytes.isEmpty && state.canReceiveData {
            let current = advertisedEdge - receiveNext
            let possible = configuration.receiveBufferSize - receiveBuffer.count
            if possible - current >= min(configuration.receiveBufferSize / 2, 2 * effectiveSendMSS) { ackNow = true }
            output(now: now)
        }
        return bytes
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
            finSequence = dataStart + sendBuffer.count
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
            emit(flags: [.rst, .ack], sequence: sendNext, payload: [], now: now)
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

    public mutating func takeSegments() -> [TCPSegment] {
        defer { outgoing.removeAll(keepingCapacity: true) }
        return outgoing
    }

    public mutating func takeEvents() -> [TCPEvent] {
        defer { events.removeAll(keepingCapacity: true) }
        return events
    }

    // MARK: Timers

    private var keepAliveDeadline: Instant? {
        guard let k = configuration.keepAlive, state == .established || state == .closeWait else { return nil }
        return lastReceived + k.idle + k.interval * keepAliveProbesSent
    }

    private var userTimeoutDeadline: Instant? {
        guard let t = configuration.userTimeout, let since = unacknowledgedSince else { return nil }
        return since + t
    }

    /// Only once the application has closed for good: a half-closed connection still reads.
    private var finWait2Deadline: Instant? {
        guard state == .finWait2, applicationClosed, let since = finWait2Since, let t = configuration.finWait2Timeout else { return nil }
        return since + t
    }

    /// When `timer` is due, if it is running.
    public func deadline(_ timer: TCPTimer) -> Instant? {
        switch timer {
        case .keepAlive: return keepAliveDeadline
        case .userTimeout: return userTimeoutDeadline
        case .finWait2: return finWait2Deadline
        case .retransmit, .persist, .delayedAck, .timeWait: return timers[timer]
        }
    }

    public var pollAt: Instant? {
        if state == .closed { return nil }
        if ackNow { return .zero }
        return TCPTimer.allCases.compactMap(deadline).min()
    }

    public mutating func poll(now: Instant) {
        for timer in TCPTimer.allCases {
            guard state != .closed else { return }
            guard let d = deadline(timer), now >= d else { continue }
            if fire(timer, now: now) { return }
        }
        output(now: now)
    }

    /// Serves a due timer; true when the connection ended.
    private mutating func fire(_ timer: TCPTimer, now: Instant) -> Bool {
        switch timer {
        case .timeWait:
            finish(.closed)
            return true
        case .finWait2:
            // The peer took our FIN and never sent its own: forget the connection (a reset
            // tells the peer, should it still be there).
            abort(now: now)
            replaceCloseReason(.finWait2Timeout)
            return true
        case .userTimeout:
            abort(now: now)
            replaceCloseReason(.userTimeout)
            return true
        case .retransmit:
            timers[.retransmit] = nil
            retransmissionTimeout(now: now)
        case .persist:
            timers[.persist] = nil
            sendZeroWindowProbe(now: now)
        case .keepAlive:
            guard let k = configuration.keepAlive else { return false }
            if keepAliveProbesSent >= k.count {
                abort(now: now)
                replaceCloseReason(.keepAliveTimeout)
                return true
            }
            keepAliveProbesSent += 1
            counters.keepAliveProbes += 1
            // RFC 1122 §4.2.3.6: SEG.SEQ = SND.NXT-1, no data, so the peer must answer with an ACK.
            emit(flags: [.ack], sequence: sendUnacknowledged - 1, payload: [], now: now)
        case .delayedAck:
            ackNow = true
        }
        return state == .closed
    }

    private mutating func replaceCloseReason(_ reason: TCPCloseReason) {
        if let i = events.lastIndex(of: .closed(.aborted)) { events[i] = .closed(reason) }
    }

    private mutating func retransmissionTimeout(now: Instant) {
        guard sendMax != sendUnacknowledged else { return }
        retransmissions += 1
        counters.timeouts += 1
        if state == .synSent || state == .synReceived {
            if retransmissions > configuration.maximumSynRetransmissions {
                if state == .synReceived { emit(flags: [.rst], sequence: initialSendSequence + 1, payload: [], now: now) }
                finish(.retransmissionTimeout)
                return
            }
            rtt.expired()
            counters.retransmittedSegments += 1
            sendSyn(now: now)
            return
        }
        if retransmissions > configuration.maximumRetransmissions {
            abort(now: now)
            replaceCloseReason(.retransmissionTimeout)
            return
        }
        rtt.expired()
        congestion.timeout(unacknowledged: sendUnacknowledged, sendMax: sendMax, mss: effectiveSendMSS)
        sendNext = sendUnacknowledged
        output(now: now)
        if timers[.retransmit] == nil && sendMax != sendUnacknowledged {
            timers[.retransmit] = now + rtt.timeout
        }
    }

    private mutating func sendZeroWindowProbe(now: Instant) {
        guard sendWindow == 0, state.canSendData, dataEnd != sendUnacknowledged else {
            persistBackoff = 0
            return
        }
        // RFC 1122 §4.2.2.17: probing goes on as long as the peer answers.
        if unansweredProbes > configuration.maximumRetransmissions {
            abort(now: now)
            replaceCloseReason(.retransmissionTimeout)
            return
        }
        // One byte beyond the closed window (RFC 9293 §3.8.6.1); it is data, resent until taken.
        counters.zeroWindowProbes += 1
        sendData(from: sendUnacknowledged, length: 1, now: now, armTimer: false)
        persistBackoff += 1
        unansweredProbes += 1
        timers[.persist] = now + persistInterval
    }

    private var persistInterval: Duration {
        var t = rtt.timeout
        for _ in 1..<max(persistBackoff, 1) {
            t = t * 2
            if t >= configuration.maximumRetransmissionTimeout { return configuration.maximumRetransmissionTimeout }
        }
        return t
    }

    // MARK: Input

    public mutating func receive(_ h: TCPHeader, payload: [UInt8], now: Instant) {
        counters.segmentsReceived += 1
        switch state {
        case .closed: return
        case .synSent:
            receiveInSynSent(h, payload: payload, now: now)
        default:
            receiveSynchronized(h, payload: payload, now: now)
        }
        output(now: now)
    }

    /// RFC 9293 §3.10.7.3.
    private mutating func receiveInSynSent(_ h: TCPHeader, payload: [UInt8], now: Instant) {
        let ack = SequenceNumber(h.acknowledgmentNumber)
        let hasAck = h.flags.contains(.ack)
        if hasAck && (ack <= initialSendSequence || ack > sendMax) {
            if !h.flags.contains(.rst) { emit(flags: [.rst], sequence: ack, payload: [], now: now, withAck: false) }
            return
        }
        if h.flags.contains(.rst) {
            if hasAck { finish(.refused) }
            return
        }
        guard h.flags.contains(.syn) else { return }
        acceptSyn(h)
        lastReceived = now
        if hasAck {
            sendUnacknowledged = ack
            sendNext = SequenceNumber.max(sendNext, ack)
            rtt.handshakeDone(clean: retransmissions == 0, now: now)
            timers[.retransmit] = nil
            retransmissions = 0
            unacknowledgedSince = nil
            // RFC 7323 §2.2: the window of a SYN is never scaled.
            sendWindow = Int(h.window)
            maxSendWindow = sendWindow
            sendWL1 = SequenceNumber(h.sequenceNumber)
            sendWL2 = ack
            state = .established
            events.append(.established)
            if finSequence != nil { state = .finWait1 }
            ackNow = true
        } else {
            // Simultaneous open (RFC 9293 §3.5, figure 8).
            state = .synReceived
            sendWindow = Int(h.window)
            sendWL1 = SequenceNumber(h.sequenceNumber)
            sendSyn(now: now)
        }
    }

    private mutating func receiveSynchronized(_ h: TCPHeader, payload: [UInt8], now: Instant) {
        let seq = SequenceNumber(h.sequenceNumber)
        let syn = h.flags.contains(.syn)
        let rst = h.flags.contains(.rst)
        var fin = h.flags.contains(.fin)
        let segmentLength = payload.count + (syn ? 1 : 0) + (fin ? 1 : 0)
        let window = max(0, advertisedEdge - receiveNext)

        // RFC 9293 §3.10.7.4, first: sequence number acceptability.
        let acceptable: Bool
        switch (segmentLength, window) {
        case (0, 0): acceptable = seq == receiveNext
        case (0, _): acceptable = seq >= receiveNext && seq < receiveNext + window
        case (_, 0): acceptable = false
        default:
            acceptable = (seq >= receiveNext && seq < receiveNext + window)
                || (seq + segmentLength - 1 >= receiveNext && seq + segmentLength - 1 < receiveNext + window)
        }
        if !acceptable {
            if !rst {
                if seq < receiveNext { counters.duplicateSegments += 1 }
                ackNow = true
                // A zero-window probe still tells us the peer's ACK and window.
                if h.flags.contains(.ack) && segmentLength > 0 && window == 0 {
                    _ = processAck(h, payloadEmpty: false, now: now)
                }
            }
            return
        }
        lastReceived = now
        keepAliveProbesSent = 0

        // Second: RST, with the RFC 5961 §3.2 exact-match rule.
        if rst {
            if seq == receiveNext {
                finish(state == .synReceived ? .refused : .reset)
            } else {
                challengeAck(now: now)
            }
            return
        }
        // Fourth: SYN in a synchronized state gets a challenge ACK (RFC 5961 §4.2).
        if syn {
            if state == .synReceived && seq == initialReceiveSequence {
                sendSyn(now: now)
            } else {
                challengeAck(now: now)
            }
            return
        }
        // Fifth: ACK.
        guard h.flags.contains(.ack) else { return }
        let ack = SequenceNumber(h.acknowledgmentNumber)
        if state == .synReceived {
            guard ack > sendUnacknowledged && ack <= sendMax else {
                emit(flags: [.rst], sequence: ack, payload: [], now: now, withAck: false)
                return
            }
            state = finSequence == nil ? .established : .finWait1
            rtt.handshakeDone(clean: retransmissions == 0, now: now)
            sendUnacknowledged = initialSendSequence + 1
            sendWindow = Int(h.window) << Int(sendShift)
            maxSendWindow = sendWindow
            sendWL1 = seq
            sendWL2 = ack
            timers[.retransmit] = nil
            retransmissions = 0
            unacknowledgedSince = nil
            events.append(.established)
        }
        if timestampsEnabled { updateTimestampRecent(h, sequence: seq, length: segmentLength) }
        guard processAck(h, payloadEmpty: payload.isEmpty && !fin, now: now) else { return }
        if state == .closed { return }

        // Seventh: segment text.
        var start = seq
        var data = payload
        if start < receiveNext {
            let skip = receiveNext - start
            if skip >= data.count {
                data = []
                start = receiveNext
                if skip > payload.count { fin = false }
            } else {
                data.removeFirst(skip)
                start = receiveNext
            }
        }
        if start + data.count > advertisedEdge {
            data.removeLast((start + data.count) - advertisedEdge)
            fin = false
        }
        if !data.isEmpty || fin {
            if state.canReceiveData {
                if applicationClosed && !data.isEmpty {
                    abort(now: now)
                    return
                }
                receiveSegmentText(start: start, data: data, fin: fin, now: now)
            } else if fin && start + data.count == receiveNext - 1 {
                // A retransmitted FIN in CLOSE-WAIT, CLOSING, LAST-ACK or TIME-WAIT.
                ackNow = true
                if state == .timeWait, timers[.timeWait] != nil { timers[.timeWait] = now + configuration.timeWait }
            }
        }
    }

    private mutating func updateTimestampRecent(_ h: TCPHeader, sequence: SequenceNumber, length: Int) {
        // RFC 7323 §4.3: remember TSval of the segment covering Last.ACK.sent.
        for option in h.options {
            if case let .timestamps(value, _) = option,
               sequence <= lastAckSent && lastAckSent <= sequence + max(length, 1) {
                timestampRecent = value
            }
        }
    }

    private mutating func challengeAck(now: Instant) {
        // RFC 5961 §7: a bounded number per second.
        if now - challengeWindowStart >= .seconds(1) {
            challengeWindowStart = now
            challengeAcksInWindow = 0
        }
        guard challengeAcksInWindow < configuration.challengeAckLimit else { return }
        challengeAcksInWindow += 1
        counters.challengeAcks += 1
        ackNow = true
    }

    /// Returns false when the segment must be dropped.
    private mutating func processAck(_ h: TCPHeader, payloadEmpty: Bool, now: Instant) -> Bool {
        let ack = SequenceNumber(h.acknowledgmentNumber)
        let seq = SequenceNumber(h.sequenceNumber)
        if ack > sendMax {
            ackNow = true
            return false
        }
        // RFC 5961 §5.2: an ACK older than the largest window the peer ever offered.
        if ack < sendUnacknowledged - maxSendWindow {
            challengeAck(now: now)
            return false
        }
        let window = Int(h.window) << Int(sendShift)
        // RFC 5681 §2; answers to zero-window probes are not loss signals.
        let isDuplicate = payloadEmpty && ack == sendUnacknowledged && window == sendWindow && window != 0 && sendMax != sendUnacknowledged
        if sackPermitted {
            for option in h.options {
                if case let .sack(blocks) = option { congestion.sacked(blocks, unacknowledged: sendUnacknowledged, sendMax: sendMax) }
            }
        }
        // RFC 9293 §3.10.7.4: window update only from a newer segment.
        if sendWL1 < seq || (sendWL1 == seq && sendWL2 <= ack) {
            sendWindow = window
            maxSendWindow = max(maxSendWindow, window)
            sendWL1 = seq
            sendWL2 = ack
        }
        if ack > sendUnacknowledged {
            newAck(ack, header: h, now: now)
        } else if isDuplicate {
            duplicateAck(now: now)
        }
        unansweredProbes = 0
        if sendWindow == 0 && dataEnd != sendUnacknowledged {
            // Zero window: nothing more goes out but probes; what was beyond the window is resent later.
            sendNext = sendUnacknowledged
            timers[.retransmit] = nil
            armPersist(now: now)
        } else if timers[.persist] != nil {
            timers[.persist] = nil
            persistBackoff = 0
            if sendMax != sendUnacknowledged && timers[.retransmit] == nil { timers[.retransmit] = now + rtt.timeout }
        }
        return true
    }

    private mutating func armPersist(now: Instant) {
        guard timers[.persist] == nil else { return }
        persistBackoff = max(persistBackoff, 1)
        timers[.persist] = now + persistInterval
    }

    /// Sequence number after the last queued data byte.
    private var dataEnd: SequenceNumber {
        (state == .synSent || state == .synReceived ? initialSendSequence + 1 : sendUnacknowledged) + sendBuffer.count
    }

    private var finAcked: Bool {
        guard let f = finSequence else { return false }
        return sendUnacknowledged > f
    }

    private mutating func newAck(_ ack: SequenceNumber, header h: TCPHeader, now: Instant) {
        let acked = ack - sendUnacknowledged
        var dataAcked = acked
        if let f = finSequence, ack > f { dataAcked -= 1 }
        sendBuffer.removeFirst(dataAcked)
        sendUnacknowledged = ack
        if sendNext < ack { sendNext = ack }
        retransmissions = 0

        // RTT, once per round trip (RFC 6298 §3; `RTTEstimator`).
        var echoed: Duration?
        if timestampsEnabled {
            for option in h.options {
                if case let .timestamps(_, echo) = option, echo != 0 {
                    echoed = .milliseconds(Int64(Int32(bitPattern: timestampValue(now) &- echo)))
                }
            }
        }
        rtt.acknowledged(ack, echoed: echoed, now: now)

        let mss = effectiveSendMSS
        if case let .retransmit(from) = congestion.newAck(ack, acked: acked, sendMax: sendMax, mss: mss, largestPeerWindow: maxSendWindow) {
            retransmit(from: from, now: now)
        }

        if sendMax != sendUnacknowledged {
            timers[.retransmit] = now + rtt.timeout
            unacknowledgedSince = now
        } else {
            timers[.retransmit] = nil
            unacknowledgedSince = nil
        }
        if writeBlocked && (configuration.sendBufferSize - sendBuffer.count) * 4 >= configuration.sendBufferSize {
            writeBlocked = false
            events.append(.writable)
        }
        if finAcked {
            switch state {
            case .finWait1:
                state = .finWait2
                finWait2Since = now
            case .closing: enterTimeWait(now: now)
            case .lastAck: finish(.closed)
            default: break
            }
        }
    }

    private mutating func duplicateAck(now: Instant) {
        if congestion.duplicateAck(unacknowledged: sendUnacknowledged, sendMax: sendMax, mss: effectiveSendMSS) {
            counters.fastRetransmits += 1
            retransmit(from: sendUnacknowledged, now: now)
        }
    }

    /// Resends one segment starting at `start`, stopping short of the next SACKed block.
    private mutating func retransmit(from start: SequenceNumber, now: Instant) {
        var length = min(effectiveSendMSS, sendMax - start)
        if let block = congestion.sackedBlock(above: start) { length = min(length, block.start - start) }
        let dataLength = min(length, dataEnd - start)
        if dataLength > 0 {
            sendData(from: start, length: dataLength, now: now, armTimer: true)
        } else if let f = finSequence, start == f {
            emit(flags: [.fin, .ack], sequence: f, payload: [], now: now)
            counters.retransmittedSegments += 1
        }
        congestion.retransmitted(from: start, length: dataLength)
    }

    // MARK: Receiving text

    private mutating func receiveSegmentText(start: SequenceNumber, data: [UInt8], fin: Bool, now: Instant) {
        if start == receiveNext {
            let fillsHole = !outOfOrder.isEmpty
            let wasEmpty = receiveBuffer.isEmpty
            appendInOrder(data)
            var finInOrder = fin
            // Pull whatever the new bytes made contiguous.
            while let first = outOfOrder.popFilled(upTo: receiveNext) {
                let skip = receiveNext - first.start
                if skip < first.data.count { appendInOrder(Array(first.data[skip...])) }
                if first.fin && first.end >= receiveNext { finInOrder = true }
            }
            if receiveBuffer.count > 0 && (wasEmpty || !data.isEmpty) { events.append(.readable) }
            if finInOrder {
                receiveFin(now: now)
            } else if fillsHole || configuration.delayedAck == nil {
                ackNow = true
            } else if !data.isEmpty {
                unacknowledgedSegments += 1
                // RFC 5681 §4.2: at least every second full-sized segment.
                if unacknowledgedSegments >= 2 {
                    ackNow = true
                } else if timers[.delayedAck] == nil, let delay = configuration.delayedAck {
                    timers[.delayedAck] = now + delay
                }
            }
        } else {
            counters.outOfOrderSegments += 1
            if !outOfOrder.insert(TCPReassembler.Segment(start: start, data: data, fin: fin)) { counters.outOfOrderDropped += 1 }
            ackNow = true
        }
    }

    private mutating func appendInOrder(_ data: [UInt8]) {
        guard !data.isEmpty else { return }
        receiveBuffer.append(contentsOf: data)
        receiveNext += data.count
        counters.bytesReceived += data.count
    }

    private mutating func receiveFin(now: Instant) {
        receiveNext += 1
        finReceived = true
        ackNow = true
        outOfOrder.removeAll()
        events.append(.peerFinished)
        switch state {
        case .established: state = .closeWait
        case .finWait1:
            if finAcked { enterTimeWait(now: now) } else { state = .closing }
        case .finWait2: enterTimeWait(now: now)
        default: break
        }
    }

    private mutating func enterTimeWait(now: Instant) {
        state = .timeWait
        timers[.retransmit] = nil
        timers[.persist] = nil
        timers[.timeWait] = now + configuration.timeWait
    }

    private mutating func finish(_ reason: TCPCloseReason) {
        guard state != .closed else { return }
        state = .closed
        timers.disarmAll()
        unacknowledgedSince = nil
        ackNow = false
        outOfOrder.removeAll()
        if reason != .closed { sendBuffer.removeAll() }
        events.append(.closed(reason))
    }

    // MARK: Output

    private func timestampValue(_ now: Instant) -> UInt32 {
        UInt32(truncatingIfNeeded: now.nanoseconds / 1_000_000) &+ timestampOffset
    }

    private mutating func sendSyn(now: Instant) {
        var flags: TCPHeader.Flags = [.syn]
        if state == .synReceived { flags.insert(.ack) }
        var h = TCPHeader(sourcePort: local.port, destinationPort: remote.port, sequenceNumber: initialSendSequence.rawValue,
                          flags: flags, window: UInt16(min(configuration.receiveBufferSize, 65535)))
        var options: [TCPOption] = [.maximumSegmentSize(UInt16(clamping: configuration.maximumSegmentSize))]
        let passive = state == .synReceived
        // On SYN-ACK, only what the peer offered (RFC 7323 §1.3, RFC 2018 §2).
        if configuration.windowScaling && (!passive || windowScalingNegotiated) {
            options += [.noOperation, .windowScale(configuration.receiveWindowShift)]
        }
        if configuration.selectiveAcknowledgments && (!passive || sackPermitted) { options += [.noOperation, .noOperation, .sackPermitted] }
        if configuration.timestamps && (!passive || timestampsEnabled) {
            options += [.noOperation, .noOperation, .timestamps(value: timestampValue(now), echoReply: passive ? timestampRecent : 0)]
        }
        h.options = options
        if flags.contains(.ack) { h.acknowledgmentNumber = receiveNext.rawValue }
        if passive {
            advertisedEdge = receiveNext + Int(h.window)
            lastAckSent = receiveNext
        }
        outgoing.append(TCPSegment(header: h, payload: []))
        counters.segmentsSent += 1
        sendNext = initialSendSequence + 1
        sendMax = SequenceNumber.max(sendMax, sendNext)
        if retransmissions == 0 { rtt.time(initialSendSequence, now: now) } else { rtt.forget() }
        timers[.retransmit] = now + rtt.timeout
        ackNow = false
        timers[.delayedAck] = nil
    }

    /// Everything due: data the windows allow, FIN, and a pending ACK.
    private mutating func output(now: Instant) {
        if state.canSendData {
            if congestion.inSACKRecovery {
                sackRecoveryOutput(now: now)
            } else {
                normalOutput(now: now)
            }
        }
        if ackNow {
            if state == .synReceived {
                sendSyn(now: now)
            } else if state != .synSent && state != .closed {
                emit(flags: [.ack], sequence: sendNext, payload: [], now: now)
            }
        }
    }

    private mutating func normalOutput(now: Instant) {
        let mss = effectiveSendMSS
        while true {
            let flight = sendNext - sendUnacknowledged
            let unsent = dataEnd - sendNext
            if unsent > 0 {
                let usable = min(sendWindow, congestion.congestionWindow) - flight
                guard usable > 0 else { break }
                let length = min(unsent, mss, usable)
                if length < mss {
                    // Sender silly-window avoidance (RFC 9293 §3.8.6.2.1): a window-limited runt waits,
                    // unless it is half the largest window the peer has offered.
                    if length < unsent && length < maxSendWindow / 2 && flight > 0 { break }
                    // Nagle: one small segment in flight at a time, unless closing.
                    if length == unsent && configuration.nagle && flight > 0 && finSequence == nil { break }
                }
                sendData(from: sendNext, length: length, now: now, armTimer: true)
                continue
            }
            if let f = finSequence, sendNext == f {
                emit(flags: [.fin, .ack], sequence: f, payload: [], now: now)
                if f < sendMax { counters.retransmittedSegments += 1 }
                sendNext = f + 1
                sendMax = SequenceNumber.max(sendMax, sendNext)
                if timers[.retransmit] == nil { timers[.retransmit] = now + rtt.timeout }
                if unacknowledgedSince == nil { unacknowledgedSince = now }
            }
            break
        }
        if sendWindow == 0 && dataEnd > sendNext && sendNext == sendUnacknowledged { armPersist(now: now) }
    }

    /// RFC 6675 §5: while the pipe leaves room in cwnd, resend the next hole, else send new data.
    private mutating func sackRecoveryOutput(now: Instant) {
        let mss = effectiveSendMSS
        var guardCount = 0
        while congestion.pipe(unacknowledged: sendUnacknowledged, sendMax: sendMax) < congestion.congestionWindow && guardCount < 1000 {
            guardCount += 1
            if let hole = congestion.nextHole(unacknowledged: sendUnacknowledged) {
                let length = min(mss, hole.length)
                sendData(from: hole.start, length: min(length, dataEnd - hole.start), now: now, armTimer: true)
                congestion.retransmitted(from: hole.start, length: length)
                continue
            }
            let unsent = dataEnd - sendNext
            let room = (sendUnacknowledged + sendWindow) - sendNext
            if unsent > 0 && room > 0 && sendNext == sendMax {
                sendData(from: sendNext, length: min(unsent, mss, room), now: now, armTimer: true)
                continue
            }
            if let f = finSequence, sendNext == f {
                emit(flags: [.fin, .ack], sequence: f, payload: [], now: now)
                sendNext = f + 1
                sendMax = SequenceNumber.max(sendMax, sendNext)
            }
            break
        }
    }

    /// Sends `length` queued bytes from `start` (FIN too when they end where FIN goes).
    private mutating func sendData(from start: SequenceNumber, length: Int, now: Instant, armTimer: Bool) {
        guard length > 0 else { return }
        let offset = start - sendUnacknowledged
        let payload = sendBuffer.copy(offset: offset, length: length)
        let end = start + length
        var flags: TCPHeader.Flags = [.ack]
        if end == dataEnd { flags.insert(.psh) }
        var finSent = false
        if let f = finSequence, end == f {
            flags.insert(.fin)
            finSent = true
        }
        let isRetransmission = start < sendMax
        emit(flags: flags, sequence: start, payload: payload, now: now)
        let newNext = end + (finSent ? 1 : 0)
        if sendNext < newNext { sendNext = newNext }
        if sendMax < newNext {
            counters.bytesSent += min(newNext - sendMax, length)
            sendMax = newNext
        }
        if isRetransmission {
            counters.retransmittedSegments += 1
            rtt.retransmitted()
        } else {
            rtt.time(start, now: now)
        }
        if armTimer && timers[.retransmit] == nil { timers[.retransmit] = now + rtt.timeout }
        if unacknowledgedSince == nil { unacknowledgedSince = now }
    }

    /// The window field to advertise, never moving the right edge left; small openings wait
    /// until they are worth a segment (receiver silly-window avoidance).
    private mutating func windowField() -> UInt16 {
        let current = max(0, advertisedEdge - receiveNext)
        var window = max(0, configuration.receiveBufferSize - receiveBuffer.count)
        if window < current || window - current < min(configuration.receiveBufferSize / 2, effectiveSendMSS) {
            window = current
        }
        var field = min(window >> Int(receiveShift), 65535)
        if (field << Int(receiveShift)) < current { field = min(field + 1, 65535) }
        let edge = receiveNext + (field << Int(receiveShift))
        if advertisedEdge < edge { advertisedEdge = edge }
        return UInt16(field)
    }

    private mutating func emit(flags: TCPHeader.Flags, sequence: SequenceNumber, payload: [UInt8], now: Instant, withAck: Bool = true) {
        var flags = flags
        var h = TCPHeader(sourcePort: local.port, destinationPort: remote.port, sequenceNumber: sequence.rawValue, flags: [], window: 0)
        if withAck && !flags.contains(.ack) && !flags.contains(.rst) { flags.insert(.ack) }
        if flags.contains(.ack) {
            h.acknowledgmentNumber = receiveNext.rawValue
            h.window = windowField()
            lastAckSent = receiveNext
            ackNow = false
            timers[.delayedAck] = nil
            unacknowledgedSegments = 0
        }
        h.flags = flags
        var options: [TCPOption] = []
        if timestampsEnabled && !flags.contains(.rst) {
            options += [.noOperation, .noOperation, .timestamps(value: timestampValue(now), echoReply: timestampRecent)]
        }
        if sackPermitted && flags.contains(.ack) && !outOfOrder.isEmpty {
            options += [.noOperation, .noOperation, .sack(outOfOrder.sackBlocks(limit: timestampsEnabled ? 3 : 4).map { ($0.start.rawValue, $0.end.rawValue) })]
        }
        h.options = options
        outgoing.append(TCPSegment(header: h, payload: payload))
        counters.segmentsSent += 1
    }
}
