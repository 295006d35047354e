import Framing
import NetStack
import PPP
import Testing

/// A generator whose n-th draw is the byte n repeated, so a test can tell which draw a value
/// on the wire came from.
struct NumberedDraws: RandomNumberGenerator, Sendable {
    var drawn: UInt64 = 0
    mutating func next() -> UInt64 {
        drawn += 1
        return (drawn & 0xFF) &* 0x0101_0101_0101_0101
    }
}

func sentPackets(_ outputs: [NegotiationOutput]) -> [ControlPacket] {
    outputs.compactMap { if case let .send(p) = $0 { return p }; return nil }
}

@Suite struct OversizedAnswerTests {
    let host = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))

    /// An IPCP negotiator past Up, its own request taken out.
    func ipcp(peerMRU: Int) -> OptionNegotiator<IPCPPolicy> {
        var n = OptionNegotiator(protocolNumber: ProtocolNumber.ipcp, policy: IPCPPolicy(configuration: host.ipcp))
        n.peerMRU = peerMRU
        n.open(now: .zero)
        n.up(now: .zero)
        _ = n.takeOutputs()
        return n
    }

    /// 4-byte compression options we answer with 6-byte ones.
    func compressionRequest(count: Int) throws -> ControlPacket {
        let options = Array(repeating: IPCPOption.compression(protocol: ProtocolNumber(0x0037), data: []).option, count: count)
        return ControlPacket(code: ControlCode.configureRequest, identifier: 7, data: try ConfigurationOption.emitList(options))
    }

    @Test func aNakLongerThanTheLengthFieldAllowsBecomesARejectThatFits() throws {
        // 64000 bytes of options: the Nak would be 96000, past the 16-bit Length.
        var n = ipcp(peerMRU: 65535)
        n.receive(try compressionRequest(count: 16000), now: .zero)
        let sent = sentPackets(n.takeOutputs())
        #expect(sent.count == 1)
        #expect(sent.first?.code == ControlCode.configureReject)
        let packet = try #require(sent.first)
        #expect(packet.length <= ControlPacket.maximumLength)
        #expect(try packet.emit().count == packet.length)
        print("16000 compression options answered with \(packet.code) of \(packet.length) bytes")
    }

    @Test func aNakThatWouldNotFitThePeersMRUIsARejectCutToIt() throws {
        // 300 options (1200 bytes) fit a 1500 MRU; their 1800-byte Nak does not.
        var n = ipcp(peerMRU: 1500)
        n.receive(try compressionRequest(count: 300), now: .zero)
        let packet = try #require(sentPackets(n.takeOutputs()).first)
        #expect(packet.code == ControlCode.configureReject)
        #expect(packet.length <= 1500)
        // Whole options only, each one the peer's own, unchanged (RFC 1661 §5.4).
        let rejected = try ConfigurationOption.parseList(packet.data)
        #expect(!rejected.isEmpty && rejected.allSatisfy { $0 == IPCPOption.compression(protocol: ProtocolNumber(0x0037), data: []).option })
        // A small Nak still goes out as a Nak.
        var small = ipcp(peerMRU: 1500)
        small.receive(try compressionRequest(count: 2), now: .zero)
        #expect(sentPackets(small.takeOutputs()).first?.code == ControlCode.configureNak)
    }

    @Test func theMRUIsCappedBothWays() throws {
        // A library user asks for 65535; the peer declares 65535. We ask for and use 16384.
        var h = host
        h.lcp.mru = 65535
        var t = LinkConfiguration.terminal()
        t.lcp.mru = 65535
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        let r = p.a.lcp.policy.result
        #expect(r.receiveMRU == Int(LCPConfiguration.maximumMRU))
        #expect(r.transmitMRU == Int(LCPConfiguration.maximumMRU))
        #expect(p.a.decoder.mru <= Int(LCPConfiguration.maximumMRU))
        // The attack that trapped before: an IPCP request as large as the line takes, all of it
        // options answered half as long again. The frame is over our MRU and dropped; the link lives.
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0))
        p.a.receive(encoder.encode(protocol: ProtocolNumber.ipcp, information: try compressionRequest(count: 16000).emit()), now: p.now)
        p.run(for: .seconds(1))
        #expect(p.downA == nil && p.a.phase == .open)
    }

    @Test func packetsAndOptionsTooLongForTheirLengthFieldsAreRefused() {
        let big = ControlPacket(code: .configureRequest, identifier: 1, data: [UInt8](repeating: 0, count: 65532))
        #expect(throws: WireError.tooLong(length: 65536, maximum: 65535)) { try big.emit() }
        #expect(throws: WireError.tooLong(length: 256, maximum: 255)) { try ConfigurationOption(type: 1, value: [UInt8](repeating: 0, count: 254)).emit() }
        #expect(throws: WireError.self) { try PAPPacket.authenticateRequest(identifier: 1, peerID: [UInt8](repeating: 0x61, count: 256), password: []).packet }
        #expect(throws: WireError.self) { try CHAPPacket.challenge(identifier: 1, value: [UInt8](repeating: 0, count: 256), name: []).packet }
    }

    @Test func aNameTooLongForPAPEndsAuthenticationWithAReason() {
        var h = host
        h.lcp.requireAuthentication = [.pap]
        h.authentication.peers = [Credentials(name: "terminal", secret: "s")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.pap]
        t.authentication.local = Credentials(name: String(repeating: "n", count: 300), secret: "s")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(40)) { $0.downB != nil }
        guard case let .authenticationFailed(m)? = p.downB else {
            Issue.record("terminal went down with \(String(describing: p.downB))")
            return
        }
        #expect(m.hasPrefix("cannot send PAP"))
    }
}

