import Wire

/// The sender's congestion control: slow start and congestion avoidance (RFC 5681), NewReno
/// fast retransmit and recovery (RFC 6582) and, when the peer permits SACK, the conservative
/// SACK-based loss recovery of RFC 6675 with its scoreboard (every hole below the highest
/// SACKed byte counts as lost). The connection owns the sequence space and sends; this says
/// how much may be in flight and what to resend.
struct TCPCongestionControl: Sendable {
    private(set) var congestionWindow = 0
    private(set) var slowStartThreshold = Int.max
    private(set) var inFastRecovery = false
    private(set) var duplicateAcks = 0
    /// RFC 6582's "recover": the highest sequence sent when the last recovery began.
    private(set) var recoveryPoint: SequenceNumber
    /// The highest sequence resent in this recovery (RFC 6675's HighRxt).
    private(set) var highRetransmitted: SequenceNumber
    private var bytesAckedInAvoidance = 0
    /// SACKed ranges above SND.UNA, sorted and disjoint.
    private(set) var scoreboard: [SequenceRange] = []
    /// The peer permits SACK: recovery follows RFC 6675.
    var sack = false
    private let initialSequence: SequenceNumber

    init(initialSequence: SequenceNumber) {
        self.initialSequence = initialSequence
        recoveryPoint = initialSequence
        highRetransmitted = initialSequence
    }

    /// RFC 5681 §3.1 initial window for `mss`.
    mutating func start(mss: Int) {
        congestionWindow = mss > 2190 ? 2 * mss : mss > 1095 ? 3 * mss : 4 * mss
    }

    /// Recovery is SACK-driven now: `pipe` and `nextHole` decide what goes out.
    var inSACKRecovery: Bool { inFastRecovery && sack && !scoreboard.isEmpty }

    /// What a new cumulative ACK asks of the sender: nothing more, or resending the hole at
    /// `retransmitFrom` (a NewReno partial acknowledgment).
    enum AckAction: Equatable { case none, retransmit(from: SequenceNumber) }

    /// `acked` bytes newly acknowledged up to `ack`; `sendMax` is the highest sequence sent.
    mutating func newAck(_ ack: SequenceNumber, acked: Int, sendMax: SequenceNumber, mss: Int, largestPeerWindow: Int) -> AckAction {
        var action = AckAction.none
        if inFastRecovery {
            if ack >= recoveryPoint {
                // RFC 6582 §3.2 (3): full acknowledgment.
                let flight = sendMax - ack
                congestionWindow = min(slowStartThreshold, max(flight, mss) + mss)
                inFastRecovery = false
                duplicateAcks = 0
            } else {
                highRetransmitted = SequenceNumber.max(highRetransmitted, ack)
                if !sack || scoreboard.isEmpty {
                    // Partial acknowledgment: resend the next hole, deflate by what was acked.
                    action = .retransmit(from: ack)
                    congestionWindow = max(congestionWindow - acked + (acked >= mss ? mss : 0), mss)
                }
            }
        } else {
            duplicateAcks = 0
            if congestionWindow < slowStartThreshold {
                congestionWindow += min(acked, mss)
            } else {
                bytesAckedInAvoidance += acked
                if bytesAckedInAvoidance >= congestionWindow {
                    bytesAckedInAvoidance -= congestionWindow
                    congestionWindow += mss
                }
            }
        }
        // Growth is capped at what the peer's window could ever use, so an idle-then-burst
        // does not overflow it.
        congestionWindow = min(congestionWindow, max(largestPeerWindow, mss) * 2 + 4 * mss)
        scoreboard.removeAll { $0.end <= ack }
        if let first = scoreboard.first, first.start < ack { scoreboard[0].start = ack }
        return action
    }

    /// A duplicate ACK (RFC 5681 §2) with `unacknowledged` = SND.UNA; true when it is the
    /// third and a fast retransmit of SND.UNA is due now.
    mutating func duplicateAck(unacknowledged: SequenceNumber, sendMax: SequenceNumber, mss: Int) -> Bool {
        duplicateAcks += 1
        if inFastRecovery {
            if !sack { congestionWindow += mss }
            return false
        }
        // RFC 6582 §3.2 (2): enter only when this loss lies beyond the last recovery.
        guard duplicateAcks == 3, unacknowledged > recoveryPoint || recoveryPoint == initialSequence else { return false }
        let flight = sendMax - unacknowledged
        slowStartThreshold = max(flight / 2, 2 * mss)
        recoveryPoint = sendMax
        inFastRecovery = true
        highRetransmitted = unacknowledged
        congestionWindow = sack ? slowStartThreshold : slowStartThreshold + 3 * mss
        return true
    }

