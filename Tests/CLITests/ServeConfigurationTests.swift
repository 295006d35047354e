import Channel
import Foundation
import Payment
import Testing
@testable import PPPBridgeCLI
@testable import Service

/// `serve`'s configuration files: `run`'s parser on pppd-style lines, with file and line in
/// every message; names, sizes and the options that are `run`'s alone.
@Suite struct ServeConfigurationTests {
    func parse(_ text: String, name: String = "t1") -> Result<TerminalFile, TerminalFile.FileErrors> {
        TerminalFile.parse(Array(text.utf8), name: name, path: "/etc/t/\(name).conf", defaults: TerminalFile.Defaults(), environment: [:])
    }

    @Test func aFileIsRunsOptionsWithoutDashes() throws {
        let file = try parse("""
            # the shop's first terminal
            device /dev/ttyACM0
            bridge host:5000   # the terminal's payment port
            bridge terminal:6000
            keepalive 60,10,5
            lcp-echo-interval 5
            novj
            holdoff 2
            """).get()
        #expect(file.device == "/dev/ttyACM0")
        #expect(file.options.bridges.map(\.description) == ["host:5000", "terminal:6000"])
        #expect(file.options.keepAlive?.idleSeconds == 60 && file.options.keepAlive?.probeCount == 5)
        #expect(file.options.echo.interval == .seconds(5))
        #expect(!file.options.vj)
        #expect(file.holdoff == 2 && file.maxfail == 10)
        #expect(file.options.channelConfiguration.line == .device("/dev/ttyACM0"))
    }

