import Testing
@testable import NetStack

/// Scripted segment-in/segment-out tests of one connection at explicit times.
struct TCPScript {
    static let local = TCPEndpoint(IPv4Address(10, 0, 0, 1), 80)
    static let remote = TCPEndpoint(IPv4Address(10, 0, 0, 2), 49_500)
    var conn: TCPConnection
    var now = Instant.zero
    var events: [TCPEvent] = []
    /// The peer's sequence numbers.
    var peerISS: SequenceNumber
    var peerNext: SequenceNumber

    /// A connection made by a passive open from a SYN with `synOptions`, after the handshake completes.
    init(iss: UInt32 = 1000, peerISS: UInt32 = 5000, configuration: TCPConfiguration = .scripted,
         synOptions: [TCPOption] = [.maximumSegmentSize(1460)], peerWindow: UInt16 = 65535, handshake: Bool = true) {
        self.peerISS = SequenceNumber(peerISS)
        peerNext = SequenceNumber(peerISS) + 1
        var syn = TCPHeader(sourcePort: Self.remote.port, destinationPort: Self.local.port, sequenceNumber: SequenceNumber(peerISS), flags: [.syn], window: peerWindow)
        syn.options = synOptions
        conn = TCPConnection(local: Self.local, remote: Self.remote, initialSequence: SequenceNumber(iss), configuration: configuration, syn: syn, now: now)
        let synAck = take()
        precondition(synAck.count == 1 && synAck[0].header.flags == [.syn, .ack])
        if handshake {
            deliver([.ack], ack: SequenceNumber(iss) + 1, window: peerWindow)
            precondition(conn.state == .established)
            _ = takeEvents()
        }
    }

    var iss: SequenceNumber { conn.initialSendSequence }

    mutating func deliver(_ flags: TCPHeader.Flags, seq: SequenceNumber? = nil, ack: SequenceNumber = 0, window: UInt16 = 65535,
                          payload: [UInt8] = [], options: [TCPOption] = []) {
        var h = TCPHeader(sourcePort: Self.remote.port, destinationPort: Self.local.port,
                          sequenceNumber: seq ?? peerNext, flags: flags, window: window)
        h.acknowledgmentNumber = ack
        h.options = options
        conn.receive(h, payload: payload, now: now)
        if seq == nil { peerNext += payload.count + (flags.contains(.fin) ? 1 : 0) }
        events += conn.takeEvents()
    }

    mutating func advance(to t: Instant) {
        now = t
        var rounds = 0
        while let p = conn.pollAt, p <= now, rounds < 100 {
            conn.poll(now: now)
            events += conn.takeEvents()
            rounds += 1
        }
    }

    mutating func advance(by d: Duration) { advance(to: now + d) }

    mutating func take() -> [TCPSegment] { conn.takeSegments() }

    mutating func takeEvents() -> [TCPEvent] {
        events += conn.takeEvents()
        defer { events = [] }
        return events
    }

    mutating func write(_ bytes: [UInt8]) -> Int { conn.write(bytes, now: now) }
}

extension TCPConfiguration {
    static var scripted: TCPConfiguration {
        var c = TCPConfiguration()
        c.timestamps = false
        c.selectiveAcknowledgments = false
        c.windowScaling = false
        c.receiveBufferSize = 8192
        c.sendBufferSize = 16384
        return c
    }
}

func bytes(_ n: Int, from start: Int = 0) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 + start) } }

