import Capture
import Framing
import NetStack
import PPP
import Testing
import TestSupport

/// The facts ../shared/traces/MANIFEST.md lists for each public capture, asserted on our decode.
@Suite struct ManifestPcapTests {
    @Test func zeekPPPoESession() throws {
        let t = try Traces.load("pppoe_zeek_lcp_pap_ipcp_ipv6cp_echo.pcap")
        #expect(t.records == 65)
        #expect(t.notes.map(\.text).prefix(4) == ["PPPoE PADI session=0x0000", "PPPoE PADO session=0x0000",
                                                  "PPPoE PADR session=0x0000", "PPPoE PADS session=0x0011"])
        #expect(t.frames.allSatisfy { $0.via == ["PPPoE 0x0011"] })
        #expect(try t.lcpOptions(5) == [.magicNumber(0x05FC_D459)])
        #expect(try t.lcpOptions(6) == [.maximumReceiveUnit(1492), .authenticationProtocol(.pap, data: []), .magicNumber(0x01FC_CBFB)])
        #expect(try t.control(7).1.code == ControlCode.configureAck)
        let nak = try t.control(8).1
        #expect(nak.code == ControlCode.configureNak && nak.identifier == 1)
        #expect(try t.lcpOptions(8) == [.maximumReceiveUnit(1500)])
        #expect(try t.control(9).1.identifier == 2)
        #expect(try t.lcpOptions(9) == [.maximumReceiveUnit(1500), .authenticationProtocol(.pap, data: []), .magicNumber(0x01FC_CBFB)])
        #expect(try t.control(10).1.code == ControlCode.configureAck)
        let (papProto, papPacket) = try t.control(11)
        #expect(papProto == ProtocolNumber.pap)
        #expect(try PAPPacket(papPacket) == .authenticateRequest(identifier: 1, peerID: Array("cisco".utf8), password: Array("cisco".utf8)))
        #expect(try PAPPacket(t.control(12).1) == .authenticateAck(identifier: 1, message: []))
        #expect(try t.ipcpOptions(13) == [.ipAddress(IPv4Address(10, 0, 0, 1))])
        #expect(try t.ipcpOptions(15) == [.ipAddress(.any)])
        #expect(try t.control(17).1.code == ControlCode.configureAck)
        #expect(try t.ipcpOptions(17) == [.ipAddress(IPv4Address(10, 0, 0, 1))])
        #expect(try t.control(19).1.code == ControlCode.configureNak)
        #expect(try t.ipcpOptions(19) == [.ipAddress(IPv4Address(10, 0, 2, 16))])
        #expect(try t.control(21).1.identifier == 2)
        #expect(try t.ipcpOptions(21) == [.ipAddress(IPv4Address(10, 0, 2, 16))])
        #expect(try t.control(27).1.code == ControlCode.configureAck)
        // IPv6CP interface identifiers, server then client.
        #expect(t.text(14) == ["IPV6CP ConfReq id=0x1 <addr fe80::c801:eff:fe88:8>"])
        #expect(t.text(16) == ["IPV6CP ConfReq id=0x1 <addr fe80::ce05:eff:fe88:0>"])
        // IPv6 data.
        let ipv6 = Set(t.frames.filter { $0.frame.protocol == ProtocolNumber.ipv6 }.map(\.number))
        #expect(ipv6 == Set(Array(22...26) + Array(30...39) + Array(54...63)))
        // The manifest says ten echo pairs; the capture holds nine (18 LCP Echo lines in tshark's
        // own summary too). Each Reply follows its Request with the same id and its sender's magic.
        let echoes = try t.frames.filter { $0.frame.protocol == ProtocolNumber.lcp }
            .map { try ControlPacket(parsing: $0.frame.information) }
            .filter { $0.code == ControlCode.echoRequest || $0.code == ControlCode.echoReply }
        #expect(echoes.count == 18)
        for pair in stride(from: 0, to: echoes.count, by: 2) {
            #expect(echoes[pair].code == ControlCode.echoRequest && echoes[pair + 1].code == ControlCode.echoReply)
            #expect(echoes[pair].identifier == echoes[pair + 1].identifier)
            let magics = Set([echoes[pair].data.prefix(4), echoes[pair + 1].data.prefix(4)].map(Array.init))
            #expect(magics == [[0x05, 0xFC, 0xD4, 0x59], [0x01, 0xFC, 0xCB, 0xFB]])
        }
        #expect(t.problems.isEmpty)
    }

    @Test func suricataTerminateAndRejects() throws {
        let t = try Traces.load("pppoe_suricata_lcp_term_ccp_ipcp_reject.pcap")
        #expect(t.records == 37)
        #expect(try t.lcpOptions(5) == [.maximumReceiveUnit(1492), .magicNumber(0xD4A5_8CBE)])
        let termReq = try t.control(6).1
        #expect(termReq.code == ControlCode.terminateRequest && termReq.identifier == 2)
        let termAck = try t.control(8).1
        #expect(termAck.code == ControlCode.terminateAck && termAck.identifier == 2)
        #expect(t.notes.filter { $0.number == 9 || $0.number == 10 }.map(\.text).allSatisfy { $0.hasPrefix("PPPoE PADT") })
        #expect(try t.lcpOptions(16) == [.maximumReceiveUnit(1492), .magicNumber(0x7E55_40E3)])
        #expect(try t.lcpOptions(17) == [.maximumReceiveUnit(1492), .magicNumber(0x2CA7_9DE8)])
        #expect(try t.control(18).1.code == ControlCode.configureAck)
        #expect(try t.lcpOptions(20) == [.maximumReceiveUnit(1492), .magicNumber(0x7E55_40E3)])
        #expect(try t.control(21).1.code == ControlCode.configureAck)
        let echo = try t.control(22).1
        #expect(echo.code == ControlCode.echoRequest && echo.identifier == 0 && echo.data == [0x2C, 0xA7, 0x9D, 0xE8])
        let reply = try t.control(24).1
        #expect(reply.code == ControlCode.echoReply && reply.data.prefix(4) == [0x7E, 0x55, 0x40, 0xE3])
        #expect(try t.ipcpOptions(26) == [.compression(protocol: .vjCompressedTCP, data: [15, 1]), .ipAddress(IPv4Address(192, 168, 1, 1))])
        #expect(try t.control(33).1.code == ControlCode.configureReject)
        #expect(try t.ipcpOptions(33) == [.compression(protocol: .vjCompressedTCP, data: [15, 1])])
        #expect(try t.control(34).1.identifier == 2)
        #expect(try t.ipcpOptions(34) == [.ipAddress(IPv4Address(192, 168, 1, 1))])
        #expect(try t.control(37).1.code == ControlCode.configureAck)
        #expect(try t.ipcpOptions(28) == [.ipAddress(IPv4Address(192, 168, 2, 45))])
        #expect(try t.control(28).1.code == ControlCode.configureAck)
        // CCP: Deflate (26), the draft Deflate number tshark calls MVRCA (24), BSD-Compress (21); all rejected.
        let (ccp, ccpRequest) = try t.control(25)
        #expect(ccp == ProtocolNumber.ccp)
        #expect(try ConfigurationOption.parseList(ccpRequest.data).map(\.type) == [26, 24, 21])
        #expect(try t.control(31).1.code == ControlCode.configureReject)
        // LCP Protocol-Reject of IPv6CP.
        let (lcp, protRej) = try t.control(35)
        #expect(lcp == ProtocolNumber.lcp && protRej.code == ControlCode.protocolReject && protRej.identifier == 2)
        #expect(protRej.data.prefix(2) == [0x80, 0x57])
    }

    @Test func pptpChapcrackSession() throws {
        let t = try Traces.load("pptp_chapcrack_lcp_mschapv2_ccp_ipcp_dns.pcap")
        #expect(t.records == 247)
        #expect(try t.lcpOptions(18) == [.asyncControlCharacterMap(0), .magicNumber(0xCDC7_E2DA), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.lcpOptions(19) == [.asyncControlCharacterMap(0), .authenticationProtocol(.chap, data: [0x81]),
                                         .magicNumber(0xC29F_1D2D), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.control(20).1.code == ControlCode.configureAck)
        #expect(try t.control(21).1.code == ControlCode.configureAck)
        #expect(try t.control(22).1.code == ControlCode.echoRequest)
        #expect(try t.control(23).1.code == ControlCode.echoReply)
        guard case let .challenge(6, value, name) = try CHAPPacket(t.control(24).1) else { Issue.record("#24 is not a Challenge id 6"); return }
        #expect(PppdHex.string(value) == "fc8c01b224aaa09c1bcc011187406c1e")
        #expect(name == Array("pptpd".utf8))
        guard case let .response(6, response, responder) = try CHAPPacket(t.control(25).1) else { Issue.record("#25 is not a Response"); return }
        #expect(response.count == 49 && responder == Array("moxie".utf8))
        #expect(try CHAPPacket(t.control(26).1) == .success(identifier: 6, message: Array("S=A75EC8F61DD73EC5D89F5AC6982448B595E8573F M=Access granted".utf8)))
        #expect(try t.ipcpOptions(34) == [.compression(protocol: .vjCompressedTCP, data: [15, 1]), .ipAddress(IPv4Address(172, 27, 200, 1))])
        #expect(try t.ipcpOptions(36) == [.ipAddress(.any), .primaryDNS(.any), .secondaryDNS(.any)])
        #expect(try t.control(37).1.code == ControlCode.configureReject)
        #expect(try t.ipcpOptions(37) == [.compression(protocol: .vjCompressedTCP, data: [15, 1])])
        let dns = IPv4Address(172, 27, 0, 1)
        #expect(try t.control(38).1.code == ControlCode.configureNak)
        #expect(try t.ipcpOptions(38) == [.ipAddress(IPv4Address(172, 27, 200, 10)), .primaryDNS(dns), .secondaryDNS(dns)])
        #expect(t.text(38) == ["IPCP ConfNak id=0x1 <addr 172.27.200.10> <ms-dns1 172.27.0.1> <ms-dns2 172.27.0.1>"])
        #expect(try t.control(39).1.identifier == 2)
        #expect(try t.ipcpOptions(39) == [.ipAddress(IPv4Address(172, 27, 200, 10)), .primaryDNS(dns), .secondaryDNS(dns)])
        #expect(try t.control(42).1.code == ControlCode.configureAck)
        #expect(try t.ipcpOptions(40) == [.ipAddress(IPv4Address(172, 27, 200, 1))])
        #expect(try t.control(41).1.code == ControlCode.configureAck)
        // MPPE: 0x01000060 then 0x01000040; a Nak in #31.
        #expect(t.text(27) == ["CCP ConfReq id=0x1 <mppe +H -M +S +L -D -C>"])
        #expect(t.text(28) == ["CCP ConfReq id=0x1 <mppe +H -M +S -L -D -C>"])
        #expect(try t.control(31).1.code == ControlCode.configureNak)
        #expect(t.frames.filter { $0.frame.protocol == ProtocolNumber.compressedDatagram }.count == 66)
        for n in [178, 179] { #expect(try t.control(n).1.code == ControlCode.terminateRequest) }
        for n in [181, 182] { #expect(try t.control(n).1.code == ControlCode.terminateAck) }
    }

    @Test func pptpConfigureRequestWithCallbackAndMultilink() throws {
        let t = try Traces.load("tcpdump_pptp.pcap")
        #expect(t.records == 23 && t.frames.map(\.number) == [16])
        let (_, packet) = try t.control(16)
        #expect(packet.identifier == 0 && packet.length == 44)
        let options = try t.lcpOptions(16)
        #expect(Array(options.prefix(4)) == [.magicNumber(0x0219_52CF), .protocolFieldCompression, .addressControlFieldCompression,
                                            .callback(operation: 6, message: [])])
        #expect(options[4] == .multilinkMRRU(1614))
        guard case .endpointDiscriminator(1, _) = options[5] else { Issue.record("no local endpoint discriminator"); return }
        #expect(t.frames[0].frame.addressControlPresent)
    }

    @Test func pppoeEchoRequestsInTwoSessions() throws {
        let t = try Traces.load("tcpdump_pppoes.pcap")
        #expect(t.frames.map(\.via) == [["PPPoE 0x0017"], ["PPPoE 0x003b"]])
        let first = try t.control(1).1
        // tcpdump's "length 14" is the PPPoE payload: the protocol field and a 12-byte LCP packet.
        #expect(t.frames[0].frame.information.count + 2 == 14)
        #expect(first.code == ControlCode.echoRequest && first.identifier == 106 && first.length == 12)
        #expect(first.data.prefix(4) == [0xA4, 0xCB, 0xEA, 0x34])
        let second = try t.control(2).1
        #expect(second.identifier == 103 && second.data.prefix(4) == [0xB4, 0x80, 0xD7, 0xBA])
    }

    @Test func pppoeDiscoveryOnly() throws {
        let t = try Traces.load("tcpdump_pppoe.pcap")
        #expect(t.frames.isEmpty)
        #expect(t.notes.map(\.text) == ["PPPoE PADI session=0x0000"])
    }

    @Test func pfcHTTPSession() throws {
        let t = try Traces.load("pppoe_pfc_http_tcp_session.pcap")
        #expect(t.frames.count == 30)
        #expect(t.frames.allSatisfy { $0.frame.protocolCompressed && !$0.frame.addressControlPresent && $0.frame.protocol == .ipv4 })
        #expect(t.frames.allSatisfy { $0.via == ["PPPoE 0x002d"] })
        let client = IPv4Address(10, 100, 0, 0), server = IPv4Address(142, 250, 179, 131)
        var fromClient = 0, fromServer = 0
        for f in t.frames {
            let (ip, tcp, payload) = try tcpSegment(f.frame.information)
            if ip.source == client {
                fromClient += 1
                #expect(ip.destination == server && tcp.sourcePort == 57013 && tcp.destinationPort == 80)
            } else {
                fromServer += 1
                #expect(ip.source == server && tcp.sourcePort == 80 && tcp.destinationPort == 57013)
            }
            switch f.number {
            case 1: #expect(tcp.flags == .syn && tcp.options.contains(.maximumSegmentSize(1452)))
            case 2: #expect(tcp.flags == [.syn, .ack] && tcp.options.contains(.maximumSegmentSize(1430)))
            case 4: #expect(payload.starts(with: Array("GET / HTTP/1.1".utf8)))
            case 28, 29: #expect(tcp.flags.contains(.fin))
            default: break
            }
        }
        #expect(fromClient == 16 && fromServer == 14)
    }

    @Test func fragmentedSYNOverDLTPPP() throws {
        let t = try Traces.load("dltppp_pfc_ipv4_frag_tcp_syn.pcap")
        #expect(t.format == .pcap(linkType: 9))
        var fragments: [IPv4Header] = []
        for f in t.frames {
            #expect(!f.frame.addressControlPresent && f.frame.protocolCompressed && f.frame.protocol == .ipv4)
            fragments.append(try f.frame.information.withUnsafeBytes { try IPv4Header(parsing: $0) })
        }
        #expect(fragments.map(\.source) == Array(repeating: IPv4Address(1, 1, 1, 1), count: 3))
        #expect(fragments.map(\.destination) == Array(repeating: IPv4Address(2, 2, 2, 2), count: 3))
        #expect(fragments.map(\.identification) == [1, 1, 1])
        #expect(fragments.map(\.fragmentOffset) == [0, 8, 16])
        #expect(fragments.map(\.moreFragments) == [true, true, false])
    }

    @Test(arguments: ["dltppp_pcap4j_hdlc_ff03_icmp.pcap", "dltppp_pcap4j_acfc_icmp.pcap"])
    func icmpEchoWithAndWithoutAddressControl(name: String) throws {
        let t = try Traces.load(name)
        let f = try #require(t.frames.first)
        #expect(f.frame.addressControlPresent == name.contains("ff03"))
        #expect(!f.frame.protocolCompressed && f.frame.protocol == .ipv4)
        let ip = try f.frame.information.withUnsafeBytes { try IPv4Header(parsing: $0) }
        #expect(ip.source == IPv4Address(192, 0, 2, 1) && ip.destination == IPv4Address(192, 0, 2, 2) && ip.timeToLive == 111)
        let icmp = try f.frame.information.withUnsafeBytes { try ICMPHeader(parsing: UnsafeRawBufferPointer(rebasing: $0[ip.headerLength...])) }
        #expect(icmp.type == ICMPHeader.echoRequest && icmp.identifier == 0x04D2 && icmp.sequence == 4321)
        #expect(t.text(1) == ["IP 192.0.2.1 > 192.0.2.2 ICMP echo request id=0x4d2 seq=4321 len=4"])
    }

    @Test func ndpiUDPWithoutAddressControl() throws {
        let t = try Traces.load("dltppp_ndpi_acfc_udp.pcap")
        let f = try #require(t.frames.first)
        #expect(!f.frame.addressControlPresent && !f.frame.protocolCompressed)
        let ip = try f.frame.information.withUnsafeBytes { try IPv4Header(parsing: $0) }
        #expect(ip.totalLength == 1228 && ip.source == IPv4Address(193, 167, 0, 252) && ip.destination == IPv4Address(193, 167, 100, 100))
        let udp = try f.frame.information.withUnsafeBytes { try UDPHeader(parsing: UnsafeRawBufferPointer(rebasing: $0[ip.headerLength...])) }
        #expect(udp.sourcePort == 44083 && udp.destinationPort == 443)
    }

    @Test func routerSerialMixingMPLSAndIPv4() throws {
        let t = try Traces.load("tcpdump_lspping-fec-ldp.pcap")
        #expect(t.records == 13)
        let mpls = t.frames.filter { $0.frame.protocol == ProtocolNumber.mpls }.map(\.number)
        #expect(mpls == [1, 2, 4, 5, 6, 8, 10, 12])
        let ipv4 = t.frames.filter { $0.frame.protocol == ProtocolNumber.ipv4 }.map(\.number)
        #expect(ipv4 == [3, 7, 9, 11, 13])
        #expect(t.frames.allSatisfy { $0.frame.addressControlPresent })
        #expect(t.text(5).first?.contains("TCP 2006 > 179 . ") == true)
        for n in ipv4 { #expect(t.text(n).first?.contains(" UDP 3503 > 4786 ") == true) }
    }

    @Test func truncatedPAPAckIsCountedNotCrashed() throws {
        let t = try Traces.load("tcpdump_truncated-aack.pcap")
        let f = try #require(t.frames.first)
        #expect(f.frame.protocol == ProtocolNumber.pap)
        let text = FramePrinter.describe(f.frame)
        #expect(text.error != nil)
        #expect(text.text.hasPrefix("PAP AuthAck id=0x1 malformed"))
    }

    @Test func invalidIPCPLengthsAreCountedNotCrashed() throws {
        let t = try Traces.load("tcpdump_ppp-invalid-lengths.pcap")
        let f = try #require(t.frames.first)
        #expect(f.frame.protocol == ProtocolNumber.ipcp)
        let packet = try ControlPacket(parsing: f.frame.information)
        #expect(packet.code == ControlCode.configureNak && packet.identifier == 128)
        #expect(throws: WireError.self) { try ConfigurationOption.parseList(packet.data) }
        #expect(FramePrinter.describe(f.frame).error != nil)
    }

    @Test func nestedL2TPInsidePPPoE() throws {
        let t = try Traces.load("pppoe_l2tp_nested_lcp_echo.pcap")
        #expect(t.frames.count == 2)
        #expect(t.frames[0].via == ["PPPoE 0x3b1a"] && t.frames[0].frame.protocol == ProtocolNumber.ipv4)
        #expect(t.frames[1].via == ["PPPoE 0x3b1a", "L2TP 18994/54110"])
        let echo = try ControlPacket(parsing: t.frames[1].frame.information)
        #expect(t.frames[1].frame.protocol == ProtocolNumber.lcp && echo.code == ControlCode.echoRequest && echo.identifier == 72)
        #expect(echo.data.prefix(4) == [0xC1, 0x34, 0x39, 0x22])
    }

    @Test(arguments: Traces.all)
    func everyTraceDecodesWithoutCrashing(name: String) throws {
        let t = try Traces.load(name)
        #expect(t.records > 0)
        for f in t.frames { _ = FramePrinter.describe(f.frame, showPassword: true) }
    }

    func tcpSegment(_ bytes: [UInt8]) throws -> (IPv4Header, TCPHeader, [UInt8]) {
        try bytes.withUnsafeBytes { raw in
            let ip = try IPv4Header(parsing: raw)
            let segment = UnsafeRawBufferPointer(rebasing: raw[ip.headerLength..<ip.totalLength])
            let tcp = try TCPHeader(parsing: segment)
            #expect(IPPacketPrinter.transportChecksumValid(ip, segment))
            return (ip, tcp, Array(segment[tcp.headerLength...]))
        }
    }
}

