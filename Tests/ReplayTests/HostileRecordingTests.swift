import Capture
import Foundation
import Framing
import PPP
import Replay
import Testing
import TestSupport

/// A replay file is input like any other: crafted captures end with a clear error or a bounded
/// replay, never a hang or a trap.
struct HostileRecordingTests {
    /// pppd-record_default.pppd written as a pcap (link type 204) with every third time stamp
    /// 1000 s in the past, one at the last second a pcap can hold and the last at 0.
    @Test func timeStampsBackwardsAndAtTheEndOfTimeAreCountedAndBounded() throws {
        let session = try EditableSession(path: try Traces.path("pppd-record_default.pppd"))
        let scratch = try ScratchDirectory()
        let path = scratch.path + "/times.pcap"
        let writer = try PcapWriter(path: path, linkType: .pppWithDirection, masking: nil)
        let base: Int64 = 1_700_000_000
        for (i, f) in session.frames.enumerated() {
            var seconds = base + Int64(f.seconds)
            if i % 3 == 2 { seconds -= 1000 }
            if i == session.frames.count / 2 { seconds = Int64(UInt32.max) }
            if i == session.frames.count - 1 { seconds = 0 }
            try writer.write(packet: f.frame.packet, time: CaptureTime(seconds: seconds, microseconds: 0), direction: f.direction)
        }
        writer.close()
        let (_, sessions) = try RecordingReader.read(path: path)
        let recorded = try #require(sessions.first)
        #expect(recorded.timeStampsBackwards > 0)
        #expect(recorded.gapsShortened > 0)
        // Monotonic, and no gap longer than the limit.
        let times = recorded.frames.map(\.time)
        #expect(zip(times, times.dropFirst()).allSatisfy { $1 >= $0 && $1 - $0 <= RecordingLimits().longestGap })
        let replays = Replay.run(sessions: sessions)
        let report = try #require(replays.first?.report)
        // Virtual time is bounded by the frames' gaps, the answer waits and the drain.
        let bound = Double(recorded.frames.count) * (RecordingLimits().longestGap + 5) + 10
        #expect(report.virtualSeconds <= bound, "\(report.text(frames: false))")
        #expect(report.stopped == nil)
    }

    /// A pppd record whose time steps add up to far beyond any real session (0x05 steps of
    /// 2^32 - 1 tenths) plays with each silence cut to the limit.
    @Test func aRecordWithStepsToTheEndOfTimePlaysWithShortenedSilences() throws {
        let session = try EditableSession(path: try Traces.path("pppd-record_default.pppd"))
        var b = RecordBuilder()
        for (i, f) in session.frames.enumerated() {
            b.add(f.direction, frame: f.frame, at: f.seconds + Double(i) * 429_496_729.5)
        }
        let scratch = try ScratchDirectory()
        try b.write(to: scratch.path + "/steps.pppd")
        let (_, sessions) = try RecordingReader.read(path: scratch.path + "/steps.pppd")
        let recorded = try #require(sessions.first)
        #expect(recorded.gapsShortened >= session.frames.count - 2)
        let report = try #require(Replay.run(sessions: sessions).first?.report)
        #expect(report.virtualSeconds <= Double(recorded.frames.count) * 35 + 10)
    }

    /// 8 MiB after an opening flag and never a closing one, each way: the decoder keeps none of
    /// it (the frame is longer than any MRU), the reader says where the data ended, and the file
    /// holds no session to play.
    @Test func aFrameThatNeverEndsIsDroppedAndReported() throws {
        var b = RecordBuilder()
        b.add(.sent, [0x7E] + [UInt8](repeating: 0x41, count: 8 << 20), at: 0)
        b.add(.received, [0x7E] + [UInt8](repeating: 0x42, count: 8 << 20), at: 1)
        let scratch = try ScratchDirectory()
        let path = scratch.path + "/endless.pppd"
        try b.write(to: path)
        let (trace, _) = try RecordingReader.read(path: path)
        #expect(trace.frames.isEmpty)
        #expect(trace.problems == ["the sent data ends inside a frame that no flag closed",
                                   "the received data ends inside a frame that no flag closed"], "\(trace.problems)")
        let replays = try Replay.run(path: path)
        #expect(Replay.status(replays) == .unplayable)
        #expect(replays.first?.unplayable?.hasPrefix("no PPP frame in the capture (") == true && replays.first?.unplayable?.contains("ends inside a frame") == true, "\(replays.first?.unplayable ?? "")")
    }

    /// A million LCP Echo-Requests of 8 bytes: refused when the 200,001st frame is read, with
    /// the limit named, before the rest is held.
    @Test func aMillionTinyFramesAreRefusedAtTheFrameLimit() throws {
        let echo = HDLCEncoder().encode(protocol: ProtocolNumber.lcp, information: [0x09, 0x01, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00])
        var line: [UInt8] = []
        line.reserveCapacity(echo.count * 1_000_000)
        for _ in 0..<1_000_000 { line += echo }
        var b = RecordBuilder()
        b.add(.sent, line, at: 0)
        let scratch = try ScratchDirectory()
        let path = scratch.path + "/tiny.pppd"
        try b.write(to: path)
        line = []
        #expect {
            _ = try Replay.run(path: path)
        } throws: { error in
            "\(error)".contains("more than \(RecordingLimits().frames)")
        }
    }

    /// Refused before it is read: a file larger than the byte limit.
    @Test func aFileOverTheByteLimitIsRefusedUnread() throws {
        let scratch = try ScratchDirectory()
        let path = scratch.path + "/large.pppd"
        var b = RecordBuilder()
        b.add(.sent, [UInt8](repeating: 0x7E, count: 2048), at: 0)
        try b.write(to: path)
        var options = ReplayOptions()
        options.limits.fileBytes = 1024
        #expect {
            _ = try Replay.run(path: path, options: options)
        } throws: { error in
            "\(error)".contains("more than the 1024")
        }
    }
}
