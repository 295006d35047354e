import Capture
import Foundation
import Framing
import Replay

/// `pppbridge replay FILE [--peer sent|rcvd|ADDRESS] [--frames] [--pcap OUT.pcap]`
struct ReplayCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge replay FILE [--peer sent|rcvd|ADDRESS] [--frames] [--pcap OUT.pcap]
                            [--capture-secrets]

    Plays a captured PPP session against this build's link and TCP/IP stack on virtual
    time. One side of the recording is the peer: its frames are fed in recording order,
    each once what it answers has come from our side, with the capture's gaps between
    them. Our stack plays the other side, configured to ask what that side asked (its LCP
    and IPCP requests, the addresses it gave, its PAP credentials and TCP options). What
    our answers change is adapted as a live peer would see it: our magic number, the
    identifiers of our requests, the options of our requests in the peer's Acks and
    Rejects, the values our Naks suggested in the peer's next request, our TCP sequence
    numbers, SACK edges and timestamps, and the addresses IPCP settled on (checksums
    computed afresh). The recorded side's own actions (closing the link, TCP data, FINs
    and resets, pings, datagrams) are taken by our side's application at the same point.

    The report lists every divergence (an answer that differs from the recorded side's,
    a Nak where it sent an Ack, a reset, a missing answer, a peer frame that waited for
    an answer of ours that never came) and the states the recorded side reached: LCP
    opened, PAP, IPCP opened with its addresses, each TCP connection established and
    closed with the bytes it carried, the link terminated.

    FILE is anything `pppbridge decode` reads in which both sides of a session can be
    told apart: a pppd `record` file (pppd's own, or `pppbridge run --record`), a pcap of
    link type 204 (PPP with direction, `run --pcap`), PPPoE on Ethernet (sides told by
    their Ethernet addresses), or PPP in PPTP's GRE or in L2TP (sides told by their IP
    addresses). Each PPPoE session or tunnel is played on its own.

    options:
      --peer SIDE       the side to feed: sent, rcvd, or an Ethernet address; by default
                        the terminal's (the side that asks for its address, authenticates or
                        is given an address), so that we play the host
      --frames          print every frame fed and sent, with its virtual time
      --pcap OUT.pcap   write the replayed session (both directions, link type 204)
      --capture-secrets write PAP passwords into OUT.pcap as they were

    Bounds: a file of more than 256 MiB or 200000 frames is refused; a silence in the
    recording is played as at most 30 s; a peer frame waits at most 5 s (virtual) for the
    answer it needs; the replay ends 10 s (virtual) after the recording's last frame.

    Exit status: 0 when every played session reached every state its recorded side
    reached; 1 when one did not (the report names the state and the first divergence);
    2 when the file cannot be read or holds no session that can be played (a one-sided
    capture, frames without directions, a session that starts after LCP, CHAP or
    MS-CHAP, whose answers need a secret the capture does not hold).
    """

    func run(_ arguments: [String]) -> Int32 {
        var path: String?
        var options = ReplayOptions()
        var frames = false
        var pcapPath: String?
        var captureSecrets = false
        var it = arguments.makeIterator()
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(ReplayCommand.usage)
                return CommandLineTool.Status.success
            case "--peer":
                guard let v = it.next() else { return usageError("--peer needs sent, rcvd or an address") }
                options.peer = v
            case "--frames":
                frames = true
            case "--pcap":
                guard let v = it.next() else { return usageError("--pcap needs a file name") }
                pcapPath = v
            case "--capture-secrets":
                captureSecrets = true
            default:
                if a.hasPrefix("-") { return usageError("unknown option \(a)") }
                guard path == nil else { return usageError("one FILE at a time") }
                path = a
            }
        }
        guard let path else { return usageError("replay needs a FILE") }
        let replays: [SessionReplay]
        do {
            replays = try Replay.run(path: path, options: options)
        } catch let e {
            error("pppbridge replay: \(e)")
            return Replay.Status.unplayable.rawValue
        }
        for r in replays {
            if let report = r.report {
                output(report.text(frames: frames))
            } else if let why = r.unplayable {
                output("session" + (r.label.isEmpty ? "" : " [\(r.label)]") + ": cannot be played: \(why)")
            }
        }
        if let pcapPath {
            do {
                let writer = try PcapWriter(path: pcapPath, linkType: .pppWithDirection, masking: captureSecrets ? nil : SecretMasker())
                defer { writer.close() }
                // Sessions one after another, each from where the one before ended.
                var offset = 0.0
                for r in replays {
                    for f in r.frames {
                        let micro = Int(((offset + f.seconds) * 1e6).rounded())
                        let time = CaptureTime(seconds: Int64(micro / 1_000_000), microseconds: Int32(micro % 1_000_000))
                        try writer.write(packet: f.frame.uncompressedPacket, time: time, direction: f.direction)
                    }
                    offset += (r.frames.last?.seconds ?? 0) + 1
                }
            } catch let e {
                error("pppbridge replay: \(e)")
                return Replay.Status.unplayable.rawValue
            }
        }
        let status = Replay.status(replays)
        if status == .unplayable && replays.allSatisfy({ $0.report == nil }) {
            error("pppbridge replay: \(path): no session in it can be played")
        }
        return status.rawValue
    }

    private func usageError(_ message: String) -> Int32 {
        error("pppbridge replay: \(message) (see `pppbridge replay --help`)")
        return CommandLineTool.Status.usage
    }
}