extension ManifestPcapTests {
    /// The synthetic fragmented SYN: our stack, as 2.2.2.2 listening on 8080, reassembles the
    /// three fragments and answers the SYN with a SYN-ACK.
    @Test func fragmentedSYNReassemblesAndIsAnswered() throws {
        let trace = try Traces.load("dltppp_pfc_ipv4_frag_tcp_syn.pcap")
        var stack = IPStack(configuration: IPStackConfiguration(address: IPv4Address(2, 2, 2, 2)), seed: 1)
        try stack.listen(port: 8080)
        for f in trace.frames { stack.receive(packet: f.frame.information, now: .zero) }
        #expect(stack.counters.fragmentsReceived == 3)
        #expect(stack.counters.datagramsReassembled == 1)
        let out = stack.takeOutgoing()
        #expect(out.count == 1)
        let (ip, tcp, _) = try tcpSegment(try #require(out.first))
        #expect(ip.destination == IPv4Address(1, 1, 1, 1))
        #expect(tcp.flags == [.syn, .ack])
        #expect(tcp.sourcePort == 8080 && tcp.destinationPort == 12345)
        #expect(tcp.options.contains(.windowScale(3)), "the SYN's window-scale option was seen, so ours is sent")
        #expect(stack.reassemblyBytes.fragments == 0)
    }
}
