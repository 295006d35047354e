import Testing
@testable import NetStack

/// Packets built by hand, as a peer would send them.
enum Peer {
    static let us = IPv4Address(10, 1, 0, 1)
    static let them = IPv4Address(10, 1, 0, 2)

    static func ip(_ proto: IPProtocol, _ payload: [UInt8], from: IPv4Address = them, to: IPv4Address = us, id: UInt16 = 7,
                   offset: Int = 0, more: Bool = false) -> [UInt8] {
        var h = IPv4Header(protocol: proto, source: from, destination: to, payloadLength: payload.count)
        h.identification = id
        h.fragmentOffset = offset
        h.moreFragments = more
        return h.emit() + payload
    }

    static func icmpEcho(id: UInt16, seq: UInt16, data: [UInt8]) -> [UInt8] {
        let h = ICMPHeader(type: ICMPHeader.echoRequest, code: 0, restOfHeader: UInt32(id) << 16 | UInt32(seq))
        return ip(IPProtocol.icmp, h.emit(payload: data) + data)
    }

    static func udp(to port: UInt16, _ data: [UInt8]) -> [UInt8] {
        let h = UDPHeader(sourcePort: 5353, destinationPort: port, payloadLength: data.count)
        return ip(IPProtocol.udp, h.emit(source: them, destination: us, payload: data) + data)
    }

    static func tcp(_ h: TCPHeader, _ payload: [UInt8] = []) -> [UInt8] {
        ip(IPProtocol.tcp, h.emit(source: them, destination: us, payload: payload) + payload)
    }

    static func tcpHeader(_ packet: [UInt8]) -> TCPHeader {
        let segment = parse(packet).1
        return try! segment.withUnsafeBytes { try TCPHeader(parsing: $0) }
    }

    static func parse(_ packet: [UInt8]) -> (IPv4Header, [UInt8]) {
        let h = try! packet.withUnsafeBytes { try IPv4Header(parsing: $0) }
        return (h, Array(packet[h.headerLength..<h.totalLength]))
    }
}

@Suite struct IPStackTests {
    func stack() -> IPStack { IPStack(configuration: IPStackConfiguration(address: Peer.us), seed: 42) }

    @Test func echoRequestIsAnswered() {
        var s = stack()
        s.receive(packet: Peer.icmpEcho(id: 0x1234, seq: 9, data: bytes(56)), now: .zero)
        let out = s.takeOutgoing()
        #expect(out.count == 1)
        let (ip, icmp) = Peer.parse(out[0])
        #expect(ip.destination == Peer.them && ip.protocol == IPProtocol.icmp)
        #expect(icmp[0] == ICMPHeader.echoReply && InternetChecksum.checksum(icmp) == 0)
        #expect(Array(icmp[4..<8]) == [0x12, 0x34, 0, 9] && Array(icmp[8...]) == bytes(56))
    }

    @Test func pingReportsTheReply() {
        var a = stack()
        var b = IPStack(configuration: IPStackConfiguration(address: Peer.them), seed: 7)
        a.ping(Peer.them, identifier: 1, sequence: 2, payload: bytes(8), now: .zero)
        for p in a.takeOutgoing() { b.receive(packet: p, now: .zero) }
        for p in b.takeOutgoing() { a.receive(packet: p, now: .zero) }
        #expect(a.takeEvents() == [.echoReply(from: Peer.them, identifier: 1, sequence: 2, payload: bytes(8))])
    }

    @Test func unknownProtocolAndClosedUDPPortGetUnreachables() throws {
        var s = stack()
        s.receive(packet: Peer.ip(.gre, bytes(20)), now: .zero)
        s.receive(packet: Peer.udp(to: 9999, bytes(10)), now: .zero)
        let out = s.takeOutgoing()
        #expect(out.count == 2)
        let codes = out.map { Peer.parse($0).1 }.map { ($0[0], $0[1]) }
        #expect(codes.map(\.0) == [3, 3] && codes.map(\.1) == [2, 3])
        // The quoted datagram: the original header and its first 8 payload bytes.
        let quoted = Peer.parse(out[1]).1
        #expect(quoted.count == 8 + 20 + 8)
        #expect(s.counters.udpNoPort == 1 && s.counters.ipUnknownProtocol == 1)
    }

