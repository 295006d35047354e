// pppbridge-bench loop: what one turn of the event loop costs with N idle clients and N idle
// timers beside one busy descriptor, for N = 1, 100 and 1,000. The busy descriptor is a pipe
// kept readable (its handler reads nothing), so every turn is a wake-up for it alone; the idle
// clients' deadlines and the timers are an hour away. A loop whose turn walks every client and
// timer costs more with more of them; one that keeps them in heaps does not.
//
//   pppbridge-bench loop [--turns N]
//
// Prints the time per turn at each N (the best of three runs) and `RESULT loop ...` with the
// ratio of the 1,000 case to the 1 case, the reference taken in the same run.
import Channel
import CSystem
import Foundation
import Glibc
import NetStack

private final class IdleClient: LoopClient {
    let at: Instant
    init(at: Instant) { self.at = at }
    var pollAt: Instant? { at }
    func service(now: Instant) {}
}

/// Nanoseconds per turn with `idle` clients and timers.
private func turnCost(idle: Int, turns: Int) -> Double {
    let loop: EventLoop
    do { loop = try EventLoop() } catch { fail("loop: \(error)") }
    let far = loop.now + .seconds(3_600)
    let clients = (0..<idle).map { _ in IdleClient(at: far) }
    for c in clients { loop.add(c) }
    for _ in 0..<idle { loop.schedule(at: far) {} }
    var fds: [Int32] = [0, 0]
    guard pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0 else { fail("pipe2") }
    var byte: UInt8 = 1
    _ = write(fds[1], &byte, 1)
    do {
        try loop.register(FileDescriptor(fds[0]), events: UInt32(EPOLLIN.rawValue)) { _ in }
    } catch { fail("register: \(error)") }
    // Settle: the first turns service every client once, as they are added.
    var count = 0
    loop.run { count += 1; return count > 10 }
    count = 0
    let start = DispatchTime.now().uptimeNanoseconds
    loop.run { count += 1; return count > turns }
    let elapsed = DispatchTime.now().uptimeNanoseconds - start
    loop.unregister(FileDescriptor(fds[0]))
    close(fds[0])
    close(fds[1])
    withExtendedLifetime(clients) {}
    return Double(elapsed) / Double(turns)
}

func loopBench(_ args: ArraySlice<String>) {
    var turns = 200_000
    var it = args.makeIterator()
    while let a = it.next() {
        switch a {
        case "--turns":
            guard let v = it.next().flatMap({ Int($0) }), v > 0 else { fail("--turns needs a positive number") }
            turns = v
        default: fail("loop: unknown option \(a)")
        }
    }
    var costs: [Int: Double] = [:]
    for idle in [1, 100, 1_000] {
        // The best of three: the least disturbed by the rest of the machine.
        let best = (0..<3).map { _ in turnCost(idle: idle, turns: turns) }.min() ?? 0
        costs[idle] = best
        print(String(format: "loop: %5d idle clients and %5d idle timers: %.0f ns a turn (best of 3 runs of %d turns)", idle, idle, best, turns))
    }
    let one = costs[1] ?? 1, hundred = costs[100] ?? 0, thousand = costs[1_000] ?? 0
    print(String(format: "RESULT loop turn_ns_1=%.0f turn_ns_100=%.0f turn_ns_1000=%.0f ratio_1000_to_1=%.2f", one, hundred, thousand, thousand / one))
}
