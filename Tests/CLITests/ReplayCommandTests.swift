import Foundation
@testable import PPPBridgeCLI
import Testing

/// `pppbridge replay` as a user runs it: the report, the exit status, and `--pcap` output that
/// tshark reads.
@Suite struct ReplayCommandTests {
    static var tshark: String? {
        ["/usr/bin/tshark", "/usr/local/bin/tshark"].first(where: FileManager.default.isExecutableFile)
    }

    @Test func aPlayableRecordReportsItsStatesAndExitsZero() throws {
        let c = Captured()
        #expect(c.run(["replay", try sharedTrace("pppd-record_pap.pppd")]) == 0, "\(c.out.joined(separator: "\n"))\n\(c.err)")
        let text = c.out.joined(separator: "\n")
        #expect(text.contains("session: the peer is sent, we play rcvd as the host"))
        #expect(text.contains("  reached  PAP authenticated \"vmpeer\""))
        #expect(text.contains("result: every recorded state reached"))
    }

    @Test func unplayableAndUnreadableFilesExitTwo() throws {
        let one = Captured()
        #expect(one.run(["replay", try sharedTrace("tcpdump_pppoes.pcap")]) == 2)
        #expect(one.out.contains { $0.contains("cannot be played: one-sided capture") })
        #expect(one.err.contains { $0.hasSuffix("no session in it can be played") })
        let missing = Captured()
        #expect(missing.run(["replay", "/nonexistent/capture.pcap"]) == 2)
        #expect(missing.err.first?.hasPrefix("pppbridge replay: /nonexistent/capture.pcap") == true, "\(missing.err)")
        let usage = Captured()
        #expect(usage.run(["replay"]) == 2)
        #expect(usage.run(["replay", "a", "b"]) == 2)
        #expect(usage.run(["replay", "--peer"]) == 2)
        let peer = Captured()
        #expect(peer.run(["replay", try sharedTrace("pppd-record_pap.pppd"), "--peer", "nobody"]) == 2)
        #expect(peer.out.contains { $0.contains("--peer nobody: this session's sides are sent and rcvd") }, "\(peer.out)")
    }

    @Test func theNakForeverFixtureExitsOne() throws {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<2 { url.deleteLastPathComponent() }
        let fixture = url.appendingPathComponent("ReplayTests/Fixtures/nak-forever.pppd").path
        let c = Captured()
        #expect(c.run(["replay", fixture]) == 1)
        let lines = c.out.joined(separator: "\n").split(separator: "\n")
        #expect(lines.contains { $0.hasPrefix("result: not reached: IPCP opened, local 10.0.2.2, peer 10.0.2.15; first divergence #14 ") }, "\(c.out.joined(separator: "\n"))")
    }

    /// The replayed session written with --pcap: every frame decodes in tshark, nothing
    /// malformed, and the PAP password is masked unless asked for.
    @Test(.enabled(if: ReplayCommandTests.tshark != nil || ProcessInfo.processInfo.environment["CI"] != nil, "tshark is not installed (Tools/install-deps.sh test installs it)"),
          arguments: ["pppd-record_pap.pppd", "pppoe_zeek_lcp_pap_ipcp_ipv6cp_echo.pcap", "pppoe_suricata_lcp_term_ccp_ipcp_reject.pcap"])
    func theReplayedSessionDecodesInTshark(_ name: String) throws {
        let tshark = try #require(ReplayCommandTests.tshark, "tshark is missing; CI installs it")
        let out = NSTemporaryDirectory() + "pppbridge-replay-" + UUID().uuidString + ".pcap"
        defer { try? FileManager.default.removeItem(atPath: out) }
        let c = Captured()
        #expect(c.run(["replay", try sharedTrace(name), "--pcap", out]) == 0, "\(c.out.joined(separator: "\n"))")
        let lines = c.out.joined(separator: "\n").split(separator: "\n").map(String.init)
        let sent = lines.compactMap { line -> Int? in
            guard line.hasPrefix("fed "), let r = line.range(of: ", sent ") else { return nil }
            return Int(line[r.upperBound...].prefix { $0.isNumber })
        }
        let fed = lines.compactMap { line -> Int? in
            guard line.hasPrefix("fed ") else { return nil }
            return Int(line.dropFirst(4).prefix { $0.isNumber })
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tshark)
        p.arguments = ["-r", out, "-T", "fields", "-e", "frame.number", "-e", "ppp.direction", "-e", "ppp.protocol", "-e", "_ws.malformed", "-e", "_ws.expert.severity", "-e", "pap.password"]
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let rows = String(decoding: data, as: UTF8.self).split(separator: "\n").map { $0.split(separator: "\t", omittingEmptySubsequences: false).map(String.init) }
        #expect(rows.count == sent.reduce(0, +) + fed.reduce(0, +), "frames in the pcap against the report's fed + sent")
        for row in rows where row.count >= 6 {
            #expect(row[3].isEmpty, "frame \(row[0]) is malformed in tshark")
            // Expert errors are severity 8388608 (0x800000); notes and chats are lower.
            #expect(!row[4].split(separator: ",").contains { (Int($0) ?? 0) >= 0x800000 }, "frame \(row[0]) has an expert error")
            #expect(row[5].isEmpty || !row[5].contains("secret") && !row[5].contains("cisco"), "frame \(row[0]) shows the PAP password \(row[5])")
        }
        #expect(Set(rows.compactMap { $0.count > 1 ? $0[1] : nil }) == ["0", "1"], "both directions")
    }
}