@Suite struct RandomSourceTests {
    @Test func magicNumbersAndChallengesAreSeparateDrawsOfTheInjectedSource() throws {
        var h = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))
        h.lcp.requireAuthentication = [.chapMD5]
        h.authentication.peers = [Credentials(name: "terminal", secret: "s3cret")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.chapMD5]
        t.authentication.local = Credentials(name: "terminal", secret: "s3cret")
        var p = LinkPair(h, t)
        p.a = PPPLink(configuration: h, random: NumberedDraws())
        var challenges: [[UInt8]] = []
        p.dropAtoB = { f in
            if f.protocol == ProtocolNumber.chap, let packet = try? ControlPacket(parsing: f.information),
               case let .challenge(_, value, _)? = try? CHAPPacket(packet) {
                challenges.append(value)
            }
            return false
        }
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil }
        let magic = p.a.lcp.policy.result.localMagic
        let challenge = try #require(challenges.first)
        print("magic 0x\(String(magic, radix: 16)), challenge \(PppdHex.string(challenge))")
        #expect(challenge.count == Authenticator.challengeLength)
        // Each value is whole draws (n repeated), and no draw serves two of them.
        let magicDraw = UInt8(truncatingIfNeeded: magic)
        #expect(magic == UInt32(magicDraw) &* 0x0101_0101)
        let challengeDraws = [challenge[0], challenge[8]]
        #expect(challenge == [UInt8](repeating: challengeDraws[0], count: 8) + [UInt8](repeating: challengeDraws[1], count: 8))
        #expect(Set(challengeDraws + [magicDraw]).count == 3)
    }
}

