@testable import NetStack
import Testing

/// The parts `TCPConnection` is made of, each on its own: the reassembler, congestion control,
/// the RTT estimator and the timers. The scripted suite (`TCPScriptTests`) drives them together.
@Suite struct TCPReassemblerTests {
    typealias Segment = TCPReassembler.Segment
    func seg(_ start: UInt32, _ count: Int, fin: Bool = false, byte: UInt8 = 1) -> Segment {
        Segment(start: SequenceNumber(start), data: [UInt8](repeating: byte, count: count), fin: fin)
    }

    @Test func heldSegmentsAreSortedTrimmedAndTheEarlierCopyWins() {
        var r = TCPReassembler(capacity: 8)
        let a = r.insert(seg(300, 100, byte: 3)), b = r.insert(seg(100, 100, byte: 1))
        // Overlaps both neighbours: only the bytes between them are kept.
        let c = r.insert(seg(150, 200, byte: 9))
        #expect(a && b && c)
        #expect(r.segments.map(\.start.rawValue) == [100, 200, 300] && r.segments[1].data == [UInt8](repeating: 9, count: 100))
        #expect(r.segments[0].data.allSatisfy { $0 == 1 } && r.segments[2].data.allSatisfy { $0 == 3 })
        // A copy of what is held changes nothing but may bring the FIN.
        let copy = r.insert(seg(300, 100, fin: true, byte: 7))
        #expect(copy && r.segments[2].fin && r.segments[2].data.allSatisfy { $0 == 3 } && r.bytes == 300)
    }

    @Test func beyondTheCapASegmentIsRefused() {
        var r = TCPReassembler(capacity: 2)
        let a = r.insert(seg(100, 10)), b = r.insert(seg(200, 10))
        let third = r.insert(seg(300, 10))
        #expect(a && b && !third && r.count == 2)
        // A copy of a held one is not a new segment.
        let copy = r.insert(seg(100, 10))
        #expect(copy && r.count == 2)
    }

    @Test func filledHolesComeOutInOrder() {
        var r = TCPReassembler(capacity: 8)
        r.insert(seg(200, 100))
        r.insert(seg(100, 100))
        let none = r.popFilled(upTo: SequenceNumber(50))
        let first = r.popFilled(upTo: SequenceNumber(100))
        let second = r.popFilled(upTo: SequenceNumber(200))
        #expect(none == nil && first?.start.rawValue == 100 && second?.start.rawValue == 200 && r.isEmpty)
    }

    @Test func sackBlocksPutTheLatestRunFirstAndMergeContiguousSegments() {
        var r = TCPReassembler(capacity: 8)
        r.insert(seg(100, 100))
        r.insert(seg(200, 100))
        r.insert(seg(500, 100))
        r.insert(seg(800, 100))
        #expect(r.sackBlocks(limit: 4).map { [$0.start.rawValue, $0.end.rawValue] } == [[800, 900], [100, 300], [500, 600]])
        r.insert(seg(250, 100))
        #expect(r.sackBlocks(limit: 2).map { [$0.start.rawValue, $0.end.rawValue] } == [[100, 350], [500, 600]])
    }
}

@Suite struct TCPCongestionControlTests {
    let mss = 1000
    func cc(sack: Bool = false) -> TCPCongestionControl {
        var c = TCPCongestionControl(initialSequence: SequenceNumber(0))
        c.sack = sack
        c.start(mss: mss)
        return c
    }

    @Test func theInitialWindowFollowsRFC5681() {
        var c = TCPCongestionControl(initialSequence: SequenceNumber(0))
        c.start(mss: 536)
        #expect(c.congestionWindow == 4 * 536)
        c.start(mss: 1460)
        #expect(c.congestionWindow == 3 * 1460)
        c.start(mss: 3000)
        #expect(c.congestionWindow == 2 * 3000)
    }