@Suite struct TCPOpeningTests {
    @Test func activeOpenOffersOptionsAndCompletes() {
        var c = TCPConfiguration()
        c.receiveBufferSize = 256 * 1024
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(100), configuration: c, now: .zero)
        let syn = conn.takeSegments()
        #expect(syn.count == 1)
        #expect(syn[0].header.flags == [.syn])
        #expect(syn[0].header.sequenceNumber == 100)
        #expect(syn[0].header.options.contains(.maximumSegmentSize(1460)))
        #expect(syn[0].header.options.contains(.windowScale(3)), "256 KiB needs shift 3")
        #expect(syn[0].header.options.contains(.sackPermitted))
        #expect(syn[0].header.options.contains { if case .timestamps = $0 { return true }; return false })
        var synAck = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 7000, flags: [.syn, .ack], window: 29200)
        synAck.acknowledgmentNumber = 101
        synAck.options = [.maximumSegmentSize(1400), .sackPermitted, .windowScale(7)]
        conn.receive(synAck, payload: [], now: .milliseconds(30))
        #expect(conn.state == .established)
        #expect(conn.takeEvents() == [.established])
        let ack = conn.takeSegments()
        #expect(ack.count == 1 && ack[0].header.flags == [.ack] && ack[0].header.acknowledgmentNumber == 7001)
        #expect(conn.sendShift == 7 && conn.receiveShift == 3 && conn.sackPermitted && !conn.timestampsEnabled)
        #expect(conn.effectiveSendMSS == 1400)
        #expect(conn.sendWindow == 29200, "the SYN-ACK's window is never scaled")
        // The first RTT sample replaced the initial 1 s timeout.
        #expect(conn.retransmissionTimer.smoothedRTT == .milliseconds(30))
    }

    @Test func passiveOpenAnswersOnlyOfferedOptions() {
        var c = TCPConfiguration()
        c.receiveBufferSize = 256 * 1024
        var syn = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 42, flags: [.syn], window: 8192)
        syn.options = [.maximumSegmentSize(536)]
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(9), configuration: c, syn: syn, now: .zero)
        let synAck = conn.takeSegments()
        #expect(synAck[0].header.flags == [.syn, .ack])
        #expect(synAck[0].header.acknowledgmentNumber == 43)
        #expect(synAck[0].header.options == [.maximumSegmentSize(1460)])
        #expect(conn.state == .synReceived)
    }

    @Test func synSentRefusedByResetWithAcceptableAck() {
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(100), configuration: .scripted, now: .zero)
        _ = conn.takeSegments()
        var rst = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 0, flags: [.rst], window: 0)
        conn.receive(rst, payload: [], now: .zero)
        #expect(conn.state == .synSent, "RST without ACK is ignored in SYN-SENT")
        rst.flags = [.rst, .ack]
        rst.acknowledgmentNumber = 555
        conn.receive(rst, payload: [], now: .zero)
        #expect(conn.state == .synSent, "RST whose ACK does not cover our SYN is ignored")
        rst.acknowledgmentNumber = 101
        conn.receive(rst, payload: [], now: .zero)
        #expect(conn.state == .closed)
        #expect(conn.takeEvents() == [.closed(.refused)])
    }

    @Test func synSentAnswersBadAckWithReset() {
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(100), configuration: .scripted, now: .zero)
        _ = conn.takeSegments()
        var h = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 1, flags: [.syn, .ack], window: 100)
        h.acknowledgmentNumber = 5000
        conn.receive(h, payload: [], now: .zero)
        let out = conn.takeSegments()
        #expect(out.count == 1 && out[0].header.flags == [.rst] && out[0].header.sequenceNumber == 5000)
        #expect(conn.state == .synSent)
    }

    @Test func simultaneousOpen() {
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(100), configuration: .scripted, now: .zero)
        _ = conn.takeSegments()
        let syn = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 300, flags: [.syn], window: 4000)
        conn.receive(syn, payload: [], now: .zero)
        #expect(conn.state == .synReceived)
        let synAck = conn.takeSegments()
        #expect(synAck.count == 1 && synAck[0].header.flags == [.syn, .ack] && synAck[0].header.sequenceNumber == 100 && synAck[0].header.acknowledgmentNumber == 301)
        var theirSynAck = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 300, flags: [.syn, .ack], window: 4000)
        theirSynAck.acknowledgmentNumber = 101
        conn.receive(theirSynAck, payload: [], now: .zero)
        // Their SYN-ACK repeats the SYN: answered, and the ACK completes our side.
        var ack = TCPHeader(sourcePort: 49_500, destinationPort: 80, sequenceNumber: 301, flags: [.ack], window: 4000)
        ack.acknowledgmentNumber = 101
        conn.receive(ack, payload: [], now: .zero)
        #expect(conn.state == .established)
        #expect(conn.takeEvents() == [.established])
    }

    @Test func synRetransmittedWithBackoffThenGivesUp() {
        var c = TCPConfiguration.scripted
        c.maximumSynRetransmissions = 2
        var conn = TCPConnection(local: TCPScript.local, remote: TCPScript.remote, initialSequence: SequenceNumber(100), configuration: c, now: .zero)
        _ = conn.takeSegments()
        #expect(conn.pollAt == .seconds(1))
        conn.poll(now: .seconds(1))
        #expect(conn.takeSegments().map(\.header.flags) == [[.syn]])
        #expect(conn.pollAt == .seconds(3))
        conn.poll(now: .seconds(3))
        #expect(conn.takeSegments().count == 1)
        conn.poll(now: .seconds(7))
        #expect(conn.state == .closed)
        #expect(conn.takeEvents() == [.closed(.retransmissionTimeout)])
    }
}

