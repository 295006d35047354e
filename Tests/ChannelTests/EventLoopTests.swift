import ChannelTestSupport
import CSystem
import Glibc
import NetStack
import Testing
@testable import Channel

/// A client that counts its services and asks for the next one at `next`.
private final class CountingClient: LoopClient {
    var next: Instant?
    var serviced: [Instant] = []
    var onService: ((Instant) -> Void)?
    init(next: Instant?) { self.next = next }
    var pollAt: Instant? { next }
    func service(now: Instant) {
        serviced.append(now)
        onService?(now)
    }
}

@Suite struct DeadlineHeapTests {
    @Test func popsInDeadlineOrderAndTiesInOrderSet() {
        var heap = DeadlineHeap<Int>()
        heap.set(1, at: .milliseconds(30))
        heap.set(2, at: .milliseconds(10))
        heap.set(3, at: .milliseconds(20))
        heap.set(4, at: .milliseconds(10))
        var order: [Int] = []
        while let k = heap.popDue(now: .milliseconds(100)) { order.append(k) }
        #expect(order == [2, 4, 3, 1])
        #expect(heap.isEmpty)
    }

    @Test func movingAndRemovingKeepTheOrder() {
        var heap = DeadlineHeap<String>()
        heap.set("a", at: .milliseconds(5))
        heap.set("b", at: .milliseconds(6))
        heap.set("c", at: .milliseconds(7))
        heap.set("a", at: .milliseconds(9))
        #expect(heap.earliest == .milliseconds(6))
        let first = heap.remove("b"), second = heap.remove("b")
        #expect(first && !second)
        heap.set("c", at: nil)
        #expect(heap.count == 1)
        let early = heap.popDue(now: .milliseconds(8)), due = heap.popDue(now: .milliseconds(9))
        #expect(early == nil && due == "a")
    }

    /// Against a sorted list, over random sets, moves and removals.
    @Test func agreesWithSortingUnderRandomChanges() {
        var random = SplitMix64(seed: 7)
        var heap = DeadlineHeap<Int>()
        var model: [Int: Int64] = [:]
        for _ in 0..<5_000 {
            let key = Int(random.next() % 200)
            switch random.next() % 3 {
            case 0, 1:
                let at = Int64(random.next() % 1_000)
                heap.set(key, at: .milliseconds(at))
                model[key] = at
            default:
                let had = model.removeValue(forKey: key) != nil
                let removed = heap.remove(key)
                #expect(removed == had)
            }
            #expect(heap.earliest == model.values.min().map { .milliseconds($0) })
        }
        var last: Instant = .zero
        while let key = heap.popDue(now: .milliseconds(1_000)) {
            let at = Instant.milliseconds(model[key]!)
            #expect(at >= last)
            last = at
            model[key] = nil
        }
        #expect(model.isEmpty)
    }
}

/// The loop on virtual time: timers and clients at their instants, and a turn's work bounded
/// by what is due, not by what is registered.
@Suite struct VirtualLoopTests {
    @Test func timersFireAtTheirInstantsInOrder() throws {
        let clock = VirtualClock()
        let loop = try EventLoop(clock: clock)
        let start = loop.now
        var fired: [(String, Instant)] = []
        loop.schedule(at: start + .seconds(3)) { fired.append(("c", loop.now)) }
        loop.schedule(at: start + .seconds(1)) { fired.append(("a", loop.now)) }
        let cancelled = loop.schedule(at: start + .seconds(2)) { fired.append(("x", loop.now)) }
        loop.schedule(at: start + .seconds(2)) { fired.append(("b", loop.now)) }
        loop.cancelTimer(cancelled)
        loop.advance(by: .milliseconds(2_500))
        #expect(fired.map(\.0) == ["a", "b"])
        #expect(fired.map(\.1) == [start + .seconds(1), start + .seconds(2)])
        loop.advance(by: .seconds(10))
        #expect(fired.map(\.0) == ["a", "b", "c"])
        #expect(fired.last?.1 == start + .seconds(3))
        #expect(loop.now == start + .milliseconds(12_500))
        #expect(loop.timerCount == 0)
    }

