// pppbridge-bench: throughput programs that compare against a reference measured in the same run.
//
//   swift run -c release pppbridge-bench framing [--mib N] [--rounds N]
//   swift run -c release pppbridge-bench bridge [--mib N] [--rounds N] [--blocks N] [--line-poll-interval US] [--report]   (see BridgeBench.swift)
//   swift run -c release pppbridge-bench loop [--turns N]   (see LoopBench.swift)
//
// framing: RFC 1662 encode and decode of N MiB (default 64) of information fields in four
// classes: random, all 0x7E (every byte escaped), one byte in ten escaped, and random in
// 64-byte frames (ACK-sized traffic, where the cost per frame shows); by our framer and by a plain C
// implementation of the RFC's byte-at-a-time table loop (Tools/CFramingBaseline, -O2).
// Both must produce identical bytes and frame counts; the best of several rounds counts.
import CFramingBaseline
import Dispatch
import Foundation
import Framing

struct Options {
    var mebibytes = 64
    var rounds = 3
    var frameLength = 1500
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("pppbridge-bench: \(message)\n".utf8))
    exit(2)
}

func parse(_ args: ArraySlice<String>) -> Options {
    var o = Options()
    var it = args.makeIterator()
    func number(_ flag: String) -> Int {
        guard let v = it.next().flatMap({ Int($0) }), v > 0 else { fail("\(flag) needs a positive number") }
        return v
    }
    while let a = it.next() {
        switch a {
        case "--mib": o.mebibytes = number(a)
        case "--rounds": o.rounds = number(a)
        case "--frame": o.frameLength = number(a)
        default: fail("unknown option \(a)")
        }
    }
    return o
}

