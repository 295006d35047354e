import Capture
import Foundation
@testable import PPPBridgeCLI
@testable import Service
import Testing
import TestSupport

/// Runs the command line in-process and collects what it prints.
final class Captured: @unchecked Sendable {
    var out: [String] = []
    var err: [String] = []

    func run(_ args: [String]) -> Int32 {
        CommandLineTool(standardOutput: { self.out.append($0) }, standardError: { self.err.append($0) }).run(args)
    }
}

func sharedTrace(_ name: String) throws -> String {
    try Traces.path(name)
}

@Suite struct CommandLineTests {
    @Test func helpExplainsItself() {
        let c = Captured()
        #expect(c.run(["--help"]) == 0)
        #expect(c.out.joined().contains("decode FILE"))
        let d = Captured()
        #expect(d.run(["decode", "--help"]) == 0)
        #expect(d.out.joined().contains("--pcap-linktype"))
        let e = Captured()
        #expect(e.run(["help", "decode"]) == 0)
        #expect(e.out == d.out)
    }

    @Test func usageErrorsExitTwo() {
        for args in [[], ["frobnicate"], ["decode"], ["decode", "--bogus"], ["decode", "a", "b"], ["decode", "x", "--pcap-linktype", "ethernet"]] {
            let c = Captured()
            #expect(c.run(args) == 2, "\(args)")
            #expect(c.err.count == 1, "\(args): one line of error")
        }
    }

    @Test func theLinePollIntervalIsBounded() {
        for (value, message) in [("20001", "--line-poll-interval takes 0 to 20000 microseconds"),
                                 ("-1", "--line-poll-interval takes a non-negative number")] {
            let c = Captured()
            #expect(c.run(["run", "--pty", "--line-poll-interval", value]) == 2, "\(value)")
            #expect(c.err.count == 1 && c.err[0].contains(message), "\(value): \(c.err)")
        }
        let help = Captured()
        #expect(help.run(["run", "--help"]) == 0)
        #expect(help.out.joined().contains("--line-poll-interval US"))
    }

    @Test func theReceiveWindowIsBoundedAndReachesTheStack() {
        for (value, message) in [("2919", "--tcp-receive-window takes 2920 to 1048576 bytes"),
                                 ("1048577", "--tcp-receive-window takes 2920 to 1048576 bytes"),
                                 ("-5", "--tcp-receive-window takes a non-negative number")] {
            let c = Captured()
            #expect(c.run(["run", "--pty", "--tcp-receive-window", value]) == 2, "\(value)")
            #expect(c.err.count == 1 && c.err[0].contains(message), "\(value): \(c.err)")
        }
        var o = RunOptions()
        var it = ArgumentCursor(["12288"])
        #expect(o.take("--tcp-receive-window", from: &it) { Issue.record("\($0)") })
        #expect(o.tcp.receiveBufferSize == 12288)
        #expect(o.channelConfiguration.tcp.receiveBufferSize == 12288)
        #expect(o.channelConfiguration.tcp.delayedAck == .milliseconds(40))
        var noDelay = ArgumentCursor([])
        #expect(o.take("--tcp-no-delayed-ack", from: &noDelay) { Issue.record("\($0)") })
        #expect(o.channelConfiguration.tcp.delayedAck == nil)
        let help = Captured()
        #expect(help.run(["run", "--help"]) == 0)
        #expect(help.out.joined().contains("--tcp-receive-window BYTES"))
        #expect(help.out.joined().contains("--tcp-no-delayed-ack"))
    }

    @Test func unreadableFilesGiveOneLineAndExitTwo() throws {
        let dir = try TemporaryDirectory.make("cli")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let garbage = dir + "/garbage.bin"
        #expect(FileManager.default.createFile(atPath: garbage, contents: Data("hello, not a capture".utf8)))
        let truncatedPcap = dir + "/short.pcap"
        #expect(FileManager.default.createFile(atPath: truncatedPcap, contents: Data([0xD4, 0xC3, 0xB2, 0xA1, 0x02, 0x00])))
        let badRecord = dir + "/bad.pppd"
        #expect(FileManager.default.createFile(atPath: badRecord, contents: Data([0x07, 0, 0, 0, 1, 0x42])))
        for path in [dir + "/does-not-exist", garbage, truncatedPcap, badRecord, dir] {
            let c = Captured()
            #expect(c.run(["decode", path]) == 2, "\(path)")
            #expect(c.err.count == 1 && c.err[0].hasPrefix("pppbridge: "), "\(path): \(c.err)")
            #expect(!c.err[0].contains("\n"))
        }
    }

    @Test func decodesARecordFileInPppdStyle() throws {
        let c = Captured()
        #expect(c.run(["decode", try sharedTrace("pppd-record_default.pppd")]) == 0)
        // Times count from the record's start stamp: pppdump shows "time 0.4s" before the first frame.
        #expect(c.out.first == "#1 0.400000 sent [LCP ConfReq id=0x1 <asyncmap 0x0> <magic 0xcf67e7e> <pcomp> <accomp>]")
        #expect(c.out.contains("#11 0.400000 sent [LCP ProtRej id=0x2 80 fd 01 01 00 04]"))
        #expect(c.out.contains { $0.hasPrefix("#98 ") && $0.hasSuffix("sent [LCP TermReq id=0x3 \"User request\"]") })
        #expect(c.out.contains("summary: pppd record, 99 frames (50 sent, 49 rcvd)"))
        #expect(c.out.last == "errors: 0 malformed packets, 0 dropped frames")
    }

