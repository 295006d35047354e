// libFuzzer target: the RFC 1662 stream decoder.
//
// The input is split into chunks at positions taken from its first bytes, decoded under
// settings taken from them too, and the result must not depend on the chunking; every frame
// delivered must re-encode and decode to itself. Build and run with Tools/fuzz.sh.
import Framing
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzStreamDecoder(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 4 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let fcs: FCSKind = [.fcs16, .fcs32, .none][Int(input[0] % 3)]
    let accm = UInt32(input[1]) * 0x0101_0101
    let mru = 64 + Int(input[2]) * 8
    let stride = 1 + Int(input[3] % 64)
    let stream = Array(input[4...])

    var whole = HDLCDecoder(fcs: fcs, mru: mru, receiveACCM: accm)
    let expected = whole.decode(stream)
    var chunked = HDLCDecoder(fcs: fcs, mru: mru, receiveACCM: accm)
    var frames: [PPPFrame] = []
    stream.withUnsafeBytes { all in
        var offset = 0
        while offset < all.count {
            let end = min(all.count, offset + stride)
            chunked.decode(UnsafeRawBufferPointer(rebasing: all[offset..<end])) { frames.append($0.frame) }
            offset = end
        }
    }
    precondition(frames == expected, "chunking changed the frames")
    precondition(chunked.counters == whole.counters, "chunking changed the counters")

    let encoder = HDLCEncoder(fcs: fcs, escapes: EscapeSet(accm: accm))
    for f in expected {
        precondition(f.information.count <= mru)
        var again = HDLCDecoder(fcs: fcs, mru: mru, receiveACCM: accm)
        let roundTrip = again.decode(encoder.encode(protocol: f.protocol, information: f.information))
        precondition(roundTrip.map(\.protocol) == [f.protocol] && roundTrip[0].information == f.information, "re-encoding changed a frame")
    }
    return 0
}

#if FUZZING
@_cdecl("FuzzStreamDecoder_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzStreamDecoder)
}
#else
@main struct Replay {
    static func main() { replay(fuzzStreamDecoder) }
}
#endif
