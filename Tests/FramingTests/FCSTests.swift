import Framing
import Testing

@Suite struct FCSTests {
    let check = Array("123456789".utf8)

    @Test func fcs16CheckValue() {
        // CRC-16/X-25, the FCS-16 of RFC 1662 §C.2, has check value 0x906E.
        #expect(FCS16.checksum(check) == 0x906E)
    }

    @Test func fcs32CheckValue() {
        // CRC-32, the FCS-32 of RFC 1662 §C.3, has check value 0xCBF43926.
        #expect(FCS32.checksum(check) == 0xCBF4_3926)
    }

    @Test(arguments: [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 1500])
    func goodResidues(length: Int) {
        var rng = TestRandom(seed: UInt64(length) + 1)
        let data = (0..<length).map { _ in rng.byte() }
        let f16 = FCS16.checksum(data)
        #expect(FCS16.update(FCS16.initial, data + [UInt8(f16 & 0xFF), UInt8(f16 >> 8)]) == FCS16.goodResidue)
        #expect(FCS16.goodResidue == 0xF0B8)
        let f32 = FCS32.checksum(data)
        let trailer = (0..<4).map { UInt8(truncatingIfNeeded: f32 >> (8 * UInt32($0))) }
        #expect(FCS32.update(FCS32.initial, data + trailer) == FCS32.goodResidue)
        #expect(FCS32.goodResidue == 0xDEBB_20E3)
    }

    @Test func slicedEqualsBytewise() {
        // The slicing-by-8 path must agree with the RFC's one-byte-at-a-time loop.
        var rng = TestRandom(seed: 99)
        for length in 0..<80 {
            let data = (0..<length).map { _ in rng.byte() }
            var reference: UInt16 = 0xFFFF
            for b in data {
                var v = (reference ^ UInt16(b)) & 0xFF
                for _ in 0..<8 { v = v & 1 == 1 ? (v >> 1) ^ 0x8408 : v >> 1 }
                reference = (reference >> 8) ^ v
            }
            #expect(FCS16.update(FCS16.initial, data) == reference)
            // Split anywhere: incremental updates compose.
            let cut = length / 3
            #expect(FCS16.update(FCS16.update(FCS16.initial, data[..<cut]), data[cut...]) == reference)
        }
    }
}

/// A deterministic generator for tests (SplitMix64).
struct TestRandom {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