    @Test func negativeTracesAreCounted() throws {
        let c = Captured()
        #expect(c.run(["decode", try sharedTrace("tcpdump_truncated-aack.pcap")]) == 0)
        #expect(c.out.last == "errors: 1 malformed packets, 0 unreadable headers")
        let d = Captured()
        #expect(d.run(["decode", try sharedTrace("tcpdump_ppp-invalid-lengths.pcap")]) == 0)
        #expect(d.out.last == "errors: 1 malformed packets, 0 unreadable headers")
    }

    @Test func passwordsAreHiddenUnlessAsked() throws {
        let path = try sharedTrace("pppd-record_pap.pppd")
        let hidden = Captured()
        _ = hidden.run(["decode", path])
        #expect(hidden.out.contains { $0.contains("user=\"vmpeer\" password=<hidden>") })
        #expect(!hidden.out.joined().contains("vmpeer-secret"))
        let shown = Captured()
        _ = shown.run(["decode", path, "--show-password"])
        #expect(shown.out.contains { $0.contains("password=\"vmpeer-secret\"") })
    }

    @Test func writesAPcapThatReadsBackTheSame() throws {
        let dir = try TemporaryDirectory.make("cli")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let source = try sharedTrace("pppd-record_escaped.pppd")
        for (flag, linkType) in [("ppp", Int32(9)), ("ppp-with-dir", Int32(204))] {
            let out = dir + "/\(flag).pcap"
            let c = Captured()
            #expect(c.run(["decode", source, "--pcap", out, "--pcap-linktype", flag]) == 0)
            let original = try Trace(path: source)
            let reread = try Trace(path: out)
            #expect(reread.format == .pcap(linkType: linkType))
            #expect(reread.frames.map(\.frame.protocol) == original.frames.map(\.frame.protocol))
            #expect(reread.frames.map(\.frame.information) == original.frames.map(\.frame.information))
            #expect(reread.frames.map(\.time) == original.frames.map(\.time))
            if linkType == 204 { #expect(reread.frames.map(\.direction) == original.frames.map(\.direction)) }
            // Decoding the pcap prints the same frames (numbered by record).
            let again = Captured()
            #expect(again.run(["decode", out]) == 0)
            let strip: (String) -> String = { String($0[$0.firstIndex(of: "[")!...]) }
            #expect(again.out.filter { $0.hasPrefix("#") }.map(strip) == c.out.filter { $0.hasPrefix("#") }.map(strip))
        }
    }
}

@Suite struct PaymentCommandLineTests {
    @Test func amountsAreTakenExactlyOrRefused() {
        let cases: [([String], String)] = [
            (["pay", "--amount", "10.505", "--currency", "EUR", "--gateway", "127.0.0.1:9"], "is not an amount in EUR"),
            (["pay", "--amount", "10.5", "--currency", "JPY", "--gateway", "127.0.0.1:9"], "is not an amount in JPY"),
            (["pay", "--amount", "1e3", "--currency", "EUR", "--gateway", "127.0.0.1:9"], "is not an amount in EUR"),
            (["pay", "--amount", "-1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9"], "is not an amount in EUR"),
            (["pay", "--amount", "1.00", "--currency", "XYZ", "--gateway", "127.0.0.1:9"], "unknown currency XYZ"),
            (["pay", "--amount", "1.00", "--currency", "EUR"], "--gateway ADDR:PORT is required"),
            (["pay", "--amount", "1.00", "--currency", "EUR", "--gateway", "localhost:9"], "IPv4 address"),
            (["pay", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9", "--transaction-id", "12"], "4 digits"),
            (["refund", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9"], "--auth CODE is required"),
            (["refund", "--auth", "000001", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9", "--signature", "x"], "unknown option --signature"),
            (["pay", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9", "--environment", "prod"], "des, int, ccal or real"),
            (["pay", "--currency", "EUR", "--gateway", "127.0.0.1:9", "--amount"], "--amount needs a value"),
            (["refund", "--auth", "12", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9"], "6-digit authorisation code"),
            (["pay", "--amount", "1.00", "--currency", "EUR", "--gateway", "127.0.0.1:9", "--signature", "/nonexistent.bmp"], "cannot read"),
            (["reader"], "expected discover, connect, reboot or update"),
            (["reader", "connect"], "--gateway ADDR:PORT is required"),
            (["reader", "discover", "--allow", "not-a-uuid"], "--allow takes a UUID"),
            (["terminal"], "--gateway ADDR:PORT is required"),
            (["terminal", "--gateway", "127.0.0.1:9", "--card", "4111111111111112"], "valid check digit"),
            (["control", "/nonexistent.control"], "expected PATH and a JSON object"),
        ]
        for (args, message) in cases {
            let c = Captured()
            #expect(c.run(args) == 2, "\(args)")
            #expect(c.err.joined().contains(message), "\(args): \(c.err)")
        }
    }

    @Test func paymentCommandsExplainThemselves() {
        for command in ["pay", "refund", "reader", "gateway", "terminal", "control"] {
            let c = Captured()
            #expect(c.run(["help", command]) == 0)
            #expect(c.out.joined().hasPrefix("usage: pppbridge"), "\(command)")
        }
        let c = Captured()
        #expect(c.run(["--help"]) == 0)
        #expect(c.out.joined().contains("pay --amount 10.50 --currency EUR"))
    }

    @Test func discoveringWithoutLinesIsRadioOff() {
        let c = Captured()
        #expect(c.run(["reader", "discover", "--pattern", "/nonexistent-pppbridge-lines/*", "--timeout", "1"]) == 3)
        #expect(c.err.joined().contains("1001 bluetoothDisabled"))
    }
}