    @Test func everyMessageSaysTheFileAndLine() {
        guard case let .failure(e) = parse("device /dev/ttyACM0\n\nmru 50\nbridge host:0\nfrobnicate\npty\nholdoff -1\nmru 1500 1600\n") else {
            Issue.record("accepted")
            return
        }
        #expect(e.messages == [
            "/etc/t/t1.conf:3: --mru must be 128–16384",
            "/etc/t/t1.conf:4: --bridge takes host:PORT, local:PORT or terminal:PORT, not 'host:0'",
            "/etc/t/t1.conf:5: unknown option --frobnicate (see `pppbridge run --help`)",
            "/etc/t/t1.conf:6: pty: not for serve: serve attaches to devices (give `device PATH`)",
            "/etc/t/t1.conf:7: holdoff takes a number of seconds, 0–86400",
            "/etc/t/t1.conf:8: mru: unexpected '1600' after its value",
        ])
    }

    @Test func checksOverTheWholeFileNameTheFile() {
        guard case let .failure(e) = parse("bridge host:5000\n") else { Issue.record("accepted"); return }
        #expect(e.messages == ["/etc/t/t1.conf: no `device PATH` line"])
        let thirteen = (1...13).map { "bridge host:\(5000 + $0)" }.joined(separator: "\n")
        guard case let .failure(f) = parse("device /dev/ttyS0\n" + thirteen) else { Issue.record("accepted"); return }
        #expect(f.messages == ["/etc/t/t1.conf: at most 12 bridges"])
    }

    @Test func controlCharactersInAFileArePrintedEscaped() {
        guard case let .failure(e) = parse("device /dev/ttyS0\nmru \u{1B}[2J\n") else { Issue.record("accepted"); return }
        #expect(e.messages == [#"/etc/t/t1.conf:2: --mru takes a non-negative number, not '\x1B[2J'"#])
    }

    /// A FIFO named by a file option would hold the loop in open(2) or read(2): refused unread.
    @Test func fileOptionsTakeOnlyRegularFiles() {
        let fifo = NSTemporaryDirectory() + "pppbridge-fifo-\(UUID().uuidString.prefix(8))"
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { unlink(fifo) }
        for option in ["password-file", "peer-file", "socks-user-file", "pcap", "record"] {
            guard case let .failure(e) = parse("device /dev/ttyS0\nuser u\n\(option) \(fifo)\n") else {
                Issue.record("\(option) took a FIFO")
                continue
            }
            #expect(e.messages.first == "/etc/t/t1.conf:3: \(option): \(fifo) is not a regular file", "\(e.messages)")
        }
    }

    @Test func namesAreFileNamesEndingInConf() {
        #expect(TerminalFile.terminalName(fileName: "lane-1.conf") == "lane-1")
        #expect(TerminalFile.terminalName(fileName: "Desk_5000.v2.conf") == "Desk_5000.v2")
        for bad in [".hidden.conf", "lane 1.conf", "lane.conf.swp", "lane\"x.conf", ".conf", "caisse-é.conf", String(repeating: "a", count: 65) + ".conf"] {
            #expect(TerminalFile.terminalName(fileName: bad) == nil, "\(bad)")
        }
    }

    @Test func ctlWordsBecomeRequests() {
        #expect(CtlCommand.request(["list"])?.line == #"{"cmd":"list"}"#)
        #expect(CtlCommand.request(["add-bridge", "t1", "host:5000"])?.line == #"{"bridge":"host:5000","cmd":"add-bridge","terminal":"t1"}"#)
        #expect(CtlCommand.request(["set-keepalive", "t1", "60,10,5"])?.line == #"{"cmd":"set-keepalive","count":5,"idle":60,"interval":10,"terminal":"t1"}"#)
        #expect(CtlCommand.request(["events"])?.line == #"{"cmd":"subscribe"}"#)
        #expect(CtlCommand.request(["add-bridge", "t1", "host:+5000"]) == nil)
        // Every request is a value the service's own decoder reads back as itself.
        for words in [["list"], ["status", "t1"], ["add-bridge", "t1", "local:7"], ["remove-bridge", "t1", "terminal:9"], ["set-keepalive", "t1", "1,2,3"],
                      ["open", "t1"], ["close", "t1"], ["reload"], ["events"]] {
            let r = CtlCommand.request(words)
            #expect(r != nil && (try? ControlRequest.decode(Array(r!.line.utf8)).get()) == r, "\(words)")
        }
        #expect(CtlCommand.request(["status"]) == nil)
        #expect(CtlCommand.request(["set-keepalive", "t1", "60,10"]) == nil)
    }

    @Test func metricLabelValuesAreEscaped() {
        #expect(MetricsText.escape(#"a"b\c"# + "\nd") == #"a\"b\\c\nd"#)
    }

    @Test func bridgeSpecsParse() {
        #expect(BridgeSpec(parsing: "local:7")?.description == "local:7")
        for bad in ["local:0", "local:", "sideways:5", "host:65536", "host:5:6", ""] { #expect(BridgeSpec(parsing: bad) == nil, "\(bad)") }
    }
}

/// journald's stream: priorities only on the stream JOURNAL_STREAM names.
@Suite struct JournalStreamTests {
    @Test func prioritiesOnlyOnTheJournalsOwnStream() throws {
        let path = NSTemporaryDirectory() + "pppbridge-journal-\(UUID().uuidString.prefix(8))"
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let fd = open(path, O_WRONLY)
        defer { close(fd) }
        var st = stat()
        #expect(fstat(fd, &st) == 0)
        #expect(JournalStream.isJournal(fd, environment: ["JOURNAL_STREAM": "\(st.st_dev):\(st.st_ino)"]))
        #expect(!JournalStream.isJournal(fd, environment: ["JOURNAL_STREAM": "\(st.st_dev):\(st.st_ino + 1)"]))
        #expect(!JournalStream.isJournal(fd, environment: [:]))
        #expect(!JournalStream.isJournal(fd, environment: ["JOURNAL_STREAM": "junk"]))
        #expect(JournalStream.prefixed("serve: t1: open", standardError: false) == "<6>serve: t1: open")
        #expect(JournalStream.prefixed("pppbridge serve: a.conf:2: --mru must be 128–16384", standardError: true).hasPrefix("<3>"))
        #expect(JournalStream.prefixed("pppbridge run: warning: x", standardError: true).hasPrefix("<4>"))
    }
}
