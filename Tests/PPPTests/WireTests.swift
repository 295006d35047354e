import Framing
import NetStack
import PPP
import Testing

@Suite struct ControlPacketTests {
    @Test func parseEmitRoundTrip() throws {
        let bytes: [UInt8] = [0x01, 0x01, 0x00, 0x14, 0x02, 0x06, 0x00, 0x00, 0x00, 0x00, 0x05, 0x06, 0x0C, 0xF6, 0x7E, 0x7E, 0x07, 0x02, 0x08, 0x02]
        let p = try ControlPacket(parsing: bytes)
        #expect(p.code == .configureRequest && p.identifier == 1 && p.length == 20)
        #expect(try p.emit() == bytes)
        let options = try ConfigurationOption.parseList(p.data)
        #expect(try ConfigurationOption.emitList(options) == p.data)
        let lcp = options.map(LCPOption.init)
        #expect(lcp == [.asyncControlCharacterMap(0), .magicNumber(0x0CF6_7E7E), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(lcp.map(\.option) == options)
    }

    @Test func paddingIsIgnoredAndBadLengthsAreErrors() throws {
        // RFC 1661 §5: octets beyond Length are padding.
        let padded = try ControlPacket(parsing: [0x09, 0x07, 0x00, 0x08, 1, 2, 3, 4, 0xEE, 0xEE])
        #expect(padded.data == [1, 2, 3, 4])
        #expect(throws: WireError.truncated(what: "control packet", needed: 4, available: 3)) { try ControlPacket(parsing: [1, 2, 0]) }
        #expect(throws: WireError.lengthTooSmall(length: 3)) { try ControlPacket(parsing: [1, 2, 0, 3]) }
        #expect(throws: WireError.lengthExceedsFrame(length: 9, available: 8)) { try ControlPacket(parsing: [1, 2, 0, 9, 0, 0, 0, 0]) }
        #expect(throws: WireError.self) { try ConfigurationOption.parseList([1, 1]) }
        #expect(throws: WireError.self) { try ConfigurationOption.parseList([1, 4, 0]) }
        #expect(throws: WireError.self) { try ConfigurationOption.parseList([1]) }
    }