/// A small deterministic generator (SplitMix64), so every run measures the same bytes.
struct SplitMix64 {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func seconds(_ d: Duration) -> Double {
    Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

func best(_ rounds: Int, _ body: () -> Void) -> Double {
    let clock = ContinuousClock()
    var fastest = Double.infinity
    for _ in 0..<rounds {
        let t = clock.measure(body)
        fastest = min(fastest, seconds(t))
    }
    return fastest
}

struct Measurement {
    var swiftEncode: Double
    var cEncode: Double
    var swiftDecode: Double
    var cDecode: Double
}

func measure(name: String, payload: [UInt8], options o: Options) -> Measurement {
    let frameCount = payload.count / o.frameLength
    let informationBytes = frameCount * o.frameLength
    let accm: UInt32 = 0
    let encoder = HDLCEncoder(fcs: .fcs16, escapes: EscapeSet(accm: accm))
    let worst = 1 + frameCount * (HDLCEncoder.maximumEncodedLength(informationCount: o.frameLength, fcs: .fcs16))

    // Encode: ours.
    var stream: [UInt8] = []
    stream.reserveCapacity(worst + 64)
    let swiftEncode = best(o.rounds) {
        stream.removeAll(keepingCapacity: true)
        payload.withUnsafeBytes { all in
            for f in 0..<frameCount {
                let slice = UnsafeRawBufferPointer(rebasing: all[(f * o.frameLength)..<((f + 1) * o.frameLength)])
                encoder.encode(protocol: .ipv4, information: slice, into: &stream)
            }
        }
    }
    // Encode: the C baseline.
    var cStream = [UInt8](repeating: 0, count: worst + 64)
    var cLength = 0
    let cEncode = best(o.rounds) {
        cLength = payload.withUnsafeBufferPointer { p in
            cStream.withUnsafeMutableBufferPointer { out in
                cbaseline_encode(p.baseAddress, o.frameLength, frameCount, 0x0021, accm, out.baseAddress)
            }
        }
    }
    guard cLength == stream.count, cStream[0..<cLength].elementsEqual(stream) else {
        fail("\(name): the C baseline and our encoder disagree (\(cLength) vs \(stream.count) bytes)")
    }

    // Decode, in 4 KiB chunks as reads from a line would arrive.
    let chunk = 4096
    var frames = 0
    var decodedBytes = 0
    let swiftDecode = best(o.rounds) {
        var decoder = HDLCDecoder(fcs: .fcs16, mru: o.frameLength, receiveACCM: 0)
        frames = 0
        decodedBytes = 0
        stream.withUnsafeBytes { all in
            var offset = 0
            while offset < all.count {
                let end = min(all.count, offset + chunk)
                decoder.decode(UnsafeRawBufferPointer(rebasing: all[offset..<end])) { frame in
                    frames += 1
                    decodedBytes += frame.information.count
                }
                offset = end
            }
        }
    }
    var cFrames = 0
    var cBytes = 0
    var cBuffer = [UInt8](repeating: 0, count: o.frameLength + 8)
    let cDecode = best(o.rounds) {
        var d = cbaseline_decoder()
        cBuffer.withUnsafeMutableBufferPointer { b in
            cbaseline_decoder_init(&d, b.baseAddress, b.count, 0)
            stream.withUnsafeBufferPointer { all in
                var offset = 0
                while offset < all.count {
                    let end = min(all.count, offset + chunk)
                    cbaseline_decode(&d, all.baseAddress! + offset, end - offset)
                    offset = end
                }
            }
        }
        cFrames = d.frames
        cBytes = d.information_bytes
    }
    guard frames == frameCount, cFrames == frameCount, decodedBytes == informationBytes, cBytes == informationBytes else {
        fail("\(name): decoded \(frames) frames (C: \(cFrames)) of \(frameCount)")
    }
    let mb = Double(informationBytes) / 1e6
    func row(_ what: String, _ ours: Double, _ c: Double) {
        let line = String(format: "%-8@ %-6@ ours %8.1f MB/s   C %8.1f MB/s   ratio %.2f", name as NSString, what as NSString, mb / ours, mb / c, c / ours)
        print(line)
    }
    row("encode", swiftEncode, cEncode)
    row("decode", swiftDecode, cDecode)
    return Measurement(swiftEncode: swiftEncode, cEncode: cEncode, swiftDecode: swiftDecode, cDecode: cDecode)
}

/// The payload classes, each measured on its own: a peer chooses what it sends, so the class
/// where ours does worst is the one that counts.
func framing(_ o: Options) {
    let size = o.mebibytes * 1024 * 1024
    var rng = SplitMix64(state: 0x5050_5042_5249_4447)
    var random = [UInt8](repeating: 0, count: size)
    random.withUnsafeMutableBytes { raw in
        for i in stride(from: 0, to: size - 7, by: 8) { raw.storeBytes(of: rng.next(), toByteOffset: i, as: UInt64.self) }
    }
    let worst = [UInt8](repeating: 0x7E, count: size)
    // One byte in ten (at random places) a flag or an escape, the rest random bytes that are not.
    var tenth = random
    for i in tenth.indices {
        if rng.next() % 10 == 0 {
            tenth[i] = i & 1 == 0 ? 0x7E : 0x7D
        } else if tenth[i] == 0x7E || tenth[i] == 0x7D {
            tenth[i] ^= 0x40
        }
    }
    print("framing: \(o.mebibytes) MiB of information in \(o.frameLength)-byte frames (and 64-byte frames), FCS-16, ACCM 0, best of \(o.rounds)")
    let r = measure(name: "random", payload: random, options: o)
    let w = measure(name: "all-7e", payload: worst, options: o)
    let t = measure(name: "1-in-10", payload: tenth, options: o)
    var small = o
    small.frameLength = 64
    let f = measure(name: "64-byte", payload: random, options: small)
    let classes = [r, w, t, f]
    // As before: total C time over total time of ours, over the random and all-0x7E payloads.
    let encodeRatio = (r.cEncode + w.cEncode) / (r.swiftEncode + w.swiftEncode)
    let decodeRatio = (r.cDecode + w.cDecode) / (r.swiftDecode + w.swiftDecode)
    let minEncode = classes.map { $0.cEncode / $0.swiftEncode }.min() ?? 0
    let minDecode = classes.map { $0.cDecode / $0.swiftDecode }.min() ?? 0
    print(String(format: "worst-case ratios over the four classes: encode %.2f decode %.2f", minEncode, minDecode))
    print(String(format: "RESULT framing encode_ratio=%.2f decode_ratio=%.2f min_encode_ratio=%.2f min_decode_ratio=%.2f min_ratio=%.2f",
                 encodeRatio, decodeRatio, minEncode, minDecode, min(minEncode, minDecode)))
}

let arguments = CommandLine.arguments.dropFirst()
switch arguments.first {
case "framing":
    framing(parse(arguments.dropFirst()))
case "loop":
    loopBench(arguments.dropFirst())
case "bridge":
    let options = parseBridge(arguments.dropFirst())
    // A path whose far end is gone fails its client's read (`fail`), not the process on a write.
    signal(SIGPIPE, SIG_IGN)
    let done = DispatchSemaphore(value: 0)
    Task.detached {
        await bridge(options)
        done.signal()
    }
    done.wait()
case nil, "--help", "-h":
    print("""
    usage: pppbridge-bench framing [--mib N] [--rounds N] [--frame BYTES]
           pppbridge-bench bridge [--mib N] [--rounds N] [--blocks N] [--line-poll-interval US] [--report]
           pppbridge-bench loop [--turns N]
      framing   RFC 1662 encode/decode throughput, ours against a C byte-loop baseline (-O2)
      bridge    the channel over a pty pair (our terminal-role stack on the far end): bulk
                throughput both ways through bridges and a 200-byte round trip, against a
                raw pty copy, a raw pty echo and a raw relay (socket to pty and back)
      loop      one event-loop turn with 1, 100 and 1,000 idle clients and timers beside a
                busy descriptor: what idle terminals cost a busy one
    """)
default:
    fail("unknown benchmark '\(arguments.first!)' (try --help)")
}
