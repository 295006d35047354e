import Framing
import Testing

/// pppd's first LCP Configure-Request from `pppd-record_default.pppd`, exactly as it went on the line.
let pppdConfReqOnWire: [UInt8] = hex("7eff7d23c0217d217d217d207d347d227d267d207d207d207d207d257d267d2cf67d5e7d5e7d277d227d287d22396d7e")
let pppdConfReqInformation: [UInt8] = hex("0101001402060000000005060cf67e7e07020802")

func hex(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var chars = s.filter { !$0.isWhitespace }.makeIterator()
    while let a = chars.next(), let b = chars.next() { out.append(UInt8(String([a, b]), radix: 16)!) }
    return out
}

/// Decodes `stream` whole, byte by byte and in random chunks, and checks that all three give
/// the same frames and counters (the swift-nio ByteToMessageDecoderVerifier idea).
func decodeAllWays(_ stream: [UInt8], make: () -> HDLCDecoder = { HDLCDecoder() },
                   sourceLocation: SourceLocation = #_sourceLocation) -> ([PPPFrame], DecoderCounters) {
    var whole = make()
    let expected = whole.decode(stream)
    var single = make()
    var bytewise: [PPPFrame] = []
    for b in stream { bytewise += single.decode([b]) }
    #expect(bytewise == expected, sourceLocation: sourceLocation)
    #expect(single.counters == whole.counters, sourceLocation: sourceLocation)
    var rng = TestRandom(seed: UInt64(stream.count))
    for _ in 0..<8 {
        var chunked = make()
        var frames: [PPPFrame] = []
        var offset = 0
        while offset < stream.count {
            let end = min(stream.count, offset + 1 + rng.below(40))
            frames += chunked.decode(Array(stream[offset..<end]))
            offset = end
        }
        #expect(frames == expected, sourceLocation: sourceLocation)
        #expect(chunked.counters == whole.counters, sourceLocation: sourceLocation)
    }
    return (expected, whole.counters)
}

/// An IPv4 frame with no FCS and both header fields compressed, escaped byte by byte as RFC
/// 1662 §4.2 defines: what the encoder's scans must come to.
func framedByDefinition(_ info: [UInt8], accm: UInt32) -> [UInt8] {
    var framed: [UInt8] = [0x7E, 0x21]
    for b in info {
        if b == 0x7E || b == 0x7D || (b < 0x20 && (accm >> UInt32(b)) & 1 == 1) {
            framed += [0x7D, b ^ 0x20]
        } else {
            framed.append(b)
        }
    }
    framed.append(0x7E)
    return framed
}

@Suite struct EncoderTests {
    @Test func lcpConfigureRequestMatchesPppd() {
        // LCP codes 1–7 escape every control character whatever the ACCM (RFC 1662 §7.1),
        // and keep FF 03 even with ACFC (RFC 1661 §6.6).
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0), compressAddressControl: true, compressProtocol: true)
        #expect(encoder.encode(protocol: .lcp, information: pppdConfReqInformation) == pppdConfReqOnWire)
    }

    @Test func compressionAppliesOnlyWhenSet() {
        let info: [UInt8] = [0x45, 0x00]
        let plain = HDLCEncoder(escapes: EscapeSet(accm: 0))
        var d = HDLCDecoder()
        let f1 = d.decode(plain.encode(protocol: .ipv4, information: info))
        #expect(f1 == [PPPFrame(protocol: .ipv4, information: info, addressControlPresent: true, protocolCompressed: false)])
        let compressed = HDLCEncoder(escapes: EscapeSet(accm: 0), compressAddressControl: true, compressProtocol: true)
        let wire = compressed.encode(protocol: .ipv4, information: info)
        #expect(wire.count == 1 + 1 + 2 + 2 + 1)
        let f2 = d.decode(wire)
        #expect(f2 == [PPPFrame(protocol: .ipv4, information: info, addressControlPresent: false, protocolCompressed: true)])
        // Protocols above 0xFF are never compressed.
        let f3 = d.decode(compressed.encode(protocol: .ipcp, information: info))
        #expect(f3.first?.protocolCompressed == false)
        #expect(d.counters.droppedFrames == 0)
    }

    @Test func escapesFollowTheSet() {
        let info: [UInt8] = [0x00, 0x11, 0x13, 0x1F, 0x20, 0x7D, 0x7E, 0x91]
        let none = HDLCEncoder(escapes: EscapeSet(accm: 0), compressAddressControl: true, compressProtocol: true)
        let wire = none.encode(protocol: .ipv4, information: info)
        // Only 0x7D and 0x7E are escaped with ACCM 0.
        #expect(Array(wire[2..<12]) == [0x00, 0x11, 0x13, 0x1F, 0x20, 0x7D, 0x5D, 0x7D, 0x5E, 0x91])
        let xonxoff = HDLCEncoder(escapes: EscapeSet(accm: 0x000A_0000, extra: [0x91]), compressAddressControl: true, compressProtocol: true)
        let wire2 = xonxoff.encode(protocol: .ipv4, information: info)
        #expect(Array(wire2[2..<16]) == [0x00, 0x7D, 0x31, 0x7D, 0x33, 0x1F, 0x20, 0x7D, 0x5D, 0x7D, 0x5E, 0x7D, 0xB1][0..<13] + [wire2[15]])
    }

    @Test func backToBackFramesShareAFlag() {
        let e = HDLCEncoder()
        var out: [UInt8] = []
        e.encode(protocol: .ipv4, information: [1, 2, 3], into: &out)
        e.encode(protocol: .ipv4, information: [4, 5, 6], into: &out)
        #expect(out.filter { $0 == 0x7E }.count == 3)
        var d = HDLCDecoder()
        #expect(d.decode(out).map(\.information) == [[1, 2, 3], [4, 5, 6]])
    }
}