@Suite struct TCPDataTests {
    @Test func delayedAckThenEverySecondSegment() {
        var s = TCPScript()
        s.deliver([.ack, .psh], ack: s.iss + 1, payload: bytes(100))
        #expect(s.take().isEmpty, "one segment waits for the delayed ACK")
        #expect(s.takeEvents() == [.readable])
        s.advance(by: .milliseconds(40))
        let ack = s.take()
        #expect(ack.count == 1 && ack[0].header.acknowledgmentNumber == 5101)
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(1460))
        #expect(s.take().isEmpty)
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(1460))
        #expect(s.take().map(\.header.acknowledgmentNumber) == [5101 + 2920])
        #expect(s.conn.read(now: s.now) == bytes(100) + bytes(1460) + bytes(1460))
    }

    @Test func aShortTailIsNotASecondFullSizedSegment() {
        // A peer writing 2 KiB at a time under Nagle: 1460, then the 588-byte tail. Counted
        // as two segments, the tail was acknowledged at once, which let Linux's Nagle send the
        // next tail at once too; counted in bytes against the largest segment, it waits.
        var s = TCPScript()
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(1460))
        s.deliver([.ack, .psh], ack: s.iss + 1, payload: bytes(588))
        #expect(s.take().isEmpty, "2048 bytes are less than two full-sized segments")
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(1460))
        let all = SequenceNumber(5001) + 1460 + 588 + 1460
        #expect(s.take().map(\.header.acknowledgmentNumber) == [all])
        // A peer whose segments are all small is acknowledged every second one, as before.
        var small = TCPScript()
        small.deliver([.ack], ack: small.iss + 1, payload: bytes(200))
        #expect(small.take().isEmpty)
        small.deliver([.ack], ack: small.iss + 1, payload: bytes(200))
        let both = SequenceNumber(5001) + 400
        #expect(small.take().map(\.header.acknowledgmentNumber) == [both])
    }

    @Test func aPeerSendingIntoTheRoundedUpWindowCannotGrowTheBuffer() {
        // Window scaling rounds the advertised window up so its edge never moves left (RFC 7323
        // §2.4): up to 2^shift - 1 bytes beyond the free space, again after each ACK. A peer
        // that sends into that margin over and over, to an application that never reads, still
        // finds the buffer bounded.
        var c = TCPConfiguration.scripted
        c.windowScaling = true
        c.receiveBufferSize = 1 << 20
        var s = TCPScript(configuration: c, synOptions: [.maximumSegmentSize(1460), .windowScale(3)])
        #expect(s.conn.receiveShift == 5)
        var sent = 0
        var lastWindow: UInt16?
        for _ in 0..<4000 {
            let edge = s.conn.advertisedEdge
            let room = edge - s.peerNext
            let length = room > 0 ? min(room, 1460 - (sent % 7)) : 31
            s.deliver([.ack], ack: s.iss + 1, payload: bytes(length))
            sent += length
            s.advance(by: .milliseconds(40))
            if let w = s.take().last?.header.window { lastWindow = w }
        }
        #expect(s.conn.readableBytes <= c.receiveBufferSize)
        #expect(s.conn.readableBytes > c.receiveBufferSize - 1460)
        #expect(lastWindow == 0, "a full buffer shows a zero window, so the peer probes it")
    }

    @Test func outOfOrderHeldAcknowledgedAndReassembled() {
        var c = TCPConfiguration.scripted
        c.selectiveAcknowledgments = true
        var s = TCPScript(configuration: c, synOptions: [.maximumSegmentSize(1000), .sackPermitted])
        let base = s.peerNext
        s.deliver([.ack], seq: base + 200, ack: s.iss + 1, payload: bytes(100, from: 200))
        var out = s.take()
        #expect(out.count == 1 && out[0].header.acknowledgmentNumber == base)
        #expect(out[0].header.options.contains(.sack([(base + 200, base + 300)])))
        s.deliver([.ack], seq: base + 400, ack: s.iss + 1, payload: bytes(100, from: 400))
        out = s.take()
        #expect(out[0].header.options.contains(.sack([(base + 400, base + 500), (base + 200, base + 300)])), "latest block first")
        #expect(s.conn.counters.outOfOrderSegments == 2)
        #expect(s.conn.readableBytes == 0)
        s.deliver([.ack], seq: base, ack: s.iss + 1, payload: bytes(200))
        out = s.take()
        #expect(out.count == 1 && out[0].header.acknowledgmentNumber == base + 300, "the hole filled: ACK at once")
        s.deliver([.ack], seq: base + 300, ack: s.iss + 1, payload: bytes(100, from: 300))
        #expect(s.take()[0].header.acknowledgmentNumber == base + 500)
        #expect(s.conn.read(now: s.now) == bytes(500))
        #expect(s.conn.outOfOrderBytes == 0)
    }

    @Test func sequenceNumbersWrapAround() {
        var s = TCPScript(iss: 0xFFFF_FF00, peerISS: 0xFFFF_FFF0)
        var received: [UInt8] = []
        for i in 0..<4 {
            s.deliver([.ack], ack: s.iss + 1, payload: bytes(100, from: i * 100))
            received += s.conn.read(now: s.now)
        }
        #expect(received == bytes(400))
        #expect(s.conn.receiveNext == SequenceNumber(0xFFFF_FFF1) + 400)
        _ = s.take()
        #expect(s.write(bytes(600)) == 600)
        let out = s.take()
        #expect(out.count == 1 && out[0].payload.count == 600)
        s.deliver([.ack], ack: s.iss + 601)
        #expect(s.conn.unacknowledgedBytes == 0)
        #expect(s.conn.sendUnacknowledged == SequenceNumber(0xFFFF_FF00) + 601)
    }

    @Test func writesFromEveryKindOfCollectionQueueTheSameBytes() {
        // An array and a slice take the contiguous path; a range has no contiguous storage.
        var s = TCPScript()
        s.deliver([.ack], ack: s.iss + 1)
        _ = s.take()
        #expect(s.conn.write(bytes(100), now: s.now) == 100)
        #expect(s.conn.write(bytes(300)[100..<200], now: s.now) == 100)
        #expect(s.conn.write(UInt8(200)..<UInt8(255), now: s.now) == 55)
        var sent = s.take().flatMap(\.payload)
        // Nagle holds the rest back until the first segment is acknowledged.
        s.deliver([.ack], ack: s.iss + 1 + sent.count)
        sent += s.take().flatMap(\.payload)
        #expect(sent == bytes(255))
    }

    @Test func dataBeyondTheWindowIsTrimmed() {
        var c = TCPConfiguration.scripted
        c.receiveBufferSize = 1000
        var s = TCPScript(configuration: c)
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(1500))
        #expect(s.conn.readableBytes == 1000)
        s.advance(by: .milliseconds(40))
        let ack = s.take()
        #expect(ack.count == 1)
        #expect(ack.last.map { $0.header.acknowledgmentNumber } == SequenceNumber(6001))
        #expect(ack.last.map { $0.header.window } == UInt16(0), "a full buffer closes the window")
        _ = s.conn.read(maximum: 400, now: s.now)
        // 400 free is less than half the buffer or one MSS: no window update yet (receiver SWS).
        #expect(s.take().isEmpty)
        _ = s.conn.read(now: s.now)
        let update = s.take()
        #expect(update.count == 1 && update[0].header.window == 1000)
    }

    @Test func nagleCoalescesSmallWritesUnlessDisabled() {
        var s = TCPScript()
        #expect(s.write(bytes(10)) == 10)
        #expect(s.take().map(\.payload.count) == [10])
        _ = s.write(bytes(10))
        _ = s.write(bytes(10))
        #expect(s.take().isEmpty, "Nagle holds small data while some is unacknowledged")
        s.deliver([.ack], ack: s.iss + 11)
        #expect(s.take().map(\.payload.count) == [20])
        s.conn.setNagle(false, now: s.now)
        _ = s.write(bytes(5))
        #expect(s.take().map(\.payload.count) == [5])
    }

    @Test func sendBufferBackPressureAndWritableEvent() {
        var s = TCPScript(peerWindow: 1000)
        #expect(s.write(bytes(20000)) == 16384)
        #expect(s.conn.writableBytes == 0)
        _ = s.take()
        s.deliver([.ack], ack: s.iss + 1 + 1000, window: 8000)
        #expect(s.takeEvents().isEmpty, "1000 bytes free is not yet a quarter of the buffer")
        s.deliver([.ack], ack: s.iss + 1 + 5000, window: 8000)
        #expect(s.takeEvents() == [.writable])
    }

    @Test func windowScalingShiftsAdvertisedWindows() {
        var c = TCPConfiguration.scripted
        c.windowScaling = true
        c.receiveBufferSize = 1 << 20
        var s = TCPScript(configuration: c, synOptions: [.maximumSegmentSize(1460), .windowScale(3)], peerWindow: 1000)
        #expect(s.conn.receiveShift == 5 && s.conn.sendShift == 3)
        s.deliver([.ack], ack: s.iss + 1, window: 1000)
        #expect(s.conn.sendWindow == 8000)
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(100))
        s.advance(by: .milliseconds(40))
        let ack = s.take()
        #expect(Int(ack[0].header.window) << 5 >= (1 << 20) - 100 - 32)
    }
}

