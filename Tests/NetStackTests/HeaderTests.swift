import NetStack
import Testing

@Suite struct HeaderTests {
    let a = IPv4Address(10, 0, 2, 15), b = IPv4Address(10, 0, 2, 2)

    @Test func internetChecksumOfRFC1071Example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (ones' complement), checksum 220d.
        #expect(InternetChecksum.checksum([0x00, 0x01, 0xF2, 0x03, 0xF4, 0xF5, 0xF6, 0xF7]) == 0x220D)
        // Odd lengths pad with zero.
        #expect(InternetChecksum.checksum([0x01]) == ~UInt16(0x0100))
    }

    /// The word-at-a-time sum against RFC 1071's definition, 16 big-endian bits at a time:
    /// every length to 300, whole and in even chunks, from several starting sums; data of
    /// random bytes, all zeros and all ones (which make every carry and the ±0 cases).
    /// Long runs (where the vector lanes are emptied on the way) and every tail length.
    @Test(arguments: [1500, 65_535, 262_144 + 8, 600_000 + 13])
    func internetChecksumOfLongRunsEqualsTheDefinition(length: Int) {
        var random = SplitMix64(seed: UInt64(length))
        for bytes in [[UInt8](repeating: 0xFF, count: length), (0..<length).map { _ in UInt8(truncatingIfNeeded: random.next()) }] {
            var s: UInt64 = 0
            var i = 0
            while i < bytes.count {
                s += UInt64(bytes[i]) << 8 | (i + 1 < bytes.count ? UInt64(bytes[i + 1]) : 0)
                i += 2
            }
            while s >> 16 != 0 { s = (s & 0xFFFF) + (s >> 16) }
            #expect(InternetChecksum.checksum(bytes) == ~UInt16(s))
        }
    }

    @Test func internetChecksumEqualsTheWordByWordDefinition() {
        func reference(_ bytes: [UInt8], _ initial: UInt64) -> UInt16 {
            var s = initial
            var i = 0
            while i < bytes.count {
                s += UInt64(bytes[i]) << 8 | (i + 1 < bytes.count ? UInt64(bytes[i + 1]) : 0)
                i += 2
            }
            while s >> 16 != 0 { s = (s & 0xFFFF) + (s >> 16) }
            return ~UInt16(s)
        }
        var random = SplitMix64(seed: 1071)
        for length in 0...300 {
            let fills: [[UInt8]] = [
                (0..<length).map { _ in UInt8(truncatingIfNeeded: random.next()) },
                [UInt8](repeating: 0, count: length),
                [UInt8](repeating: 0xFF, count: length),
            ]
            for bytes in fills {
                for initial: UInt64 in [0, 0xFFFF, 0x1_2345, random.next() >> 20] {
                    let expected = reference(bytes, initial)
                    #expect(InternetChecksum.finish(InternetChecksum.sum(bytes, into: initial)) == expected)
                    let cut = Int(random.next() % UInt64(length + 1)) & ~1
                    let first = bytes.withUnsafeBytes { InternetChecksum.sum(UnsafeRawBufferPointer(rebasing: $0[0..<cut]), into: initial) }
                    let both = bytes.withUnsafeBytes { InternetChecksum.sum(UnsafeRawBufferPointer(rebasing: $0[cut...]), into: first) }
                    #expect(InternetChecksum.finish(both) == expected, "length \(length), cut at \(cut)")
                }
            }
        }
    }

