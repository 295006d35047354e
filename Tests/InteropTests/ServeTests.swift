import ChannelTestSupport
import Foundation
import Glibc
import NetStack
import Testing
import TestSupport

/// `pppbridge serve` as a service manager runs it: terminals (our stack in the terminal role,
/// each its own `pppbridge run --pty` process) picked up from configuration files, driven with
/// `pppbridge ctl`, watched through metrics (checked by promtool) and the notify socket (played
/// here as systemd would).
@Suite(.serialized, .timeLimit(.minutes(10))) struct ServeTests {
    /// systemd's side of NOTIFY_SOCKET: a datagram socket that collects what the service says.
    final class NotifySocket {
        let path: String
        let fd: Int32
        private(set) var messages: [String] = []

        init(path: String) throws {
            self.path = path
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var a = sockaddr_un()
            a.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &a.sun_path) { p in
                for (i, b) in path.utf8.enumerated() { p[i] = b }
            }
            let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
            guard r == 0 else { throw InteropError("bind \(path): \(String(cString: strerror(errno)))") }
        }

        deinit { close(fd) }

        /// Everything received so far, each datagram one entry.
        func received() -> [String] {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard n > 0 else { break }
                messages.append(String(decoding: buffer[..<n], as: UTF8.self))
            }
            return messages
        }
    }

    /// A terminal: `pppbridge run --pty --link PATH --role terminal --services echo:PORT`.
    static func terminal(_ link: String, echo port: UInt16, log: String) throws -> ChildProcess {
        try ChildProcess(BridgeProcess.binary, ["run", "--pty", "--link", link, "--role", "terminal", "--services", "echo:\(port)",
                                                "--lcp-echo-interval", "1", "--lcp-echo-failure", "3"], output: log)
    }

    static func ctl(_ control: String, _ words: [String]) async throws -> (status: Int32, reply: [String: Any]) {
        let r = try await runCommand(BridgeProcess.binary, ["ctl", "--control", control] + words, timeout: 20)
        let line = r.output.split(separator: "\n").first.map(String.init) ?? ""
        let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? ["unparsed": r.output]
        return (r.status, object)
    }

    static func states(_ reply: [String: Any]) -> [String: String] {
        var states: [String: String] = [:]
        for t in reply["terminals"] as? [[String: Any]] ?? [] {
            if let name = t["name"] as? String { states[name] = t["state"] as? String }
        }
        return states
    }

    static func echoes(_ port: UInt16) async -> Bool {
        let payload = Host.random(20_000, seed: UInt64(port))
        guard let r = await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), payload) else { return false }
        return r.clean && r.bytes == payload
    }

    /// Echoes through `port` within 10 s (a bridge added as the link opens may take a moment).
    static func eventuallyEchoes(_ port: UInt16) async -> Bool {
        await eventually(within: .seconds(10), every: .milliseconds(200)) { await echoes(port) }
    }

    /// A private directory for one test, with `conf` and `lines` in it.
    static func makeDirectories() throws -> (directory: String, conf: String, lines: String) {
        let directory = try TemporaryDirectory.make("serve")
        let conf = directory + "/conf", lines = directory + "/lines"
        for d in [conf, lines] { try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true) }
        return (directory, conf, lines)
    }

    static func refuses(_ port: UInt16) -> Bool {
        guard case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), timeout: 5) else { return true }
        close(fd)
        return false
    }

    @Test func terminalsFromFilesDrivenThroughTheControlSocket() async throws {
        let (directory, conf, lines) = try Self.makeDirectories()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let control = directory + "/control"
        let notify = try NotifySocket(path: directory + "/notify")

        var children: [ChildProcess] = []
        defer { for c in children { c.reap() } }
        let ports = (0..<4).map { _ in Host.freePort() }
        for n in 1...2 { children.append(try Self.terminal(lines + "/t\(n)", echo: ports[n], log: directory + "/t\(n).log")) }

        try "device \(lines)/t1\nbridge local:\(ports[1])   # the terminal's echo\nlcp-echo-interval 1\nlcp-echo-failure 3\nholdoff 1\n"
            .write(toFile: conf + "/t1.conf", atomically: true, encoding: .utf8)
        try "# the second terminal\ndevice \(lines)/t2\n".write(toFile: conf + "/t2.conf", atomically: true, encoding: .utf8)
        try "device \(lines)/t9\nmru 50\n".write(toFile: conf + "/bad.conf", atomically: true, encoding: .utf8)
        let metricsPort = Host.freePort()
        let serveLog = directory + "/serve.log"
        let serve = try ChildProcess(BridgeProcess.binary, ["serve", "--config", conf, "--control", control, "--metrics", "127.0.0.1:\(metricsPort)",
                                                            "--holdoff", "1"],
                                     output: serveLog, environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"])
        children.append(serve)
        var serveOutput: String { String(decoding: FileManager.default.contents(atPath: serveLog) ?? Data(), as: UTF8.self) }

        // Ready once the control socket listens and the files are read; then its status and
        // the watchdog's pings (every 500 ms for 1 s). The socket's queue holds only a few
        // datagrams (net.unix.max_dgram_qlen), so the test reads it as it goes, as systemd does.
        #expect(await eventually(10) { notify.received().contains { $0.contains("READY=1") } }, "\(notify.messages)")
        #expect(FileManager.default.fileExists(atPath: control))
        var st = stat()
        #expect(lstat(control, &st) == 0 && st.st_mode & 0o777 == 0o660)
        #expect(await eventually(10) { notify.received().filter { $0 == "WATCHDOG=1" }.count >= 3 }, "\(notify.messages)")
        #expect(await eventually(20) { notify.received().contains("STATUS=2 of 2 terminals up") }, "\(notify.messages)")
        // The bad file is reported with its line, the others run.
        #expect(serveOutput.contains("\(conf)/bad.conf:2: --mru must be 128–16384"), "\(serveOutput)")

        // Both open, with the four addresses.
        #expect(await eventually(20) { serveOutput.components(separatedBy: ": open, ").count >= 3 }, "\(serveOutput)")
        let list = try await Self.ctl(control, ["list"])
        #expect(list.status == 0 && Self.states(list.reply) == ["t1": "open", "t2": "open"], "\(list.reply)")
        let t1 = (list.reply["terminals"] as? [[String: Any]])?.first { $0["name"] as? String == "t1" }
        #expect(t1?["ip"] as? String == "192.168.53.1" && t1?["terminal_ip"] as? String == "192.168.53.2"
            && t1?["submask"] as? String == "255.255.255.255" && t1?["dns"] as? String == "192.168.53.1", "\(String(describing: t1))")

        // The file's bridge carries the echo; one added through the control socket does at once,
        // the same again is -2, removed its port refuses.
        #expect(await Self.eventuallyEchoes(ports[1]))
        let added = try await Self.ctl(control, ["add-bridge", "t2", "local:\(ports[2])"])
        #expect(added.status == 0 && added.reply["ok"] as? Bool == true, "\(added.reply)")
        #expect(await Self.echoes(ports[2]))
        let again = try await Self.ctl(control, ["add-bridge", "t2", "local:\(ports[2])"])
        #expect(again.status == 1 && again.reply["code"] as? Int == -2, "\(again.reply)")
        let removed = try await Self.ctl(control, ["remove-bridge", "t2", "local:\(ports[2])"])
        #expect(removed.status == 0, "\(removed.reply)")
        #expect(Self.refuses(ports[2]))
        let status = try await Self.ctl(control, ["status", "t2"])
        let counters = status.reply["terminal"] as? [String: Any]
        #expect((counters?["line_bytes_in"] as? Int ?? 0) > 0 && counters?["state"] as? String == "open", "\(status.reply)")

        // Metrics: promtool passes them clean; two terminals up.
        let metrics = try await runCommand("/usr/bin/curl", ["-s", "--max-time", "10", "http://127.0.0.1:\(metricsPort)/metrics"], timeout: 20)
        #expect(metrics.status == 0 && metrics.output.contains("\npppbridge_terminals_up 2\n"), "\(metrics.output)")
        let metricsFile = directory + "/metrics.txt"
        try metrics.output.write(toFile: metricsFile, atomically: true, encoding: .utf8)
        let check = try await runCommand("/bin/sh", ["-c", "promtool check metrics < '\(metricsFile)'"], timeout: 30)
        #expect(check.status == 0 && check.output.isEmpty, "promtool: \(check.output)")
        // A request that never ends its header is answered and let go at 8 KiB; only GET is served.
        for (request, status) in [(String(repeating: "X", count: 9000), "431"), ("POST /metrics HTTP/1.0\r\n\r\n", "405"),
                                  ("GET /other HTTP/1.0\r\n\r\n", "404")] {
            guard case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), metricsPort), timeout: 5) else {
                Issue.record("metrics refused a connection")
                continue
            }
            defer { close(fd) }
            Host.setTimeout(fd, seconds: 10)
            _ = Host.sendAll(fd, Array(request.utf8))
            let answer = String(decoding: Host.readAll(fd).bytes, as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 \(status) "), "\(request.prefix(20)): \(answer.prefix(80))")
        }

        // Events: a terminal's process killed is a line hang-up within the echo timeout; started
        // again on the same path it opens again, serve untouched.
        let eventsLog = directory + "/events.log"
        let events = try ChildProcess(BridgeProcess.binary, ["ctl", "--control", control, "events"], output: eventsLog)
        children.append(events)
        var eventsText: String { String(decoding: FileManager.default.contents(atPath: eventsLog) ?? Data(), as: UTF8.self) }
        #expect(await eventually(10) { eventsText.contains(#""ok":true"#) })
        let killedAt = Date()
        kill(children[0].pid, SIGKILL)
        _ = children[0].waitBlocking(5)
        #expect(await eventually(10) { eventsText.contains(#""event":"closed","reason":"line_hang_up","terminal":"t1""#) }, "\(eventsText)")
        #expect(Date().timeIntervalSince(killedAt) < 5, "hang-up seen after \(Date().timeIntervalSince(killedAt)) s")
        children.append(try Self.terminal(lines + "/t1", echo: ports[1], log: directory + "/t1-again.log"))
        #expect(await eventually(20) { eventsText.components(separatedBy: #""event":"opened""#).count >= 2 && eventsText.contains(#""terminal":"t1","terminal_ip""#) }, "\(eventsText)")
        #expect(await Self.eventuallyEchoes(ports[1]))
        #expect(eventsText.split(separator: "\n").contains { $0.contains(#""bridge":"local:\#(ports[1])""#) && $0.contains(#""event":"connection-opened""#)
            && $0.contains(#""destination":"192.168.53.2:\#(ports[1])""#) && $0.contains(#""terminal":"t1""#) }, "\(eventsText)")

        // A file added opens its terminal once its device appears; one removed closes its own.
        try "device \(lines)/t3\n".write(toFile: conf + "/t3.conf", atomically: true, encoding: .utf8)
        #expect(await eventually(10) { eventsText.contains(#""device":"\#(lines)/t3","event":"waiting","terminal":"t3""#) }, "\(eventsText)")
        children.append(try Self.terminal(lines + "/t3", echo: ports[3], log: directory + "/t3.log"))
        #expect(await eventually(20) { eventsText.contains(#""terminal":"t3","terminal_ip""#) }, "\(eventsText)")
        try FileManager.default.removeItem(atPath: conf + "/t2.conf")
        #expect(await eventually(10) { eventsText.contains(#""event":"terminal-removed","terminal":"t2""#) }, "\(eventsText)")
        let after = try await Self.ctl(control, ["list"])
        #expect(Self.states(after.reply) == ["t1": "open", "t3": "open"], "\(after.reply)")

        // Malformed requests get an error reply and the service goes on.
        for bad in ["not json", #"{"cmd":"status"}"#, #"{"cmd":"status","terminal":"nobody"}"#, #"{"cmd":"add-bridge","terminal":"t1","bridge":"host:0"}"#,
                    #"{"cmd":"set-keepalive","terminal":"t1","idle":1e300,"interval":1,"count":1}"#, String(repeating: "x", count: 70_000)] {
            let fd = try UnixSocketClient.connect(control)
            defer { close(fd) }
            #expect(Host.sendAll(fd, Array((bad + "\n").utf8)))
            let reply = UnixSocketClient.readLine(fd)
            #expect(reply.contains(#""ok":false"#), "\(bad.prefix(40)): \(reply)")
        }
        #expect(try await Self.ctl(control, ["status", "t1"]).status == 0)

        // A client that asks and never reads is let go once a megabyte of replies waits for it;
        // the loop goes on serving the others meanwhile.
        let greedy = try UnixSocketClient.connect(control)
        defer { close(greedy) }
        let requests = Array(String(repeating: #"{"cmd":"status","terminal":"t1"}"# + "\n", count: 4000).utf8)
        var sent = 0
        while sent < requests.count {
            let n = requests[sent...].withUnsafeBytes { send(greedy, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { break }
            sent += n
        }
        #expect(try await Self.ctl(control, ["list"]).status == 0)
        #expect(await eventually(10) {
            // Not read: the service answers a few requests a turn, and lets the client go once
            // a megabyte of answers waits for it. The end shows as a hang-up with the answers
            // still unread.
            var p = pollfd(fd: greedy, events: 0x2000 /* POLLRDHUP */, revents: 0)
            return poll(&p, 1, 0) == 1 && p.revents & (Int16(POLLHUP) | 0x2000) != 0
        }, "the greedy client was not let go")

        // SIGTERM: every link closed, STOPPING=1, exit 0.
        _ = notify.received()
        kill(serve.pid, SIGTERM)
        #expect(await serve.wait(15) == 0, "\(serveOutput)")
        #expect(notify.received().contains("STOPPING=1"), "\(notify.messages)")
        #expect(!FileManager.default.fileExists(atPath: control))
    }

    /// pppd's maxfail: a line that never opens is given up after that many tries, and `ctl open`
    /// tries again; a file renamed hands its device to the new name at once.
    @Test func maxfailGivesUpAndARenamedFileKeepsItsDevice() async throws {
        let (directory, conf, lines) = try Self.makeDirectories()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let control = directory + "/control"
        var children: [ChildProcess] = []
        defer { for c in children { c.reap() } }
        // A terminal that stays for the next link when ours closes (--persist makes a new pty).
        let port = Host.freePort()
        children.append(try ChildProcess(BridgeProcess.binary, ["run", "--pty", "--link", lines + "/a", "--role", "terminal", "--services", "echo:\(port)",
                                                                "--persist"], output: directory + "/a.log"))
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: lines + "/a") })
        try "not a tty".write(toFile: lines + "/plain", atomically: true, encoding: .utf8)
        try "device \(lines)/a\nbridge local:\(port)\n".write(toFile: conf + "/a.conf", atomically: true, encoding: .utf8)
        try "device \(lines)/plain\nmaxfail 2\nholdoff 0\n".write(toFile: conf + "/b.conf", atomically: true, encoding: .utf8)
        let serveLog = directory + "/serve.log"
        children.append(try ChildProcess(BridgeProcess.binary, ["serve", "--config", conf, "--control", control], output: serveLog))
        var serveOutput: String { String(decoding: FileManager.default.contents(atPath: serveLog) ?? Data(), as: UTF8.self) }
        #expect(await eventually(20) { serveOutput.contains("b: 2 failed opens in a row (maxfail 2)") }, "\(serveOutput)")
        let given = try await Self.ctl(control, ["list"])
        #expect(Self.states(given.reply) == ["a": "open", "b": "gave-up"], "\(given.reply)")
        #expect(try await Self.ctl(control, ["open", "b"]).status == 0)
        #expect(await eventually(20) { serveOutput.components(separatedBy: "b: 2 failed opens in a row").count == 3 }, "\(serveOutput)")

        // Renamed: the old name lets the line go first, the new one takes it and opens.
        try FileManager.default.moveItem(atPath: conf + "/a.conf", toPath: conf + "/c.conf")
        #expect(await eventually(30) {
            serveOutput.contains("a: configuration removed") && serveOutput.components(separatedBy: "c: open, ").count >= 2
        }, "\(serveOutput)")
        #expect(!serveOutput.contains("is a's already"), "\(serveOutput)")
        #expect(await Self.eventuallyEchoes(port))
        let renamed = try await Self.ctl(control, ["list"])
        #expect(Self.states(renamed.reply) == ["b": "gave-up", "c": "open"], "\(renamed.reply)")
    }

    /// `Tools/CExample/NAME.c` compiled with gcc against the built `libPPPBridgeC.so`; the
    /// program's path.
    static func compileCExample(_ name: String, into directory: String) async throws -> String {
        let products = URL(fileURLWithPath: BridgeProcess.binary).deletingLastPathComponent().path
        #expect(FileManager.default.fileExists(atPath: products + "/libPPPBridgeC.so"), "build the PPPBridgeC product first")
        let program = directory + "/" + name
        let compiled = try await runCommand("/usr/bin/gcc", ["-Wall", "-Wextra", "-Werror", "-o", program, packageRoot + "/Tools/CExample/\(name).c",
                                                              "-I", packageRoot + "/Sources/PPPBridgeC/include", "-L", products, "-lPPPBridgeC",
                                                              "-Wl,-rpath," + products, "-pthread"], timeout: 120)
        #expect(compiled.status == 0, "\(compiled.output)")
        return program
    }

    /// Handles used after destroy, destroyed twice or never created, a reopen from did-close on
    /// a missing device, and a descriptor limit too low for the loop: errors, never a trap or a
    /// hang (`Tools/CExample/pb_handles.c`).
    @Test func theCAPINeverKillsOrHangsItsHost() async throws {
        let directory = try TemporaryDirectory.make("capi")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let program = try await Self.compileCExample("pb_handles", into: directory)
        let run = try await runCommand(program, [], timeout: 60)
        #expect(run.status == 0 && run.output.contains("pb_handles: ok"), "\(run.output)")
        #expect(!run.output.contains("NOT as expected"), "\(run.output)")
        // Room for the loader and the runtime, none for the loop's epoll and pipe.
        let starved = try await runCommand("/usr/bin/prlimit", ["--nofile=5:5", program], timeout: 60)
        #expect(starved.status == 0 && starved.output.contains("pb_handles: create failed cleanly: errno 24"), "\(starved.output)")
    }

    /// The service through the C API (`Tools/CExample/pb_service_example.c`): a directory
    /// opened, the opened event heard, list, bridges added and removed with the header's codes.
    @Test func theServiceThroughTheCAPI() async throws {
        let (directory, conf, lines) = try Self.makeDirectories()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let program = try await Self.compileCExample("pb_service_example", into: directory)
        let port = Host.freePort()
        let terminal = try Self.terminal(lines + "/t1", echo: port, log: directory + "/t1.log")
        defer { terminal.reap() }
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: lines + "/t1") })
        try "device \(lines)/t1\n".write(toFile: conf + "/t1.conf", atomically: true, encoding: .utf8)
        let run = try await runCommand(program, [conf, "t1", "\(port)"], timeout: 90)
        #expect(run.status == 0 && run.output.contains("pb_service_example: ok"), "\(run.output)")
        #expect(!run.output.contains("NOT as expected"), "\(run.output)")
    }

    @Test func theCExampleBuildsAndDrivesAChannel() async throws {
        let directory = try TemporaryDirectory.make("capi")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let example = try await Self.compileCExample("pb_example", into: directory)
        let link = directory + "/line", port = Host.freePort()
        let terminal = try Self.terminal(link, echo: port, log: directory + "/terminal.log")
        defer { terminal.reap() }
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: link) })
        let run = try await runCommand(example, [link, "\(port)"], timeout: 90)
        #expect(run.status == 0, "\(run.output)")
        for line in ["pb_open_channel: 0", "did-open: ip 192.168.53.1 submask 255.255.255.255 dns 192.168.53.1 terminal 192.168.53.2",
                     "bridge local:\(port) added: 0, again: -2", "echo through the bridge: 4096 of 4096 bytes back, equal",
                     "remove bridge: 0, again: -5", "did-close: reason 0 (closed by us)", "pb_example: ok"] {
            #expect(run.output.contains(line), "\(line) missing from:\n\(run.output)")
        }
    }
}

/// A blocking client of a Unix stream socket, for requests the `ctl` command would not send.
enum UnixSocketClient {
    static func connect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var a = sockaddr_un()
        a.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &a.sun_path) { p in
            for (i, b) in path.utf8.enumerated() { p[i] = b }
        }
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        guard r == 0 else {
            close(fd)
            throw InteropError("connect \(path): \(String(cString: strerror(errno)))")
        }
        Host.setTimeout(fd, seconds: 10)
        return fd
    }

    /// The next line (without its newline), or what came before the connection ended.
    static func readLine(_ fd: Int32) -> String {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while recv(fd, &byte, 1, 0) == 1 {
            if byte == 0x0A { break }
            line.append(byte)
        }
        return String(decoding: line, as: UTF8.self)
    }
}
