/// A point on a monotonic time line, as the sans-IO cores take it: callers pass `now`, tests
/// pass virtual time. Nanoseconds from an arbitrary origin.
public struct Instant: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static let zero = Instant(nanoseconds: 0)

    public static func seconds(_ s: Double) -> Instant { Instant(nanoseconds: Int64(s * 1e9)) }
    public static func milliseconds(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    public static func + (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: a.nanoseconds + d.nanoseconds) }

    public static func - (a: Instant, b: Instant) -> Duration { .nanoseconds(a.nanoseconds - b.nanoseconds) }

    public var description: String {
        let ms = nanoseconds / 1_000_000
        let fraction = String(abs(ms % 1000))
        return "\(ms / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction + "s"
    }
}

extension Duration {
    /// Whole nanoseconds (saturating far outside any timer this project sets).
    public var nanoseconds: Int64 {
        let (s, atto) = components
        return s * 1_000_000_000 + atto / 1_000_000_000
    }
}

/// The earliest of optional deadlines.
public func earliest(_ deadlines: Instant?...) -> Instant? {
    deadlines.compactMap { $0 }.min()
}
