import Capture
import Foundation
import Framing
import NetStack
import PPP
import Testing
import TestSupport

/// Every trace, written back out by our pcap writer, must decode in tshark with no malformed
/// packet and no expert error, and with the field values we decoded ourselves; tcpdump must
/// read it too. The two negative traces must show tshark the very faults the manifest names.
@Suite(.serialized) struct TsharkInteropTests {
    static let negative = ["tcpdump_truncated-aack.pcap", "tcpdump_ppp-invalid-lengths.pcap"]
    static let fields = ["frame.number", "ppp.direction", "ppp.protocol", "ppp.code", "ppp.identifier", "lcp.opt.magic_number",
                         "ipcp.opt.ip_address", "ipcp.opt.pri_dns_address", "pap.peer_id", "pap.password", "chap.name",
                         "ip.src", "ip.dst", "_ws.malformed", "_ws.expert.severity"]
    /// tshark's expert severities (epan/proto.h): PI_WARN and PI_ERROR.
    static let warning = 0x0060_0000, error = 0x0080_0000

    struct Row {
        var values: [String: String]
        /// The field's first occurrence: tshark lists nested ones too (the packet inside a
        /// Protocol-Reject, a PPP frame inside L2TP).
        subscript(_ f: String) -> String { values[f].flatMap { $0.split(separator: ",").first.map(String.init) } ?? "" }
        var severities: [Int] { (values["_ws.expert.severity"] ?? "").split(separator: ",").compactMap { Int($0) } }
    }

    func writeAndRead(_ trace: Trace, linkType: LinkType, in scratch: ScratchDirectory) throws -> (String, [Row]) {
        let out = scratch.path + "/out-\(linkType.rawValue).pcap"
        let writer = try PcapWriter(path: out, linkType: linkType, masking: nil)
        for f in trace.frames { try writer.write(packet: f.frame.uncompressedPacket, time: f.time, direction: f.direction) }
        writer.close()
        let tshark = try #require(ExternalTool.find("tshark"))
        let r = try ExternalTool.run(tshark, ["-r", out, "-T", "fields", "-E", "separator=|", "-E", "occurrence=a"]
            + TsharkInteropTests.fields.flatMap { ["-e", $0] })
        #expect(r.status == 0, "tshark: \(r.error)")
        let rows = r.output.split(separator: "\n").map { line -> Row in
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
            return Row(values: Dictionary(uniqueKeysWithValues: zip(TsharkInteropTests.fields, cells)))
        }
        return (out, rows)
    }