@Suite struct TCPClosingTests {
    @Test func activeCloseThroughTimeWait() {
        var s = TCPScript()
        s.conn.shutdownWrite(now: s.now)
        #expect(s.conn.state == .finWait1)
        let fin = s.take()
        #expect(fin.count == 1 && fin[0].header.flags == [.fin, .ack] && fin[0].header.sequenceNumber == s.iss + 1)
        s.deliver([.ack], ack: s.iss + 2)
        #expect(s.conn.state == .finWait2)
        // Half-closed: the peer still sends and we still read.
        s.deliver([.ack, .psh], ack: s.iss + 2, payload: bytes(50))
        #expect(s.conn.read(now: s.now) == bytes(50))
        s.deliver([.fin, .ack], ack: s.iss + 2)
        #expect(s.conn.state == .timeWait)
        #expect(s.take().last?.header.acknowledgmentNumber == s.peerNext)
        #expect(s.takeEvents() == [.readable, .peerFinished])
        #expect(s.conn.atEndOfStream)
        s.advance(by: .seconds(2))
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents() == [.closed(.closed)])
    }

    @Test func passiveCloseAfterPeerHalfClose() {
        var s = TCPScript()
        s.deliver([.fin, .ack], ack: s.iss + 1)
        #expect(s.conn.state == .closeWait)
        #expect(s.takeEvents() == [.peerFinished])
        #expect(s.take().count == 1)
        // Our direction stays open: data still flows to the peer.
        #expect(s.write(bytes(300)) == 300)
        #expect(s.take().map(\.payload.count) == [300])
        s.deliver([.ack], ack: s.iss + 301)
        s.conn.close(now: s.now)
        #expect(s.conn.state == .lastAck)
        #expect(s.take().map(\.header.flags) == [[.fin, .ack]])
        s.deliver([.ack], ack: s.iss + 302)
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents() == [.closed(.closed)])
    }

    @Test func simultaneousCloseGoesThroughClosing() {
        var s = TCPScript()
        s.conn.shutdownWrite(now: s.now)
        _ = s.take()
        s.deliver([.fin, .ack], ack: s.iss + 1)
        #expect(s.conn.state == .closing)
        s.deliver([.ack], ack: s.iss + 2)
        #expect(s.conn.state == .timeWait)
    }

    @Test func finRetransmittedUntilAcknowledged() {
        var s = TCPScript()
        _ = s.write(bytes(100))
        s.conn.shutdownWrite(now: s.now)
        let first = s.take()
        #expect(first.map(\.payload.count) == [100, 0])
        #expect(first.last?.header.flags.contains(.fin) == true)
        s.advance(to: s.conn.pollAt!)
        let again = s.take()
        #expect(again.count == 1 && again[0].header.flags.contains(.fin) && again[0].payload.count == 100, "the retransmission carries data and FIN together")
        s.deliver([.ack], ack: s.iss + 102)
        #expect(s.conn.state == .finWait2)
    }

    @Test func closeWithUnreadDataResets() {
        var s = TCPScript()
        s.deliver([.ack], ack: s.iss + 1, payload: bytes(10))
        _ = s.take()
        s.conn.close(now: s.now)
        let out = s.take()
        #expect(out.count == 1 && out[0].header.flags.contains(.rst))
        #expect(s.takeEvents().last == .closed(.aborted))
    }
}

