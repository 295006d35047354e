import Testing
import Wire

@Suite struct BufferPoolTests {
    @Test func keptArraysComeBackEmptyWithTheirStorage() {
        var pool = BufferPool(limit: 2, largest: 4096)
        var a = [UInt8](repeating: 7, count: 1500)
        let storage = a.withUnsafeBytes { $0.baseAddress }
        pool.give(a)
        a = []
        #expect(pool.count == 1)
        let b = pool.take(capacity: 1000)
        #expect(b.isEmpty && b.capacity >= 1500)
        #expect(b.withUnsafeBytes { $0.baseAddress } == storage)
        #expect(pool.count == 0)
        // Empty: a new array with the room asked for.
        #expect(pool.take(capacity: 300).capacity >= 300)
    }

    @Test func boundedInCountAndSizeAndCountsWhatItRefuses() {
        var pool = BufferPool(limit: 2, largest: 4096)
        var list: [[UInt8]] = (0..<3).map { _ in [UInt8](repeating: 1, count: 100) }
        list.append([UInt8](repeating: 1, count: 10000))
        list.append([])
        pool.give(all: &list)
        #expect(list.isEmpty)
        // Two kept, the third and the large one refused; an array with no storage is not kept.
        #expect(pool.count == 2 && pool.refused == 2)
        var large = pool.take(capacity: 20000)
        #expect(large.capacity >= 20000)
        large.append(1)
        pool.give(large)
        #expect(pool.count == 1 && pool.refused == 3)
        pool.give([UInt8](repeating: 2, count: 100))
        #expect(pool.count == 2)
        pool.trim(keeping: 1)
        #expect(pool.count == 1)
        pool.trim(keeping: 0)
        #expect(pool.count == 0)
    }

    @Test func everyArrayHandedOutHasTheSmallestRoom() {
        var pool = BufferPool(limit: 4, smallest: 2048)
        pool.give([UInt8](repeating: 0, count: 40))
        #expect(pool.take(capacity: 40).capacity >= 2048, "an ACK's array grows once, to serve a full segment after")
        #expect(pool.take(capacity: 0).capacity >= 2048)
    }
}
