// libFuzzer target: a device server as a hostile peer of our RFC 2217 client.
//
// The first byte picks the chunk size and which options we start with; the rest is what the
// server sends. Nothing may trap; the line's bytes out of a read are never more than came in;
// the result (the line's bytes, our answers, the events, the report, the counters) must not
// depend on how the stream is cut into reads; our answers stay within the per-option budget;
// and what we encode for the server decodes back to itself in the mode both sides settled on.
// The same bytes as text go through the network line name parser.
import RemoteSerial
import FuzzSupport

private struct Outcome: Equatable {
    var data: [UInt8] = []
    var written: [UInt8] = []
    var events: [ComPortClient.Event] = []
    var report = ComPortReport()
    var counters = ComPortClient.Counters()
}

private func run(_ stream: [UInt8], chunk: Int, settings: ComPortSettings) -> (Outcome, ComPortClient) {
    var client = ComPortClient(settings: settings)
    client.start()
    var o = Outcome()
    client.takeOutput(into: &o.written)
    var offset = 0
    while offset < stream.count {
        let end = min(stream.count, offset + chunk)
        var buffer = Array(stream[offset..<end])
        let n = client.receive(&buffer, count: buffer.count)
        precondition(n >= 0 && n <= end - offset, "a read gave more than came in")
        o.data += buffer[0..<n]
        client.takeOutput(into: &o.written)
        o.events += client.takeEvents()
        offset = end
    }
    o.report = client.report
    o.counters = client.counters
    return (o, client)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRemoteSerial(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 1 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let stream = Array(input[1...])
    var settings = ComPortSettings()
    settings.baudRate = UInt32(input[0]) * 1200
    settings.flowControl = input[0] & 1 == 0 ? .none : .hardware
    let chunk = 1 + Int(input[0] % 17)

    let (whole, client) = run(stream, chunk: max(1, stream.count), settings: settings)
    let (cut, _) = run(stream, chunk: chunk, settings: settings)
    precondition(whole == cut, "cutting the stream into reads changed the outcome")
    // Opening requests and settings, then at most the per-option budget of 3-byte answers.
    precondition(whole.written.count <= 15 + 80 + 256 * 8 * 3, "answers beyond the budget: \(whole.written.count)")

    // What we would send decodes back to itself, in the modes the two sides are in.
    var peer = ComPortClient(settings: settings)
    let binary: [UInt8] = client.sendsBinary ? [255, 253, 0, 255, 251, 0] : [255, 254, 0, 255, 252, 0]
    var setup = binary
    _ = peer.receive(&setup, count: setup.count)
    var encoded: [UInt8] = []
    client.encode(stream, into: &encoded)
    var decoded = encoded
    let n = peer.receive(&decoded, count: decoded.count)
    if client.sendsBinary == peer.receivesBinary {
        // A CR NUL pair in the stream reads back as CR in NVT mode: only binary is exact.
        if client.sendsBinary { precondition(Array(decoded[0..<n]) == stream, "escaping did not round-trip") }
    }

    _ = RemoteLineAddress.parse(String(decoding: stream, as: UTF8.self)).map(\.description)
    return 0
}

#if FUZZING
@_cdecl("FuzzRemoteSerial_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzRemoteSerial)
}
#else
@main struct Replay {
    static func main() { replay(fuzzRemoteSerial) }
}
#endif