    @Test func slowStartThenCongestionAvoidance() {
        var c = cc()
        // Slow start: at most one MSS per ACK however much it acknowledges.
        _ = c.newAck(SequenceNumber(3000), acked: 3000, sendMax: SequenceNumber(3000), mss: mss, largestPeerWindow: 1 << 20)
        #expect(c.congestionWindow == 5000)
        c.timeout(unacknowledged: SequenceNumber(3000), sendMax: SequenceNumber(9000), mss: mss)
        #expect(c.congestionWindow == 1000 && c.slowStartThreshold == 3000)
        for ack in stride(from: 4000, through: 6000, by: 1000) {
            _ = c.newAck(SequenceNumber(UInt32(ack)), acked: 1000, sendMax: SequenceNumber(9000), mss: mss, largestPeerWindow: 1 << 20)
        }
        #expect(c.congestionWindow == 3000, "slow start up to ssthresh, then avoidance: the third ACK adds nothing yet")
        _ = c.newAck(SequenceNumber(10_000), acked: 4000, sendMax: SequenceNumber(10_000), mss: mss, largestPeerWindow: 1 << 20)
        #expect(c.congestionWindow == 4000, "one MSS once a window's worth is acknowledged")
    }

    @Test func growthIsCappedByWhatThePeersWindowCouldUse() {
        var c = cc()
        for i in 1...100 { _ = c.newAck(SequenceNumber(UInt32(i * 1000)), acked: 1000, sendMax: SequenceNumber(UInt32(i * 1000)), mss: mss, largestPeerWindow: 2000) }
        #expect(c.congestionWindow == 2000 * 2 + 4 * 1000)
    }

    @Test func threeDuplicatesStartNewRenoRecoveryOncePerLoss() {
        var c = cc()
        let una = SequenceNumber(1000), max = SequenceNumber(11_000)
        let first = c.duplicateAck(unacknowledged: una, sendMax: max, mss: mss)
        let second = c.duplicateAck(unacknowledged: una, sendMax: max, mss: mss)
        let third = c.duplicateAck(unacknowledged: una, sendMax: max, mss: mss)
        #expect(!first && !second && third, "the third: fast retransmit")
        #expect(c.inFastRecovery && c.slowStartThreshold == 5000 && c.congestionWindow == 8000)
        // Each further duplicate inflates by one MSS.
        let fourth = c.duplicateAck(unacknowledged: una, sendMax: max, mss: mss)
        #expect(!fourth && c.congestionWindow == 9000)
        // A partial ACK resends the next hole and deflates.
        let partial = c.newAck(SequenceNumber(4000), acked: 3000, sendMax: max, mss: mss, largestPeerWindow: 1 << 20)
        #expect(partial == .retransmit(from: SequenceNumber(4000)))
        #expect(c.inFastRecovery && c.congestionWindow == 9000 - 3000 + 1000)
        // The full ACK ends it: the window is what is in flight plus one MSS, at most ssthresh.
        let full = c.newAck(SequenceNumber(11_000), acked: 7000, sendMax: max, mss: mss, largestPeerWindow: 1 << 20)
        #expect(full == .none && !c.inFastRecovery && c.congestionWindow == 2000)
        // Duplicates for data below the last recovery point do not start another (RFC 6582 §3.2).
        var d = cc()
        for _ in 0..<3 { _ = d.duplicateAck(unacknowledged: una, sendMax: max, mss: mss) }
        _ = d.newAck(max, acked: 10_000, sendMax: SequenceNumber(20_000), mss: mss, largestPeerWindow: 1 << 20)
        #expect(!d.inFastRecovery)
        for _ in 0..<2 { _ = d.duplicateAck(unacknowledged: SequenceNumber(10_000), sendMax: SequenceNumber(20_000), mss: mss) }
        let again = d.duplicateAck(unacknowledged: SequenceNumber(10_000), sendMax: SequenceNumber(20_000), mss: mss)
        #expect(!again, "SND.UNA is not beyond the last recovery point")
    }

