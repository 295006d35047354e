// libFuzzer target: a recorded session played against our link and stack (`pppbridge replay`
// on bytes instead of a file). What replay reads and what it rewrites are the peer's frames,
// the recorded side's frames, their times and their order; every one of them may be crafted.
//
// Input, by its first byte:
//   0x07  a pppd record file as it is (the recorder's format, `PPPDRecord`), read through the
//         record reader and the RFC 1662 decoder, as `replay FILE.pppd` does;
//   else  a flags byte, then frames, each: a side/time byte (bit 7: the frame is the recorded
//         host's, "rcvd"; bits 0-6: tenths of a second since the frame before), a 2-byte
//         big-endian length, and that many bytes: the PPP protocol (2 bytes) and the
//         information field. These are framed (FCS-16, control characters escaped) into a
//         record, with IPv4 checksums fixed, so mutations reach the replay's rewriting and the
//         state machines instead of dying at an FCS or a checksum. Flags: bit 0 feeds the
//         host's side ("--peer rcvd", we play the terminal); bit 1 sets the peer by the
//         side-detection (no --peer).
// The engine runs with a step bound small enough that one input takes milliseconds; the
// replay's own bounds (frames, sent frames, answer waits, the drain) hold as they are.
import Capture
import Framing
import FuzzSupport
import Replay

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReplay(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    var options = ReplayOptions()
    options.bounds.steps = 20_000
    options.limits.frames = 2_000
    var bytes: [UInt8]
    if input[0] == 0x07 {
        bytes = input
        options.peer = nil
    } else {
        let flags = input[0]
        options.peer = flags & 2 != 0 ? nil : (flags & 1 != 0 ? "rcvd" : "sent")
        bytes = [0x07, 0x5F, 0x00, 0x00, 0x00]
        let encoder = HDLCEncoder(fcs: .fcs16, escapes: .allControlCharacters)
        var i = 1
        while i + 3 <= input.count {
            let sideAndTime = input[i]
            let n = min(Int(input[i + 1]) << 8 | Int(input[i + 2]), input.count - i - 3)
            let frame = Array(input[(i + 3)..<(i + 3 + n)])
            i += 3 + n
            guard frame.count >= 2 else { continue }
            let proto = ProtocolNumber(UInt16(frame[0]) << 8 | UInt16(frame[1]))
            var information = Array(frame[2...])
            if proto == .ipv4 { fixIPv4Checksums(&information) }
            let tenths = sideAndTime & 0x7F
            if tenths > 0 { bytes += [0x06, tenths] }
            let line = encoder.encode(protocol: proto, information: information)
            guard line.count <= 0xFFFF else { continue }
            bytes += [sideAndTime & 0x80 != 0 ? 0x02 : 0x01, UInt8(line.count >> 8), UInt8(line.count & 0xFF)] + line
        }
    }
    guard let record = try? PPPDRecord(bytes: bytes, maximumEntries: 16_000) else { return 0 }
    let trace = Trace(record: record, maximumFrames: options.limits.frames)
    guard trace.frames.count <= options.limits.frames else { return 0 }
    let sessions = RecordingReader.sessions(of: trace, limits: options.limits)
    for replay in Replay.run(sessions: sessions, options: options) {
        guard let report = replay.report else {
            FuzzDepth.count("unplayable")
            continue
        }
        FuzzDepth.count("played")
        for outcome in report.outcomes where outcome.reached {
            switch outcome.state {
            case .lcpOpened: FuzzDepth.count("lcp-opened")
            case .authenticated: FuzzDepth.count("authenticated")
            case .ipcpOpened: FuzzDepth.count("ipcp-opened")
            case .tcp: FuzzDepth.count("tcp-reached")
            case .terminated: FuzzDepth.count("terminated")
            }
        }
        if report.passed { FuzzDepth.count("passed") }
        if report.stopped != nil { FuzzDepth.count("stopped-at-a-bound") }
        // Printing the report escapes every peer string it holds.
        _ = report.text(frames: true)
    }
    return 0
}

#if FUZZING
@_cdecl("FuzzReplay_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzReplay)
}
#else
@main struct ReplayInputs {
    static func main() { replay(fuzzReplay) }
}
#endif
