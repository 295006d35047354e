import Testing
@testable import NetStack

@Suite struct VJCompressionTests {
    /// Every packet of a real exchange between two of our stacks (timestamps off, as on a
    /// VJ link), compressed and decompressed, comes back byte for byte.
    static func exchange() -> [[UInt8]] {
        var config = IPStackConfiguration(address: Peer.us)
        config.tcp.timestamps = false
        var a = IPStack(configuration: config, seed: 1)
        config.address = Peer.them
        var b = IPStack(configuration: config, seed: 2)
        try! b.listen(port: 7)
        var now = Instant.zero
        let c = try! a.connect(to: TCPEndpoint(Peer.them, 7), now: now)
        var s: ConnectionID?
        var packets: [[UInt8]] = []
        var written = 0
        let data = bytes(200_000)
        for _ in 0..<5000 {
            let fromA = a.takeOutgoing()
            let fromB = b.takeOutgoing()
            packets += fromA + fromB
            for p in fromA { b.receive(packet: p, now: now) }
            for p in fromB { a.receive(packet: p, now: now) }
            if s == nil { s = b.accept(port: 7) }
            if written < data.count { written += a.write(c, data[written...].prefix(3000), now: now) }
            if let s {
                // Echo a little back, so both directions carry data and ACKs.
                let got = b.read(s, now: now)
                if !got.isEmpty { b.write(s, got.prefix(10), now: now) }
            }
            if fromA.isEmpty && fromB.isEmpty, let t = earliest(a.pollAt, b.pollAt) {
                now = max(now, t)
                a.poll(now: now)
                b.poll(now: now)
            }
            if written == data.count && packets.count > 400 { break }
        }
        return packets
    }

    @Test func roundTripOverARealExchange() {
        var compressor = VJCompressor(parameters: VJParameters())
        var decompressor = VJDecompressor(parameters: VJParameters())
        var kinds: [UInt16: Int] = [:]
        var saved = 0
        for p in Self.exchange() {
            let (proto, bytes) = compressor.compress(p)
            kinds[proto, default: 0] += 1
            saved += p.count - bytes.count
            let back: [UInt8]?
            switch proto {
            case 0x002D: back = decompressor.compressed(bytes)
            case 0x002F: back = decompressor.uncompressed(bytes)
            default: back = bytes
            }
            #expect(back == p)
        }
        #expect(kinds[0x0021, default: 0] == 2, "SYN and SYN-ACK go as plain IP")
        #expect(kinds[0x002D, default: 0] > kinds[0x002F, default: 0] * 10, "\(kinds)")
        #expect(saved > 0)
    }

    /// The data path compresses in place: the information field is the packet's own tail,
    /// byte for byte what the copying call gives, in the same array; decompression into one
    /// kept array gives every packet back.
    @Test func inPlaceCompressionMatchesTheCopyInTheSameArray() {
        var copying = VJCompressor(parameters: VJParameters())
        var inPlace = VJCompressor(parameters: VJParameters())
        var decompressor = VJDecompressor(parameters: VJParameters())
        var rebuilt: [UInt8] = []
        var compressedCount = 0
        for p in Self.exchange() {
            let (proto, bytes) = copying.compress(p)
            // An array of its own (not one sharing `p`'s storage, which a write would copy).
            var packet: [UInt8] = []
            packet.append(contentsOf: p)
            let storage = packet.withUnsafeBytes { $0.baseAddress }
            let (inPlaceProto, start) = inPlace.compress(&packet)
            #expect(inPlaceProto == proto)
            #expect(Array(packet[start...]) == bytes)
            #expect(packet.withUnsafeBytes { $0.baseAddress } == storage, "compressed in its own array")
            if proto == 0x002D {
                compressedCount += 1
                #expect(start >= 40 - 19, "the header is written over the end of the one it replaces")
                #expect(decompressor.compressed(Array(packet[start...]), into: &rebuilt))
                #expect(rebuilt == p)
            } else if proto == 0x002F {
                #expect(start == 0 && decompressor.uncompressed(packet) == p)
            }
        }
        #expect(compressedCount > 100)
        // A packet that cannot be rebuilt leaves the kept array empty.
        #expect(!decompressor.compressed([0x40, 99, 0, 0], into: &rebuilt))
        #expect(rebuilt.isEmpty)
    }

    @Test func damagedFrameTossesUntilResynchronised() {
        var compressor = VJCompressor(parameters: VJParameters())
        var decompressor = VJDecompressor(parameters: VJParameters())
        // One direction of one connection: the slot repeats, so the slot id is left out.
        let oneWay = Self.exchange().filter { Array($0[12..<16]) == Peer.us.bytes }
        let frames = oneWay.map { compressor.compress($0) }.filter { $0.protocol != 0x0021 }
        // Deliver the first uncompressed one and one compressed, then lose one compressed frame.
        let firstCompressed = frames.firstIndex { $0.protocol == 0x002D }!
        for f in frames[...firstCompressed] {
            _ = f.protocol == 0x002D ? decompressor.compressed(f.bytes) : decompressor.uncompressed(f.bytes)
        }
        decompressor.toss()
        var dropped = 0
        for f in frames[(firstCompressed + 2)...] where f.protocol == 0x002D && f.bytes[0] & 0x40 == 0 {
            #expect(decompressor.compressed(f.bytes) == nil, "a compressed packet without a slot id after an error is dropped")
            dropped += 1
        }
        #expect(dropped > 10 && decompressor.tossed == dropped)
        // An uncompressed packet resynchronises.
        #expect(decompressor.uncompressed(frames[0].bytes) != nil)
        #expect(!decompressor.tossing)
    }