    @Test func sackRecoveryCountsThePipeAndFindsTheHoles() {
        var c = cc(sack: true)
        let una = SequenceNumber(0), max = SequenceNumber(10_000)
        c.sacked([(2000, 4000), (6000, 7000), (50_000, 60_000)], unacknowledged: una, sendMax: max)
        #expect(c.scoreboard.count == 2, "a block beyond what was sent is ignored")
        for _ in 0..<3 { _ = c.duplicateAck(unacknowledged: una, sendMax: max, mss: mss) }
        #expect(c.inSACKRecovery && c.congestionWindow == c.slowStartThreshold)
        // Outstanding 10000, SACKed 3000, holes below the highest SACK 0-2000 and 4000-6000 lost.
        #expect(c.pipe(unacknowledged: una, sendMax: max) == 10_000 - 3000 - 4000)
        #expect(c.nextHole(unacknowledged: una) == SequenceRange(start: SequenceNumber(0), end: SequenceNumber(2000)))
        c.retransmitted(from: SequenceNumber(0), length: 1000)
        #expect(c.nextHole(unacknowledged: una) == SequenceRange(start: SequenceNumber(1000), end: SequenceNumber(2000)))
        #expect(c.pipe(unacknowledged: una, sendMax: max) == 10_000 - 3000 - 3000)
        // Merging: an overlapping block joins its neighbour.
        c.sacked([(3500, 6500)], unacknowledged: una, sendMax: max)
        #expect(c.scoreboard == [SequenceRange(start: SequenceNumber(2000), end: SequenceNumber(7000))])
        // The timeout forgets the scoreboard (RFC 2018 §8).
        c.timeout(unacknowledged: una, sendMax: max, mss: mss)
        #expect(c.scoreboard.isEmpty && !c.inFastRecovery && c.congestionWindow == mss)
    }

    /// Blocks merged in place give the list a merge into a fresh array gives (the
    /// definition: every range the block overlaps or touches joins it, sorted, at most 64
    /// kept from the lowest), for random blocks, touching ones and repeats.
    @Test func theScoreboardMergesInPlaceAsTheDefinitionDoes() {
        func definition(_ board: [SequenceRange], _ block: SequenceRange) -> [SequenceRange] {
            var merged = block
            var result: [SequenceRange] = []
            var placed = false
            for r in board {
                if r.end < merged.start {
                    result.append(r)
                } else if merged.end < r.start {
                    if !placed { result.append(merged); placed = true }
                    result.append(r)
                } else {
                    merged = SequenceRange(start: SequenceNumber.min(r.start, merged.start), end: SequenceNumber.max(r.end, merged.end))
                }
            }
            if !placed { result.append(merged) }
            return Array(result.prefix(64))
        }
        var random = SplitMix64(seed: 6675)
        for _ in 0..<50 {
            var c = cc(sack: true)
            var expected: [SequenceRange] = []
            for _ in 0..<300 {
                let start = UInt32(random.next() % 20_000)
                let end = start + 1 + UInt32(random.next() % 300)
                c.sacked([(SequenceNumber(start), SequenceNumber(end))], unacknowledged: SequenceNumber(0), sendMax: SequenceNumber(100_000))
                expected = definition(expected, SequenceRange(start: SequenceNumber(start), end: SequenceNumber(end)))
                #expect(c.scoreboard == expected)
            }
        }
    }

    @Test func theScoreboardIsBounded() {
        var c = cc(sack: true)
        for i in 0..<200 {
            let s = SequenceNumber(UInt32(i * 20 + 10))
            c.sacked([(s, s + 5)], unacknowledged: SequenceNumber(0), sendMax: SequenceNumber(100_000))
        }
        #expect(c.scoreboard.count <= 64)
    }
}

@Suite struct RTTEstimatorTests {
    let t0 = Instant.zero
    func estimator() -> RTTEstimator { RTTEstimator(timer: RetransmissionTimer()) }

    @Test func oneSamplePerRoundTripAndKarnsRule() {
        var e = estimator()
        e.time(SequenceNumber(1000), now: t0)
        e.time(SequenceNumber(2000), now: t0 + .milliseconds(5))
        e.acknowledged(SequenceNumber(1000), echoed: nil, now: t0 + .milliseconds(50))
        #expect(e.timer.smoothedRTT == nil, "the timed byte is not acknowledged yet")
        e.acknowledged(SequenceNumber(1001), echoed: nil, now: t0 + .milliseconds(80))
        #expect(e.timer.smoothedRTT == .milliseconds(80) && e.timing == nil)
        // A resend makes the next sample ambiguous: none is taken.
        e.time(SequenceNumber(3000), now: t0 + .milliseconds(100))
        e.retransmitted()
        e.acknowledged(SequenceNumber(4000), echoed: nil, now: t0 + .milliseconds(900))
        #expect(e.timer.smoothedRTT == .milliseconds(80))
    }