@Suite struct AuthenticationPreferenceTests {
    let host = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))

    func pair(require: Set<AuthenticationProtocol>, offer: [AuthenticationProtocol]) -> LinkPair {
        var h = host
        h.lcp.requireAuthentication = require
        h.authentication.peers = [Credentials(name: "terminal", secret: "s3cret")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = offer
        t.authentication.local = Credentials(name: "terminal", secret: "s3cret")
        return LinkPair(h, t)
    }

    @Test func chapIsAskedForFirstWhenPAPWouldDoToo() {
        var p = pair(require: [.pap, .chapMD5], offer: [.pap, .chapMD5])
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.a.lcp.policy.result.peerAuthentication == .chapMD5)
        #expect(p.eventsA.contains(.authenticated(peerName: "terminal")))
    }

    @Test func papIsTheFallbackWhenThePeerRefusesCHAP() {
        var p = pair(require: [.pap, .chapMD5], offer: [.pap])
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.a.lcp.policy.result.peerAuthentication == .pap)
        #expect(p.eventsA.contains(.authenticated(peerName: "terminal")))
    }

    @Test func papIsNotTakenWhenOnlyCHAPIsAllowed() {
        var p = pair(require: [.chapMD5], offer: [.pap])
        p.start()
        p.run(for: .seconds(30)) { $0.downA != nil }
        #expect(p.downA == .negotiationFailed("peer refused to authenticate with chap-md5"))
        #expect(p.ipcpA == nil)
    }

    @Test func aPeerAskingForAProtocolWeCannotDoIsToldCHAP() {
        var lcp = LCPConfiguration()
        lcp.authenticateWith = [.pap, .chapMD5]
        var policy = LCPPolicy(configuration: lcp, random: LinkRandom(SplitMix64(seed: 1)))
        let eap = LCPOption.authenticationProtocol(ProtocolNumber.eap, data: []).option
        #expect(policy.judge([eap], mayNak: true) == .nak([LCPOption.authenticationProtocol(ProtocolNumber.chap, data: [5]).option]))
    }
}

@Suite struct AddressConflictTests {
    let pppdLocal = IPv4Address(10, 0, 2, 15), pppdRemote = IPv4Address(10, 0, 2, 2)
    let ourLocal = IPv4Address(192, 168, 53, 1), ourTerminal = IPv4Address(192, 168, 53, 2)

    /// pppd run as `10.0.2.15:10.0.2.2` without ipcp-accept-local or -remote: it Naks any other
    /// address for us and keeps asking for its own, whatever it is told.
    var pppd: LinkConfiguration {
        var c = LinkConfiguration.host(local: pppdLocal, terminal: pppdRemote)
        c.ipcp.vj = nil
        // pppd gives up later than we do, so our side is the one that decides.
        c.negotiation.maxFailure = 10
        return c
    }

    @Test func aHostWithoutChosenAddressesTakesThoseAPppdPeerInsistsOn() {
        // What `pppbridge run` does without --local-ip and --terminal-ip.
        var host = LinkConfiguration.host(local: ourLocal, terminal: ourTerminal)
        host.ipcp.acceptLocal = true
        host.ipcp.acceptRemote = true
        var p = LinkPair(host, pppd)
        p.start()
        p.run(for: .seconds(30)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpA?.localAddress == pppdRemote && p.ipcpA?.peerAddress == pppdLocal)
        #expect(p.ipcpB?.localAddress == pppdLocal && p.ipcpB?.peerAddress == pppdRemote)
        #expect(p.downA == nil && p.downB == nil)
    }

