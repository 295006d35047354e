import Crypto
import NetStack
import PPP
import Testing

/// A one-way bulk transfer between our two stacks across the simulated serial line.
struct BulkTransfer {
    let data: [UInt8]
    let port: UInt16 = 5001
    var client: ConnectionID?
    var server: ConnectionID?
    var written = 0
    var received: [UInt8] = []
    var finished = false

    init(size: Int, seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        var d = [UInt8](repeating: 0, count: size)
        var i = 0
        while i < size {
            var v = rng.next()
            for _ in 0..<8 where i < size {
                d[i] = UInt8(truncatingIfNeeded: v)
                v >>= 8
                i += 1
            }
        }
        data = d
    }

    /// Terminal connects to the host and writes; the host reads until end of stream.
    mutating func drive(_ sim: inout LinkSimulator) -> Bool {
        let now = sim.now
        guard sim.host.stack != nil, sim.terminal.stack != nil else { return false }
        if !sim.host.stack!.listeningPorts.contains(port) { try! sim.host.stack!.listen(port: port) }
        if client == nil {
            client = try! sim.terminal.stack!.connect(to: TCPEndpoint(LinkSimulator.hostAddress, port), now: now)
        }
        if server == nil { server = sim.host.stack!.accept(port: port) }
        _ = sim.host.stack!.takeEvents()
        _ = sim.terminal.stack!.takeEvents()
        if let c = client, written < data.count {
            let n = sim.terminal.stack!.write(c, data[written...], now: now)
            written += n
            if written == data.count { sim.terminal.stack!.shutdownWrite(c, now: now) }
        }
        if let s = server {
            while true {
                let chunk = sim.host.stack!.read(s, now: now)
                if chunk.isEmpty { break }
                received += chunk
            }
            if sim.host.stack!.atEndOfStream(s) && !finished {
                finished = true
                sim.host.stack!.close(s, now: now)
            }
        }
        return finished && sim.terminal.stack!.state(client!) == nil
    }
}

@Suite(.serialized) struct SimulatedLinkTests {
    /// 10 MiB from the terminal's stack to the host's at 115200 baud, at 0, 1 and 5% frame
    /// loss, with VJ header compression (both ends' default) and without. Lost frames are a
    /// hard case for VJ: nothing marks them, so the next deltas rebuild wrong packets that TCP's
    /// checksum throws away until a retransmission timeout resends uncompressed (RFC 1144 §4.1);
    /// without VJ, SACK recovery repairs the holes.
    @Test(arguments: [(0.0, true), (0.01, true), (0.05, true), (0.01, false), (0.05, false)])
    func tenMebibytesAcrossALossyLine(loss: Double, vj: Bool) throws {
        var sim = LinkSimulator(seed: 0x5EED_0000 &+ UInt64(loss * 1000), frameLoss: loss, vj: vj)
        var transfer = BulkTransfer(size: 10 << 20, seed: 99)
        sim.start()
        let done = sim.run(for: .seconds(7200)) { transfer.drive(&$0) }
        #expect(done, "transfer did not finish in two virtual hours")
        #expect(transfer.received.count == transfer.data.count)
        let sent = Digest.hash(.sha256, transfer.data)!
        let got = Digest.hash(.sha256, transfer.received)!
        #expect(Digest.hex(sent) == Digest.hex(got))
        let t = sim.terminal.stack!.counters
        let h = sim.host.stack!.counters
        let seconds = Double(sim.now.nanoseconds) / 1e9
        let rate = Int(Double(transfer.data.count) / seconds)
        let line1 = "simulator: \(vj ? "VJ" : "no VJ"), loss \(Int(loss * 100))%: 10 MiB in \(Int(seconds)) virtual s (\(rate) B/s on a 11520 B/s line)"
        let line2 = "frames dropped \(sim.terminalToHost.framesDropped) and \(sim.hostToTerminal.framesDropped)"
        let line3 = "retransmissions \(t.tcp.retransmittedSegments) (fast \(t.tcp.fastRetransmits), timeouts \(t.tcp.timeouts)), receiver out-of-order \(h.tcp.outOfOrderSegments)"
        print([line1, line2, line3, "sha256 " + Digest.hex(got)].joined(separator: "; "))
        if loss > 0 { #expect(t.tcp.retransmittedSegments > 0) }
        if vj {
            #expect(sim.terminal.link.vjCompressor!.compressed > 5000, "bulk data went VJ-compressed")
        } else {
            #expect(sim.terminal.link.vjCompressor == nil)
            if loss > 0 { #expect(t.tcp.fastRetransmits > 0 && h.tcp.outOfOrderSegments > 0) }
        }
    }
}
