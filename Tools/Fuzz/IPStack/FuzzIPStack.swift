// libFuzzer target: our IP stack's input path. The input is a series of packets, each a
// 2-byte big-endian length and that many bytes, delivered to a stack that listens on TCP 80
// and has UDP 53 bound, one virtual millisecond apart, with its timers run in between. Every
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
    var i = 0
    while i + 2 <= input.count {
        let n = min(Int(input[i]) << 8 | Int(input[i + 1]), input.count - i - 2)
        let packet = Array(input[(i + 2)..<(i + 2 + n)])
        i += 2 + n
        stack.receive(packet: packet, now: now)
        if let p = receiver.compressed(packet) { stack.receive(packet: p, now: now) }
        if let p = receiver.uncompressed(packet) { stack.receive(packet: p, now: now) }
        if wellFormed(packet) {
            let (proto, bytes) = compressor.compress(packet)
            let back = proto == 0x002D ? mirror.compressed(bytes) : proto == 0x002F ? mirror.uncompressed(bytes) : bytes
            precondition(back == packet, "VJ did not round-trip a packet")
        }
        if let id = stack.accept(port: 80) { _ = stack.read(id, now: now) }
        _ = stack.receiveDatagram(port: 53)
        _ = stack.takeOutgoing()
        _ = stack.takeEvents()
        now = now + .milliseconds(1)
        if let p = stack.pollAt, p <= now { stack.poll(now: now) }
        let held = stack.reassemblyBytes
        precondition(held.fragments <= configuration.reassembly.memory, "reassembly over its limit")
        precondition(held.outOfOrder <= stack.connectionCount * configuration.tcp.receiveBufferSize, "out-of-order data over the window")
    }
    // Time runs out for everything held.
    stack.poll(now: now + .seconds(120))
    _ = stack.takeOutgoing()
    precondition(stack.reassemblyBytes.fragments == 0, "fragments outlived their timeout")
    return 0
}

/// A packet VJ must carry unchanged: total length equal to its size, a valid IP header checksum.
func wellFormed(_ p: [UInt8]) -> Bool {
    guard let h = try? p.withUnsafeBytes({ b throws(PacketError) in try IPv4Header(parsing: b) }), h.totalLength == p.count else { return false }
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