    @Test func deltaEncodingAndSpecialCases() {
        // A bulk-data segment after another of the same length: SPECIAL_D (S, A, W, U bits) only.
        var c = VJCompressor(parameters: VJParameters())
        var h = TCPHeader(sourcePort: 1000, destinationPort: 80, sequenceNumber: 1, flags: [.ack], window: 1000)
        h.acknowledgmentNumber = 500
        func packet(_ h: TCPHeader, id: UInt16, payload: [UInt8]) -> [UInt8] {
            var ip = IPv4Header(protocol: IPProtocol.tcp, source: Peer.us, destination: Peer.them, payloadLength: 20 + payload.count)
            ip.identification = id
            return ip.emit() + h.emit(source: Peer.us, destination: Peer.them, payload: payload) + payload
        }
        _ = c.compress(packet(h, id: 1, payload: bytes(100)))
        h.sequenceNumber = 101
        let (proto, out) = c.compress(packet(h, id: 2, payload: bytes(100)))
        #expect(proto == 0x002D)
        #expect(out[0] == 0x0F, "unidirectional data: S A W U together, no deltas")
        #expect(out.count == 3 + 100)
        // A window change of 300 takes the three-byte form; an IP id jump adds I.
        h.sequenceNumber = 201
        h.window = 1300
        let (_, out2) = c.compress(packet(h, id: 10, payload: bytes(100)))
        #expect(out2[0] == 0x2A && Array(out2[3..<6]) == [0, 1, 44] && out2[6] == 100 && out2[7] == 8)
    }
}

extension VJCompressionTests {
    /// What VJ cannot carry (ECN flags, reserved bits, a changed IP flags byte) goes uncompressed,
    /// so it arrives unchanged (found by the fuzz target).
    @Test func fieldsVJCannotEncodeGoUncompressed() {
        var c = VJCompressor(parameters: VJParameters())
        var d = VJDecompressor(parameters: VJParameters())
        var h = TCPHeader(sourcePort: 1000, destinationPort: 80, sequenceNumber: 1, flags: [.ack], window: 1000)
        func packet(_ h: TCPHeader, id: UInt16, tweak: (inout [UInt8]) -> Void = { _ in }) -> [UInt8] {
            var ip = IPv4Header(protocol: IPProtocol.tcp, source: Peer.us, destination: Peer.them, payloadLength: 30)
            ip.identification = id
            var p = ip.emit() + h.emit(source: Peer.us, destination: Peer.them, payload: bytes(10)) + bytes(10)
            tweak(&p)
            var fixed = try! p.withUnsafeBytes { try IPv4Header(parsing: $0) }.emit()
            fixed.replaceSubrange(4..<8, with: p[4..<8])
            p.replaceSubrange(0..<20, with: fixed)
            p[10] = 0
            p[11] = 0
            let sum = InternetChecksum.checksum(p[0..<20])
            p[10] = UInt8(sum >> 8)
            p[11] = UInt8(sum & 0xFF)
            return p
        }
        func roundTrip(_ p: [UInt8]) -> UInt16 {
            let (proto, bytes) = c.compress(p)
            let back = proto == 0x002D ? d.compressed(bytes) : proto == 0x002F ? d.uncompressed(bytes) : bytes
            #expect(back == p)
            return proto
        }
        #expect(roundTrip(packet(h, id: 1)) == 0x002F)
        h.sequenceNumber = 11
        #expect(roundTrip(packet(h, id: 2)) == 0x002D)
        h.sequenceNumber = 21
        h.flags = [.ack, .ece]
        #expect(roundTrip(packet(h, id: 3)) == 0x002F, "ECE changed")
        h.sequenceNumber = 31
        #expect(roundTrip(packet(h, id: 4) { $0[20 + 12] |= 0x01 }) == 0x002F, "a reserved bit changed")
        h.sequenceNumber = 41
        #expect(roundTrip(packet(h, id: 5) { $0[20 + 12] |= 0x01; $0[6] |= 0x80 }) == 0x002F, "the IP flags byte changed")
    }
}

extension VJCompressionTests {
    /// A segment dropping URG after one that carried it, advancing only the sequence number by
    /// the last segment's length, looks like SPECIAL_D, which leaves the saved header's URG set
    /// at the decompressor (found by the stack fuzz target once its checksums were fixed up).
    @Test func droppingUrgentGoesUncompressed() {
        var c = VJCompressor(parameters: VJParameters())
        var d = VJDecompressor(parameters: VJParameters())
        var h = TCPHeader(sourcePort: 40000, destinationPort: 80, sequenceNumber: 1, flags: [.ack, .urg], window: 0)
        func packet(_ h: TCPHeader, id: UInt16) -> [UInt8] {
            var ip = IPv4Header(protocol: IPProtocol.tcp, source: Peer.them, destination: Peer.us, payloadLength: 30)
            ip.identification = id
            return ip.emit() + h.emit(source: Peer.them, destination: Peer.us, payload: bytes(10)) + bytes(10)
        }
        func roundTrip(_ p: [UInt8]) -> UInt16 {
            let (proto, bytes) = c.compress(p)
            let back = proto == 0x002D ? d.compressed(bytes) : proto == 0x002F ? d.uncompressed(bytes) : bytes
            #expect(back == p)
            return proto
        }
        _ = roundTrip(packet(h, id: 1))
        h.sequenceNumber = 11
        h.flags = [.ack, .psh]
        #expect(roundTrip(packet(h, id: 7)) == 0x002F, "URG dropped")
        h.sequenceNumber = 21
        #expect(roundTrip(packet(h, id: 8)) == 0x002D, "and compression resumes after it")
    }
}
