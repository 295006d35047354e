import Capture
import Framing
import Wire

/// What `replay` is told.
public struct ReplayOptions: Sendable {
    /// The side to feed ("sent", "rcvd", or a sender's address); nil: the terminal's.
    public var peer: String?
    public var limits = RecordingLimits()
    public var bounds = ReplayBounds()
    /// Seeds our magic numbers and initial sequence numbers.
    public var seed: UInt64 = 0x5EED
    public init() {}
}

/// One session's replay, or why it could not be played.
public struct SessionReplay: Sendable {
    public var label: String
    public var report: ReplayReport?
    public var unplayable: String?
    /// Every frame on our line, with its virtual time in seconds (for `--pcap`).
    public var frames: [(direction: Direction, frame: PPPFrame, seconds: Double)] = []
}

/// Plays a capture's PPP sessions against our link and stack (see `ReplayEngine`).
public enum Replay {
    /// Exit statuses of `pppbridge replay`.
    public enum Status: Int32, Sendable {
        /// Every played session reached every state its recorded side reached.
        case reached = 0
        /// A session did not: the report says which state and the first divergence.
        case diverged = 1
        /// The file could not be read, or no session in it can be played.
        case unplayable = 2
    }

    public static func run(path: String, options: ReplayOptions = ReplayOptions()) throws(ReplayError) -> [SessionReplay] {
        let (trace, sessions) = try RecordingReader.read(path: path, limits: options.limits)
        if trace.frames.isEmpty {
            let problems = trace.problems.prefix(2).map { "; " + $0 }.joined()
            return [SessionReplay(label: "", unplayable: "no PPP frame in the capture (\(trace.records) records\(problems))")]
        }
        return run(sessions: sessions, options: options)
    }

    public static func run(sessions: [RecordedSession], options: ReplayOptions = ReplayOptions()) -> [SessionReplay] {
        guard !sessions.isEmpty else {
            return [SessionReplay(label: "", unplayable: "no PPP frame with a known sender: the capture does not say which side sent each frame")]
        }
        return sessions.map { session -> SessionReplay in
            do throws(ReplayError) {
                let plan = try ReplayPlan(session: session, peer: options.peer)
                let engine = ReplayEngine(plan: plan, bounds: options.bounds, seed: options.seed)
                let report = engine.run()
                let frames = engine.captured.map { (direction: $0.0, frame: $0.1, seconds: Double($0.2.nanoseconds) / 1e9) }
                return SessionReplay(label: session.label, report: report, frames: frames)
            } catch {
                return SessionReplay(label: session.label, unplayable: error.message)
            }
        }
    }

    public static func status(_ replays: [SessionReplay]) -> Status {
        let played = replays.compactMap(\.report)
        if played.isEmpty { return .unplayable }
        return played.allSatisfy(\.passed) ? .reached : .diverged
    }
}
