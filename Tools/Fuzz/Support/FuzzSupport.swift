// What every fuzz target needs around its LLVMFuzzerTestOneInput: the libFuzzer driver when
// built with -sanitize=fuzzer (-DFUZZING), and a replayer of input files otherwise; checksum
// fix-ups that let mutations reach the state machines; depth counters.
import Glibc
import NetStack
import Proxy
#if FUZZING
/// libFuzzer's driver (LLVM ≥ 11), called from the entry point SwiftPM links executables with.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

public func runFuzzer(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?,
                      _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, callback)
}
#else
import Foundation

/// Feeds each file named on the command line to `callback` (crash reproducers, seeds).
public func replay(_ callback: (UnsafePointer<UInt8>?, Int) -> CInt) {
    for path in CommandLine.arguments.dropFirst() {
        let bytes = [UInt8](FileManager.default.contents(atPath: path) ?? Data())
        _ = bytes.withUnsafeBufferPointer { callback($0.baseAddress, $0.count) }
        print("ok \(path)")
    }
}
#endif

// MARK: - Checksum fix-ups

/// Makes a mutated IPv4 packet pass the checks that guard the state machines, so a fuzzer's
/// mutations reach reassembly and TCP instead of dying at a checksum: the header checksum over
/// the header length the packet claims, and, for a packet that is not a fragment, the TCP, UDP
/// (when not zero: RFC 768's "no checksum") or ICMP checksum over the length the header claims.
/// Lengths stay as mutated; what does not fit is left alone.
public func fixIPv4Checksums(_ p: inout [UInt8]) {
    guard p.count >= 20, p[0] >> 4 == 4 else { return }
    let ihl = Int(p[0] & 0x0F) * 4
    guard ihl >= 20, ihl <= p.count else { return }
    p[10] = 0
    p[11] = 0
    store(onesComplement(sum(p[0..<ihl])), in: &p, at: 10)
    let total = min(Int(p[2]) << 8 | Int(p[3]), p.count)
    let fragment = (Int(p[6]) << 8 | Int(p[7])) & 0x3FFF != 0
    guard !fragment, total > ihl else { return }
    let proto = p[9]
    let length = total - ihl
    let at: Int
    switch proto {
    case 6: at = ihl + 16
    case 17: at = ihl + 6
    case 1: at = ihl + 2
    default: return
    }
    guard at + 2 <= total else { return }
    if proto == 17 && p[at] == 0 && p[at + 1] == 0 { return }
    p[at] = 0
    p[at + 1] = 0
    var s = sum(p[ihl..<total])
    if proto != 1 {
        // The pseudo-header (RFC 9293 §3.1, RFC 768).
        s += sum(p[12..<20]) + UInt32(proto) + UInt32(length)
    }
    var c = onesComplement(s)
    if proto == 17 && c == 0 { c = 0xFFFF }
    store(c, in: &p, at: at)
}

private func sum(_ bytes: ArraySlice<UInt8>) -> UInt32 {
    var s: UInt32 = 0
    var i = bytes.startIndex
    while i + 1 < bytes.endIndex {
        s &+= UInt32(bytes[i]) << 8 | UInt32(bytes[i + 1])
        i += 2
    }
    if i < bytes.endIndex { s &+= UInt32(bytes[i]) << 8 }
    return s
}

private func onesComplement(_ s: UInt32) -> UInt16 {
    var x = s
    while x > 0xFFFF { x = (x & 0xFFFF) + (x >> 16) }
    return ~UInt16(truncatingIfNeeded: x)
}

private func store(_ v: UInt16, in p: inout [UInt8], at i: Int) {
    p[i] = UInt8(truncatingIfNeeded: v >> 8)
    p[i + 1] = UInt8(truncatingIfNeeded: v)
}

// MARK: - Depth

/// What a fuzzing run reached, counted over every input and printed when the fuzzer exits
/// (`depth: …`), so a campaign shows it got past the parsers into the state machines.
public final class FuzzDepth: @unchecked Sendable {
    public nonisolated(unsafe) static var counts: [String: Int] = [:]
    nonisolated(unsafe) private static var registered = false

    public static func count(_ name: String, _ n: Int = 1) {
        guard n > 0 else { return }
        if !registered {
            registered = true
            atexit { FuzzDepth.report() }
        }
        counts[name, default: 0] += n
    }

    public static func report() {
        let line = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        let text = Array("depth: \(line)\n".utf8)
        _ = text.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }
}

// MARK: - TCP numbers

/// What the stack expects next from each remote port, learnt from the segments it sends.
public struct TCPExpectations {
    public init() {}

    var byPort: [UInt16: (sequence: SequenceNumber, acknowledgment: SequenceNumber)] = [:]

    public mutating func learn(from packet: [UInt8]) {
        guard let ip = try? packet.withUnsafeBytes({ b throws(WireError) in try IPv4Header(parsing: b) }), ip.protocol == IPProtocol.tcp,
              let tcp = try? packet[ip.headerLength..<ip.totalLength].withUnsafeBytes({ b throws(WireError) in try TCPHeader(parsing: b) })
        else { return }
        let length = ip.payloadLength - tcp.headerLength
        let next = tcp.sequenceNumber + length + (tcp.flags.contains(.syn) ? 1 : 0) + (tcp.flags.contains(.fin) ? 1 : 0)
        if byPort.count < 64 || byPort[tcp.destinationPort] != nil {
            byPort[tcp.destinationPort] = (tcp.acknowledgmentNumber, next)
        }
    }

    public func apply(to p: inout [UInt8]) {
        guard p.count >= 40, p[0] >> 4 == 4, p[9] == 6 else { return }
        let ihl = Int(p[0] & 0x0F) * 4
        guard ihl >= 20, ihl + 20 <= p.count else { return }
        let port = UInt16(p[ihl]) << 8 | UInt16(p[ihl + 1])
        guard let e = byPort[port] else { return }
        if p[ihl + 13] & 0x02 == 0 { put(e.sequence, into: &p, at: ihl + 4) }
        if p[ihl + 13] & 0x10 != 0 { put(e.acknowledgment, into: &p, at: ihl + 8) }
    }

    private func put(_ v: SequenceNumber, into p: inout [UInt8], at i: Int) {
        for k in 0..<4 { p[i + k] = UInt8(truncatingIfNeeded: v.rawValue >> (24 - 8 * k)) }
    }
}


// MARK: - SOCKS

/// The steps a SOCKS negotiation takes over `body` fed whole, after checking that feeding it
/// in pieces (sizes picked by the bytes themselves) reaches the same end with the same leftover.
public func socksStepsWhateverTheCut(_ body: [UInt8], passwords: [String: String]?) -> [SocksNegotiation.Step] {
    var whole = SocksNegotiation(passwords: passwords)
    let once = whole.feed(body)
    var cut = SocksNegotiation(passwords: passwords)
    var pieces: [SocksNegotiation.Step] = []
    var i = 0
    while i < body.count {
        let n = 1 + Int(body[i] % 13)
        pieces += cut.feed(Array(body[i..<min(body.count, i + n)]))
        i += n
    }
    let ends = { (steps: [SocksNegotiation.Step]) in steps.filter { if case .needMore = $0 { return false } else { return true } } }
    precondition(ends(once) == ends(pieces), "SOCKS steps depend on how the input was cut")
    precondition(whole.leftover == cut.leftover, "SOCKS leftover depends on how the input was cut")
    return once
}