    @Test func aHostWithChosenAddressesEndsTheLinkNamingBothSides() {
        var p = LinkPair(.host(local: ourLocal, terminal: ourTerminal), pppd)
        p.start()
        p.run(for: .seconds(60)) { $0.downA != nil }
        let expected = AddressConflict(local: ourLocal, peer: ourTerminal, peerLocal: pppdLocal, peerAssigned: pppdRemote)
        #expect(p.downA == .addressConflict(expected))
        #expect(p.ipcpA == nil, "IPCP never reported addresses the peer did not accept")
        let text = p.downA?.description ?? ""
        print(text)
        for a in [ourLocal, ourTerminal, pppdLocal, pppdRemote] { #expect(text.contains("\(a)")) }
        // The peer (our own code, in pppd's place) never opened IPCP either.
        p.run(for: .seconds(10)) { $0.downB != nil }
        #expect(p.downB != nil && p.ipcpB == nil)
    }

    @Test func aPeerThatRejectsTheAddressItWouldNotLetUsHaveEndsTheLink() {
        var policy = IPCPPolicy(configuration: LinkConfiguration.host(local: ourLocal, terminal: ourTerminal).ipcp)
        _ = policy.peerRefused([IPCPOption.ipAddress(pppdRemote).option], rejected: false)
        #expect(policy.conflict == nil, "one Nak is a suggestion")
        _ = policy.peerRefused([IPCPOption.ipAddress(ourLocal).option], rejected: true)
        #expect(policy.conflict == AddressConflict(local: ourLocal, peer: ourTerminal, peerLocal: nil, peerAssigned: pppdRemote))
    }
}

@Suite struct DeadPeerTests {
    let host = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))

    @Test func aSilentPeerIsNoticedByDefaultWithinAbout20Seconds() {
        #expect(EchoConfiguration().interval == .seconds(5) && EchoConfiguration().failureLimit == 4)
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        p.run(for: .seconds(60)) { $0.downA != nil }
        #expect(p.downA == nil, "a peer that answers keeps the link")
        p.bTalks = false
        let silent = p.now
        p.run(for: .seconds(60)) { $0.downA != nil }
        #expect(p.downA == .echoTimeout(missed: 4))
        print("silent peer noticed after \(p.now - silent)")
        #expect(p.now - silent <= .seconds(25))
    }

    @Test func echoesAreOffWithAZeroInterval() {
        var h = host
        h.echo.interval = .zero
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        p.bTalks = false
        p.run(for: .seconds(120)) { $0.downA != nil }
        #expect(p.downA == nil)
    }
}

@Suite struct PeerTextTests {
    let host = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))
    /// Clears the screen, rings the bell and closes a JSON string.
    let hostile = "\u{1B}[2J\u{07}\"}\\"

    func isInert(_ s: String) -> Bool { s.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) } }

    @Test func aTerminateRequestsTextIsEscaped() {
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        p.b.close(now: p.now, reason: hostile)
        p.run(for: .seconds(10)) { $0.downA != nil }
        #expect(p.downA == .peerTerminated("\\x1B[2J\\x07\\\"}\\\\"))
        #expect(isInert(p.downA?.description ?? "\u{1B}"))
    }

    @Test func papNamesAndMessagesAreEscaped() {
        var h = host
        h.lcp.requireAuthentication = [.pap]
        h.authentication.peers = [Credentials(name: hostile, secret: "right")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.pap]
        t.authentication.local = Credentials(name: hostile, secret: "wrong")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(20)) { $0.downA != nil }
        guard case let .authenticationFailed(m)? = p.downA else {
            Issue.record("host went down with \(String(describing: p.downA))")
            return
        }
        #expect(m.contains("\\x1B[2J"))
        #expect(isInert(m))
    }

    @Test func theRightNameStillAuthenticatesAndIsReportedEscaped() {
        var h = host
        h.lcp.requireAuthentication = [.chapMD5]
        h.authentication.peers = [Credentials(name: hostile, secret: "s")]
        var t = LinkConfiguration.terminal()
        t.lcp.authenticateWith = [.chapMD5]
        t.authentication.local = Credentials(name: hostile, secret: "s")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil }
        #expect(p.eventsA.contains(.authenticated(peerName: "\\x1B[2J\\x07\\\"}\\\\")))
    }

    @Test func debugLinesShowPeerTextEscaped() {
        var h = host
        h.debug = true
        var p = LinkPair(h, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        p.b.close(now: p.now, reason: "x" + hostile)
        p.run(for: .seconds(10)) { $0.downA != nil }
        let lines = p.eventsA.compactMap { if case let .debug(l) = $0 { return l }; return nil }
        let termReq = lines.first { $0.hasPrefix("rcvd [LCP TermReq") }
        #expect(termReq?.hasSuffix(" \"x\\x1B[2J\\x07\\\"}\\\\\"]") == true, "\(termReq ?? "no TermReq")")
        #expect(lines.allSatisfy(isInert))
    }
}
