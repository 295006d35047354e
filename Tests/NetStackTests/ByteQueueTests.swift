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
