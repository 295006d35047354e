import CCarrylessMultiply
@testable import Framing
import NetStack
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

    /// The register run bit by bit (RFC 1662 §C.2/§C.3's definition, no tables).
    static func bitwise<W: FixedWidthInteger & UnsignedInteger>(_ register: W, _ bytes: some Collection<UInt8>, reflectedPolynomial poly: W) -> W {
        var r = register
        for b in bytes {
            r ^= W(b)
            for _ in 0..<8 { r = r & 1 == 1 ? (r >> 1) ^ poly : r >> 1 }
        }
        return r
    }

    @Test(.enabled(if: pb_carryless_multiply_available() != 0, "the CPU has no carry-less multiply"))
    func foldedEqualsTablesAndBitwise() {
        // Long runs fold with carry-less multiplication first: every length around the block
        // sizes (16, 64) and the frame sizes, from any register, at any alignment.
        let folding16 = SlicingTables<UInt16>(reflectedPolynomial: 0x8408, carrylessMultiply: true)
        let folding32 = SlicingTables<UInt32>(reflectedPolynomial: 0xEDB8_8320, carrylessMultiply: true)
        #expect(folding16.foldConstants != nil && folding32.foldConstants != nil)
        var rng = TestRandom(seed: 7)
        let buffer = (0..<4200).map { _ in rng.byte() }
        var lengths = Array(0..<300)
        lengths += [511, 512, 513, 1023, 1024, 1500, 1502, 1504, 1506, 2048, 4095, 4096]
        for length in lengths {
            for _ in 0..<3 {
                let offset = rng.below(buffer.count - length + 1)
                let r16 = UInt16(truncatingIfNeeded: rng.next()), r32 = UInt32(truncatingIfNeeded: rng.next())
                let slice = buffer[offset..<(offset + length)]
                let expected16 = Self.bitwise(r16, slice, reflectedPolynomial: UInt16(0x8408))
                let expected32 = Self.bitwise(r32, slice, reflectedPolynomial: UInt32(0xEDB8_8320))
                slice.withUnsafeBytes { b in
                    #expect(folding16.update(r16, b) == expected16, "FCS-16, \(length) bytes at \(offset)")
                    #expect(folding16.tableUpdate(r16, b) == expected16)
                    #expect(folding32.update(r32, b) == expected32, "FCS-32, \(length) bytes at \(offset)")
                    #expect(folding32.tableUpdate(r32, b) == expected32)
                }
            }
        }
        // All ones and all zeros, whose blocks fold onto themselves.
        for fill: UInt8 in [0x00, 0xFF, 0x7E] {
            let run = [UInt8](repeating: fill, count: 1500)
            run.withUnsafeBytes { b in
                #expect(folding16.update(0xFFFF, b) == Self.bitwise(UInt16(0xFFFF), run, reflectedPolynomial: UInt16(0x8408)))
                #expect(folding32.update(0xFFFF_FFFF, b) == Self.bitwise(UInt32(0xFFFF_FFFF), run, reflectedPolynomial: UInt32(0xEDB8_8320)))
            }
        }
    }

    @Test func withoutCarrylessMultiplyTheTablesAlone() {
        let tables = SlicingTables<UInt16>(reflectedPolynomial: 0x8408, carrylessMultiply: false)
        #expect(tables.foldConstants == nil)
        var rng = TestRandom(seed: 8)
        let data = (0..<1500).map { _ in rng.byte() }
        data.withUnsafeBytes { #expect(tables.update(0xFFFF, $0) == Self.bitwise(UInt16(0xFFFF), data, reflectedPolynomial: UInt16(0x8408))) }
    }
}

/// A deterministic generator for tests: NetStack's SplitMix64, with the draws these tests use.
struct TestRandom {
    private var generator: SplitMix64
    init(seed: UInt64) { generator = SplitMix64(seed: seed) }
    mutating func next() -> UInt64 { generator.next() }
    mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
