import Testing
@testable import Channel

struct FrameDropperTests {
    @Test func onlyFramesThatLostBytesAreCounted() {
        var d = FrameDropper(frameLoss: 1.0, seed: 1)
        // Two frames, each with its own pair of flags: the empty span between them is decided
        // on too, but loses nothing.
        let out = d.filter([0x7E, 1, 2, 0x7E, 0x7E, 3, 4, 0x7E])
        #expect(out == [0x7E, 0x7E, 0x7E, 0x7E])
        #expect(d.framesDropped == 2)
        // Back to back flags with nothing between them.
        _ = d.filter([0x7E, 0x7E, 0x7E])
        #expect(d.framesDropped == 2)
    }

    @Test func aFrameSpanningCallsIsCountedOnce() {
        var d = FrameDropper(frameLoss: 1.0, seed: 1)
        #expect(d.filter([0x7E, 1]) == [0x7E])
        #expect(d.filter([2, 3]) == [])
        #expect(d.filter([4, 0x7E]) == [0x7E])
        #expect(d.framesDropped == 1)
    }

    @Test func noLossPassesEveryByteAndCountsNothing() {
        var d = FrameDropper(frameLoss: 0, seed: 1)
        let bytes: [UInt8] = [0x7E, 1, 2, 0x7E, 3]
        #expect(d.filter(bytes) == bytes)
        #expect(d.framesDropped == 0)
    }

    @Test func aPartialLossCountsWhatItDroppedAndKeepsTheRestWhole() {
        var d = FrameDropper(frameLoss: 0.5, seed: 3)
        var input: [UInt8] = []
        for i in 0..<1000 { input += [0x7E, UInt8(i % 100), 0xAA] }
        input.append(0x7E)
        let out = d.filter(input)
        // Every frame arrives whole or not at all: between flags, two bytes or none.
        let kept = out.split(separator: 0x7E, omittingEmptySubsequences: true)
        #expect(kept.allSatisfy { $0.count == 2 })
        #expect(kept.count + d.framesDropped == 1000)
        #expect(d.framesDropped > 300 && d.framesDropped < 700)
    }
}