@Suite struct TCPResetTests {
    @Test func exactResetClosesInWindowResetChallenges() {
        var s = TCPScript()
        s.deliver([.rst], seq: s.peerNext + 10)
        #expect(s.conn.state == .established)
        let challenge = s.take()
        #expect(challenge.count == 1 && challenge[0].header.flags == [.ack] && challenge[0].header.acknowledgmentNumber == s.peerNext)
        #expect(s.conn.counters.challengeAcks == 1)
        s.deliver([.rst], seq: s.peerNext + 100_000)
        #expect(s.take().isEmpty, "a reset outside the window is dropped silently")
        s.deliver([.rst], seq: s.peerNext)
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents() == [.closed(.reset)])
    }

    @Test func synInSynchronizedStateGetsChallengeAck() {
        var s = TCPScript()
        s.deliver([.syn], seq: s.peerNext + 5)
        #expect(s.conn.state == .established)
        #expect(s.take().map(\.header.flags) == [[.ack]])
    }

    @Test func challengeAcksAreRateLimited() {
        var s = TCPScript()
        for _ in 0..<20 { s.deliver([.syn], seq: s.peerNext + 5) }
        #expect(s.take().count == 10)
        s.advance(by: .seconds(1))
        s.deliver([.syn], seq: s.peerNext + 5)
        #expect(s.take().count == 1)
    }

    @Test func ackOfUnsentDataIsAnsweredAndDropped() {
        var s = TCPScript()
        s.deliver([.ack], ack: s.iss + 500, payload: bytes(10))
        #expect(s.conn.readableBytes == 0)
        #expect(s.take().map(\.header.acknowledgmentNumber) == [s.peerNext - 10])
    }

    @Test func tooOldAckIsChallenged() {
        var s = TCPScript(peerWindow: 1000)
        s.deliver([.ack], ack: s.iss + 1 - 5000)
        #expect(s.conn.counters.challengeAcks == 1)
    }
}