    /// The SACK blocks read where they lie are those of the option list, in order, for
    /// well-formed options and for a peer's random bytes (cut lengths, odd SACK sizes).
    @Test func sackBlocksReadInPlaceAreThoseOfTheOptionList() {
        var random = SplitMix64(seed: 2018)
        var withBlocks = 0
        for round in 0..<4000 {
            var h = TCPHeader(sourcePort: 1, destinationPort: 2, sequenceNumber: 3, flags: [.ack], window: 4)
            if round % 2 == 0 {
                let blocks = (0..<Int(random.next() % 5)).map { _ in
                    (SequenceNumber(UInt32(truncatingIfNeeded: random.next())), SequenceNumber(UInt32(truncatingIfNeeded: random.next())))
                }
                h.options = [.noOperation, .noOperation, .sack(blocks)]
            } else {
                // Kind 5 often, with any length byte after it.
                let bytes = (0..<40).map { i -> UInt8 in
                    let r = UInt8(truncatingIfNeeded: random.next())
                    return i % 10 == 0 && r & 1 == 0 ? 5 : r
                }
                h.optionBytes = bytes.withUnsafeBytes { TCPOptionBytes($0) }
            }
            var listed: [UInt32] = []
            for case let .sack(blocks) in h.options { for (s, e) in blocks { listed += [s.rawValue, e.rawValue] } }
            var read: [UInt32] = []
            h.forEachSACKBlock { s, e in read += [s.rawValue, e.rawValue] }
            #expect(read == listed)
            if !listed.isEmpty { withBlocks += 1 }
        }
        #expect(withBlocks > 1000)
    }

    /// The SACK option written in place is the bytes the option list writes, with or without
    /// timestamps before it, and left out whole where it would not fit.
    @Test func sackWrittenInPlaceIsTheOptionListsBytes() {
        for timestamps in [false, true] {
            for count in 0...4 {
                var blocks: [(SequenceNumber, SequenceNumber)] = []
                for k in 0..<count {
                    let left = UInt32(1000 * k + 1)
                    blocks.append((SequenceNumber(left), SequenceNumber(left + 499)))
                }
                var listed = TCPHeader(sourcePort: 1, destinationPort: 2, sequenceNumber: 3, flags: [.ack], window: 4)
                if timestamps { listed.appendTimestamps(value: 7, echoReply: 8) }
                var inPlace = listed
                listed.append(.noOperation)
                listed.append(.noOperation)
                listed.append(.sack(blocks))
                inPlace.appendSACK(count: count) { blocks[$0] }
                #expect(inPlace.optionBytes == listed.optionBytes, "\(count) blocks, timestamps \(timestamps)")
            }
        }
    }

    @Test func ipv4EmitParseRoundTrip() throws {
        var h = IPv4Header(protocol: IPProtocol.udp, source: a, destination: b, payloadLength: 12)
        h.identification = 0x1234
        h.dontFragment = true
        h.timeToLive = 77
        h.options = [1, 1, 1, 0]
        let bytes = h.emit() + [UInt8](repeating: 0, count: 12)
        let parsed = try bytes.withUnsafeBytes { try IPv4Header(parsing: $0) }
        #expect(parsed.source == a && parsed.destination == b && parsed.identification == 0x1234 && parsed.dontFragment)
        #expect(parsed.timeToLive == 77 && parsed.options == [1, 1, 1, 0] && parsed.totalLength == 36)
        #expect(bytes.withUnsafeBytes { IPv4Header.checksumValid(UnsafeRawBufferPointer(rebasing: $0[0..<24])) })
        var again = parsed
        again.checksum = 0
        var h2 = h
        h2.checksum = 0
        #expect(again == h2)
    }

    @Test func ipv4RejectsWhatIsNotIPv4() {
        let good = IPv4Header(protocol: .tcp, source: a, destination: b, payloadLength: 0).emit()
        var v6 = good
        v6[0] = 0x60
        var shortIHL = good
        shortIHL[0] = 0x44
        var long = good
        long[3] = 40
        for bad in [[UInt8](good.prefix(19)), v6, shortIHL, long] {
            #expect(throws: WireError.self) { try bad.withUnsafeBytes { try IPv4Header(parsing: $0) } }
        }
    }

