import CVectorScan
@testable import Framing
import NetStack
import Testing

/// The framer's sixteen- and thirty-two-byte scans against a byte-by-byte definition, for both sets it is used
/// with, on blocks built around the values next to the set's edges.
struct VectorScanTests {
    @Test func theVectorScansFindTheFirstSpecialByteAsTheDefinitionDoes() {
        func definition(_ block: ArraySlice<UInt8>, controls: Bool) -> Int {
            (block.firstIndex { $0 == HDLC.flag || $0 == HDLC.escape || (controls && $0 < 0x20) } ?? block.endIndex) - block.startIndex
        }
        // Each special value and its neighbours, and the signed-compare trap values 0x80/0xFF.
        let edges: [UInt8] = [0x00, 0x01, 0x1E, 0x1F, 0x20, 0x21, 0x7C, 0x7D, 0x7E, 0x7F, 0x80, 0x9F, 0xA0, 0xFD, 0xFE, 0xFF]
        var random = SplitMix64(seed: 1662)
        var checked = 0
        for _ in 0..<20_000 {
            var block = (0..<32).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            // Mostly plain backgrounds, then up to three edge values at random places.
            if random.next() % 2 == 0 { block = block.map { 0x40 | ($0 & 0x3F) } }
            for _ in 0..<Int(random.next() % 4) {
                block[Int(random.next() % 32)] = edges[Int(random.next() % UInt64(edges.count))]
            }
            // Read at an odd address inside a larger buffer: the load is unaligned.
            let padded = [0x7E] + block + [0x7E]
            padded.withUnsafeBytes { raw in
                let p = raw.baseAddress! + 1
                for (mode, controls) in [(ScanMode.flagAndEscape, false), (.controlsFlagAndEscape, true)] {
                    let expected = definition(block[0..<16], controls: controls)
                    #expect(mode.plainPrefix16(p) == expected, "\(block) controls \(controls)")
                    #expect(Int(pb_plain_prefix16_reference(p, controls ? 1 : 0)) == expected)
                    #expect(mode.plainPrefix(p.loadUnaligned(as: SIMD16<UInt8>.self)) == expected)
                    let expected32 = definition(block[...], controls: controls)
                    #expect(mode.plainPrefix32(p) == expected32, "\(block) controls \(controls)")
                    #expect(Int(pb_plain_prefix32_reference(p, controls ? 1 : 0)) == expected32)
                    checked += 1
                }
            }
        }
        #expect(checked == 40_000)
        #expect(ScanMode.table.plainPrefix16([UInt8](repeating: 0x41, count: 16)) == 0)
        #expect(ScanMode.table.plainPrefix32([UInt8](repeating: 0x41, count: 32)) == 0)
    }
}
