// libFuzzer target: our IP stack's input path. The input is a flags byte, then a series of
// packets, each a 2-byte big-endian length and that many bytes, delivered to a stack that
// listens on TCP 80 and has UDP 53 bound, one virtual millisecond apart, with its timers run in
// between. Unless the flags' low bit asks for raw bytes, each packet's IPv4 header checksum and
// (for whole datagrams) its TCP/UDP/ICMP checksum are fixed up first, so mutations reach
// reassembly and the TCP state machine instead of a checksum check; with the flags' second bit
// a TCP segment from a port the stack has answered also takes the sequence and acknowledgment
// numbers the stack expects, so handshakes complete and data flows. Every
// IPv4, ICMP, UDP and TCP header parser and the reassembly and TCP state machines see them.
// Each packet also goes through VJ decompression (as a compressed and as an uncompressed
// frame, whatever comes out reaching the stack too) and through a VJ compressor whose output a
// mirror decompressor must turn back into the very same packet.
// Nothing may trap; the stack's memory stays within its bounds.
import FuzzSupport
import NetStack

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzIPStack(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    var configuration = IPStackConfiguration(address: IPv4Address(10, 0, 0, 1))
    configuration.tcp.receiveBufferSize = 8192
    var stack = IPStack(configuration: configuration, seed: 1)
    try? stack.listen(port: 80)
    try? stack.bindUDP(port: 53)
    var now = Instant.zero
    var receiver = VJDecompressor(parameters: VJParameters(maxSlotID: 3, compressSlotID: true))
    var compressor = VJCompressor(parameters: VJParameters(maxSlotID: 3, compressSlotID: true))
    var mirror = VJDecompressor(parameters: VJParameters(maxSlotID: 3, compressSlotID: true))
    guard let flags = input.first else { return 0 }
    let raw = flags & 1 != 0
    var expected = TCPExpectations()
    var i = 1
    var established = 0
    while i + 2 <= input.count {
        let n = min(Int(input[i]) << 8 | Int(input[i + 1]), input.count - i - 2)
        var packet = Array(input[(i + 2)..<(i + 2 + n)])
        i += 2 + n
        if !raw {
            if flags & 2 != 0 { expected.apply(to: &packet) }
            fixIPv4Checksums(&packet)
        }
        stack.receive(packet: packet, now: now)
        if let p = receiver.compressed(packet) { stack.receive(packet: p, now: now) }
        if let p = receiver.uncompressed(packet) { stack.receive(packet: p, now: now) }
        if wellFormed(packet) {
            let (proto, bytes) = compressor.compress(packet)
            let back = proto == 0x002D ? mirror.compressed(bytes) : proto == 0x002F ? mirror.uncompressed(bytes) : bytes
            precondition(back == packet, "VJ did not round-trip a packet")
        }
        if let id = stack.accept(port: 80) {
            established += 1
            _ = stack.read(id, now: now)
        }
        if stack.receiveDatagram(port: 53) != nil { FuzzDepth.count("udp-delivered") }
        for p in stack.takeOutgoing() { expected.learn(from: p) }
        _ = stack.takeEvents()
        now = now + .milliseconds(1)
        if let p = stack.pollAt, p <= now { stack.poll(now: now) }
        let held = stack.reassemblyBytes
        precondition(held.fragments <= configuration.reassembly.memory, "reassembly over its limit")
        precondition(held.outOfOrder <= stack.connectionCount * configuration.tcp.receiveBufferSize, "out-of-order data over the window")
    }
    let counters = stack.counters
    FuzzDepth.count("datagrams-reassembled", counters.datagramsReassembled)
    FuzzDepth.count("tcp-established", established)
    FuzzDepth.count("tcp-segments-in", counters.tcp.segmentsReceived)
    FuzzDepth.count("icmp-echo", counters.icmpEchoRequests)
    // Time runs out for everything held.
    stack.poll(now: now + .seconds(120))
    _ = stack.takeOutgoing()
    precondition(stack.reassemblyBytes.fragments == 0, "fragments outlived their timeout")
    return 0
}

/// A packet VJ must carry unchanged: total length equal to its size, a valid IP header checksum.
func wellFormed(_ p: [UInt8]) -> Bool {
    guard let h = try? p.withUnsafeBytes({ b throws(WireError) in try IPv4Header(parsing: b) }), h.totalLength == p.count else { return false }
    return p.withUnsafeBytes { IPv4Header.checksumValid(UnsafeRawBufferPointer(rebasing: $0[0..<h.headerLength])) }
}

#if FUZZING
@_cdecl("FuzzIPStack_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzIPStack)
}
#else
@main struct Replay {
    static func main() { replay(fuzzIPStack) }
}
#endif