    @Test func icmpErrorsAreRateLimited() {
        var s = stack()
        for i in 0..<30 { s.receive(packet: Peer.udp(to: UInt16(1000 + i), []), now: .zero) }
        #expect(s.takeOutgoing().count == 10)
        #expect(s.counters.icmpRateLimited == 20)
        s.receive(packet: Peer.udp(to: 1, []), now: .milliseconds(500))
        #expect(s.takeOutgoing().count == 1, "the bucket refills at ten per second")
    }

    @Test func udpDatagramsAreQueuedOnBoundPorts() throws {
        var s = stack()
        try s.bindUDP(port: 53)
        #expect(throws: StackError.portInUse(53)) { try s.bindUDP(port: 53) }
        s.receive(packet: Peer.udp(to: 53, bytes(30)), now: .zero)
        #expect(s.takeEvents() == [.datagram(port: 53)])
        let datagram = s.receiveDatagram(port: 53)
        let d = try #require(datagram)
        #expect(d.from == TCPEndpoint(Peer.them, 5353) && d.payload == bytes(30))
        s.sendDatagram(from: 53, to: d.from, payload: bytes(4), now: .zero)
        let (ip, udp) = Peer.parse(s.takeOutgoing()[0])
        let pseudo = InternetChecksum.pseudoHeaderSum(source: ip.source, destination: ip.destination, protocol: IPProtocol.udp, length: udp.count)
        #expect(InternetChecksum.finish(InternetChecksum.sum(udp, into: pseudo)) == 0)
    }