    @Test func tcpEmitParseRoundTripWithOptions() throws {
        var t = TCPHeader(sourcePort: 42184, destinationPort: 9000, sequenceNumber: 0xFFFF_FFF0, flags: [.syn, .ack], window: 64240)
        t.acknowledgmentNumber = 77
        t.options = [.maximumSegmentSize(1460), .sackPermitted, .timestamps(value: 1, echoReply: 2), .noOperation, .windowScale(7),
                     .sack([(1, 2), (3, 4)])]
        let payload: [UInt8] = Array("hello".utf8)
        let segment = t.emit(source: a, destination: b, payload: payload) + payload
        let parsed = try segment.withUnsafeBytes { try TCPHeader(parsing: $0) }
        #expect(parsed.options == t.options)
        #expect(parsed.sourcePort == 42184 && parsed.sequenceNumber == 0xFFFF_FFF0 && parsed.flags == [.syn, .ack])
        var ip = IPv4Header(protocol: IPProtocol.tcp, source: a, destination: b, payloadLength: segment.count)
        ip.checksum = 0
        #expect(segment.withUnsafeBytes { IPPacketPrinter.transportChecksumValid(ip, $0) })
        let line = IPPacketPrinter.describe(ip.emit() + segment).text
        #expect(line == "IP 10.0.2.15 > 10.0.2.2 TCP 42184 > 9000 S. seq=4294967280 ack=77 win=64240 <mss 1460,sackOK,TS val 1 ecr 2,nop,wscale 7,sack 2 {1:2}{3:4}> len=5")
    }

    @Test func corruptedTCPChecksumIsShown() {
        let t = TCPHeader(sourcePort: 1, destinationPort: 2, sequenceNumber: 3, flags: [.rst], window: 0)
        var segment = t.emit(source: a, destination: b, payload: [])
        segment[16] ^= 0xFF
        let ip = IPv4Header(protocol: IPProtocol.tcp, source: a, destination: b, payloadLength: segment.count)
        #expect(IPPacketPrinter.describe(ip.emit() + segment).text.hasSuffix("bad-cksum"))
    }

    @Test func udpAndICMPRoundTrips() throws {
        let payload: [UInt8] = [1, 2, 3]
        let udp = UDPHeader(sourcePort: 53, destinationPort: 3333, payloadLength: payload.count)
        let datagram = udp.emit(source: a, destination: b, payload: payload) + payload
        let parsedUDP = try datagram.withUnsafeBytes { try UDPHeader(parsing: $0) }
        #expect(parsedUDP.length == 11 && parsedUDP.destinationPort == 3333)
        let ip = IPv4Header(protocol: IPProtocol.udp, source: a, destination: b, payloadLength: datagram.count)
        #expect(datagram.withUnsafeBytes { IPPacketPrinter.transportChecksumValid(ip, $0) })
        let icmp = ICMPHeader(type: ICMPHeader.echoRequest, code: 0, restOfHeader: 0x04D2_10E1)
        let message = icmp.emit(payload: payload) + payload
        #expect(InternetChecksum.checksum(message) == 0)
        let parsedICMP = try message.withUnsafeBytes { try ICMPHeader(parsing: $0) }
        #expect(parsedICMP.identifier == 0x04D2 && parsedICMP.sequence == 4321)
    }

    @Test func vjCompressedHeaderReadsDeltas() throws {
        // Change mask C|P|A|S with connection 3, checksum 0x1234, ack delta 1460 (0 05 b4), seq delta 1.
        let bytes: [UInt8] = [0x5C, 3, 0x12, 0x34, 0x00, 0x05, 0xB4, 0x01, 0xAA, 0xBB]
        let h = try bytes.withUnsafeBytes { try VJCompressedHeader(parsing: $0) }
        #expect(h.connection == 3 && h.tcpChecksum == 0x1234 && h.ackDelta == 1460 && h.sequenceDelta == 1 && h.headerLength == 8)
        #expect(h.summary == "conn=3 P A=+1460 S=+1")
        #expect(throws: WireError.self) { try [UInt8]([0x48, 1, 2]).withUnsafeBytes { try VJCompressedHeader(parsing: $0) } }
        #expect(throws: WireError.self) { try [UInt8]([0x80, 0, 0]).withUnsafeBytes { try VJCompressedHeader(parsing: $0) } }
    }
}