    /// A timer that schedules another at `now` does not run it in the same turn, and a chain of
    /// them cannot hold `advance` forever.
    @Test func aTimerAtNowWaitsATurnAndCannotSpinForever() throws {
        let loop = try EventLoop(clock: VirtualClock())
        var runs = 0
        func again() {
            runs += 1
            loop.schedule(at: loop.now, again)
        }
        loop.schedule(at: loop.now, again)
        let turnsBefore = loop.turns
        loop.advance(by: .seconds(1), turnLimit: 50)
        #expect(runs >= 50 && runs <= 53)
        #expect(loop.turns - turnsBefore == runs + 1 || loop.turns - turnsBefore == runs)
    }

    @Test func aClientIsServicedWhenItsDeadlineIsDueAndNotBefore() throws {
        let loop = try EventLoop(clock: VirtualClock())
        let start = loop.now
        let client = CountingClient(next: start + .seconds(10))
        loop.add(client)
        loop.advance(by: .zero)
        #expect(client.serviced == [start])
        loop.advance(by: .seconds(9))
        #expect(client.serviced.count == 1)
        client.onService = { now in client.next = now + .seconds(10) }
        loop.advance(by: .seconds(25))
        #expect(client.serviced == [start, start + .seconds(10), start + .seconds(20), start + .seconds(30)])
        loop.remove(client)
        loop.advance(by: .seconds(60))
        #expect(client.serviced.count == 4)
    }

    /// 1,000 idle clients and 1,000 idle timers: a turn brought by a busy timer services none
    /// of them.
    @Test func idleClientsAreNotServicedOnOtherTurns() throws {
        let loop = try EventLoop(clock: VirtualClock())
        let far = loop.now + .seconds(3_600)
        let idle = (0..<1_000).map { _ in CountingClient(next: far) }
        for c in idle { loop.add(c) }
        for _ in 0..<1_000 { loop.schedule(at: far) {} }
        loop.advance(by: .zero)
        #expect(idle.allSatisfy { $0.serviced.count == 1 })
        var ticks = 0
        func tick() {
            ticks += 1
            loop.schedule(at: loop.now + .milliseconds(1), tick)
        }
        tick()
        loop.advance(by: .seconds(1))
        #expect(ticks >= 1_000)
        #expect(idle.allSatisfy { $0.serviced.count == 1 })
    }

    @Test func aWokenClientIsServicedOnTheNextTurnOnce() throws {
        let loop = try EventLoop(clock: VirtualClock())
        let client = CountingClient(next: nil)
        loop.add(client)
        loop.advance(by: .zero)
        loop.wake(client)
        loop.wake(client)
        loop.advance(by: .zero)
        #expect(client.serviced.count == 2)
        // Woken from its own service (a callback of its service gave it more): once more on the
        // next turn, never again within the same turn.
        client.onService = { _ in
            client.onService = nil
            loop.wake(client)
        }
        loop.wake(client)
        loop.runTurn()
        #expect(client.serviced.count == 3)
        loop.runTurn()
        #expect(client.serviced.count == 4)
        loop.advance(by: .seconds(1))
        #expect(client.serviced.count == 4)
    }

    /// A descriptor registered as serving a client has that client serviced in the turn its
    /// handler runs; others are left alone.
    @Test func aDescriptorsClientIsServicedWithItsHandler() throws {
        let loop = try EventLoop(clock: VirtualClock())
        let owner = CountingClient(next: nil), bystander = CountingClient(next: nil)
        loop.add(owner)
        loop.add(bystander)
        loop.advance(by: .zero)
        var fds: [Int32] = [0, 0]
        #expect(pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0)
        defer {
            loop.unregister(FileDescriptor(fds[0]))
            close(fds[0])
            close(fds[1])
        }
        var handled = 0
        try loop.register(FileDescriptor(fds[0]), events: EPOLLIN.rawValue, serving: owner) { _ in
            var b: UInt8 = 0
            _ = read(fds[0], &b, 1)
            handled += 1
        }
        var byte: UInt8 = 1
        #expect(write(fds[1], &byte, 1) == 1)
        loop.advance(by: .zero)
        #expect(handled == 1)
        #expect(owner.serviced.count == 2)
        #expect(bystander.serviced.count == 1)
    }

    /// Work put off with `nextTurn` runs on the next turn, not this one.
    @Test func nextTurnRunsOnTheNextTurn() throws {
        let loop = try EventLoop(clock: VirtualClock())
        var order: [Int] = []
        loop.schedule(at: loop.now) {
            loop.nextTurn { order.append(loop.turns) }
            order.append(loop.turns)
        }
        loop.advance(by: .zero)
        #expect(order.count == 2)
        #expect(order[1] == order[0] + 1)
    }
}