@Suite struct DecoderTests {
    @Test func decodesPppdFrame() {
        let (frames, counters) = decodeAllWays(pppdConfReqOnWire)
        #expect(frames == [PPPFrame(protocol: .lcp, information: pppdConfReqInformation)])
        #expect(counters.frames == 1 && counters.droppedFrames == 0)
    }

    @Test func badFCSIsCountedAndTheNextFrameSurvives() {
        var bad = pppdConfReqOnWire
        bad[bad.count - 2] ^= 0x01
        let (frames, counters) = decodeAllWays(bad + pppdConfReqOnWire.dropFirst())
        #expect(frames.count == 1)
        #expect(counters.badFCS == 1)
    }

    @Test func emptyFramesAndIgnoredControlBytes() {
        // `7E 7E` and `7E 00 00 7E` with 0x00 in the receive ACCM are empty frames; the frame's
        // own opening flag makes a third.
        let stream: [UInt8] = [0x7E, 0x7E, 0x00, 0x00, 0x7E] + pppdConfReqOnWire
        let (frames, counters) = decodeAllWays(stream) { HDLCDecoder(receiveACCM: 0xFFFF_FFFF) }
        #expect(frames.count == 1)
        #expect(counters.emptyFrames == 3)
        #expect(counters.ignoredControlBytes == 2)
        // With ACCM 0 the two zero bytes are data: a runt.
        let (_, c2) = decodeAllWays(stream)
        #expect(c2.runts == 1 && c2.emptyFrames == 2)
    }

    @Test func controlCharactersInsertedByTheLineAreDropped() {
        // XON/XOFF inserted by a modem inside a frame: dropped when in the receive ACCM.
        var noisy = pppdConfReqOnWire
        noisy.insert(0x11, at: 10)
        noisy.insert(0x13, at: 20)
        let (frames, counters) = decodeAllWays(noisy) { HDLCDecoder(receiveACCM: 0x000A_0000) }
        #expect(frames.map(\.information) == [pppdConfReqInformation])
        #expect(counters.ignoredControlBytes == 2)
    }

    @Test func abortSequenceDropsTheFrame() {
        let aborted = Array(pppdConfReqOnWire[0..<20]) + [0x7D, 0x7E]
        let (frames, counters) = decodeAllWays(aborted + pppdConfReqOnWire.dropFirst())
        #expect(frames.count == 1)
        #expect(counters.aborted == 1)
    }

    @Test func tooLongFramesAreDroppedWithoutBuffering() {
        let encoder = HDLCEncoder()
        let big = encoder.encode(protocol: .ipv4, information: [UInt8](repeating: 0x45, count: 2000))
        let fits = encoder.encode(protocol: .ipv4, information: [UInt8](repeating: 0x45, count: 100))
        let (frames, counters) = decodeAllWays(big + fits) { HDLCDecoder(mru: 1500) }
        #expect(frames.count == 1 && frames[0].information.count == 100)
        #expect(counters.tooLong == 1)
        // A longer MRU accepts it.
        let (frames2, _) = decodeAllWays(big) { HDLCDecoder(mru: 2000) }
        #expect(frames2.count == 1)
    }

