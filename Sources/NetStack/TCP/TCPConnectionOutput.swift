import Wire

/// Segments out: data as the windows allow (Nagle, sender SWS avoidance, RFC 6675 recovery),
/// FIN, ACKs, the window we advertise and the options every segment carries.
extension TCPConnection {
    // MARK: Output

    func timestampValue(_ now: Instant) -> UInt32 {
        UInt32(truncatingIfNeeded: now.nanoseconds / 1_000_000) &+ timestampOffset
    }

    mutating func sendSyn(now: Instant) {
        var flags: TCPHeader.Flags = [.syn]
        if state == .synReceived { flags.insert(.ack) }
        var h = TCPHeader(sourcePort: local.port, destinationPort: remote.port, sequenceNumber: initialSendSequence,
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
        if flags.contains(.ack) { h.acknowledgmentNumber = receiveNext }
        if passive {
            advertisedEdge = receiveNext + Int(h.window)
            lastAckSent = receiveNext
        }
        outgoing.append(QueuedSegment(header: h, payloadLength: 0))
        counters.segmentsSent += 1
        sendNext = initialSendSequence + 1
        sendMax = SequenceNumber.max(sendMax, sendNext)
        if retransmissions == 0 { rtt.time(initialSendSequence, now: now) } else { rtt.forget() }
        timers[.retransmit] = now + rtt.timeout
        ackNow = false
        timers[.delayedAck] = nil
    }

    /// Everything due: data the windows allow, FIN, and a pending ACK.
    mutating func output(now: Instant) {
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
            } else if state != .synSent && state != .closed && (ackHeldSince == nil || ackUnheld) {
                emit(flags: [.ack], sequence: sendNext, now: now)
            }
        }
    }

    /// From now until `releaseHeldAck`, a pure ACK waits (`IPStackConfiguration.acknowledgeAtCollection`).
    mutating func holdAcks(now: Instant) {
        if ackHeldSince == nil { ackHeldSince = now }
    }

    /// Sends the ACK that waited, if one is still due (a data segment may have carried it).
    mutating func releaseHeldAck() {
        guard let since = ackHeldSince else { return }
        ackHeldSince = nil
        if ackNow { output(now: since) }
    }

    mutating func normalOutput(now: Instant) {
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
                emit(flags: [.fin, .ack], sequence: f, now: now)
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
    mutating func sackRecoveryOutput(now: Instant) {
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
                emit(flags: [.fin, .ack], sequence: f, now: now)
                sendNext = f + 1
                sendMax = SequenceNumber.max(sendMax, sendNext)
            }
            break
        }
    }

    /// Sends `length` queued bytes from `start` (FIN too when they end where FIN goes).
    mutating func sendData(from start: SequenceNumber, length: Int, now: Instant, armTimer: Bool) {
        guard length > 0 else { return }
        // The bytes stay in the send buffer: the stack copies them into the packet it builds.
        let end = start + length
        var flags: TCPHeader.Flags = [.ack]
        if end == dataEnd { flags.insert(.psh) }
        var finSent = false
        if let f = finSequence, end == f {
            flags.insert(.fin)
            finSent = true
        }
        let isRetransmission = start < sendMax
        emit(flags: flags, sequence: start, payloadLength: length, now: now)
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

    /// The window field to advertise, never moving the right edge left by more than the
    /// scale's rounding; small openings wait until they are worth a segment (receiver
    /// silly-window avoidance).
    mutating func windowField() -> UInt16 {
        let current = max(0, advertisedEdge - receiveNext)
        let free = max(0, configuration.receiveBufferSize - receiveBuffer.count)
        var window = free
        if window < current || window - current < min(configuration.receiveBufferSize / 2, effectiveSendMSS) {
            window = current
        }
        var field = min(window >> Int(receiveShift), 65535)
        // Rounded up so the right edge does not move left (RFC 7323 §2.4), but only within the
        // free space. Beyond it the edge would creep past the buffer by up to 2^shift - 1 bytes
        // an ACK while the application does not read, and a full buffer would never show a
        // zero window; rounded down, the edge moves left by less than one unit of the scale,
        // which §2.4 tells senders to expect.
        if (field << Int(receiveShift)) < current && ((field + 1) << Int(receiveShift)) <= free {
            field = min(field + 1, 65535)
        }
        let edge = receiveNext + (field << Int(receiveShift))
        if advertisedEdge < edge { advertisedEdge = edge }
        return UInt16(field)
    }

    mutating func emit(flags: TCPHeader.Flags, sequence: SequenceNumber, payloadLength: Int = 0, now: Instant, withAck: Bool = true) {
        var flags = flags
        var h = TCPHeader(sourcePort: local.port, destinationPort: remote.port, sequenceNumber: sequence, flags: [], window: 0)
        if withAck && !flags.contains(.ack) && !flags.contains(.rst) { flags.insert(.ack) }
        if flags.contains(.ack) {
            h.acknowledgmentNumber = receiveNext
            h.window = windowField()
            lastAckSent = receiveNext
            ackNow = false
            ackUnheld = false
            timers[.delayedAck] = nil
        }
        h.flags = flags
        // Written into the header's own option bytes: no list, no array.
        if timestampsEnabled && !flags.contains(.rst) {
            h.appendTimestamps(value: timestampValue(now), echoReply: timestampRecent)
        }
        if sackPermitted && flags.contains(.ack) && !outOfOrder.isEmpty {
            var blocks = SACKBlockList()
            outOfOrder.forEachSACKBlock(limit: timestampsEnabled ? 3 : 4) { blocks.append($0) }
            h.appendSACK(count: blocks.count) { (blocks[$0].start, blocks[$0].end) }
        }
        outgoing.append(QueuedSegment(header: h, payloadLength: payloadLength))
        if payloadLength > 0 { queuedPayloadSegments += 1 }
        counters.segmentsSent += 1
    }
}