@Suite struct LineAssemblerBlankLineTests {
    /// Blank lines cost no piece, and the line around them comes out whole, even split across
    /// feeds.
    @Test func blankLinesArePassedOverAndOthersKept() {
        var a = LineAssembler(limit: 100, skipsBlankLines: true)
        #expect(a.feed(Array("\n \r\n\t\n".utf8)).isEmpty)
        #expect(a.feed(Array("  {\"cmd\"".utf8)).isEmpty)
        #expect(a.feed(Array(":\"list\"}\n\n\n".utf8)) == [.line(Array("  {\"cmd\":\"list\"}".utf8))])
        var keeps = LineAssembler(limit: 100)
        #expect(keeps.feed(Array("\n\n".utf8)) == [.line([]), .line([])])
    }
}

/// A loop on its own thread, real descriptors, and a clock a test moves ahead at once.
@Suite struct LeapingClockTests {
    @Test func aLeapFiresTheTimersThatFellDueOnEveryLoopOnTheClock() async throws {
        let clock = LeapingClock()
        let first = try EventLoop(clock: clock), second = try EventLoop(clock: clock)
        try first.startThread()
        try second.startThread()
        let fired = Locked<[String]>([])
        await first.perform {
            _ = first.schedule(at: first.now + .seconds(30)) { fired.mutate { $0.append("first 30 s") } }
            _ = first.schedule(at: first.now + .seconds(90)) { fired.mutate { $0.append("first 90 s") } }
        }
        await second.perform {
            _ = second.schedule(at: second.now + .seconds(45)) { fired.mutate { $0.append("second 45 s") } }
        }
        let before = clock.now
        clock.leap(by: .seconds(60))
        #expect(clock.now - before >= .seconds(60))
        // The leap wakes both loops; the timers due run in a turn that read the time after it.
        await first.fullTurn()
        await second.fullTurn()
        #expect(fired.value.sorted() == ["first 30 s", "second 45 s"])
        clock.leap(by: .seconds(-100))
        #expect(clock.now - before >= .seconds(60), "never backwards")
    }
}

/// A listener whose accept(2) runs out of descriptors rests instead of spinning on a socket
/// that stays readable, on virtual time: the client waits in the kernel's queue, is not looked
/// at while the listener rests (100 ms, doubling), and is taken the first time a descriptor
/// is there again.
@Suite struct ListenerOutOfDescriptorsTests {
    @Test func aListenerOutOfDescriptorsRestsDoublingAndTakesTheClientAfter() throws {
        let loop = try EventLoop(clock: VirtualClock())
        var accepted: [StreamConnection] = []
        let listener = try StreamListener(on: TCPEndpoint(IPv4Address(127, 0, 0, 1), 0), loop: loop) { accepted.append($0) }
        defer { listener.close() }
        var calls = 0, failuresLeft = 3
        let real = listener.acceptNext
        listener.acceptNext = { l in
            calls += 1
            if failuresLeft > 0 {
                failuresLeft -= 1
                return .outOfResources
            }
            return real(l)
        }
        let port = try #require(listener.endpoint?.port)
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try #require(client >= 0)
        defer { close(client) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(connected == 0)

        loop.runTurn()
        #expect(calls == 1 && listener.acceptBackoffs == 1)
        // Rests 100 ms, then 200, then 400: the listener stays readable, and no turn looks at it.
        for (rest, callsAfter) in [(Duration.milliseconds(100), 2), (.milliseconds(200), 3), (.milliseconds(400), 4)] {
            for _ in 0..<10 { loop.advance(by: rest / 20) }
            #expect(calls == callsAfter - 1, "looked at while resting")
            loop.advance(by: rest / 2)
            #expect(calls >= callsAfter)
        }
        #expect(listener.acceptBackoffs == 3)
        #expect(accepted.count == 1, "the waiting client was taken once a descriptor was there")
        for c in accepted { c.close() }
        // A client taken resets the rest: the next shortage rests 100 ms again.
        failuresLeft = 1
        let again = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(again) }
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(again, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let before = calls
        loop.runTurn()
        #expect(calls == before + 1)
        loop.advance(by: .milliseconds(99))
        #expect(calls == before + 1)
        loop.advance(by: .milliseconds(1))
        #expect(accepted.count == 2)
    }
}
