import Framing

/// A point in time as captures carry it: seconds and microseconds since the Unix epoch.
public struct CaptureTime: Sendable, Equatable, Comparable {
    public var seconds: Int64
    public var microseconds: Int32

    public init(seconds: Int64, microseconds: Int32) {
        self.seconds = seconds
        self.microseconds = microseconds
    }

    public init(tenthsOfSeconds tenths: Int64, since start: Int64) {
        seconds = start + tenths / 10
        microseconds = Int32(tenths % 10) * 100_000
    }

    /// Seconds since `origin`, for printing.
    public func interval(since origin: CaptureTime) -> Double {
        Double(seconds - origin.seconds) + Double(microseconds - origin.microseconds) / 1e6
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