@Suite struct TCPRecoveryTests {
    /// Sends `count` full segments and returns their payload size.
    static func fill(_ s: inout TCPScript, segments count: Int) -> Int {
        let mss = s.conn.effectiveSendMSS
        #expect(s.write(bytes(mss * count)) == mss * count)
        return mss
    }

    @Test func retransmissionTimeoutBacksOffAndGivesUp() {
        var c = TCPConfiguration.scripted
        c.maximumRetransmissions = 3
        var s = TCPScript(configuration: c)
        _ = s.write(bytes(100))
        #expect(s.take().count == 1)
        var times: [Instant] = []
        for _ in 0..<3 {
            let t = s.conn.pollAt!
            s.advance(to: t)
            #expect(s.take().map(\.payload.count) == [100])
            times.append(t)
        }
        // The handshake's RTT sample of 0 set the timeout to its 200 ms floor; then it doubles.
        #expect(times == [.milliseconds(200), .milliseconds(600), .milliseconds(1400)])
        s.advance(to: s.conn.pollAt!)
        #expect(s.conn.state == .closed)
        #expect(s.take().last?.header.flags.contains(.rst) == true)
        #expect(s.takeEvents() == [.closed(.retransmissionTimeout)])
        #expect(s.conn.counters.timeouts == 4)
    }

