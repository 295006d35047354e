import Framing
import NetStack
import PPP
import Testing

/// Two links joined back to back in virtual time. Bytes cross instantly unless a filter drops
/// the frames they carry; time jumps to the next deadline when nothing is in flight.
struct LinkPair {
    var a: PPPLink
    var b: PPPLink
    var now = Instant.zero
    var eventsA: [LinkEvent] = []
    var eventsB: [LinkEvent] = []
    /// Frames from A to B for which this returns true are lost (the filter sees each frame's bytes).
    var dropAtoB: (PPPFrame) -> Bool = { _ in false }
    var dropBtoA: (PPPFrame) -> Bool = { _ in false }
    /// When false, B's output is thrown away: a peer that has gone silent.
    var bTalks = true

    init(_ ca: LinkConfiguration, _ cb: LinkConfiguration) {
        a = PPPLink(configuration: ca, random: SplitMix64(seed: 1))
        b = PPPLink(configuration: cb, random: SplitMix64(seed: 2))
    }

    mutating func start() {
        a.open(now: now)
        b.open(now: now)
    }

    /// Runs until `done` holds or virtual time passes `limit`.
    mutating func run(for limit: Duration = .seconds(120), until done: (LinkPair) -> Bool = { _ in false }) {
        let end = now + limit
        while now <= end && !done(self) {
            let fromA = a.takeTransmit()
            var fromB = b.takeTransmit()
            if !bTalks { fromB = [] }
            eventsA += a.takeEvents()
            eventsB += b.takeEvents()
            if !fromA.isEmpty { b.receive(LinkPair.filter(fromA, dropAtoB), now: now) }
            if !fromB.isEmpty { a.receive(LinkPair.filter(fromB, dropBtoA), now: now) }
            eventsA += a.takeEvents()
            eventsB += b.takeEvents()
            if done(self) { break }
            if fromA.isEmpty && fromB.isEmpty {
                guard let next = earliest(a.pollAt, b.pollAt), next <= end else { break }
                now = max(now, next)
                a.poll(now: now)
                b.poll(now: now)
            }
        }
        eventsA += a.takeEvents()
        eventsB += b.takeEvents()
    }

    /// Re-frames the stream without the frames the filter drops.
    static func filter(_ stream: [UInt8], _ drop: (PPPFrame) -> Bool) -> [UInt8] {
        var d = HDLCDecoder(fcs: .fcs16, mru: 65535, receiveACCM: 0)
        var out: [UInt8] = []
        var start = 0
        var kept: [UInt8] = []
        // Split on flags so kept frames keep their exact bytes (escapes and all).
        for (i, byte) in stream.enumerated() where byte == HDLC.flag {
            let piece = Array(stream[start...i])
            start = i
            let frames = d.decode(piece)
            if let f = frames.first, drop(f) { continue }
            kept += piece.dropFirst(kept.last == HDLC.flag ? 1 : 0)
        }
        out = kept
        return out
    }

    var ipcpA: IPCPResult? { eventsA.lazy.compactMap { if case let .ipcpOpened(r) = $0 { return r }; return nil }.first }
    var ipcpB: IPCPResult? { eventsB.lazy.compactMap { if case let .ipcpOpened(r) = $0 { return r }; return nil }.first }
    var downA: LinkDownReason? { a.downReason }
    var downB: LinkDownReason? { b.downReason }
}

func isLCP(_ code: ControlCode) -> (PPPFrame) -> Bool {
    { $0.protocol == ProtocolNumber.lcp && $0.information.first == code.rawValue }
}

@Suite struct LinkTests {
    let hostAddress = IPv4Address(10, 0, 2, 2), terminalAddress = IPv4Address(10, 0, 2, 15), dns = IPv4Address(10, 0, 2, 3)

    var host: LinkConfiguration { .host(local: hostAddress, terminal: terminalAddress, dns: [dns]) }