    @Test func badChecksumsAndForeignDestinationsAreCounted() {
        var s = stack()
        var p = Peer.icmpEcho(id: 1, seq: 1, data: [])
        p[10] ^= 0xFF
        s.receive(packet: p, now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.icmp, [8, 0, 0, 0, 0, 0, 0, 0], to: IPv4Address(10, 9, 9, 9)), now: .zero)
        s.receive(packet: [0x45, 0, 0], now: .zero)
        var tcp = TCPHeader(sourcePort: 1, destinationPort: 80, sequenceNumber: 1, flags: [.syn], window: 100).emit(source: Peer.them, destination: Peer.us, payload: [])
        tcp[16] ^= 1
        s.receive(packet: Peer.ip(IPProtocol.tcp, tcp), now: .zero)
        let c = s.counters
        #expect(c.ipChecksumErrors == 1 && c.ipNotForUs == 1 && c.ipMalformed == 1 && c.tcpChecksumErrors == 1)
        #expect(s.takeOutgoing().isEmpty)
    }

    @Test func segmentsForNoConnectionAreReset() {
        var s = stack()
        var syn = TCPHeader(sourcePort: 4000, destinationPort: 81, sequenceNumber: 100, flags: [.syn], window: 1000)
        s.receive(packet: Peer.tcp(syn), now: .zero)
        var ack = TCPHeader(sourcePort: 4000, destinationPort: 81, sequenceNumber: 100, flags: [.ack], window: 1000)
        ack.acknowledgmentNumber = 777
        s.receive(packet: Peer.tcp(ack), now: .zero)
        syn.flags = [.rst]
        s.receive(packet: Peer.tcp(syn), now: .zero)
        let resets = s.takeOutgoing().map(Peer.tcpHeader)
        #expect(resets.count == 2, "a reset is never answered")
        #expect(resets[0].flags == [.rst, .ack] && resets[0].sequenceNumber == 0 && resets[0].acknowledgmentNumber == 101)
        #expect(resets[1].flags == [.rst] && resets[1].sequenceNumber == 777)
    }

    @Test func twoStacksConnectTransferAndClose() throws {
        var a = stack()
        var b = IPStack(configuration: IPStackConfiguration(address: Peer.them), seed: 9)
        try b.listen(port: 7)
        var now = Instant.zero
        let c = try a.connect(to: TCPEndpoint(Peer.them, 7), now: now)
        var s: ConnectionID?
        var got: [UInt8] = []
        let data = bytes(300_000)
        var written = 0
        for _ in 0..<10_000 {
            let fromA = a.takeOutgoing()
            for p in fromA { b.receive(packet: p, now: now) }
            let fromB = b.takeOutgoing()
            for p in fromB { a.receive(packet: p, now: now) }
            if s == nil { s = b.accept(port: 7) }
            if written < data.count {
                written += a.write(c, data[written...], now: now)
                if written == data.count { a.shutdownWrite(c, now: now) }
            }
            if let s { got += b.read(s, now: now) }
            if let s, b.atEndOfStream(s) { b.close(s, now: now) }
            if a.connectionCount == 0 && b.connectionCount == 0 { break }
            if let t = earliest(a.pollAt, b.pollAt), t > now, fromA.isEmpty && fromB.isEmpty {
                now = t
                a.poll(now: now)
                b.poll(now: now)
            }
        }
        #expect(got == data)
        #expect(a.connectionCount == 0 && b.connectionCount == 0, "both sides finished (TIME-WAIT ran out)")
        #expect(a.counters.tcp.retransmittedSegments == 0)
    }

    /// A stack with `acknowledgeAtCollection` as given, and a connection on port 80 that a peer
    /// at port 4000 opened (sequence 1001 onwards), accepted; and the peer's next segment.
    func acceptedConnection(acknowledgeAtCollection: Bool) throws -> (IPStack, ConnectionID, TCPHeader) {
        var c = IPStackConfiguration(address: Peer.us)
        c.acknowledgeAtCollection = acknowledgeAtCollection
        c.tcp.windowScaling = false
        c.tcp.timestamps = false
        c.tcp.receiveBufferSize = 60000
        var s = IPStack(configuration: c, seed: 42)
        try s.listen(port: 80)
        var syn = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1000, flags: [.syn], window: 65535)
        syn.options = [.maximumSegmentSize(1460)]
        s.receive(packet: Peer.tcp(syn), now: .zero)
        let synAck = Peer.tcpHeader(s.takeOutgoing()[0])
        var seg = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1001, flags: [.ack], window: 65535)
        seg.acknowledgmentNumber = synAck.sequenceNumber + 1
        s.receive(packet: Peer.tcp(seg), now: .zero)
        let accepted = s.accept(port: 80)
        return (s, try #require(accepted), seg)
    }

    /// Packets handed back once framed carry the next segments (the payload copied from the
    /// send buffer straight into them): what goes out is still every byte, in order.
    @Test func packetsHandedBackCarryTheNextSegments() throws {
        var (s, id, _) = try acceptedConnection(acknowledgeAtCollection: true)
        let data = bytes(40 * 1460)
        #expect(s.write(id, data, now: .zero) == data.count)
        var packets: [[UInt8]] = []
        var sent: [UInt8] = []
        s.takeOutgoing(into: &packets)
        let first = packets.count
        #expect(first >= 2)
        var rounds = 0, deadlines = 0
        while !packets.isEmpty {
            for p in packets { sent += p[40...] }
            let handedBack = packets.count
            let pooled = s.pooledPacketBuffers
            s.recycle(&packets)
            #expect(packets.isEmpty && s.pooledPacketBuffers == min(pooled + handedBack, 64))
            // The peer acknowledges everything sent so far; the next segments go out in the
            // arrays handed back.
            var ack = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1001, flags: [.ack], window: 65535)
            ack.acknowledgmentNumber = try #require(s.connection(id)).sendNext
            s.receive(packet: Peer.tcp(ack), now: .milliseconds(Int64(rounds)))
            let before = s.pooledPacketBuffers
            // With data in flight, the retransmission timer is armed.
            if s.pollAtInPlace() != nil { deadlines += 1 }
            s.takeOutgoing(into: &packets)
            if !packets.isEmpty {
                #expect(s.pooledPacketBuffers == before - min(before, packets.count), "taken from the pool")
            }
            rounds += 1
        }
        #expect(sent == data)
        #expect(rounds > 2 && deadlines > 0)
        // All acknowledged: the send buffer holds nothing more.
        #expect(try #require(s.connection(id)).unacknowledgedBytes == 0)
    }

    /// Segments sent and all acknowledged within one batch (before the stack collects them):
    /// the acknowledged bytes stay in the send buffer until the segments carrying them are
    /// built, so each goes out whole, and then they are dropped.
    @Test func aBatchSentAndAcknowledgedAtOnceStillSendsItsSegments() throws {
        var (s, id, _) = try acceptedConnection(acknowledgeAtCollection: true)
        // Within the initial congestion window: every byte leaves in this batch.
        let data = bytes(3 * 1460)
        #expect(s.write(id, data, now: .zero) == data.count)
        let sendNext = try #require(s.connection(id)).sendNext
        #expect(try #require(s.connection(id)).pendingSegments.count == 3)
        var ack = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1001, flags: [.ack], window: 65535)
        ack.acknowledgmentNumber = sendNext
        s.receive(packet: Peer.tcp(ack), now: .milliseconds(1))
        var packets: [[UInt8]] = []
        s.takeOutgoing(into: &packets)
        #expect(packets.count == 3)
        #expect(packets.map { $0.count - 20 - Peer.tcpHeader($0).headerLength } == [1460, 1460, 1460])
        #expect(Array(packets.map { Array($0[(20 + Peer.tcpHeader($0).headerLength)...]) }.joined()) == data)
        let c = try #require(s.connection(id))
        #expect(c.unacknowledgedBytes == 0)
        #expect(c.sendBuffer.count == 0 && c.acknowledgedHeld == 0)
    }

    @Test func acknowledgedAtCollectionOneACKAnswersABatchWithTheWindowReopened() throws {
        var (s, id, seg) = try acceptedConnection(acknowledgeAtCollection: true)
        // Five full segments in one batch, each read by the application as it comes.
        var read: [UInt8] = []
        for i in 0..<5 {
            seg.sequenceNumber = SequenceNumber(1001) + i * 1460
            s.receive(packet: Peer.tcp(seg, bytes(1460, from: i * 1460)), now: .zero)
            _ = s.takeEvents()
            read += s.read(id, now: .zero)
        }
        #expect(read == bytes(5 * 1460))
        let acks = s.takeOutgoing().map(Peer.tcpHeader)
        #expect(acks.count == 1, "one ACK for the batch, not one per two segments and window updates")
        let expectedAck = SequenceNumber(1001) + 5 * 1460
        #expect(acks.first?.acknowledgmentNumber == expectedAck)
        let reopened: UInt16 = 60000
        #expect(acks.first?.window == reopened, "the window the reads reopened")
        // Without it, the same batch is answered as it comes in.
        var (p, id2, seg2) = try acceptedConnection(acknowledgeAtCollection: false)
        for i in 0..<5 {
            seg2.sequenceNumber = SequenceNumber(1001) + i * 1460
            p.receive(packet: Peer.tcp(seg2, bytes(1460, from: i * 1460)), now: .zero)
            _ = p.takeEvents()
            _ = p.read(id2, now: .zero)
        }
        #expect(p.takeOutgoing().count > 1)

        // A hole in a held batch: every segment beyond it is answered at once by a duplicate
        // ACK (three make the peer's fast retransmit, RFC 5681 §3.2), not one for the batch.
        let base = 1001 + 5 * 1460
        for i in [0, 2, 3, 4] {
            seg.sequenceNumber = SequenceNumber(UInt32(base + i * 1460))
            s.receive(packet: Peer.tcp(seg, bytes(1460)), now: .zero)
        }
        let duplicates = s.takeOutgoing().map(Peer.tcpHeader).map(\.acknowledgmentNumber)
        let hole = SequenceNumber(UInt32(base + 1460))
        #expect(duplicates == [hole, hole, hole])
    }

    @Test func outOfOrderFloodStaysWithinTheReceiveBuffer() throws {
        var s = stack()
        try s.listen(port: 80)
        var syn = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1000, flags: [.syn], window: 65535)
        syn.options = [.maximumSegmentSize(1460), .sackPermitted, .windowScale(7)]
        s.receive(packet: Peer.tcp(syn), now: .zero)
        let synAck = Peer.tcpHeader(s.takeOutgoing()[0])
        var ack = TCPHeader(sourcePort: 4000, destinationPort: 80, sequenceNumber: 1001, flags: [.ack], window: 65535)
        ack.acknowledgmentNumber = synAck.sequenceNumber + 1
        s.receive(packet: Peer.tcp(ack), now: .zero)
        // Every other 1000-byte segment, far beyond the window too; the first byte never comes.
        var seg = ack
        for i in stride(from: 1, to: 4000, by: 2) {
            seg.sequenceNumber = SequenceNumber(1001) + i * 1000
            s.receive(packet: Peer.tcp(seg, bytes(1000)), now: .zero)
        }
        let held = s.reassemblyBytes.outOfOrder
        #expect(held > 0)
        #expect(held <= IPStackConfiguration(address: Peer.us).tcp.receiveBufferSize)
        let accepted = s.accept(port: 80)
        let id = try #require(accepted)
        #expect(s.connection(id)!.outOfOrderSegmentCount <= TCPConfiguration().maximumOutOfOrderSegments)
    }

    @Test func fragmentFloodStaysWithinTheReassemblyLimit() {
        var s = stack()
        // 2000 datagrams, each missing its last fragment.
        for id in 0..<2000 {
            s.receive(packet: Peer.ip(IPProtocol.udp, bytes(1200), id: UInt16(id), offset: 0, more: true), now: .milliseconds(Int64(id)))
        }
        #expect(s.reassemblyBytes.fragments <= 64 * 1024)
        #expect(s.counters.reassemblyDrops > 0)
        s.poll(now: .seconds(40))
        #expect(s.reassemblyBytes.fragments == 0)
        #expect(s.counters.reassemblyTimeouts > 0)
        let timeExceeded = s.takeOutgoing().map { Peer.parse($0).1 }.filter { $0[0] == ICMPHeader.timeExceeded }
        #expect(!timeExceeded.isEmpty && timeExceeded.count <= 10, "time exceeded, rate-limited")
    }

    @Test func fragmentsReassembleInAnyOrderAndOverlapsAreRefused() {
        var s = stack()
        try! s.bindUDP(port: 53)
        let data = bytes(100)
        let udp = UDPHeader(sourcePort: 1, destinationPort: 53, payloadLength: 100).emit(source: Peer.them, destination: Peer.us, payload: data) + data
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[48...]), id: 5, offset: 48), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[0..<24]), id: 5, offset: 0, more: true), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[24..<48]), id: 5, offset: 24, more: true), now: .zero)
        #expect(s.receiveDatagram(port: 53)?.payload == data)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[0..<24]), id: 6, offset: 0, more: true), now: .zero)
        s.receive(packet: Peer.ip(IPProtocol.udp, Array(udp[16..<40]), id: 6, offset: 16, more: true), now: .zero)
        #expect(s.counters.reassemblyDrops == 1)
        #expect(s.reassemblyBytes.fragments == 0)
    }

    @Test func largeDatagramsAreFragmentedOnOutput() {
        var s = IPStack(configuration: { var c = IPStackConfiguration(address: Peer.us); c.mtu = 576; return c }(), seed: 1)
        var r = IPStack(configuration: IPStackConfiguration(address: Peer.them), seed: 2)
        try! r.bindUDP(port: 9)
        s.sendDatagram(from: 9, to: TCPEndpoint(Peer.them, 9), payload: bytes(2000), now: .zero)
        let out = s.takeOutgoing()
        #expect(out.count == 4 && out.allSatisfy { $0.count <= 576 })
        for p in out { r.receive(packet: p, now: .zero) }
        #expect(r.receiveDatagram(port: 9)?.payload == bytes(2000))
    }
}