    /// The buffer's edge, met by each path of the decoder: a frame that fills the buffer to the
    /// byte is kept and one byte more is dropped, whether its bytes come plain (stored sixteen
    /// at a time), escaped (a pair at a time) or mixed, so the block stored whole into the
    /// slack past the frame's room never lets a frame through that the MRU refuses.
    @Test(arguments: [0, 1, 10, 256])
    func framesAtTheBuffersEdge(escapeEvery: Int) {
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0))
        let mru = 64
        var rng = TestRandom(seed: UInt64(escapeEvery))
        func information(_ count: Int) -> [UInt8] {
            (0..<count).map { i in
                if escapeEvery == 1 || (escapeEvery > 1 && i % escapeEvery == 0) { return i & 1 == 0 ? 0x7E : 0x7D }
                let b = UInt8(truncatingIfNeeded: rng.below(256))
                return b == 0x7E || b == 0x7D ? 0x41 : b
            }
        }
        for extra in 0...20 {
            let fits = information(mru - extra)
            let over = information(mru + 1 + extra)
            let stream = encoder.encode(protocol: .ipv4, information: over) + encoder.encode(protocol: .ipv4, information: fits)
                + encoder.encode(protocol: .ipv4, information: information(mru))
            let (frames, counters) = decodeAllWays(stream) { HDLCDecoder(mru: mru) }
            #expect(frames.count == 2)
            #expect(frames.first?.information == fits)
            #expect(frames.last?.information.count == mru)
            #expect(counters.tooLong == 1)
        }
    }

    @Test func garbageBeforeAndBetweenFramesResynchronises() {
        var rng = TestRandom(seed: 7)
        let garbage = (0..<300).map { _ in rng.byte() }.filter { $0 != 0x7E }
        let stream = garbage + pppdConfReqOnWire + garbage + [0x7E] + pppdConfReqOnWire.dropFirst()
        let (frames, counters) = decodeAllWays(stream)
        #expect(frames.count == 2)
        #expect(counters.discardedBytes > 0)
        #expect(counters.frames == 2)
    }

    @Test func runtsAndBadHeaders() {
        // A frame of 3 bytes with FCS-16 is a runt; FF 05 is not a PPP header.
        var stream: [UInt8] = [0x7E, 0x21, 0x01, 0x02, 0x7E]
        let badHeader: [UInt8] = [0xFF, 0x05, 0x00, 0x21, 0x45]
        let f = FCS16.checksum(badHeader)
        stream += badHeader + [UInt8(f & 0xFF), UInt8(f >> 8), 0x7E]
        let (frames, counters) = decodeAllWays(stream)
        #expect(frames.isEmpty)
        #expect(counters.runts == 1)
        #expect(counters.badHeader == 1)
    }

    /// A special byte at every position of the sixteen-byte blocks and eight-byte words the
    /// encoder and decoder scan, in both sets they scan for: the bytes on the wire are exactly
    /// the escaping RFC 1662 §4.2 defines, and they decode back.
    @Test(arguments: [UInt32(0), 0xFFFF_FFFF])
    func aSpecialByteAtEveryPositionOfABlock(accm: UInt32) {
        let encoder = HDLCEncoder(fcs: .none, escapes: EscapeSet(accm: accm), compressAddressControl: true, compressProtocol: true)
        for special: UInt8 in [0x7E, 0x7D, 0x00, 0x1F, 0x20, 0x5E, 0x80, 0xFF] {
            for position in 0..<48 {
                var info = [UInt8](repeating: 0x41, count: 48)
                info[position] = special
                let wire = encoder.encode(protocol: .ipv4, information: info)
                let expected = framedByDefinition(info, accm: accm)
                #expect(wire == expected, "special \(special) at \(position)")
                let (frames, counters) = decodeAllWays(wire) { HDLCDecoder(fcs: .none, receiveACCM: accm) }
                #expect(frames.map(\.information) == [info] && counters.droppedFrames == 0, "special \(special) at \(position)")
            }
        }
    }

    /// Runs of every length up to 200 bytes, plain, sparse, dense and all special, against the
    /// byte-by-byte definition of RFC 1662 §4.2, for both sets the vector scan is used with:
    /// the runs cross the 32-, 16- and 8-byte steps of the scan at every offset. Then frames
    /// long enough to be escaped in pieces, around the lengths where that starts.
    @Test(arguments: [UInt32(0), 0xFFFF_FFFF])
    func escapedRunsOfEveryLengthAndDensityMatchTheDefinition(accm: UInt32) {
        let encoder = HDLCEncoder(fcs: .none, escapes: EscapeSet(accm: accm), compressAddressControl: true, compressProtocol: true)
        var rng = TestRandom(seed: UInt64(accm) ^ 0x1662)
        let specials: [UInt8] = [0x7E, 0x7D, 0x00, 0x1F]
        for length in Array(0...200) + [499, 500, 501, 502, 503, 1019, 1500, 2000, 4093] {
            for density in [0, 1, 10, 50, 100] {
                let info = (0..<length).map { _ in
                    rng.below(100) < density ? specials[rng.below(specials.count)] : UInt8(0x20 + rng.below(0x5D))
                }
                let expected = framedByDefinition(info, accm: accm)
                #expect(encoder.encode(protocol: .ipv4, information: info) == expected, "length \(length), density \(density)")
            }
        }
    }

    /// The word scan finds the first special byte at every position in a word, for each of the
    /// receive ACCMs that select a scan (0, all ones) and one that takes the table: whole
    /// streams decode as they do a byte at a time and in random chunks (`decodeAllWays`).
    /// The streams mix valid frames with runs of specials, ignored controls, escapes before
    /// specials, aborts and garbage, so every way out of the fast path is taken.
    @Test(arguments: [UInt32(0), 0xFFFF_FFFF, 0x000A_0000])
    func wordScanDecodesAsTheStateMachineDoes(receiveACCM: UInt32) {
        var rng = TestRandom(seed: UInt64(receiveACCM) ^ 0x5CA9)
        let specials: [UInt8] = [0x7E, 0x7D, 0x00, 0x11, 0x13, 0x1F, 0x5E, 0x5D, 0x20]
        let encoder = HDLCEncoder(escapes: EscapeSet(accm: 0xFFFF_FFFF))
        var delivered = 0
        var tooLong = 0
        for _ in 0..<40 {
            var stream: [UInt8] = [0x7E]
            for _ in 0..<(1 + rng.below(5)) {
                switch rng.below(4) {
                case 0:
                    // Specials at each offset of a word inside a plain run.
                    var info = (0..<(16 + rng.below(200))).map { _ in UInt8(0x21 + rng.below(0x5B)) }
                    for k in 0..<min(8, info.count) where rng.below(2) == 0 { info[k * (info.count / 8)] = specials[rng.below(specials.count)] }
                    encoder.encode(protocol: .ipv4, information: info, into: &stream)
                case 1:
                    // Raw bytes straight onto the line: specials, controls, split escapes.
                    for _ in 0..<rng.below(64) {
                        stream.append(rng.below(3) == 0 ? specials[rng.below(specials.count)] : rng.byte())
                    }
                case 2:
                    // An escape before a special, then a flag: an abort or worse.
                    stream += [0x41, 0x42, 0x7D, specials[rng.below(specials.count)], 0x7E]
                default:
                    encoder.encode(protocol: .lcp, information: (0..<rng.below(1600)).map { _ in rng.byte() }, into: &stream)
                }
            }
            let (frames, _) = decodeAllWays(stream) { HDLCDecoder(receiveACCM: receiveACCM) }
            delivered += frames.count
            // And with a small MRU, so frames overflow the buffer in a run and in an escape pair.
            let (_, small) = decodeAllWays(stream) { HDLCDecoder(mru: 24, receiveACCM: receiveACCM) }
            tooLong += small.tooLong
        }
        #expect(delivered > 20 && tooLong > 20)
    }

    @Test(arguments: [FCSKind.fcs16, .fcs32, .none])
    func randomRoundTrips(fcs: FCSKind) {
        var rng = TestRandom(seed: 0xF00D)
        for round in 0..<60 {
            var set = EscapeSet(accm: UInt32(truncatingIfNeeded: rng.next()))
            if round % 3 == 0 { for _ in 0..<rng.below(20) { set.insert(rng.byte()) } }
            let encoder = HDLCEncoder(fcs: fcs, escapes: set, compressAddressControl: rng.below(2) == 0,
                                      compressProtocol: rng.below(2) == 0)
            var stream: [UInt8] = []
            var sent: [(ProtocolNumber, [UInt8])] = []
            for _ in 0..<(1 + rng.below(6)) {
                let protocols: [ProtocolNumber] = [.ipv4, .vjCompressedTCP, .vjUncompressedTCP, .ipcp, .lcp, .pap, .ccp]
                let proto = protocols[rng.below(protocols.count)]
                var info = (0..<rng.below(1500)).map { _ in rng.byte() }
                if proto == .lcp, !info.isEmpty { info[0] = 9 }
                encoder.encode(protocol: proto, information: info, into: &stream)
                sent.append((proto, info))
            }
            // Every byte in the set went out escaped.
            var afterEscape = false
            for b in stream {
                if !afterEscape && b != 0x7E && b != 0x7D { #expect(!set.contains(b)) }
                afterEscape = b == 0x7D
            }
            let (frames, counters) = decodeAllWays(stream) { HDLCDecoder(fcs: fcs) }
            #expect(frames.map(\.protocol) == sent.map(\.0))
            #expect(frames.map(\.information) == sent.map(\.1))
            #expect(counters.droppedFrames == 0)
        }
    }
}
