import Capture
import Foundation
import Framing
import PPP
import Replay
import Testing
import TestSupport

/// Sessions whose peer misbehaved replay to a clear report within the bounds, never a hang.
struct MisbehavingPeerTests {
    static let fixture = TestFiles.path("Fixtures/nak-forever.pppd")

    /// The checked-in edited trace is what the edit makes of the shared trace (regenerate it
    /// with PPPBRIDGE_WRITE_FIXTURES=1), so `pppbridge replay` can be shown it.
    @Test func theNakForeverFixtureIsTheEditOfTheSharedTrace() throws {
        let edited = try EditableSession.nakForever(from: try Traces.path("pppd-record_default.pppd")).record
        if ProcessInfo.processInfo.environment["PPPBRIDGE_WRITE_FIXTURES"] != nil {
            try edited.write(to: MisbehavingPeerTests.fixture)
        }
        let stored = try #require(FileManager.default.contents(atPath: MisbehavingPeerTests.fixture), "\(MisbehavingPeerTests.fixture) is missing")
        #expect(Array(stored) == edited.bytes, "Fixtures/nak-forever.pppd differs from the edit; regenerate it with PPPBRIDGE_WRITE_FIXTURES=1")
    }

    @Test func aTerminalThatNaksOurAddressForeverIsAClearDivergence() throws {
        let replays = try Replay.run(path: MisbehavingPeerTests.fixture)
        #expect(Replay.status(replays) == .diverged)
        let report = try #require(replays.first?.report)
        let text = report.text(frames: false)
        print(text)
        #expect(report.role == .host)
        let ipcp = try #require(report.outcomes.first { if case .ipcpOpened = $0.state { return true } else { return false } })
        #expect(!ipcp.reached, "\(text)")
        // The first thing ours did that the recorded host did not: ask again after the Nak.
        #expect(text.contains("result: not reached: IPCP opened, local 10.0.2.2, peer 10.0.2.15; first divergence #14 "), "\(text)")
        #expect(text.contains("more requests than the recorded side's 2, after the peer's #14 IPCP ConfNak id=0x2 <addr 10.0.2.15>"), "\(text)")
        // Ours gives up on a peer that insists on giving us its own address (RFC 1332 §3.3).
        #expect(report.linkDown?.hasPrefix("IPCP failed: IP addresses refused") == true, "\(text)")
        #expect(report.outcomes.first { $0.state == .lcpOpened }?.reached == true)
        #expect(report.stopped == nil, "\(text)")
    }

    /// The terminal answers nothing once LCP is open: ours asks for IPCP again and again
    /// (RFC 1661 §4.6, the restart timer), and the replay ends within its drain.
    @Test func aTerminalThatGoesSilentIsAClearDivergence() throws {
        var session = try EditableSession(path: try Traces.path("pppd-record_default.pppd"))
        let firstIPCP = try #require(session.frames.firstIndex { $0.frame.protocol == ProtocolNumber.ipcp })
        session.frames = session.frames.enumerated().filter { $0.offset < firstIPCP || $0.element.direction == .received }.map(\.element)
        let scratch = try ScratchDirectory()
        try session.record.write(to: scratch.path + "/silent.pppd")
        let replays = try Replay.run(path: scratch.path + "/silent.pppd")
        let report = try #require(replays.first?.report)
        let text = report.text(frames: false)
        #expect(Replay.status(replays) == .diverged, "\(text)")
        #expect(report.outcomes.first { $0.state == .lcpOpened }?.reached == true, "\(text)")
        // The replay ends 10 s (virtual) after the recording, before our restart counter
        // would give up: the report says what went unanswered since when.
        #expect(report.linkDown == nil, "\(text)")
        #expect(text.contains("result: not reached: IPCP opened, local 10.0.2.2, peer 10.0.2.15; first divergence #4 at 0.0 s: our IPCP ConfReq was sent again without an answer from 0.0 s on, up to id=0x5"), "\(text)")
        #expect(report.stopped == nil)
    }
}
