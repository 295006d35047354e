/// The retransmission timeout estimator of RFC 6298: SRTT and RTTVAR from samples taken
/// per Karn's rule (the caller never samples a retransmitted segment), exponential backoff
/// on expiry, clamped between a minimum and a maximum.
public struct RetransmissionTimer: Sendable, Equatable {
    public let minimum: Duration
    public let maximum: Duration
    public private(set) var smoothedRTT: Duration?
    public private(set) var rttVariance: Duration = .zero
    /// The timeout before backoff.
    public private(set) var baseTimeout: Duration
    /// Expiries since the last fresh sample (RFC 6298 §5.5).
    public private(set) var backoff = 0

    public init(initial: Duration = .seconds(1), minimum: Duration = .milliseconds(200), maximum: Duration = .seconds(60)) {
        self.minimum = minimum
        self.maximum = maximum
        baseTimeout = initial
    }

    /// The current timeout, backoff included.
    public var timeout: Duration {
        var t = baseTimeout
        for _ in 0..<backoff {
            t = t * 2
            if t >= maximum { return maximum }
        }
        return t
    }

    /// RFC 6298 §2.2 and §2.3, with K = 4, alpha = 1/8, beta = 1/4, G folded into the minimum.
    public mutating func sample(_ rtt: Duration) {
        let r = max(rtt, .zero)
        if let srtt = smoothedRTT {
            let delta = srtt > r ? srtt - r : r - srtt
            rttVariance = rttVariance * 3 / 4 + delta / 4
            smoothedRTT = srtt * 7 / 8 + r / 8
        } else {
            smoothedRTT = r
            rttVariance = r / 2
        }
        baseTimeout = min(max(smoothedRTT! + max(rttVariance * 4, .milliseconds(1)), minimum), maximum)
        backoff = 0
    }

    /// RFC 6298 §5.5: double the timeout after an expiry.
    public mutating func expired() { backoff += 1 }
}