    @Test func vjIsNegotiatedPerDirection() {
        // The terminal refuses VJ; the host asked for it and goes without, both ways.
        var terminal = LinkConfiguration.terminal()
        terminal.ipcp.vj = nil
        var p = LinkPair(host, terminal)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpA?.transmitVJ == nil && p.ipcpA?.receiveVJ == nil)
        #expect(p.ipcpB?.transmitVJ == nil && p.ipcpB?.receiveVJ == nil)
        #expect(p.a.vjCompressor == nil && p.b.vjDecompressor == nil)
        // A peer asking for 8 slots without slot-id compression gets exactly that from us.
        var eight = LinkConfiguration.terminal()
        eight.ipcp.vj = VJParameters(maxSlotID: 7, compressSlotID: false)
        var q = LinkPair(host, eight)
        q.start()
        q.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(q.ipcpA?.transmitVJ == VJParameters(maxSlotID: 7, compressSlotID: false))
        #expect(q.ipcpA?.receiveVJ == VJParameters(maxSlotID: 15, compressSlotID: true))
        #expect(q.a.vjCompressor?.parameters.maxSlotID == 7)
    }

    @Test func hostAssignsTheTerminalItsAddressAndDNS() {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        // VJ (16 slots, slot-id compression) is the default both ways, as in pppd.
        let vj = VJParameters(maxSlotID: 15, compressSlotID: true)
        #expect(p.ipcpA == IPCPResult(localAddress: hostAddress, peerAddress: terminalAddress, dnsServers: [dns], netmask: IPv4Address(255, 255, 255, 255),
                                      transmitVJ: vj, receiveVJ: vj))
        #expect(p.ipcpB == IPCPResult(localAddress: terminalAddress, peerAddress: hostAddress, dnsServers: [dns], netmask: IPv4Address(255, 255, 255, 255),
                                      transmitVJ: vj, receiveVJ: vj))
        #expect(p.now < .seconds(1), "no retransmission was needed")
        #expect(p.a.phase == .open && p.b.phase == .open)
        // The negotiated map and compression are in force on both framers.
        #expect(p.a.encoder.escapes == EscapeSet(accm: 0) && p.a.encoder.compressProtocol && p.a.encoder.compressAddressControl)
        #expect(p.b.decoder.receiveACCM == 0)
    }

    @Test func ipPacketsFlowOnceIPCPIsOpen() {
        var p = LinkPair(host, .terminal())
        let early = p.a.send(ipPacket: [0x45], now: p.now)
        #expect(!early)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        let packet: [UInt8] = [0x45, 0x00, 0x7E, 0x7D, 0x11, 0x13] + Array(0..<200)
        let sent = p.a.send(ipPacket: packet, now: p.now)
        #expect(sent)
        p.run(for: .zero)
        #expect(p.b.takeReceivedIPPackets() == [packet])
        let tooLarge = p.a.send(ipPacket: [UInt8](repeating: 0x45, count: 1501), now: p.now)
        #expect(!tooLarge, "larger than the peer's MRU")
    }

    /// RFC 1144 §3.3.4: after a damaged frame the next compressed packet without a connection
    /// number is tossed, whether the damaged frame came in an earlier read or in the same one
    /// (where the compressed frame is rebuilt straight from the decoder's buffer).
    @Test(arguments: [false, true])
    func aDamagedFrameTossesTheCompressedPacketAfterIt(sameRead: Bool) {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        // Segments of one connection, host → terminal: VJ sends the first whole, the rest
        // compressed, each a frame of its own.
        func segment(_ n: UInt32) -> [UInt8] {
            let payload = [UInt8](repeating: 0x41, count: 100)
            var tcp = TCPHeader(sourcePort: 1000, destinationPort: 2000, sequenceNumber: SequenceNumber(1 + 100 * n), flags: [.ack], window: 8000)
            tcp.acknowledgmentNumber = 1
            var ip = IPv4Header(protocol: IPProtocol.tcp, source: hostAddress, destination: terminalAddress, payloadLength: 20 + payload.count)
            ip.identification = UInt16(n)
            return ip.emit() + tcp.emit(source: hostAddress, destination: terminalAddress, payload: payload) + payload
        }
        var frames: [[UInt8]] = []
        for n in 0..<4 {
            let sent = p.a.send(ipPacket: segment(UInt32(n)), now: p.now)
            #expect(sent)
            frames.append(p.a.takeTransmit())
        }
        p.b.receive(frames[0] + frames[1], now: p.now)
        let first = p.b.takeReceivedIPPackets()
        #expect(first == [segment(0), segment(1)])
        // The third frame damaged: one payload byte changed to another plain byte (the FCS fails).
        var damaged = frames[2]
        let at = damaged.count / 2
        damaged[at] = damaged[at] == 0x41 ? 0x42 : 0x41
        if sameRead {
            p.b.receive(damaged + frames[3], now: p.now)
        } else {
            p.b.receive(damaged, now: p.now)
            p.b.receive(frames[3], now: p.now)
        }
        #expect(p.b.decoder.counters.badFCS == 1)
        let after = p.b.takeReceivedIPPackets()
        #expect(after.isEmpty)
        #expect(p.b.vjDecompressor?.tossed == 1)
    }

    @Test func lostConfigureRequestsAreRetransmitted() {
        var p = LinkPair(host, .terminal())
        var lost = 0
        p.dropAtoB = { f in
            if isLCP(ControlCode.configureRequest)(f) && lost < 3 { lost += 1; return true }
            return false
        }
        p.start()
        p.run(for: .seconds(30)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(lost == 3)
        #expect(p.ipcpA != nil && p.ipcpB != nil)
        // Three restart intervals of 3 s went by.
        #expect(p.now >= .seconds(9) && p.now < .seconds(12))
    }

    @Test func aPeerThatNeverAnswersEndsInStoppedAfterMaxConfigure() {
        var p = LinkPair(host, .terminal())
        p.bTalks = false
        p.start()
        p.run(for: .seconds(60)) { $0.downA != nil }
        #expect(p.a.lcp.state == .stopped)
        #expect(p.downA == .negotiationFailed("no response to LCP Configure-Requests"))
        // Max-Configure (10) requests, 3 s apart: down after the tenth times out.
        #expect(p.now == .seconds(30))
    }

    @Test func anMRUBelowOurMinimumIsNakdAndConverges() {
        var small = LinkConfiguration.terminal()
        small.lcp.mru = 100
        var p = LinkPair(host, small)
        var naks: [PPPFrame] = []
        p.dropAtoB = { f in
            if isLCP(ControlCode.configureNak)(f) { naks.append(f) }
            return false
        }
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(naks.count == 1)
        #expect(p.a.lcp.policy.result.transmitMRU == 128 && p.b.lcp.policy.result.receiveMRU == 128)
    }

    @Test func papInBothDirections() {
        var h = host
        h.lcp.requireAuthentication = [.pap]
        h.authentication.peers = [Credentials(name: "terminal", secret: "s3cret")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.pap, .chapMD5]
        t.authentication.local = Credentials(name: "terminal", secret: "s3cret")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.eventsA.contains(.authenticated(peerName: "terminal")))
        #expect(p.ipcpA != nil && p.ipcpB != nil)
    }

    @Test func chapMD5InBothDirections() {
        var h = host
        h.lcp.requireAuthentication = [.chapMD5]
        h.authentication.peers = [Credentials(name: "terminal", secret: "s3cret")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.chapMD5]
        t.authentication.local = Credentials(name: "terminal", secret: "s3cret")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.eventsA.contains(.authenticated(peerName: "terminal")))
        #expect(p.ipcpB != nil)
    }

    @Test func wrongSecretBringsTheLinkDownWithAReason() {
        for proto in [AuthenticationProtocol.pap, .chapMD5] {
            var h = host
            h.lcp.requireAuthentication = [proto]
            h.authentication.peers = [Credentials(name: "terminal", secret: "right")]
            var t = LinkConfiguration.terminal()
            t.lcp.authenticateWith = [proto]
            t.authentication.local = Credentials(name: "terminal", secret: "wrong")
            var p = LinkPair(h, t)
            p.start()
            p.run(for: .seconds(20)) { $0.downA != nil && $0.downB != nil }
            guard case .authenticationFailed? = p.downA else { Issue.record("\(proto): host went down with \(String(describing: p.downA))"); continue }
            guard case .authenticationFailed? = p.downB else { Issue.record("\(proto): terminal went down with \(String(describing: p.downB))"); continue }
            #expect(p.ipcpA == nil && p.ipcpB == nil)
        }
    }

    @Test func aPeerWithoutCredentialsRefusesToAuthenticate() {
        var h = host
        h.lcp.requireAuthentication = [.pap]
        h.authentication.peers = [Credentials(name: "terminal", secret: "s3cret")]
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(30)) { $0.downA != nil }
        #expect(p.downA == .negotiationFailed("peer refused to authenticate with pap"))
    }

    @Test func aLoopedBackLineIsDetected() {
        // One link talking to itself: its own Configure-Requests come back with its magic.
        var link = PPPLink(configuration: host, random: SplitMix64(seed: 7))
        var now = Instant.zero
        link.open(now: now)
        var events: [LinkEvent] = []
        for _ in 0..<200 where link.downReason == nil {
            let out = link.takeTransmit()
            if out.isEmpty {
                guard let next = link.pollAt else { break }
                now = next
                link.poll(now: now)
            } else {
                link.receive(out, now: now)
            }
            events += link.takeEvents()
        }
        #expect(link.downReason == .loopback)
        #expect(events.contains(.down(.loopback)))
    }

    @Test func echoFailuresBringTheLinkDown() {
        var h = host
        h.echo.interval = .seconds(1)
        h.echo.failureLimit = 3
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        // Echoes are answered while the peer talks: the link stays up 20 s.
        let opened = p.now
        p.run(for: .seconds(20)) { $0.downA != nil }
        #expect(p.downA == nil)
        p.bTalks = false
        let silent = p.now
        p.run(for: .seconds(20)) { $0.downA != nil }
        #expect(p.downA == .echoTimeout(missed: 3))
        // Within interval × failures + 1 s of the peer going silent.
        #expect(p.now - silent <= .seconds(4))
        #expect(opened < silent)
        #expect(p.eventsA.contains(.echoMissed(1)) && p.eventsA.contains(.echoMissed(2)))
    }

    @Test func adaptiveEchoesOnlyProbeAnIdleLine() {
        var h = host
        h.echo.interval = .seconds(1)
        h.echo.failureLimit = 3
        h.echo.adaptive = true
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        var echoRequests = 0
        p.dropAtoB = { f in
            if isLCP(ControlCode.echoRequest)(f) { echoRequests += 1 }
            return false
        }
        // The terminal sends a packet every 0.5 s: the host never needs to probe.
        for _ in 0..<20 {
            p.b.send(ipPacket: [0x45, 0, 0, 20], now: p.now)
            p.run(for: .milliseconds(500))
        }
        #expect(echoRequests == 0)
        #expect(p.downA == nil)
    }

    @Test func closingSendsTerminateAndThePeerSeesIt() {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        p.a.close(now: p.now)
        p.run(for: .seconds(10)) { $0.downA != nil && $0.downB != nil }
        #expect(p.downA == .closedByUs)
        #expect(p.downB == .peerTerminated("User request"))
        #expect(p.eventsB.contains(.ipcpClosed))
    }

    @Test func aRejectedIPCPIsStoppedNotRetried() throws {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(1)) { $0.a.lcp.state == .opened && $0.b.lcp.state == .opened }
        // The terminal rejects IPCP as a protocol, as a peer without IPv4 would.
        let reject = ControlPacket(code: ControlCode.protocolReject, identifier: 0x99, data: [0x80, 0x21, 1, 1, 0, 4])
        var encoder = HDLCEncoder(escapes: EscapeSet(accm: 0))
        encoder.compressAddressControl = false
        p.a.receive(encoder.encode(protocol: ProtocolNumber.lcp, information: try reject.emit()), now: p.now)
        p.run(for: .seconds(30)) { $0.downA != nil }
        #expect(p.downA == .networkFailed("Protocol-Reject"))
    }

    /// IP frames are decoded into kept arrays (what `recycle` hands back), and take the same
    /// ways as before: IPv4 once IPCP is open, VJ only when negotiated, a Protocol-Reject
    /// for VJ that was not.
    @Test func ipFramesGoThroughKeptArrays() throws {
        var terminal = LinkConfiguration.terminal()
        terminal.ipcp.vj = nil
        var p = LinkPair(host, terminal)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        var rejects: [PPPFrame] = []
        p.dropBtoA = { f in
            if isLCP(ControlCode.protocolReject)(f) { rejects.append(f) }
            return false
        }
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0))
        let packets = (0..<3).map { i in [0x45, 0, 0, 20] + [UInt8](repeating: UInt8(i), count: 16) }
        var line: [UInt8] = []
        for packet in packets { encoder.encode(protocol: ProtocolNumber.ipv4, information: packet, into: &line) }
        // VJ was not negotiated: rejected (RFC 1661 §5.7), not handed on.
        encoder.encode(protocol: ProtocolNumber.vjCompressedTCP, information: [0x40, 1, 0, 0], into: &line)
        p.b.receive(line, now: p.now)
        var received: [[UInt8]] = []
        p.b.takeReceivedIPPackets(into: &received)
        #expect(received == packets)
        #expect(received.allSatisfy { $0.capacity < 256 }, "a tiny frame costs a tiny array, not a full-sized one")
        p.run(for: .zero)
        #expect(rejects.count == 1 && p.b.unknownProtocolFrames == 1)
        #expect(rejects.first.map { Array($0.information[4...5]) } == [0x00, 0x2D])
        let pooled = p.b.pooledPacketBuffers
        p.b.recycle(&received)
        #expect(received.isEmpty && p.b.pooledPacketBuffers == pooled + 3)
        // The next frames are decoded into those arrays.
        var more: [UInt8] = []
        for packet in packets.prefix(2) { encoder.encode(protocol: ProtocolNumber.ipv4, information: packet, into: &more) }
        p.b.receive(more, now: p.now)
        #expect(p.b.pooledPacketBuffers == pooled + 1)
        p.b.takeReceivedIPPackets(into: &received)
        #expect(received == Array(packets.prefix(2)))
    }

    @Test func unknownProtocolsGetAProtocolReject() throws {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        let ccp = ControlPacket(code: .configureRequest, identifier: 1, data: [])
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0))
        var rejects: [PPPFrame] = []
        p.dropBtoA = { f in
            if isLCP(ControlCode.protocolReject)(f) { rejects.append(f) }
            return false
        }
        p.b.receive(encoder.encode(protocol: ProtocolNumber.ccp, information: try ccp.emit()), now: p.now)
        p.run(for: .zero)
        #expect(rejects.count == 1)
        #expect(rejects.first.map { Array($0.information[4...5]) } == [0x80, 0xFD])
        #expect(p.b.unknownProtocolFrames == 1)
    }

    @Test func answersPppdsOwnConfigureRequest() throws {
        // pppd's first LCP Configure-Request as it went on the line (pppd-record_default.pppd).
        var link = PPPLink(configuration: host, random: SplitMix64(seed: 3))
        link.open(now: .zero)
        _ = link.takeTransmit()
        let pppd: [UInt8] = [0x7e, 0xff, 0x7d, 0x23, 0xc0, 0x21, 0x7d, 0x21, 0x7d, 0x21, 0x7d, 0x20, 0x7d, 0x34, 0x7d, 0x22, 0x7d, 0x26,
                             0x7d, 0x20, 0x7d, 0x20, 0x7d, 0x20, 0x7d, 0x20, 0x7d, 0x25, 0x7d, 0x26, 0x7d, 0x2c, 0xf6, 0x7d, 0x5e, 0x7d,
                             0x5e, 0x7d, 0x27, 0x7d, 0x22, 0x7d, 0x28, 0x7d, 0x22, 0x39, 0x6d, 0x7e]
        link.receive(pppd, now: .zero)
        var d = HDLCDecoder()
        let replies = d.decode(link.takeTransmit())
        let ack = try ControlPacket(parsing: try #require(replies.first).information)
        #expect(ack.code == ControlCode.configureAck && ack.identifier == 1)
        #expect(try ConfigurationOption.parseList(ack.data).map(LCPOption.init) ==
                [.asyncControlCharacterMap(0), .magicNumber(0x0CF6_7E7E), .protocolFieldCompression, .addressControlFieldCompression])
    }
}

