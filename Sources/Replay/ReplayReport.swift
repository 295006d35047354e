import Wire

/// Where our stack's answers departed from what the recorded side sent.
public struct Divergence: Sendable, Equatable, CustomStringConvertible {
    /// The recorded frame it is about (tshark's number).
    public var frame: Int
    /// Virtual seconds since the replay began.
    public var time: Double
    public var text: String

    public var description: String { "#\(frame) at \(ReplayReport.seconds(time)): \(text)" }
}

/// A recorded state and whether our stack reached it.
public struct StateOutcome: Sendable, Equatable {
    public var state: RecordedState
    public var reached: Bool
    /// What our stack did instead, when it did not.
    public var detail: String
}

/// What one session's replay found.
public struct ReplayReport: Sendable {
    public var label: String
    public var peerSide: String
    public var ourSide: String
    public var role: ReplayRole
    public var notes: [String] = []
    /// Frame by frame: what was fed and what we sent, in order (`--frames`).
    public var log: [String] = []
    public var divergences: [Divergence] = []
    /// Divergences beyond the kept ones, counted.
    public var divergencesDropped = 0
    public var outcomes: [StateOutcome] = []
    /// Why the replay stopped early (a bound reached), if it did.
    public var stopped: String?
    public var linkDown: String?
    public var framesFed = 0
    public var framesDropped = 0
    public var framesSent = 0
    public var virtualSeconds = 0.0

    public static let keptDivergences = 200

    public var passed: Bool { stopped == nil && outcomes.allSatisfy(\.reached) }

    static func seconds(_ t: Double) -> String {
        let tenths = (t * 10).rounded() / 10
        return "\(tenths) s"
    }

    /// The report as `pppbridge replay` prints it.
    public func text(frames: Bool) -> String {
        var out: [String] = []
        let carried = label.isEmpty ? "" : " [\(label)]"
        out.append("session\(carried): the peer is \(peerSide), we play \(ourSide) as the \(role.rawValue)")
        for n in notes { out.append("  " + n) }
        if frames {
            out.append("frames:")
            out += log.map { "  " + $0 }
        }
        out.append("fed \(framesFed) of the peer's frames (\(framesDropped) left out), sent \(framesSent), \(ReplayReport.seconds(virtualSeconds)) of virtual time")
        if divergences.isEmpty {
            out.append("divergences: none")
        } else {
            out.append("divergences: \(divergences.count + divergencesDropped)")
            out += divergences.map { "  " + $0.description }
            if divergencesDropped > 0 { out.append("  ... and \(divergencesDropped) more") }
        }
        if let linkDown { out.append("link: \(linkDown)") }
        out.append("states:")
        for o in outcomes {
            out.append("  " + (o.reached ? "reached  " : "MISSED   ") + o.state.description + (o.detail.isEmpty ? "" : " (\(o.detail))"))
        }
        if let stopped { out.append("stopped: \(stopped)") }
        if passed {
            out.append("result: every recorded state reached")
        } else if let missed = outcomes.first(where: { !$0.reached }) {
            // The earliest in virtual time: what ours did first that the recorded side did not.
            let earliest = divergences.enumerated().min { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }?.element
            let first = earliest.map { "; first divergence " + $0.description } ?? ""
            out.append("result: not reached: \(missed.state)\(first)")
        } else {
            out.append("result: stopped before the end of the recording")
        }
        return out.joined(separator: "\n")
    }
}
