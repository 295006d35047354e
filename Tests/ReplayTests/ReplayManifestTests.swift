import Foundation
import Replay
import Testing
import TestSupport

/// Every shared trace replays as `ReplayManifest.txt` says: the states it must reach in each
/// role it can be played in, or why it cannot be played.
struct ReplayManifestTests {
    struct Expectation: CustomTestStringConvertible, Sendable {
        var trace: String
        var peer: String?
        var exit: Int32?
        /// Per session label ("" for a serial line's): role and states, or the reason.
        var sessions: [(label: String, role: String?, states: [String], unplayable: String?)] = []
        var testDescription: String { trace + (peer.map { " --peer \($0)" } ?? "") }
    }

    static let manifest: [Expectation] = {
        guard let text = try? String(contentsOfFile: TestFiles.path("ReplayManifest.txt"), encoding: .utf8) else { return [] }
        var out: [Expectation] = []
        for raw in text.split(separator: "\n", omittingEmptySubsequences: true) {
            if raw.hasPrefix("#") { continue }
            if !raw.hasPrefix(" ") {
                let words = raw.split(separator: " ").map(String.init)
                var e = Expectation(trace: words[0])
                if words.count == 3 && words[1] == "--peer" { e.peer = words[2] }
                out.append(e)
                continue
            }
            let line = raw.trimmingCharacters(in: .whitespaces)
            let (key, value) = line.firstIndex(of: " ").map { (String(line[..<$0]), String(line[line.index(after: $0)...])) } ?? (line, "")
            guard !out.isEmpty else { continue }
            switch key {
            case "exit": out[out.count - 1].exit = Int32(value)
            case "session": out[out.count - 1].sessions.append((value == "-" ? "" : value, nil, [], nil))
            case "play": if !out[out.count - 1].sessions.isEmpty { out[out.count - 1].sessions[out[out.count - 1].sessions.count - 1].role = value }
            case "reach": if !out[out.count - 1].sessions.isEmpty { out[out.count - 1].sessions[out[out.count - 1].sessions.count - 1].states.append(value) }
            case "unplayable": if !out[out.count - 1].sessions.isEmpty { out[out.count - 1].sessions[out[out.count - 1].sessions.count - 1].unplayable = value }
            default: out[out.count - 1].exit = -1  // an unknown key fails the replay's test
            }
        }
        return out
    }()

    @Test func everySharedTraceHasAManifestLine() throws {
        let traces = Traces.all
        try #require(!traces.isEmpty, "no shared traces found (../shared/traces beside the checkout, or PPPBRIDGE_TRACES)")
        let listed = Set(ReplayManifestTests.manifest.map(\.trace))
        for name in traces {
            #expect(listed.contains(name), "\(name) has no line in ReplayManifest.txt")
        }
        for name in listed {
            #expect(traces.contains(name), "ReplayManifest.txt names \(name), which is not among the shared traces")
        }
    }

    @Test(arguments: ReplayManifestTests.manifest)
    func replayReachesTheManifestStates(_ e: Expectation) throws {
        var options = ReplayOptions()
        options.peer = e.peer
        let replays = try Replay.run(path: try Traces.path(e.trace), options: options)
        #expect(Replay.status(replays).rawValue == e.exit, "exit status")
        #expect(replays.map(\.label) == e.sessions.map(\.label), "sessions")
        for (replay, expected) in zip(replays, e.sessions) {
            let printed = replay.report?.text(frames: false) ?? replay.unplayable ?? ""
            if let reason = expected.unplayable {
                #expect(replay.report == nil, "session [\(expected.label)] was played:\n\(printed)")
                #expect(replay.unplayable?.hasPrefix(reason) == true, "session [\(expected.label)]: \(replay.unplayable ?? "")")
                continue
            }
            let report = try #require(replay.report, "session [\(expected.label)] cannot be played: \(replay.unplayable ?? "")")
            #expect(report.role.rawValue == expected.role, "\(printed)")
            #expect(report.outcomes.map(\.state.description) == expected.states, "\(printed)")
            let missed = report.outcomes.filter { !$0.reached }.map(\.state.description)
            #expect(missed.isEmpty, "\(printed)")
            #expect(report.stopped == nil, "\(printed)")
        }
    }
}
