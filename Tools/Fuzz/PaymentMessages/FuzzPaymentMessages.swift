// libFuzzer target: the reader protocol's decoder (framing, strict JSON, the message envelope).
//
// The first byte picks a chunk stride; the rest is a byte stream fed to the frame decoder in
// chunks of that size and whole, which must agree. Every frame is decoded as a message; one that
// decodes must re-encode to text that decodes to the same message. The stream is also parsed as
// one JSON text, whose serialisation must parse back to the same value. Build and run with
// Tools/fuzz.sh.
import FuzzSupport
import Payment

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPaymentMessages(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 1 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let stride = 1 + Int(input[0] % 32)
    let stream = Array(input[1...])

    var whole = PaymentFrameDecoder()
    let expected = try? whole.feed(stream)
    var chunked = PaymentFrameDecoder()
    var frames: [[UInt8]] = []
    var failed = false
    var offset = 0
    while offset < stream.count && !failed {
        let end = min(stream.count, offset + stride)
        do { frames += try chunked.feed(Array(stream[offset..<end])) } catch { failed = true }
        offset = end
    }
    if let expected {
        precondition(!failed || chunked.failure != nil, "chunking failed where the whole stream did not")
        if !failed { precondition(frames == expected, "chunking changed the frames") }
    } else {
        precondition(whole.failure != nil)
    }

    for frame in frames {
        precondition(!frame.isEmpty && frame.count <= PaymentFrame.maximumLength)
        if let message = try? PaymentMessage.decode(frame) {
            let again = try? PaymentMessage.decode(message.encoded)
            precondition(again == message, "re-encoding changed a message")
        }
    }

    if let value = try? JSONParser.parse(stream) {
        precondition((try? JSONParser.parse(value.serialized)) == value, "JSON did not round-trip")
    }
    return 0
}

#if FUZZING
@_cdecl("FuzzPaymentMessages_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzPaymentMessages)
}
#else
@main struct Replay {
    static func main() { replay(fuzzPaymentMessages) }
}
#endif
