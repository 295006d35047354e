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
