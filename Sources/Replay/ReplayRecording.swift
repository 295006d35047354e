import Capture
import Framing
import PPP
import Wire

/// One frame of a recorded session, ready to play: its time made monotonic, VJ-compressed TCP
/// rebuilt into the IPv4 packet it stands for (RFC 1144 §4), so that what is fed to our stack and
/// what is compared with it are whole packets whichever way the recording carried them.
public struct RecordedFrame: Sendable {
    /// tshark's frame number in the capture.
    public var number: Int
    /// Seconds since the session's first frame; never less than the frame before.
    public var time: Double
    /// The side that sent it (`RecordedSession.sides`).
    public var side: String
    public var frame: PPPFrame
    /// The IPv4 packet of an 0x0021, 0x002d or 0x002f frame (nil: not IP, or unreadable).
    public var ip: [UInt8]?
}

/// The frames of one PPP session in a capture (one PPPoE session, one tunnel, or the whole of a
/// serial line's recording) with the two sides that sent them.
public struct RecordedSession: Sendable {
    /// How the session was carried ("" on a serial line, "PPPoE 0x0011", ...).
    public var label: String
    public var frames: [RecordedFrame] = []
    /// The sides in the order they first sent: "sent"/"rcvd" for a pppd record or a capture with
    /// directions, Ethernet addresses for PPPoE.
    public var sides: [String] = []
    /// Frames whose time stamp went backwards (played at the time of the frame before) and gaps
    /// longer than `RecordingLimits.longestGap` (played as that).
    public var timeStampsBackwards = 0
    public var gapsShortened = 0
    /// VJ frames that could not be rebuilt (before the first uncompressed packet of their slot,
    /// or malformed): played as they are, compared by protocol only.
    public var vjUnreadable = 0
    /// Sessions past `RecordingLimits.sessions` in the capture, not played (on the last one).
    public var sessionsLeftOut = 0
}

/// What a replay reads at most: a recording is input like any other.
public struct RecordingLimits: Sendable, Equatable {
    /// Bytes of the file.
    public var fileBytes = 256 * 1024 * 1024
    /// PPP frames in the file (a serial line at 115200 baud carries fewer in an hour of traffic).
    public var frames = 200_000
    /// A silence longer than this in the recording is played as this much virtual time.
    public var longestGap = 30.0
    /// Sessions (PPPoE sessions, tunnels) played from one capture.
    public var sessions = 64
    public init() {}
}

/// Why a recording cannot be played.
public struct ReplayError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

public enum RecordingReader {
    /// Reads a capture (any format `pppbridge decode` reads) and splits it into sessions.
    public static func read(path: String, limits: RecordingLimits = RecordingLimits()) throws(ReplayError) -> (Trace, [RecordedSession]) {
        let trace: Trace
        do {
            trace = try Trace(path: path, maximumBytes: limits.fileBytes, maximumFrames: limits.frames)
        } catch {
            throw ReplayError(error.message)
        }
        return (trace, sessions(of: trace, limits: limits))
    }

    /// A session's carrier without the identifiers that differ by direction: PPTP's GRE header
    /// carries the receiver's call ID (RFC 2637 §4.1), L2TP's the receiver's tunnel and session
    /// IDs (RFC 2661 §3.1), so the two directions of one call are told apart by nothing else.
    static func sessionLabel(_ via: [String]) -> String {
        via.map { layer in
            if layer.hasPrefix("GRE call ") { return "GRE" }
            if layer.hasPrefix("L2TP ") { return "L2TP" }
            return layer
        }.joined(separator: "/")
    }

    /// The trace's PPP frames grouped by how they were carried. A frame with neither a direction
    /// nor a sender has no side and is left out (its session then cannot be played).
    public static func sessions(of trace: Trace, limits: RecordingLimits = RecordingLimits()) -> [RecordedSession] {
        var order: [String] = []
        var byLabel: [String: RecordedSession] = [:]
        var last: [String: (raw: Double, played: Double)] = [:]
        var decompressors: [String: VJDecompressor] = [:]
        var sessionsLeftOut: Set<String> = []
        let origin = trace.frames.first?.time ?? trace.origin
        for f in trace.frames {
            guard let side = f.direction.map({ $0 == .sent ? "sent" : "rcvd" }) ?? f.sender else { continue }
            let label = sessionLabel(f.via)
            if byLabel[label] == nil {
                // A capture of thousands of PPPoE sessions is not one terminal's: the first
                // ones are played, the rest counted.
                guard order.count < limits.sessions else {
                    sessionsLeftOut.insert(label)
                    continue
                }
                order.append(label)
            }
            // Taken out of the table while it grows, so that appending does not copy it.
            var session = byLabel.removeValue(forKey: label) ?? RecordedSession(label: label)
            // Two sides make a session; a third is enough to refuse it (`ReplayPlan`).
            if !session.sides.contains(side) && session.sides.count < 3 { session.sides.append(side) }
            // Times: monotonic, and no silence longer than the limit.
            let raw = f.time.interval(since: origin)
            var played = 0.0
            if let (previousRaw, previousPlayed) = last[label] {
                var gap = raw - previousRaw
                if !(gap >= 0) {
                    session.timeStampsBackwards += 1
                    gap = 0
                }
                if gap > limits.longestGap {
                    session.gapsShortened += 1
                    gap = limits.longestGap
                }
                played = previousPlayed + gap
            }
            last[label] = (raw.isFinite ? raw : last[label]?.raw ?? 0, played)
            var ip: [UInt8]?
            switch f.frame.protocol {
            case ProtocolNumber.ipv4: ip = f.frame.information
            case ProtocolNumber.vjUncompressedTCP, ProtocolNumber.vjCompressedTCP:
                // VJ state is per direction of a session (RFC 1144 §3.2), made for those that use it.
                let key = label + "|" + side
                var vj = decompressors.removeValue(forKey: key) ?? VJDecompressor(parameters: VJParameters(maxSlotID: 255, compressSlotID: true))
                ip = f.frame.protocol == ProtocolNumber.vjCompressedTCP ? vj.compressed(f.frame.information) : vj.uncompressed(f.frame.information)
                if ip == nil { session.vjUnreadable += 1 }
                decompressors[key] = vj
            default: break
            }
            session.frames.append(RecordedFrame(number: f.number, time: played, side: side, frame: f.frame, ip: ip))
            byLabel[label] = session
        }
        var out = order.compactMap { byLabel[$0] }
        if !sessionsLeftOut.isEmpty, !out.isEmpty { out[out.count - 1].sessionsLeftOut = sessionsLeftOut.count }
        return out
    }
}