    /// The retransmission timer expired with `sendMax - unacknowledged` in flight.
    mutating func timeout(unacknowledged: SequenceNumber, sendMax: SequenceNumber, mss: Int) {
        // RFC 5681 §3.1 (4): loss window of one segment; RFC 6582 §3.2 (4): recover = highest sent.
        slowStartThreshold = max((sendMax - unacknowledged) / 2, 2 * mss)
        congestionWindow = mss
        bytesAckedInAvoidance = 0
        inFastRecovery = false
        duplicateAcks = 0
        recoveryPoint = sendMax
        // RFC 2018 §8: after a timeout the SACKed bits are forgotten.
        scoreboard.removeAll()
        highRetransmitted = unacknowledged
    }

    /// A segment from `start` of `length` was resent.
    mutating func retransmitted(from start: SequenceNumber, length: Int) {
        highRetransmitted = SequenceNumber.max(highRetransmitted, start + max(length, 1))
    }

    /// The SACK blocks of an ACK, kept when they lie in `unacknowledged ..< sendMax`.
    mutating func sacked(_ blocks: [(SequenceNumber, SequenceNumber)], unacknowledged: SequenceNumber, sendMax: SequenceNumber) {
        for (s, e) in blocks { sacked(s, e, unacknowledged: unacknowledged, sendMax: sendMax) }
    }

    /// One SACK block (RFC 2018 §3), as a segment's options give it.
    mutating func sacked(_ start: SequenceNumber, _ end: SequenceNumber, unacknowledged: SequenceNumber, sendMax: SequenceNumber) {
        var block = SequenceRange(start: start, end: end)
        guard block.start < block.end, block.end > unacknowledged, block.end <= sendMax else { return }
        if block.start < unacknowledged { block.start = unacknowledged }
        insert(block)
    }

    /// Merges `block` into the scoreboard in place: the ranges it overlaps or touches become
    /// one, the list stays sorted and disjoint, and at most 64 ranges are kept (the highest go).
    private mutating func insert(_ block: SequenceRange) {
        // The first range that does not end before the block starts.
        var first = 0
        while first < scoreboard.count && scoreboard[first].end < block.start { first += 1 }
        var merged = block
        var past = first
        while past < scoreboard.count && !(merged.end < scoreboard[past].start) {
            let r = scoreboard[past]
            merged = SequenceRange(start: SequenceNumber.min(r.start, merged.start), end: SequenceNumber.max(r.end, merged.end))
            past += 1
        }
        scoreboard.replaceSubrange(first..<past, with: CollectionOfOne(merged))
        if scoreboard.count > 64 { scoreboard.removeLast(scoreboard.count - 64) }
    }

    /// RFC 6675 §4's pipe: bytes believed in the network (outstanding, minus SACKed, minus
    /// holes judged lost and not yet resent).
    func pipe(unacknowledged: SequenceNumber, sendMax: SequenceNumber) -> Int {
        let outstanding = sendMax - unacknowledged
        guard !scoreboard.isEmpty else { return outstanding }
        let sacked = scoreboard.reduce(0) { $0 + $1.length }
        var lost = 0
        var cursor = SequenceNumber.max(unacknowledged, highRetransmitted)
        for block in scoreboard where block.end > cursor {
            if cursor < block.start { lost += block.start - cursor }
            cursor = SequenceNumber.max(cursor, block.end)
        }
        return max(0, outstanding - sacked - lost)
    }

    /// The next hole to resend in SACK recovery (RFC 6675 §5's NextSeg, rule 1).
    func nextHole(unacknowledged: SequenceNumber) -> SequenceRange? {
        var cursor = SequenceNumber.max(unacknowledged, highRetransmitted)
        for block in scoreboard {
            if cursor < block.start { return SequenceRange(start: cursor, end: block.start) }
            cursor = SequenceNumber.max(cursor, block.end)
        }
        return nil
    }

    /// The first SACKed block above `start`: a resend stops short of it.
    func sackedBlock(above start: SequenceNumber) -> SequenceRange? {
        scoreboard.first { $0.start > start }
    }
}
