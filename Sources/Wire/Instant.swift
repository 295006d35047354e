/// A point on a monotonic time line, as the sans-IO cores take it: callers pass `now`, tests
/// pass virtual time. Nanoseconds from an arbitrary origin. Arithmetic saturates at the ends of
/// the line (about ±292 years), so a timer value taken from a peer (a keep-alive, a user
/// timeout, a control client's delay) can never trap: it only lands at the far end.
public struct Instant: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static let zero = Instant(nanoseconds: 0)

    public static func seconds(_ s: Double) -> Instant { Instant(nanoseconds: saturatingNanoseconds(s * 1e9)) }
    public static func milliseconds(_ ms: Int64) -> Instant { Instant(nanoseconds: saturatingProduct(ms, 1_000_000)) }

    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    public static func + (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: saturatingSum(a.nanoseconds, d.nanoseconds)) }

    public static func - (a: Instant, b: Instant) -> Duration { .nanoseconds(saturatingSum(a.nanoseconds, saturatingNegation(b.nanoseconds))) }

    public var description: String {
        let ms = nanoseconds / 1_000_000
        let fraction = String(abs(ms % 1000))
        return "\(ms / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction + "s"
    }
}

extension Duration {
    /// Whole nanoseconds (truncated toward zero), saturating at `Int64`'s ends. Asked for
    /// every deadline computed: a duration under about 9.2 s is divided as a 64-bit integer,
    /// where `components` cost a 128-bit division, some 200 instructions.
    public var nanoseconds: Int64 {
        let atto = attoseconds
        if let small = Int64(exactly: atto) { return small / 1_000_000_000 }
        return Int64(clamping: atto / 1_000_000_000)
    }
}

func saturatingSum(_ a: Int64, _ b: Int64) -> Int64 {
    let (r, overflow) = a.addingReportingOverflow(b)
    return overflow ? (b > 0 ? .max : .min) : r
}

func saturatingProduct(_ a: Int64, _ b: Int64) -> Int64 {
    let (r, overflow) = a.multipliedReportingOverflow(by: b)
    return overflow ? ((a < 0) != (b < 0) ? .min : .max) : r
}

func saturatingNegation(_ a: Int64) -> Int64 { a == .min ? .max : -a }

/// A count of nanoseconds as a `Double` (from seconds given by a user or a peer), clamped to
/// `Int64`; not-a-number is zero.
func saturatingNanoseconds(_ x: Double) -> Int64 {
    if x.isNaN { return 0 }
    if x >= 9.2e18 { return .max }
    if x <= -9.2e18 { return .min }
    return Int64(x)
}

/// The earliest of optional deadlines. Fixed arities rather than a variadic list: asked on
/// every turn of the loop for every link, a variadic call would allocate its array each time.
@inlinable
public func earliest(_ a: Instant?, _ b: Instant?) -> Instant? {
    guard let a else { return b }
    guard let b else { return a }
    return min(a, b)
}

@inlinable
public func earliest(_ a: Instant?, _ b: Instant?, _ c: Instant?) -> Instant? { earliest(earliest(a, b), c) }

@inlinable
public func earliest(_ a: Instant?, _ b: Instant?, _ c: Instant?, _ d: Instant?) -> Instant? { earliest(earliest(a, b), earliest(c, d)) }

@inlinable
public func earliest(_ a: Instant?, _ b: Instant?, _ c: Instant?, _ d: Instant?, _ e: Instant?) -> Instant? {
    earliest(earliest(a, b, c), earliest(d, e))
}

@inlinable
public func earliest(_ a: Instant?, _ b: Instant?, _ c: Instant?, _ d: Instant?, _ e: Instant?, _ f: Instant?) -> Instant? {
    earliest(earliest(a, b, c), earliest(d, e, f))
}