    @Test func everyLCPOptionRoundTrips() {
        let all: [LCPOption] = [
            .maximumReceiveUnit(1500), .asyncControlCharacterMap(0x000A_0000), .authenticationProtocol(.chap, data: [5]),
            .authenticationProtocol(.pap, data: []), .qualityProtocol(.lqr, data: [0, 0, 0, 10]), .magicNumber(0xDEAD_BEEF),
            .protocolFieldCompression, .addressControlFieldCompression, .fcsAlternatives(0x04), .callback(operation: 6, message: []),
            .multilinkMRRU(1614), .endpointDiscriminator(class: 1, address: [1, 2, 3]),
            .other(ConfigurationOption(type: 99, value: [1])), .other(ConfigurationOption(type: 1, value: [5])),
        ]
        for o in all { #expect(LCPOption(o.option) == o, "\(o)") }
        #expect(LCPOption.authenticationProtocol(.chap, data: [5]).description == "auth chap MD5")
        #expect(LCPOption.asyncControlCharacterMap(0).description == "asyncmap 0x0")
    }

    @Test func everyIPCPOptionRoundTrips() {
        let a = IPv4Address(10, 0, 2, 15), b = IPv4Address(10, 0, 2, 2)
        let all: [IPCPOption] = [.ipAddresses(a, b), .compression(protocol: .vjCompressedTCP, data: [15, 1]), .ipAddress(a),
                                 .primaryDNS(b), .secondaryDNS(a), .primaryNBNS(a), .secondaryNBNS(b),
                                 .other(ConfigurationOption(type: 3, value: [1, 2]))]
        for o in all { #expect(IPCPOption(o.option) == o, "\(o)") }
        #expect(IPCPOption.compression(protocol: .vjCompressedTCP, data: [15, 1]).description == "compress VJ 0f 01")
        #expect(IPCPOption.secondaryDNS(a).description == "ms-dns2 10.0.2.15")
    }

    @Test func papAndChapRoundTrip() throws {
        let paps: [PAPPacket] = [.authenticateRequest(identifier: 1, peerID: Array("user".utf8), password: Array("pw".utf8)),
                                 .authenticateAck(identifier: 1, message: Array("Login ok".utf8)), .authenticateNak(identifier: 9, message: [])]
        for p in paps { #expect(try PAPPacket(ControlPacket(parsing: p.packet.emit())) == p) }
        let chaps: [CHAPPacket] = [.challenge(identifier: 1, value: [1, 2, 3], name: Array("host".utf8)),
                                   .response(identifier: 1, value: Array(repeating: 7, count: 16), name: []),
                                   .success(identifier: 1, message: Array("Welcome".utf8)), .failure(identifier: 2, message: [])]
        for c in chaps { #expect(try CHAPPacket(ControlPacket(parsing: c.packet.emit())) == c) }
        #expect(throws: WireError.self) { try PAPPacket(ControlPacket(code: PAPPacket.Code.request, identifier: 1, data: [5, 1])) }
        #expect(throws: WireError.self) { try CHAPPacket(ControlPacket(code: CHAPPacket.Code.challenge, identifier: 1, data: [16, 1])) }
    }

    @Test func printerMatchesPppdForms() {
        func line(_ proto: ProtocolNumber, _ info: [UInt8]) -> String? { ControlProtocolPrinter.describe(protocol: proto, information: info)?.text }
        #expect(line(.lcp, [0x09, 0x00, 0x00, 0x08, 0x89, 0xA3, 0x0B, 0x1F]) == "LCP EchoReq id=0x0 magic=0x89a30b1f")
        #expect(line(.lcp, [0x0D, 0x01, 0x00, 0x0F, 0, 0, 0, 1, 0, 0, 0, 60, 0x68, 0x69, 0x21]) == "LCP TimeRem id=0x1 magic=0x1 seconds=60 \"hi!\"")
        #expect(line(.lcp, [0x0C, 0x01, 0x00, 0x0A, 0, 0, 0, 1, 0x68, 0x69]) == "LCP Ident id=0x1 magic=0x1 \"hi\"")
        #expect(line(.lcp, [0x07, 0x05, 0x00, 0x06, 0x20, 0x01]) == "LCP CodeRej id=0x5 20 01")
        #expect(line(.ipcp, [0x09, 0x05, 0x00, 0x04]) == "IPCP code=0x9 id=0x5")
        #expect(line(.pap, [0x01, 0x01, 0x00, 0x0A, 0x02, 0x61, 0x62, 0x02, 0x63, 0x64]) == "PAP AuthReq id=0x1 user=\"ab\" password=<hidden>")
        #expect(line(.chap, [0x01, 0x02, 0x00, 0x08, 0x02, 0xAB, 0xCD, 0x68]) == "CHAP Challenge id=0x2 <abcd>, name = \"h\"")
        #expect(line(.ipv4, [0x45]) == nil)
        #expect(line(.lcp, [0x01, 0x01, 0x00, 0x09, 0x01, 0x04, 0x05]) == "LCP ConfReq id=0x1 malformed: length 9 exceeds the 7 bytes present")
        #expect(PrintableString.quoted([0x41, 0x22, 0x0A, 0x01, 0xFF]) == "\"A\\\"\\x0A\\x01\\xFF\"")
    }
}

@Suite struct IPv4AddressTests {
    @Test func parsesOnlyDottedQuads() {
        #expect(IPv4Address("10.0.2.15") == IPv4Address(10, 0, 2, 15))
        #expect(IPv4Address("255.255.255.255")?.value == 0xFFFF_FFFF)
        for bad in ["", "1.2.3", "1.2.3.4.5", "256.1.1.1", "a.b.c.d", "1..2.3", "1.2.3.-4", "1.2.3.4 "] { #expect(IPv4Address(bad) == nil, "\(bad)") }
    }
}
