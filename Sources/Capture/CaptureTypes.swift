import Framing

/// A point in time as captures carry it: seconds and microseconds since the Unix epoch.
/// `microseconds` is always 0–999 999 once a time has gone through `normalised`.
public struct CaptureTime: Sendable, Equatable, Comparable {
    public var seconds: Int64
    public var microseconds: Int32

    public init(seconds: Int64, microseconds: Int32) {
        self.seconds = seconds
        self.microseconds = microseconds
    }

    /// `tenths` of a second after `start` (pppd record files), saturating at the ends of Int64.
    public init(tenthsOfSeconds tenths: Int64, since start: Int64) {
        let (sum, overflow) = start.addingReportingOverflow(tenths / 10)
        seconds = overflow ? (tenths < 0 ? .min : .max) : sum
        microseconds = Int32(tenths % 10) * 100_000
    }

    /// A time stamp as a capture file gave it: `microseconds` may be anything a file can hold
    /// (negative, or a million and more). It is carried into the seconds (saturating); `adjusted`
    /// says it was out of range, so the caller can count and report the record.
    public static func normalised(seconds: Int64, microseconds: Int) -> (time: CaptureTime, adjusted: Bool) {
        let perSecond = 1_000_000
        guard !(0..<perSecond).contains(microseconds) else {
            return (CaptureTime(seconds: seconds, microseconds: Int32(microseconds)), false)
        }
        var carry = microseconds / perSecond
        var rest = microseconds % perSecond
        if rest < 0 {
            rest += perSecond
            carry -= 1
        }
        let (sum, overflow) = seconds.addingReportingOverflow(Int64(carry))
        let total = overflow ? (carry < 0 ? Int64.min : Int64.max) : sum
        return (CaptureTime(seconds: total, microseconds: Int32(rest)), true)
    }

    /// Seconds since `origin`, for printing. Any two times give a finite answer: the difference
    /// of two file-given times can exceed Int64, so it falls back to floating point.
    public func interval(since origin: CaptureTime) -> Double {
        let micro = Double(Int64(microseconds) - Int64(origin.microseconds)) / 1e6
        let (difference, overflow) = seconds.subtractingReportingOverflow(origin.seconds)
        if !overflow { return Double(difference) + micro }
        return Double(seconds) - Double(origin.seconds) + micro
    }

    public static func < (a: CaptureTime, b: CaptureTime) -> Bool {
        (a.seconds, a.microseconds) < (b.seconds, b.microseconds)
    }
}

/// Why a capture could not be read or written.
public struct CaptureError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
