import Wire

/// A connection's timers (`TCPTimer`): when each is due, and what each does when it fires.
extension TCPConnection {
    // MARK: Timers

    @inline(__always) var keepAliveDeadline: Instant? {
        guard let k = configuration.keepAlive, state == .established || state == .closeWait else { return nil }
        return lastReceived + k.idle + k.interval * keepAliveProbesSent
    }

    @inline(__always) var userTimeoutDeadline: Instant? {
        guard let t = configuration.userTimeout, let since = unacknowledgedSince else { return nil }
        return since + t
    }

    /// Only once the application has closed for good: a half-closed connection still reads.
    @inline(__always) var finWait2Deadline: Instant? {
        guard state == .finWait2, applicationClosed, let since = finWait2Since, let t = configuration.finWait2Timeout else { return nil }
        return since + t
    }

    /// When `timer` is due, if it is running.
    @inline(__always) public func deadline(_ timer: TCPTimer) -> Instant? {
        switch timer {
        case .keepAlive: return keepAliveDeadline
        case .userTimeout: return userTimeoutDeadline
        case .finWait2: return finWait2Deadline
        case .retransmit, .persist, .delayedAck, .timeWait: return timers[timer]
        }
    }

    // Inlined, as are the deadlines it reads: the stack asks every connection on every turn,
    // through an `inout` access (`ConnectionTable.inspect`), and a getter that is called
    // rather than inlined there is handed a copy of the whole connection (some 940 bytes).
    @inline(__always) public var pollAt: Instant? {
        if state == .closed { return nil }
        if ackNow { return .zero }
        // A loop, not compactMap(...).min(): asked on every turn, it must not allocate.
        var earliest: Instant?
        for timer in TCPTimer.allCases {
            if let d = deadline(timer), earliest.map({ d < $0 }) ?? true { earliest = d }
        }
        return earliest
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
    mutating func fire(_ timer: TCPTimer, now: Instant) -> Bool {
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
            emit(flags: [.ack], sequence: sendUnacknowledged - 1, now: now)
        case .delayedAck:
            ackNow = true
        }
        return state == .closed
    }

    mutating func replaceCloseReason(_ reason: TCPCloseReason) {
        if let i = events.lastIndex(of: .closed(.aborted)) { events[i] = .closed(reason) }
    }

    mutating func retransmissionTimeout(now: Instant) {
        guard sendMax != sendUnacknowledged else { return }
        retransmissions += 1
        counters.timeouts += 1
        if state == .synSent || state == .synReceived {
            if retransmissions > configuration.maximumSynRetransmissions {
                if state == .synReceived { emit(flags: [.rst], sequence: initialSendSequence + 1, now: now) }
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

    mutating func sendZeroWindowProbe(now: Instant) {
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

    var persistInterval: Duration {
        var t = rtt.timeout
        for _ in 1..<max(persistBackoff, 1) {
            t = t * 2
            if t >= configuration.maximumRetransmissionTimeout { return configuration.maximumRetransmissionTimeout }
        }
        return t
    }
}
