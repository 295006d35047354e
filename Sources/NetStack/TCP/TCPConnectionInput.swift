import Wire

/// Segments in (RFC 9293 §3.10.7): SYN-SENT, then the synchronized states' checks in order,
/// ACK processing, and the segment text into the receive buffer or the reassembler.
extension TCPConnection {
    // MARK: Input

    public mutating func receive(_ h: TCPHeader, payload: [UInt8], now: Instant) {
        receive(h, payload: payload[...], now: now)
    }

    /// The payload as a slice of the packet it came in: nothing is copied until the bytes
    /// reach the receive buffer (or the reassembler, for a segment beyond a hole).
    public mutating func receive(_ h: TCPHeader, payload: ArraySlice<UInt8>, now: Instant) {
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
    mutating func receiveInSynSent(_ h: TCPHeader, payload: ArraySlice<UInt8>, now: Instant) {
        let ack = h.acknowledgmentNumber
        let hasAck = h.flags.contains(.ack)
        if hasAck && (ack <= initialSendSequence || ack > sendMax) {
            if !h.flags.contains(.rst) { emit(flags: [.rst], sequence: ack, now: now, withAck: false) }
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
            sendWL1 = h.sequenceNumber
            sendWL2 = ack
            state = .established
            events.append(.established)
            if finSequence != nil { state = .finWait1 }
            ackNow = true
        } else {
            // Simultaneous open (RFC 9293 §3.5, figure 8).
            state = .synReceived
            sendWindow = Int(h.window)
            sendWL1 = h.sequenceNumber
            sendSyn(now: now)
        }
    }

    mutating func receiveSynchronized(_ h: TCPHeader, payload: ArraySlice<UInt8>, now: Instant) {
        let seq = h.sequenceNumber
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
        let ack = h.acknowledgmentNumber
        if state == .synReceived {
            guard ack > sendUnacknowledged && ack <= sendMax else {
                emit(flags: [.rst], sequence: ack, now: now, withAck: false)
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
        // Within the window we advertised, and within the buffer: a scaled window is rounded
        // up so its right edge never moves left (RFC 7323 §2.4), which lets the edge pass the
        // free space by up to 2^shift - 1 bytes an ACK while the application does not read. A
        // peer sending into that margin again and again would grow the buffer without bound;
        // the bytes beyond it are dropped here and come again once the application has read.
        let capacityEdge = receiveNext + max(0, configuration.receiveBufferSize - receiveBuffer.count)
        let edge = SequenceNumber.min(advertisedEdge, SequenceNumber.max(capacityEdge, receiveNext))
        if start + data.count > edge {
            data.removeLast(min(data.count, (start + data.count) - edge))
            fin = false
            // Told at once where the window ends, so the peer probes it rather than retransmits.
            ackNow = true
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

    mutating func updateTimestampRecent(_ h: TCPHeader, sequence: SequenceNumber, length: Int) {
        // RFC 7323 §4.3: remember TSval of the segment covering Last.ACK.sent.
        if let (value, _) = h.timestamps, sequence <= lastAckSent && lastAckSent <= sequence + max(length, 1) {
            timestampRecent = value
        }
    }

    mutating func challengeAck(now: Instant) {
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
    mutating func processAck(_ h: TCPHeader, payloadEmpty: Bool, now: Instant) -> Bool {
        let ack = h.acknowledgmentNumber
        let seq = h.sequenceNumber
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
            h.forEachSACKBlock { start, end in congestion.sacked(start, end, unacknowledged: sendUnacknowledged, sendMax: sendMax) }
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

    mutating func armPersist(now: Instant) {
        guard timers[.persist] == nil else { return }
        persistBackoff = max(persistBackoff, 1)
        timers[.persist] = now + persistInterval
    }

    /// Sequence number after the last queued data byte.
    /// Inlined: called from `mutating` methods, a getter that is not inlined is handed a copy
    /// of the whole connection.
    @inline(__always) var dataEnd: SequenceNumber {
        (state == .synSent || state == .synReceived ? initialSendSequence + 1 : sendUnacknowledged) + queuedBytes
    }

    var finAcked: Bool {
        guard let f = finSequence else { return false }
        return sendUnacknowledged > f
    }

    mutating func newAck(_ ack: SequenceNumber, header h: TCPHeader, now: Instant) {
        let acked = ack - sendUnacknowledged
        var dataAcked = acked
        if let f = finSequence, ack > f { dataAcked -= 1 }
        if queuedPayloadSegments > 0 {
            // A queued segment may carry these bytes: kept until the queue is collected.
            if heldFrom == nil { heldFrom = sendUnacknowledged }
            acknowledgedHeld += dataAcked
        } else {
            sendBuffer.removeFirst(dataAcked)
        }
        sendUnacknowledged = ack
        if sendNext < ack { sendNext = ack }
        retransmissions = 0

        // RTT, once per round trip (RFC 6298 §3; `RTTEstimator`).
        var echoed: Duration?
        if timestampsEnabled {
            if let (_, echo) = h.timestamps, echo != 0 {
                echoed = .milliseconds(Int64(Int32(bitPattern: timestampValue(now) &- echo)))
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
        if writeBlocked && (configuration.sendBufferSize - queuedBytes) * 4 >= configuration.sendBufferSize {
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

    mutating func duplicateAck(now: Instant) {
        if congestion.duplicateAck(unacknowledged: sendUnacknowledged, sendMax: sendMax, mss: effectiveSendMSS) {
            counters.fastRetransmits += 1
            retransmit(from: sendUnacknowledged, now: now)
        }
    }

    /// Resends one segment starting at `start`, stopping short of the next SACKed block.
    mutating func retransmit(from start: SequenceNumber, now: Instant) {
        var length = min(effectiveSendMSS, sendMax - start)
        if let block = congestion.sackedBlock(above: start) { length = min(length, block.start - start) }
        let dataLength = min(length, dataEnd - start)
        if dataLength > 0 {
            sendData(from: start, length: dataLength, now: now, armTimer: true)
        } else if let f = finSequence, start == f {
            emit(flags: [.fin, .ack], sequence: f, now: now)
            counters.retransmittedSegments += 1
        }
        congestion.retransmitted(from: start, length: dataLength)
    }

    // MARK: Receiving text

    mutating func receiveSegmentText(start: SequenceNumber, data: ArraySlice<UInt8>, fin: Bool, now: Instant) {
        if start == receiveNext {
            let fillsHole = !outOfOrder.isEmpty
            let wasEmpty = receiveBuffer.isEmpty
            appendInOrder(data)
            var finInOrder = fin
            // Pull whatever the new bytes made contiguous.
            while let first = outOfOrder.popFilled(upTo: receiveNext) {
                let skip = receiveNext - first.start
                if skip < first.data.count { appendInOrder(first.data[skip...]) }
                if first.fin && first.end >= receiveNext { finInOrder = true }
            }
            if receiveBuffer.count > 0 && (wasEmpty || !data.isEmpty) { events.append(.readable) }
            if finInOrder {
                receiveFin(now: now)
            } else if fillsHole || configuration.delayedAck == nil {
                ackNow = true
                if fillsHole { ackUnheld = true }
            } else if !data.isEmpty {
                // RFC 5681 §4.2: at least every second full-sized segment, counted in bytes
                // against the largest segment the peer has sent. Counting segments instead
                // acknowledged each short tail at once, and Linux's Nagle (Minshall's variant)
                // sends the next short segment as soon as the last one is acknowledged: a peer
                // writing 2 KiB at a time then never filled a segment again, and its upload
                // went as 1460 + 588 pairs, one frame per wakeup here.
                // At most our MSS: a peer's oversized segment must not stretch our ACKs.
                largestSegmentReceived = min(max(largestSegmentReceived, data.count), configuration.maximumSegmentSize)
                if receiveNext - lastAckSent >= 2 * largestSegmentReceived {
                    ackNow = true
                } else if timers[.delayedAck] == nil, let delay = configuration.delayedAck {
                    timers[.delayedAck] = now + delay
                }
            }
        } else {
            counters.outOfOrderSegments += 1
            if !outOfOrder.insert(TCPReassembler.Segment(start: start, data: Array(data), fin: fin)) { counters.outOfOrderDropped += 1 }
            ackNow = true
            ackUnheld = true
        }
    }

    mutating func appendInOrder(_ data: ArraySlice<UInt8>) {
        guard !data.isEmpty else { return }
        receiveBuffer.append(contentsOf: data)
        receiveNext += data.count
        counters.bytesReceived += data.count
    }

    mutating func receiveFin(now: Instant) {
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

    mutating func enterTimeWait(now: Instant) {
        state = .timeWait
        timers[.retransmit] = nil
        timers[.persist] = nil
        timers[.timeWait] = now + configuration.timeWait
    }

    mutating func finish(_ reason: TCPCloseReason) {
        guard state != .closed else { return }
        state = .closed
        timers.disarmAll()
        unacknowledgedSince = nil
        ackNow = false
        outOfOrder.removeAll()
        if reason != .closed {
            // Segments queued before the reset (data written and then aborted in one batch)
            // still go out ahead of it: their bytes are let go once they are collected.
            if queuedPayloadSegments > 0 {
                discardSendBufferWhenCollected = true
            } else {
                sendBuffer.removeAll()
                acknowledgedHeld = 0
                heldFrom = nil
            }
        }
        events.append(.closed(reason))
    }
}