    @Test func fastRetransmitAndNewRenoPartialAck() {
        var s = TCPScript(configuration: {
            var c = TCPConfiguration.scripted
            c.sendBufferSize = 1 << 20
            return c
        }(), synOptions: [.maximumSegmentSize(1000)])
        // Grow cwnd: ten segments acknowledged one by one.
        let first = s.write(bytes(10_000))
        #expect(first == 10_000)
        var acked = s.iss + 1
        for _ in 0..<10 {
            _ = s.take()
            acked += 1000
            s.deliver([.ack], ack: acked)
        }
        _ = s.write(bytes(8000))
        let flight = s.take()
        #expect(flight.count == 8)
        // Segments 1 and 3 lost: three duplicate ACKs for the first.
        for _ in 0..<3 { s.deliver([.ack], ack: acked) }
        let retransmit = s.take()
        #expect(retransmit.first?.header.sequenceNumber == acked)
        #expect(s.conn.counters.fastRetransmits == 1)
        // Partial ACK up to the second hole: NewReno resends it at once.
        s.deliver([.ack], ack: acked + 2000)
        let next = s.take()
        #expect(next.first?.header.sequenceNumber == acked + 2000)
        s.deliver([.ack], ack: acked + 8000)
        #expect(s.conn.unacknowledgedBytes == 0)
        #expect(s.conn.congestionWindow <= s.conn.slowStartThreshold)
    }

    @Test func sackRecoveryResendsEveryHole() {
        var c = TCPConfiguration.scripted
        c.selectiveAcknowledgments = true
        c.sendBufferSize = 1 << 20
        var s = TCPScript(configuration: c, synOptions: [.maximumSegmentSize(1000), .sackPermitted])
        var acked = s.iss + 1
        _ = s.write(bytes(10_000))
        for _ in 0..<10 {
            _ = s.take()
            acked += 1000
            s.deliver([.ack], ack: acked)
        }
        _ = s.write(bytes(10_000))
        #expect(s.take().count == 10)
        // Segments 0, 3 and 6 lost; the peer SACKs what arrived.
        let a = acked
        let blocks: [[(SequenceNumber, SequenceNumber)]] = [
            [(a + 1000, a + 2000)],
            [(a + 1000, a + 3000)],
            [(a + 4000, a + 5000), (a + 1000, a + 3000)],
            [(a + 4000, a + 6000), (a + 1000, a + 3000)],
            [(a + 7000, a + 8000), (a + 4000, a + 6000), (a + 1000, a + 3000)],
        ]
        var resent: [SequenceNumber] = []
        for b in blocks {
            s.deliver([.ack], ack: a, options: [.sack(b)])
            resent += s.take().filter { !$0.payload.isEmpty }.map(\.header.sequenceNumber)
        }
        #expect(resent.contains(a))
        #expect(resent.contains(a + 3000))
        #expect(resent.contains(a + 6000))
        #expect(!resent.contains(a + 1000), "SACKed data is not resent")
        #expect(s.conn.counters.timeouts == 0)
    }

    @Test func zeroWindowProbesUntilTheWindowOpens() {
        var s = TCPScript()
        _ = s.write(bytes(2920))
        let sent = s.take()
        #expect(sent.count == 2)
        s.deliver([.ack], ack: s.iss + 2921, window: 0)
        _ = s.write(bytes(500))
        #expect(s.take().isEmpty)
        var probes: [Instant] = []
        for _ in 0..<4 {
            s.advance(to: s.conn.pollAt!)
            let p = s.take()
            #expect(p.count == 1 && p[0].payload.count == 1 && p[0].header.sequenceNumber == s.iss + 2921, "\(p.map { ($0.header.sequenceNumber, $0.payload.count, $0.header.flags.letters) }) at \(s.now)")
            probes.append(s.now)
            s.deliver([.ack], ack: s.iss + 2921, window: 0)
        }
        #expect(s.conn.state == .established, "a peer that answers probes is never dropped")
        #expect(probes[2] - probes[1] == (probes[1] - probes[0]) * 2, "probe interval backs off")
        s.deliver([.ack], ack: s.iss + 2921, window: 8000)
        let resumed = s.take()
        #expect(resumed.reduce(0) { $0 + $1.payload.count } == 500)
        #expect(s.conn.counters.zeroWindowProbes == 4)
    }

