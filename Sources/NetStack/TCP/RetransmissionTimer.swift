import Wire

/// The retransmission timeout estimator of RFC 6298: SRTT and RTTVAR from samples taken
/// per Karn's rule (the caller never samples a retransmitted segment), exponential backoff
/// on expiry, clamped between a minimum and a maximum.
///
/// The arithmetic is on whole nanoseconds: `Duration` is a 128-bit count of attoseconds, and
/// its generic division and multiplication by an integer cost about 500 instructions each,
/// seven of them for each sample, which is once per round trip. The maximum is kept under
/// `Int64.max / 8` (about 36 years) and a sample is clamped to it first (an absurd echoed
/// timestamp then weighs no more than the maximum), so nothing below can overflow.
public struct RetransmissionTimer: Sendable, Equatable {
    private let minimumNanoseconds: Int64
    private let maximumNanoseconds: Int64
    private var smoothedNanoseconds: Int64?
    private var varianceNanoseconds: Int64 = 0
    /// The timeout before backoff.
    private var baseNanoseconds: Int64
    /// Expiries since the last fresh sample (RFC 6298 §5.5).
    public private(set) var backoff = 0

    public init(initial: Duration = .seconds(1), minimum: Duration = .milliseconds(200), maximum: Duration = .seconds(60)) {
        minimumNanoseconds = max(minimum.nanoseconds, 0)
        maximumNanoseconds = min(max(maximum.nanoseconds, 0), Int64.max / 8)
        baseNanoseconds = max(initial.nanoseconds, 0)
    }

    public var minimum: Duration { .nanoseconds(minimumNanoseconds) }
    public var maximum: Duration { .nanoseconds(maximumNanoseconds) }
    public var smoothedRTT: Duration? { smoothedNanoseconds.map { .nanoseconds($0) } }
    public var rttVariance: Duration { .nanoseconds(varianceNanoseconds) }
    public var baseTimeout: Duration { .nanoseconds(baseNanoseconds) }

    /// The current timeout, backoff included.
    public var timeout: Duration {
        var t = baseNanoseconds
        for _ in 0..<backoff {
            let (doubled, overflow) = t.multipliedReportingOverflow(by: 2)
            if overflow || doubled >= maximumNanoseconds { return maximum }
            t = doubled
        }
        return .nanoseconds(t)
    }

    /// RFC 6298 §2.2 and §2.3, with K = 4, alpha = 1/8, beta = 1/4, G folded into the minimum.
    public mutating func sample(_ rtt: Duration) {
        let r = min(max(rtt.nanoseconds, 0), maximumNanoseconds)
        let srtt: Int64
        if let s = smoothedNanoseconds {
            let delta = s > r ? s - r : r - s
            varianceNanoseconds = varianceNanoseconds * 3 / 4 + delta / 4
            srtt = s * 7 / 8 + r / 8
        } else {
            varianceNanoseconds = r / 2
            srtt = r
        }
        smoothedNanoseconds = srtt
        baseNanoseconds = min(max(srtt + max(varianceNanoseconds * 4, 1_000_000), minimumNanoseconds), maximumNanoseconds)
        backoff = 0
    }

    /// RFC 6298 §5.5: double the timeout after an expiry.
    public mutating func expired() { backoff += 1 }
}
