import Testing
@testable import NetStack

/// Fragments as a hostile terminal sends them: each test is an attack that once killed or
/// swelled the host, or a rule of RFC 791/815 the reassembly must keep.
@Suite struct HostileFragmentTests {
    func header(id: UInt16 = 9, from source: IPv4Address = Peer.them, offset: Int, more: Bool, length: Int,
                proto: IPProtocol = IPProtocol.udp, options: [UInt8] = []) -> IPv4Header {
        var h = IPv4Header(protocol: proto, source: source, destination: Peer.us, payloadLength: length)
        h.identification = id
        h.fragmentOffset = offset
        h.moreFragments = more
        h.options = options
        return h
    }

    /// Offsets 1000 (more), 16 (last) and 0 (more): the last fragment ends the datagram at 24
    /// bytes, so the piece held at 1000 lies beyond it. Once a byte count said "complete" and
    /// the copy trapped past the end.
    @Test func aPieceBeyondTheEndDropsTheDatagram() {
        var r = FragmentReassembly()
        let eight = [UInt8](repeating: 0xAB, count: 8)
        #expect(r.add(header: header(offset: 1000, more: true, length: 8), payload: eight, now: .zero) == nil)
        #expect(r.add(header: header(offset: 16, more: false, length: 8), payload: eight, now: .zero) == nil)
        #expect(r.add(header: header(offset: 0, more: true, length: 8), payload: eight, now: .zero) == nil)
        #expect(r.drops.beyondEnd == 1 && r.reassembled == 0)
        #expect(r.bytesHeld == 8, "only the piece after the drop is held")
        // And when the end arrives first, a later piece beyond it is refused too.
        var s = FragmentReassembly()
        #expect(s.add(header: header(offset: 8, more: false, length: 8), payload: eight, now: .zero) == nil)
        #expect(s.add(header: header(offset: 32, more: true, length: 8), payload: eight, now: .zero) == nil)
        #expect(s.drops.beyondEnd == 1 && s.datagramsPending == 0)
    }