    @Test func keepAliveProbesThenDrops() {
        var c = TCPConfiguration.scripted
        c.keepAlive = TCPKeepAlive(idle: .seconds(60), interval: .seconds(10), count: 3)
        var s = TCPScript(configuration: c)
        s.advance(to: .seconds(60))
        var probe = s.take()
        #expect(probe.count == 1 && probe[0].header.sequenceNumber == s.iss && probe[0].payload.isEmpty)
        // Answered: the idle clock restarts.
        s.deliver([.ack], ack: s.iss + 1)
        s.advance(to: .seconds(110))
        #expect(s.take().isEmpty)
        s.advance(to: .seconds(120))
        #expect(s.take().count == 1)
        s.advance(to: .seconds(130))
        s.advance(to: .seconds(140))
        probe = s.take()
        #expect(probe.count == 2)
        s.advance(to: .seconds(150))
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents() == [.closed(.keepAliveTimeout)])
    }

    @Test func userTimeoutAbortsStalledData() {
        var c = TCPConfiguration.scripted
        c.userTimeout = .seconds(5)
        var s = TCPScript(configuration: c)
        _ = s.write(bytes(100))
        _ = s.take()
        s.advance(to: .seconds(5))
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents() == [.closed(.userTimeout)])
    }

    @Test func timestampsEchoAndSampleRTT() {
        var c = TCPConfiguration.scripted
        c.timestamps = true
        var s = TCPScript(configuration: c, synOptions: [.maximumSegmentSize(1460), .timestamps(value: 777, echoReply: 0)])
        #expect(s.conn.timestampsEnabled)
        #expect(s.conn.effectiveSendMSS == 1448)
        s.now = .milliseconds(500)
        _ = s.write(bytes(10))
        let seg = s.take()[0]
        guard case let .timestamps(value, echo)? = seg.header.options.first(where: { if case .timestamps = $0 { return true }; return false }) else {
            Issue.record("no timestamps option")
            return
        }
        #expect(echo == 777)
        s.now = .milliseconds(620)
        s.deliver([.ack], ack: s.iss + 11, options: [.timestamps(value: 800, echoReply: value)])
        // The handshake sampled 0 ms; 120 ms from the echoed timestamp moves SRTT by an eighth.
        #expect(s.conn.retransmissionTimer.smoothedRTT == .milliseconds(15))
    }
}

@Suite struct RetransmissionTimerTests {
    @Test func rfc6298Estimates() {
        var t = RetransmissionTimer()
        #expect(t.timeout == .seconds(1))
        t.sample(.milliseconds(100))
        #expect(t.smoothedRTT == .milliseconds(100))
        #expect(t.timeout == .milliseconds(300))
        t.sample(.milliseconds(200))
        // SRTT = 7/8·100 + 1/8·200 = 112.5; RTTVAR = 3/4·50 + 1/4·100 = 62.5; RTO = 112.5 + 250.
        #expect(t.timeout == .microseconds(362_500))
        t.expired()
        t.expired()
        #expect(t.timeout == .microseconds(1_450_000))
        for _ in 0..<10 { t.expired() }
        #expect(t.timeout == .seconds(60))
    }

    @Test func anAbsurdSampleOrBackoffLandsAtTheMaximum() {
        // A peer's echoed timestamp can say anything; nothing here may trap.
        var t = RetransmissionTimer()
        t.sample(.seconds(Int64.max))
        #expect(t.smoothedRTT == .seconds(60) && t.timeout == .seconds(60))
        t.sample(.seconds(-5))
        #expect(t.timeout == .seconds(60), "SRTT 52.5 s + 4 × RTTVAR is still past the maximum")
        var u = RetransmissionTimer(initial: .seconds(Int64.max / 2))
        for _ in 0..<200 { u.expired() }
        #expect(u.timeout == .seconds(60))
        var w = RetransmissionTimer(maximum: .seconds(Int64.max))
        w.sample(.seconds(Int64.max))
        w.sample(.seconds(Int64.max))
        #expect(w.timeout == w.maximum && w.maximum > .seconds(1_000_000_000), "no cap at all is the largest cap")
        var v = RetransmissionTimer()
        for _ in 0..<20 { v.sample(.milliseconds(10)) }
        #expect(v.timeout == .milliseconds(200), "the minimum holds for a fast path")
    }

    @Test func sipHashReferenceVector() {
        // The reference implementation's vector: key 00..0f, message 00..0e.
        let k0 = UInt64(littleEndianBytes: Array(0..<8))
        let k1 = UInt64(littleEndianBytes: Array(8..<16))
        #expect(SipHash24(key0: k0, key1: k1).hash(Array(0..<15)) == 0xA129_CA61_49BE_45E5)
    }
}

extension UInt64 {
    init(littleEndianBytes b: [UInt8]) {
        self = b.enumerated().reduce(0) { $0 | UInt64($1.element) << (8 * UInt64($1.offset)) }
    }
}
