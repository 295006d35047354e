import Capture
import Foundation
import Service
import Framing
import PPP

/// `pppbridge decode FILE [--pcap OUT.pcap] [--pcap-linktype ppp|ppp-with-dir] [--show-password] [--capture-secrets]`
struct DecodeCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge decode FILE [--pcap OUT.pcap] [--pcap-linktype ppp|ppp-with-dir] [--show-password]
                            [--capture-secrets]

    Prints one line per PPP frame of FILE, in pppd's debug-log style:
        #NUMBER TIME [sent|rcvd] [VIA] [PROTOCOL ...]
    NUMBER is tshark's frame number (the pcap record, or the frame of a pppd record file);
    TIME is seconds since the first record; sent/rcvd appear where the capture keeps a
    direction; VIA names the tunnels that carried the frame (VLAN, PPPoE, GRE, L2TP).
    Counts of bad, aborted and malformed frames close the output, and records whose time
    stamp was out of range (read normalised) are counted.

    FILE may be:
      a pcap file (read with libpcap) of link type 1 (Ethernet, VLAN-tagged or not: PPPoE
        sessions, PPTP GRE and L2TP over IPv4 or IPv6, IP-in-IP tunnels included),
        9 (PPP), 50 (PPP in HDLC-like framing) or 204 (PPP with a direction byte);
      a pppd `record` file: the raw async line both ways, de-framed here with FCS checks.

    options:
      --pcap OUT.pcap       also write the frames to OUT.pcap, one record per frame
      --pcap-linktype TYPE  ppp (9, the default): FF 03 and a two-byte protocol before each
                            packet, decoded by every tool but without direction;
                            ppp-with-dir (204): the same after a byte that keeps the direction
      --show-password       print PAP passwords (hidden by default, as pppd does)
      --capture-secrets     write PAP passwords into OUT.pcap as they were (by default each
                            password byte is written as '*')

    Exit status: 0 when the file was read (bad frames are counted, not fatal), 2 when it
    could not be read or the arguments are wrong.
    """

    func run(_ arguments: [String]) -> Int32 {
        var path: String?
        var pcapPath: String?
        var linkType = LinkType.ppp
        var showPassword = false
        var captureSecrets = false
        var it = arguments.makeIterator()
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(DecodeCommand.usage)
                return CommandLineTool.Status.success
            case "--pcap":
                guard let v = it.next() else { return usageError("--pcap needs a file name") }
                pcapPath = v
            case "--pcap-linktype":
                switch it.next() {
                case "ppp", "9": linkType = .ppp
                case "ppp-with-dir", "204": linkType = .pppWithDirection
                default: return usageError("--pcap-linktype takes ppp (9) or ppp-with-dir (204)")
                }
            case "--show-password":
                showPassword = true
            case "--capture-secrets":
                captureSecrets = true
            default:
                if a.hasPrefix("-") { return usageError("unknown option \(a)") }
                guard path == nil else { return usageError("one FILE at a time") }
                path = a
            }
        }
        guard let path else { return usageError("decode needs a FILE") }

        let trace: Trace
        do {
            trace = try Trace(path: path)
        } catch let e {
            error("pppbridge: \(e)")
            return CommandLineTool.Status.usage
        }
        var writer: PcapWriter?
        if let pcapPath {
            do {
                writer = try PcapWriter(path: pcapPath, linkType: linkType, masking: captureSecrets ? nil : SecretMasker())
            } catch let e {
                error("pppbridge: \(e)")
                return CommandLineTool.Status.usage
            }
        }
        defer { writer?.close() }

        let report = DecodeReport(trace: trace, showPassword: showPassword)
        report.lines.forEach(output)
        if let writer {
            do {
                for f in trace.frames {
                    try writer.write(packet: f.frame.uncompressedPacket, time: f.time, direction: f.direction)
                }
            } catch let e {
                error("pppbridge: \(e)")
                return CommandLineTool.Status.usage
            }
        }
        return CommandLineTool.Status.success
    }

    private func usageError(_ message: String) -> Int32 {
        error("pppbridge decode: \(message) (see `pppbridge decode --help`)")
        return CommandLineTool.Status.usage
    }
}

/// The text `decode` prints for a trace: one line per frame or note, then the counts.
public struct DecodeReport {
    public private(set) var lines: [String] = []
    /// Frames whose packet could not be read in full.
    public private(set) var malformed = 0

    public init(trace: Trace, showPassword: Bool = false) {
        let origin = trace.origin
        var entries: [(Int, Int, String)] = []
        for (order, f) in trace.frames.enumerated() {
            let text = FramePrinter.describe(f.frame, showPassword: showPassword)
            if text.error != nil { malformed += 1 }
            var prefix = "#\(f.number) " + String(format: "%.6f", f.time.interval(since: origin))
            if let d = f.direction { prefix += " " + d.rawValue }
            if !f.via.isEmpty { prefix += " " + f.via.joined(separator: "/") }
            entries.append((f.number, order, prefix + " [" + text.text + "]"))
        }
        for (order, n) in trace.notes.enumerated() {
            entries.append((n.number, trace.frames.count + order,
                            "#\(n.number) " + String(format: "%.6f", n.time.interval(since: origin)) + " " + n.text))
        }
        lines = entries.sorted { ($0.0, $0.1) < ($1.0, $1.1) }.map(\.2)
        lines += trace.problems.map { "problem " + $0 }
        lines += DecodeReport.summary(trace, malformed: malformed)
    }

    static func summary(_ t: Trace, malformed: Int) -> [String] {
        var out: [String] = []
        switch t.format {
        case let .pcap(linkType):
            let name = LinkType(rawValue: linkType)?.name ?? "?"
            out.append("summary: pcap link type \(linkType) (\(name)), \(t.records) records, \(t.frames.count) PPP frames, "
                + "\(t.notes.count) PPPoE discovery, \(t.recordsWithoutPPP) records without PPP")
            if t.recordsWithAdjustedTime > 0 {
                out.append("time stamps: \(t.recordsWithAdjustedTime) records with microseconds out of range, read normalised")
            }
            out.append("errors: \(malformed) malformed packets, \(t.problems.count) unreadable headers")
        case .pppdRecord:
            let sent = t.frames.filter { $0.direction == .sent }.count
            out.append("summary: pppd record, \(t.frames.count) frames (\(sent) sent, \(t.frames.count - sent) rcvd)")
            for (name, c) in [("sent", t.sentCounters), ("rcvd", t.receivedCounters)] {
                out.append("framing \(name): \(c.frames) frames, \(c.badFCS) bad FCS, \(c.aborted) aborted, \(c.runts) runts, "
                    + "\(c.tooLong) too long, \(c.badHeader) bad headers, \(c.emptyFrames) empty, \(c.discardedBytes) bytes outside frames")
            }
            var errors = "errors: \(malformed) malformed packets, \(t.sentCounters.droppedFrames + t.receivedCounters.droppedFrames) dropped frames"
            if let at = t.truncatedAt { errors += ", file ends inside the entry at offset \(at)" }
            out.append(errors)
        }
        return out
    }
}