    /// The same attack through the whole stack: the host is alive and still answers.
    @Test func theStackSurvivesThePieceBeyondTheEnd() {
        var s = IPStack(configuration: IPStackConfiguration(address: Peer.us), seed: 1)
        let eight = [UInt8](repeating: 0, count: 8)
        s.receive(packet: Peer.ip(IPProtocol.udp, eight, id: 77, offset: 1000, more: true), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, eight, id: 77, offset: 16), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, eight, id: 77, offset: 0, more: true), now: .zero)
        #expect(s.counters.reassemblyDropReasons.beyondEnd == 1)
        s.receive(packet: Peer.icmpEcho(id: 1, seq: 1, data: bytes(8)), now: .zero)
        #expect(s.takeOutgoing().count == 1, "echo still answered")
    }

    /// RFC 815: completion is every hole filled, in any order of arrival.
    @Test func outOfOrderPiecesMakeTheWholeDatagram() {
        var r = FragmentReassembly()
        let data = bytes(40)
        #expect(r.add(header: header(offset: 32, more: false, length: 8), payload: Array(data[32...]), now: .zero) == nil)
        #expect(r.add(header: header(offset: 8, more: true, length: 16), payload: Array(data[8..<24]), now: .zero) == nil)
        #expect(r.add(header: header(offset: 24, more: true, length: 8), payload: Array(data[24..<32]), now: .zero) == nil)
        // A duplicate is harmless.
        #expect(r.add(header: header(offset: 24, more: true, length: 8), payload: Array(data[24..<32]), now: .zero) == nil)
        let whole = r.add(header: header(offset: 0, more: true, length: 8), payload: Array(data[0..<8]), now: .zero)
        #expect(whole?.1 == data)
        #expect(whole?.0.payloadLength == 40 && whole?.0.moreFragments == false && whole?.0.fragmentOffset == 0)
        #expect(r.bytesHeld == 0 && r.datagramsPending == 0 && r.reassembled == 1)
    }

    @Test func overlapsWithOtherBytesPoisonTheDatagram() {
        var r = FragmentReassembly()
        #expect(r.add(header: header(offset: 0, more: true, length: 16), payload: bytes(16), now: .zero) == nil)
        #expect(r.add(header: header(offset: 8, more: false, length: 16), payload: bytes(16, from: 100), now: .zero) == nil)
        #expect(r.drops.overlapping == 1 && r.datagramsPending == 0 && r.bytesHeld == 0)
    }

    /// A first fragment with 40 bytes of options and 65515 bytes of payload in all: the
    /// datagram would be 65575 bytes. It once reached the ICMP error path (no UDP port bound)
    /// and trapped emitting a quoted total length above 65535.
    @Test func aDatagramOverTheIPv4MaximumIsDropped() {
        var config = IPStackConfiguration(address: Peer.us)
        config.reassembly = FragmentReassembly.Limits(memory: 128 * 1024)
        var s = IPStack(configuration: config, seed: 1)
        let options = [UInt8](repeating: 1, count: 40) // 40 NOPs
        // A whole UDP datagram of 65515 bytes (length field right, no checksum) to port 9999.
        let udp = BigEndian.bytes(UInt16(5353)) + BigEndian.bytes(UInt16(9999)) + BigEndian.bytes(UInt16(65515)) + [0, 0]
            + [UInt8](repeating: 0, count: 65507)
        var first = header(id: 5, offset: 0, more: true, length: 32000, options: options)
        first.payloadLength = 32000
        s.receive(packet: first.emit() + Array(udp[0..<32000]), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[32000..<64000]), id: 5, offset: 32000, more: true), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[64000...]), id: 5, offset: 64000), now: .zero)
        #expect(s.counters.reassemblyDropReasons.tooLarge == 1)
        #expect(s.counters.datagramsReassembled == 0 && s.counters.icmpErrorsSent == 0)
        #expect(s.reassemblyBytes.fragments == 0)
        s.receive(packet: Peer.icmpEcho(id: 1, seq: 1, data: bytes(8)), now: .zero)
        #expect(s.takeOutgoing().count == 1, "echo still answered")
    }

    /// 200000 empty first fragments from random sources once grew the host by 67 MB while it
    /// reported 0 bytes held: an empty non-final fragment fills no hole and is dropped.
    @Test func emptyFragmentsHoldNothing() {
        var s = IPStack(configuration: IPStackConfiguration(address: Peer.us), seed: 1)
        var random = SplitMix64(seed: 3)
        for i in 0..<200_000 {
            let source = IPv4Address(UInt32(truncatingIfNeeded: random.next()))
            s.receive(packet: Peer.ip(IPProtocol.udp, [], from: source, id: UInt16(truncatingIfNeeded: i), more: true), now: .zero)
        }
        #expect(s.counters.reassemblyDropReasons.malformed == 200_000)
        #expect(s.reassemblyBytes.fragments == 0)
        #expect(s.pollAt == nil, "nothing pending, nothing to wake for")
    }

    /// Datagrams pending are capped in total and per source; the oldest go first, counted.
    @Test func pendingDatagramsAreCappedInTotalAndPerSource() {
        var r = FragmentReassembly(limits: .init(datagrams: 8, datagramsPerSource: 3))
        for id in 0..<5 {
            _ = r.add(header: header(id: UInt16(id), offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(Int64(id)))
        }
        #expect(r.datagramsPending == 3 && r.drops.evicted == 2)
        // The survivors are the newest three: the oldest left first, so the deadline moved on.
        #expect(r.pollAt == Instant.milliseconds(2) + .seconds(30))
        for n in 0..<20 {
            let source = IPv4Address(192, 0, 2, UInt8(n))
            _ = r.add(header: header(id: 1, from: source, offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(10 + Int64(n)))
        }
        #expect(r.datagramsPending == 8 && r.drops.evicted == 2 + 3 + 12)
        #expect(r.bytesHeld == 64)
    }

    /// Eight-byte fragments are charged for their bookkeeping too: a datagram sent in 8000 of
    /// them cannot hold more than the memory limit, counting each piece's overhead.
    @Test func tinyFragmentsAreChargedTheirBookkeeping() {
        var r = FragmentReassembly(limits: .init(memory: 64 * 1024))
        for i in 0..<8000 {
            _ = r.add(header: header(offset: 8 * (8000 - i), more: true, length: 8), payload: bytes(8), now: .zero)
            #expect(r.memoryHeld <= 64 * 1024)
        }
        #expect(r.memoryHeld == r.bytesHeld + (r.bytesHeld / 8) * FragmentReassembly.pieceOverhead)
        #expect(r.bytesHeld <= 64 * 1024 / (8 + FragmentReassembly.pieceOverhead) * 8)
        #expect(r.drops.evicted >= 1)
    }

    /// `pollAt` is the oldest datagram's deadline, kept as datagrams come and go.
    @Test func deadlinesFollowTheOldestDatagram() {
        var r = FragmentReassembly()
        _ = r.add(header: header(id: 1, offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(0))
        _ = r.add(header: header(id: 2, offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(5))
        _ = r.add(header: header(id: 3, offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(9))
        #expect(r.pollAt == Instant.milliseconds(0) + .seconds(30))
        // The oldest completes: the next one's deadline is due next.
        #expect(r.add(header: header(id: 1, offset: 8, more: false, length: 4), payload: bytes(4), now: .milliseconds(10)) != nil)
        #expect(r.pollAt == Instant.milliseconds(5) + .seconds(30))
        let expired = r.expire(now: .milliseconds(5) + .seconds(30))
        #expect(expired.count == 1 && r.timedOut == 1 && r.datagramsPending == 1)
        #expect(r.pollAt == Instant.milliseconds(9) + .seconds(30))
        // Many datagrams coming and going leave no trail behind the oldest.
        for id in 100..<5000 {
            _ = r.add(header: header(id: UInt16(id), offset: 0, more: true, length: 8), payload: bytes(8), now: .milliseconds(20))
            _ = r.add(header: header(id: UInt16(id), offset: 8, more: false, length: 8), payload: bytes(8), now: .milliseconds(20))
        }
        #expect(r.reassembled == 1 + 4900 && r.datagramsPending == 1)
        #expect(r.pollAt == Instant.milliseconds(9) + .seconds(30))
    }
}

@Suite struct SaturatingTimeTests {
    @Test func instantArithmeticSaturates() {
        let far = Instant(nanoseconds: .max - 5)
        #expect((far + .seconds(1)).nanoseconds == .max)
        #expect((Instant(nanoseconds: .min + 5) + .seconds(-1)).nanoseconds == .min)
        #expect((Instant(nanoseconds: .max) - Instant(nanoseconds: .min)).nanoseconds == .max)
        #expect(Duration.seconds(Int64.max).nanoseconds == .max)
        #expect(Duration.seconds(Int64.min).nanoseconds == .min)
        #expect(Instant.seconds(1e300).nanoseconds == .max && Instant.seconds(-.infinity).nanoseconds == .min)
        #expect(Instant.seconds(.nan) == .zero)
        #expect(Instant.milliseconds(.max).nanoseconds == .max)
    }

    @Test func durationsOnEitherSideOfTheShortPathConvertExactly() {
        // Under about 9.2 s the attoseconds fit 64 bits and take the short path.
        #expect(Duration.milliseconds(1500).nanoseconds == 1_500_000_000)
        #expect(Duration.milliseconds(-1500).nanoseconds == -1_500_000_000)
        #expect(Duration.seconds(9).nanoseconds == 9_000_000_000)
        #expect(Duration.seconds(10).nanoseconds == 10_000_000_000)
        #expect(Duration.seconds(-60).nanoseconds == -60_000_000_000)
        #expect((Duration.seconds(9) + .milliseconds(500)).nanoseconds == 9_500_000_000)
        #expect(Duration(secondsComponent: 3, attosecondsComponent: 1_999_999_999).nanoseconds == 3_000_000_001, "truncated")
        #expect(Duration(secondsComponent: 30, attosecondsComponent: 1_999_999_999).nanoseconds == 30_000_000_001, "truncated")
        #expect(Duration.nanoseconds(Int64.max).nanoseconds == .max)
    }
}

@Suite struct EmitBoundsTests {
    /// Emit clamps what it cannot say instead of trapping.
    @Test func anOversizedHeaderEmitsClamped() throws {
        var h = IPv4Header(protocol: IPProtocol.udp, source: Peer.them, destination: Peer.us, payloadLength: 70000)
        h.options = [UInt8](repeating: 1, count: 2000)
        h.fragmentOffset = 1 << 20
        let bytes = h.emit()
        #expect(bytes.count == 60 && bytes[0] == 0x4F)
        #expect(BigEndian.uint16(bytes, 2) == 65535)
        #expect(BigEndian.uint16(bytes, 6) & 0x1FFF == 0x1FFF)
    }
}

@Suite struct ListenerBoundsTests {
    func syn(from port: UInt16, to listening: UInt16 = 80) -> [UInt8] {
        var h = TCPHeader(sourcePort: port, destinationPort: listening, sequenceNumber: 1000, flags: [.syn], window: 8192)
        h.options = [.maximumSegmentSize(1460)]
        return Peer.tcp(h)
    }

    /// A listener holds at most its limit of connections; a SYN beyond gets a reset at once.
    @Test func aListenerRefusesConnectionsBeyondItsLimit() throws {
        var s = IPStack(configuration: IPStackConfiguration(address: Peer.us), seed: 1)
        try s.listen(port: 80, maximumConnections: 2)
        for p in 1000..<1003 { s.receive(packet: syn(from: UInt16(p)), now: .zero) }
        let out = s.takeOutgoing().map(Peer.tcpHeader)
        #expect(out.filter { $0.flags.contains(.syn) && $0.flags.contains(.ack) }.count == 2)
        #expect(out.filter { $0.flags.contains(.rst) }.map(\.destinationPort) == [1002])
        #expect(s.counters.tcpListenRefused == 1 && s.connectionCount == 2)
    }

    /// Connections still in their handshake when the port stops listening are reset: once
    /// they completed into established orphans no one read, holding the port's backlog.
    @Test func unlistenResetsConnectionsNotYetAccepted() throws {
        var s = IPStack(configuration: IPStackConfiguration(address: Peer.us), seed: 1)
        try s.listen(port: 80)
        for p in 1000..<1010 { s.receive(packet: syn(from: UInt16(p)), now: .zero) }
        _ = s.takeOutgoing()
        #expect(s.connectionCount == 10)
        s.unlisten(port: 80)
        let out = s.takeOutgoing().map(Peer.tcpHeader)
        #expect(out.filter { $0.flags.contains(.rst) }.count == 10)
        #expect(s.connectionCount == 0)
        // The port can listen again and takes a new connection.
        try s.listen(port: 80)
        s.receive(packet: syn(from: 2000), now: .zero)
        #expect(s.takeOutgoing().map(Peer.tcpHeader).first?.flags.contains(.syn) == true)
    }
}