    @Test(.enabled(if: ExternalTool.present("tshark"), "tshark is not installed (Tools/install-deps.sh test installs it)"), arguments: Traces.all)
    func tsharkDecodesOurPcap(name: String) throws {
        let trace = try Traces.load(name)
        let scratch = try ScratchDirectory()
        let usesVJ = trace.frames.contains { $0.frame.protocol == ProtocolNumber.vjCompressedTCP || $0.frame.protocol == ProtocolNumber.vjUncompressedTCP }
        for linkType in [LinkType.ppp, .pppWithDirection] {
            let (_, rows) = try writeAndRead(trace, linkType: linkType, in: scratch)
            #expect(rows.count == trace.frames.count)
            for (row, f) in zip(rows, trace.frames) {
                let where_ = "\(name) frame #\(f.number) (\(row["frame.number"]))"
                #expect(row["ppp.protocol"] == "0x" + PppdHex.string(BigEndian.bytes(f.frame.protocol.rawValue)), "\(where_)")
                if linkType == .pppWithDirection, let d = f.direction {
                    // tshark shows the capturing side's sent frames as DTE → DCE (0), as for pppd logs.
                    #expect(row["ppp.direction"] == (d == .sent ? "0" : "1"), "\(where_)")
                }
                if !TsharkInteropTests.negative.contains(name) {
                    #expect(row["_ws.malformed"].isEmpty, "\(where_) is malformed in tshark")
                    #expect(!row.severities.contains { $0 >= TsharkInteropTests.error }, "\(where_) has an expert error")
                    // tshark's VJ decoder takes the TCP checksum for payload (MANIFEST), which throws its
                    // TCP sequence analysis off for the whole session; without VJ, no warnings at all.
                    if !usesVJ { #expect(!row.severities.contains { $0 >= TsharkInteropTests.warning }, "\(where_) has an expert warning") }
                }
                try compareFields(row, f.frame, where_)
            }
        }
        if name == "tcpdump_truncated-aack.pcap" {
            let (_, rows) = try writeAndRead(trace, linkType: .ppp, in: scratch)
            #expect(rows.first.map { !$0["_ws.malformed"].isEmpty } == true)
        }
        if name == "tcpdump_ppp-invalid-lengths.pcap" {
            let (_, rows) = try writeAndRead(trace, linkType: .ppp, in: scratch)
            #expect(rows.first?.severities.filter { $0 == TsharkInteropTests.warning }.count == 2)
        }
    }

    /// The values tshark shows are the ones our parsers read.
    func compareFields(_ row: Row, _ frame: PPPFrame, _ where_: String) throws {
        // tshark read `field` from a packet it found whole (not malformed, no expert warning):
        // our parser must read that packet too, or a regression in it would pass unseen.
        func tsharkRead(_ field: String) -> Bool {
            !row[field].isEmpty && row["_ws.malformed"].isEmpty && !row.severities.contains { $0 >= TsharkInteropTests.warning }
        }
        func rejected(_ what: String, _ field: String) {
            #expect(!tsharkRead(field), "\(where_): tshark reads \(field) \(row[field]) but our parser rejects the \(what)")
        }
        switch frame.protocol {
        case ProtocolNumber.lcp, ProtocolNumber.ipcp:
            guard let packet = try? ControlPacket(parsing: frame.information) else { return rejected("control packet", "ppp.code") }
            #expect(row["ppp.code"] == String(packet.code.rawValue), "\(where_)")
            #expect(row["ppp.identifier"] == String(packet.identifier), "\(where_)")
            guard packet.code.carriesOptions else { return }
            guard let options = try? ConfigurationOption.parseList(packet.data) else {
                return rejected("options", "ppp.code")
            }
            if frame.protocol == ProtocolNumber.lcp {
                let magics = options.compactMap { o -> String? in
                    if case let .magicNumber(m) = LCPOption(o) { return "0x" + String(m, radix: 16).leftPadded(8) }
                    return nil
                }
                #expect(row["lcp.opt.magic_number"] == (magics.first ?? ""), "\(where_)")
            } else {
                let ipcp = options.map(IPCPOption.init)
                let addresses = ipcp.compactMap { o -> String? in if case let .ipAddress(a) = o { return a.description }; return nil }
                let dns = ipcp.compactMap { o -> String? in if case let .primaryDNS(a) = o { return a.description }; return nil }
                #expect(row["ipcp.opt.ip_address"] == (addresses.first ?? ""), "\(where_)")
                #expect(row["ipcp.opt.pri_dns_address"] == (dns.first ?? ""), "\(where_)")
            }
        case ProtocolNumber.pap:
            guard let packet = try? ControlPacket(parsing: frame.information), let pap = try? PAPPacket(packet) else {
                return rejected("PAP packet", "ppp.code")
            }
            guard case let .authenticateRequest(_, peer, password) = pap else { return }
            #expect(row["pap.peer_id"] == String(decoding: peer, as: UTF8.self), "\(where_)")
            #expect(row["pap.password"] == String(decoding: password, as: UTF8.self), "\(where_)")
        case ProtocolNumber.chap:
            guard let packet = try? ControlPacket(parsing: frame.information), let chap = try? CHAPPacket(packet) else {
                return rejected("CHAP packet", "ppp.code")
            }
            switch chap {
            case let .challenge(_, _, name), let .response(_, _, name):
                #expect(row["chap.name"] == String(decoding: name, as: UTF8.self), "\(where_)")
            default: break
            }
        case ProtocolNumber.ipv4:
            guard let ip = frame.information.withUnsafeBytes({ try? IPv4Header(parsing: $0) }) else { return rejected("IPv4 header", "ip.src") }
            #expect(row["ip.src"] == ip.source.description, "\(where_)")
            #expect(row["ip.dst"] == ip.destination.description, "\(where_)")
        default:
            break
        }
    }

    @Test(.enabled(if: ExternalTool.present("tcpdump"), "tcpdump is not installed (Tools/install-deps.sh test installs it)"), arguments: Traces.all)
    func tcpdumpReadsOurPcap(name: String) throws {
        let trace = try Traces.load(name)
        let scratch = try ScratchDirectory()
        let out = scratch.path + "/out.pcap"
        let writer = try PcapWriter(path: out)
        for f in trace.frames { try writer.write(packet: f.frame.uncompressedPacket, time: f.time, direction: f.direction) }
        writer.close()
        let r = try ExternalTool.run(try #require(ExternalTool.find("tcpdump")), ["-n", "-r", out])
        #expect(r.status == 0, "tcpdump: \(r.error)")
        // One line per packet starts with its time stamp; payload dumps follow on other lines.
        #expect(r.output.split(separator: "\n").filter { $0.first?.isNumber == true }.count == trace.frames.count)
    }
}

extension String {
    func leftPadded(_ width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
