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