    @Test func anEchoedTimestampIsASampleEvenAfterAResend() {
        var e = estimator()
        e.time(SequenceNumber(0), now: t0)
        e.retransmitted()
        e.acknowledged(SequenceNumber(10), echoed: .milliseconds(40), now: t0 + .seconds(2))
        #expect(e.timer.smoothedRTT == .milliseconds(40))
        // An echo from the future (a peer's bad clock arithmetic) is no sample.
        e.time(SequenceNumber(20), now: t0)
        e.acknowledged(SequenceNumber(30), echoed: .milliseconds(-5), now: t0)
        #expect(e.timer.smoothedRTT == .milliseconds(40) && e.timing == nil)
    }

    @Test func theHandshakeSamplesOnlyWhenTheSYNWasNotResent() {
        var e = estimator()
        e.time(SequenceNumber(0), now: t0)
        e.handshakeDone(clean: false, now: t0 + .seconds(3))
        #expect(e.timer.smoothedRTT == nil)
        e.time(SequenceNumber(0), now: t0)
        e.handshakeDone(clean: true, now: t0 + .milliseconds(30))
        #expect(e.timer.smoothedRTT == .milliseconds(30))
        let before = e.timeout
        e.expired()
        #expect(e.timeout == before * 2)
    }
}

@Suite struct TCPTimerTests {
    @Test func armedTimersAreKeptAndComputedOnesAreNot() {
        var t = TCPArmedTimers()
        for timer in TCPTimer.allCases { #expect(t[timer] == nil) }
        t[.retransmit] = Instant.zero + .seconds(1)
        t[.delayedAck] = Instant.zero + .milliseconds(40)
        t[.keepAlive] = Instant.zero
        #expect(t[.retransmit] == Instant.zero + .seconds(1) && t[.delayedAck] == Instant.zero + .milliseconds(40) && t[.keepAlive] == nil)
        t.disarmAll()
        #expect(TCPTimer.allCases.allSatisfy { t[$0] == nil })
        // Served in this order when several are due: the ones that end the connection first.
        #expect(TCPTimer.allCases == [.timeWait, .finWait2, .userTimeout, .retransmit, .persist, .keepAlive, .delayedAck])
    }
}

@Suite struct ConnectionTableTests {
    static func connection(port: UInt16) -> TCPConnection {
        TCPConnection(local: TCPEndpoint(Peer.us, port), remote: TCPEndpoint(Peer.them, 80), initialSequence: SequenceNumber(1),
                      configuration: TCPConfiguration(), now: .zero)
    }

    @Test func connectionsAreReadAndChangedInPlaceAndSlotsAreReused() {
        var table = ConnectionTable()
        let ids = (1...3).map { ConnectionID(rawValue: $0) }
        for (n, id) in ids.enumerated() { table.insert(Self.connection(port: UInt16(1000 + n)), id: id) }
        #expect(table.count == 3 && table.positions.count == 3)
        #expect(table.modify(ids[1]) { $0.local.port } == 1001)
        #expect(table.modify(ConnectionID(rawValue: 99)) { $0.local.port } == nil)
        // A change happens where the connection lies.
        #expect(table.modify(ids[0]) { $0.write([1, 2, 3], now: .zero) } == 3)
        #expect(table.modify(ids[0]) { $0.unacknowledgedBytes } == 3)
        #expect(table.modify(ConnectionID(rawValue: 99)) { $0.write([1], now: .zero) } == nil)
        // A freed slot in the middle is reused; freed slots at the end are let go.
        // Looked up just before, so remembered: a removed id is forgotten with its slot.
        #expect(table.inspect(ids[1]) { $0.local.port } == 1001)
        #expect(table.removeValue(forKey: ids[1])?.local.port == 1001)
        #expect(!table.contains(ids[1]) && table.positions.count == 3 && table.id(at: 1) == nil)
        #expect(table.inspect(ids[1]) { $0.local.port } == nil)
        let fourth = ConnectionID(rawValue: 4)
        table.insert(Self.connection(port: 1003), id: fourth)
        #expect(table.id(at: 1) == fourth && table.positions.count == 3)
        #expect(table.modify(ids[1]) { $0.local.port } == nil)
        #expect(table.inspect(fourth) { $0.local.port } == 1003)
        table.removeValue(forKey: ids[2])
        table.removeValue(forKey: fourth)
        #expect(table.positions.count == 1 && table.count == 1)
        #expect(table.read(position: 0) { $0.local.port } == 1000)
        table.removeValue(forKey: ids[0])
        #expect(table.isEmpty && table.positions.isEmpty)
    }
}
