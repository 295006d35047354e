import Glibc
import NetStack

/// Seeded frame loss on a byte stream, for testing recovery against real peers: each frame
/// (the bytes between 0x7E flags) is dropped whole with probability `frameLoss`. Frames may
/// span calls; the decision for a frame is made at its opening flag.
public struct FrameDropper: Sendable {
    public let frameLoss: Double
    private var rng: SplitMix64
    private var dropping = false
    /// The frame being dropped has lost a byte already (and is counted).
    private var counted = false
    /// Frames that lost bytes. The empty span between a closing and an opening flag is
    /// decided on too, but skips nothing and so is not a frame dropped.
    public private(set) var framesDropped = 0

    public init(frameLoss: Double, seed: UInt64) {
        self.frameLoss = frameLoss
        rng = SplitMix64(seed: seed)
    }

    public mutating func filter(_ bytes: [UInt8]) -> [UInt8] {
        guard frameLoss > 0 else { return bytes }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var start = 0
        for i in bytes.indices where bytes[i] == 0x7E {
            take(bytes[start..<i], into: &out)
            out.append(0x7E)
            start = i + 1
            dropping = Double(rng.next() >> 11) / Double(1 << 53) < frameLoss
            counted = false
        }
        take(bytes[start...], into: &out)
        return out
    }

    private mutating func take(_ span: ArraySlice<UInt8>, into out: inout [UInt8]) {
        if !dropping {
            out += span
        } else if !span.isEmpty && !counted {
            counted = true
            framesDropped += 1
        }
    }
}

/// Seeded bit errors on the bytes written to a line, for a simulated noisy line: each bit is
/// flipped with probability `bitErrorRate`. The gaps between errors are drawn from the
/// geometric distribution, so the cost is per error, not per bit. The peer's FCS check
/// (RFC 1662 §C) is what has to catch them.
public struct LineNoise: Sendable {
    public let bitErrorRate: Double
    private var rng: SplitMix64
    private var bitsToNextError = Int.max / 2
    /// Bits flipped so far.
    public private(set) var bitsFlipped = 0

    /// A rate outside 0...1 (or not a number) is clamped: 0 is a clean line.
    public init(bitErrorRate: Double, seed: UInt64) {
        self.bitErrorRate = bitErrorRate.isNaN ? 0 : min(max(bitErrorRate, 0), 1)
        rng = SplitMix64(seed: seed)
        bitsToNextError = nextGap()
    }

    private mutating func nextGap() -> Int {
        guard bitErrorRate > 0 else { return Int.max / 2 }
        guard bitErrorRate < 1 else { return 0 }
        // u in (0, 1]: the number of clean bits before the next error.
        let u = (Double(rng.next() >> 11) + 1) / Double(UInt64(1) << 53)
        let gap = (log(u) / log1p(-bitErrorRate)).rounded(.down)
        return gap >= Double(Int.max / 4) ? Int.max / 4 : Int(gap)
    }

    /// Flips the bits due in `bytes`; the count of clean bits carries over to the next call.
    public mutating func apply(_ bytes: inout [UInt8]) {
        let total = bytes.count * 8
        var bit = bitsToNextError
        while bit < total {
            bytes[bit >> 3] ^= UInt8(1) << UInt8(bit & 7)
            bitsFlipped += 1
            bit += 1 + nextGap()
        }
        bitsToNextError = bit - total
    }
}
