import NetStack
import Synchronization

/// Where a loop reads the time.
public protocol LoopClock: AnyObject, Sendable {
    var now: Instant { get }
}

/// The monotonic clock (CLOCK_MONOTONIC): what every loop outside tests runs on.
public final class MonotonicClock: LoopClock {
    public init() {}
    public var now: Instant { monotonicNow() }
}

/// Time that moves only when told (`EventLoop.advance(by:)`): a test's loop.
public final class VirtualClock: LoopClock {
    private let instant: Mutex<Instant>
    public init(_ start: Instant = .seconds(1_000)) { instant = Mutex(start) }
    public var now: Instant { instant.withLock { $0 } }
    /// Moves the clock to `to`; never backwards.
    public func set(_ to: Instant) { instant.withLock { $0 = max($0, to) } }
}

/// The monotonic clock that a test can move ahead at once (`leap(by:)`): for loops whose
/// descriptors are real (ptys, sockets) but whose timers a test must see fire without
/// waiting for them. Every loop on the clock is woken by the leap, so each takes the timers
/// that fell due at its next turn.
public final class LeapingClock: LoopClock {
    private let state = Mutex<(ahead: Duration, loops: [WeakLoop])>((.zero, []))
    public init() {}
    public var now: Instant { monotonicNow() + state.withLock { $0.ahead } }

    /// Wakes `loop` at each leap; a loop made on this clock is attached by `EventLoop.init`.
    func attach(_ loop: EventLoop) { state.withLock { $0.loops.append(WeakLoop(loop)) } }

    /// Moves the time ahead by `duration` (never backwards) and wakes every loop on it.
    public func leap(by duration: Duration) {
        let loops: [EventLoop] = state.withLock { s in
            s.ahead += max(.zero, duration)
            return s.loops.compactMap(\.loop)
        }
        for loop in loops { loop.execute {} }
    }
}

private struct WeakLoop: Sendable {
    weak var loop: EventLoop?
    init(_ loop: EventLoop) { self.loop = loop }
}
