import Framing
import NetStack
import PPP
import Testing

@Suite struct PolicyTests {
    let host = LinkConfiguration.host(local: IPv4Address(10, 0, 2, 2), terminal: IPv4Address(10, 0, 2, 15))

    @Test func renegotiationFromOpenedKeepsWhatThePeerAsksNow() {
        // The terminal restarts its LCP (a reboot) while we are Opened, now asking for MRU 576.
        var p = LinkPair(host, .terminal())
        p.start()
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        var rebooted = LinkConfiguration.terminal()
        rebooted.lcp.mru = 576
        p.b = PPPLink(configuration: rebooted, random: SplitMix64(seed: 9))
        p.eventsA = []
        p.eventsB = []
        p.b.open(now: p.now)
        p.run(for: .seconds(10)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.ipcpA != nil && p.ipcpB != nil)
        #expect(p.a.lcp.policy.result.transmitMRU == 576)
        #expect(p.a.encoder.compressProtocol && p.a.encoder.escapes == EscapeSet(accm: 0))
    }

    @Test func papOneWayAndCHAPTheOtherAtTheSameTime() {
        var h = host
        h.lcp.requireAuthentication = [.chapMD5]
        h.lcp.authenticateWith = [.pap]
        h.authentication.peers = [Credentials(name: "terminal", secret: "t-secret")]
        h.authentication.local = Credentials(name: "host", secret: "h-secret")
        var t = LinkConfiguration.terminal()
        t.lcp.requireAuthentication = [.pap]
        t.lcp.authenticateWith = [.chapMD5]
        t.authentication.peers = [Credentials(name: "host", secret: "h-secret")]
        t.authentication.local = Credentials(name: "terminal", secret: "t-secret")
        var p = LinkPair(h, t)
        p.start()
        p.run(for: .seconds(20)) { $0.ipcpA != nil && $0.ipcpB != nil }
        #expect(p.eventsA.contains(.authenticated(peerName: "terminal")))
        #expect(p.eventsB.contains(.authenticated(peerName: "host")))
        #expect(p.now < .seconds(1), "no retransmission was needed")
    }

    @Test func aPeerThatAsksNoAddressIsToldItsAddressOnce() {
        var policy = IPCPPolicy(configuration: host.ipcp)
        let first = policy.judge([], mayNak: true)
        let second = policy.judge([], mayNak: true)
        #expect(first == .nak([IPCPOption.ipAddress(IPv4Address(10, 0, 2, 15)).option]))
        #expect(second == .ack)
    }

    @Test func aRejectOfAnOptionWeDidNotSendIsIgnoredWhole() {
        var lcp = LCPConfiguration()
        lcp.mru = 1400
        var policy = LCPPolicy(configuration: lcp, random: LinkRandom(SplitMix64(seed: 1)))
        let before = policy.requestOptions()
        let ok = policy.peerRefused([LCPOption.maximumReceiveUnit(1400).option, ConfigurationOption(type: 0x42)], rejected: true)
        #expect(!ok)
        #expect(policy.requestOptions() == before)
        let valid = policy.peerRefused([LCPOption.maximumReceiveUnit(1400).option], rejected: true)
        #expect(valid)
        #expect(!policy.requestOptions().contains(LCPOption.maximumReceiveUnit(1400).option))
    }

    @Test func aZeroMagicNumberIsNakd() {
        var policy = LCPPolicy(configuration: LCPConfiguration(), random: LinkRandom(SplitMix64(seed: 1)))
        guard case let .nak(options) = policy.judge([LCPOption.magicNumber(0).option], mayNak: true),
              case let .magicNumber(m) = LCPOption(options[0]) else {
            Issue.record("zero magic was not Nak'd")
            return
        }
        #expect(m != 0)
    }

    @Test func lcpNegotiationPacketsKeepTheExtraEscapes() {
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0, extra: [0xFF]))
        let wire = encoder.encode(protocol: ProtocolNumber.lcp, information: [1, 1, 0, 4])
        // FF 03 goes out as 7D DF 7D 23: the extra value and the control character both escaped.
        #expect(Array(wire[1...4]) == [0x7D, 0xDF, 0x7D, 0x23])
        #expect(!wire.contains(0xFF))
    }

    @Test func codeRejectsFitThePeersMRU() {
        var a = OptionNegotiator(protocolNumber: ProtocolNumber.lcp, policy: LCPPolicy(configuration: LCPConfiguration(), random: LinkRandom(SplitMix64(seed: 1))))
        a.open(now: .zero)
        a.up(now: .zero)
        _ = a.takeOutputs()
        a.peerMRU = 296
        a.receive(ControlPacket(code: ControlCode(99), identifier: 1, data: [UInt8](repeating: 7, count: 1000)), now: .zero)
        let reject = a.takeOutputs().compactMap { if case let .send(p) = $0, p.code == ControlCode.codeReject { return p }; return nil }.first
        #expect(reject?.length == 296)
    }
}
