import NetStack
import Testing

@Suite struct ByteQueueTests {
    /// Random appends, removals, copies and takes against a plain array: the contents slide
    /// along the ring, so it wraps, grows while wrapped, and empties, and every byte comes out
    /// where the array says.
    @Test func behavesAsAnArrayThroughWrapsAndGrowth() {
        var random = SplitMix64(seed: 0xB1F0)
        var queue = ByteQueue()
        var model: [UInt8] = []
        var next: UInt8 = 0
        for step in 0..<1500 {
            let roll = random.next() % 10
            switch roll {
            case 0...3:
                let n = Int(random.next() % 3000)
                let bytes = (0..<n).map { _ -> UInt8 in next &+= 1; return next }
                if roll == 0 {
                    queue.append(contentsOf: bytes[...])
                } else {
                    bytes.withUnsafeBytes { queue.append($0) }
                }
                model += bytes
            case 4...5:
                let n = Int(random.next() % 2500)
                queue.removeFirst(n)
                model.removeFirst(min(n, model.count))
            case 6:
                let n = Int(random.next() % 2000)
                #expect(queue.take(n) == Array(model.prefix(n)))
                model.removeFirst(min(n, model.count))
            case 7:
                var out: [UInt8] = [0xEE]
                let n = Int(random.next() % 2000)
                #expect(queue.take(n, appendingTo: &out) == min(n, model.count))
                #expect(out == [0xEE] + model.prefix(n))
                model.removeFirst(min(n, model.count))
            case 8:
                guard !model.isEmpty else { continue }
                let offset = Int(random.next() % UInt64(model.count))
                let length = Int(random.next() % UInt64(model.count - offset + 1))
                #expect(queue.copy(offset: offset, length: length) == Array(model[offset..<(offset + length)]))
            default:
                // Nothing asked for: a negative count is none.
                queue.removeFirst(-3)
                #expect(queue.take(-1) == [])
            }
            if step % 500 == 499 {
                queue.removeAll()
                model.removeAll()
                #expect(queue.capacity == 0)
            }
            #expect(queue.count == model.count && queue.isEmpty == model.isEmpty)
            #expect(queue.capacity >= queue.count)
            if step % 5 == 0 && queue.copy(offset: 0, length: queue.count) != model { Issue.record("contents differ at step \(step)") }
        }
    }

    /// Filled in place (as a relay's read fills it) and emptied in place (as its send empties
    /// it), through wraps and growth, against a plain array: each is offered one contiguous
    /// piece, never more than asked, and only what it says it used counts.
    @Test func fillsAndEmptiesInPlaceAsAnArrayWould() {
        var random = SplitMix64(seed: 0x1D1E)
        var queue = ByteQueue()
        var model: [UInt8] = []
        var next: UInt8 = 0
        for _ in 0..<2000 {
            let asked = Int(random.next() % 9000) - 10
            if random.next() % 2 == 0 {
                let usePart = random.next() % 4
                var offered = 0
                let kept = queue.append(upTo: asked) { space in
                    offered = space.count
                    // A read may bring all, some, nothing, or fail (-1).
                    let n = usePart == 3 ? -1 : space.count * Int(usePart) / 2
                    for i in 0..<max(0, min(n, space.count)) { next &+= 1; space[i] = next; model.append(next) }
                    return n
                }
                #expect(offered <= max(0, asked))
                #expect(kept == max(0, min(offered * Int(usePart) / 2, offered)) || (usePart == 3 && kept == 0))
                if asked > 0 { #expect(offered > 0) }
            } else {
                var given: [UInt8] = []
                let take = random.next() % 3
                let taken = queue.removeFirst(upTo: asked) { bytes in
                    given = Array(bytes)
                    return take == 2 ? bytes.count + 5 : bytes.count * Int(take) / 2
                }
                #expect(given.count <= max(0, asked) && given == Array(model.prefix(given.count)))
                #expect(taken == min(given.count, take == 2 ? given.count : given.count * Int(take) / 2))
                model.removeFirst(taken)
            }
            #expect(queue.count == model.count)
            #expect(queue.copy(offset: 0, length: queue.count) == model)
        }
    }

    @Test func anEmptyQueueCopiesAndTakesNothing() {
        var queue = ByteQueue()
        #expect(queue.copy(offset: 0, length: 0) == [])
        #expect(queue.take(10) == [])
        var out: [UInt8] = []
        #expect(queue.take(10, appendingTo: &out) == 0 && out.isEmpty)
        queue.removeFirst(5)
        #expect(queue.count == 0)
    }
}
