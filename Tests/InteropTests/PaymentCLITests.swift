import ChannelTestSupport
import Foundation
import Glibc
import Channel
import Testing
import TestSupport

/// The payment commands as a person runs them: `pppbridge gateway` and `pppbridge terminal` as
/// processes, then `pppbridge pay`, `refund`, `reader discover|connect|update` against them.
@Suite(.serialized, .timeLimit(.minutes(10))) struct PaymentCLITests {
    final class Service {
        let child: ChildProcess
        let log: String
        init(_ arguments: [String], log: String) throws {
            self.log = log
            child = try ChildProcess(BridgeProcess.binary, arguments, output: log)
        }
        var output: String { String(decoding: FileManager.default.contents(atPath: log) ?? Data(), as: UTF8.self) }
        func stop() async -> Int32? {
            child.signal(SIGTERM)
            let status = await child.wait(15)
            child.reap()
            return status
        }

        /// `stop` for a `defer` (the thread waits; the service exits at once on SIGTERM).
        func stopBlocking() {
            child.signal(SIGTERM)
            if child.waitBlocking(15) == nil { child.reap() }
        }
    }

    @Test func payRefundAndUpdateFromTheCommandLine() async throws {
        let directory = try TemporaryDirectory.make("paycli")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let port = Host.freePort()
        let gateway = try Service(["gateway", "--port", "\(port)", "--offer-update", "1.1.0", "--update-size", "30000",
                                   "--signing-key", directory + "/update.key", "--merchant", "LIC-TEST-B:bob:hunter2"], log: directory + "/gateway.log")
        defer { gateway.stopBlocking() }
        #expect(await eventually(10) { gateway.output.contains("listening on 127.0.0.1:\(port)") }, "\(gateway.output)")
        let key = try #require(gateway.output.split(separator: "\n").first { $0.contains("update public key") }?.split(separator: " ").last)
        #expect(gateway.output.contains("gateway: merchant bob (LIC-TEST-B) has MerchantID 999008882"), "\(gateway.output)")
        let control = directory + "/control", state = directory + "/terminal.state"
        let terminalArguments = ["terminal", "--gateway", "127.0.0.1:\(port)", "--link", directory + "/SIM-00000001", "--rssi", "-45",
                                 "--update-key", String(key), "--card", "4111111111111111:1234", "--control", control, "--state", state]
        var terminal = try Service(terminalArguments, log: directory + "/terminal.log")
        defer { terminal.stopBlocking() }
        // The advertisement is written while the simulator starts, before it prints its control path.
        #expect(await eventually(10) {
            FileManager.default.fileExists(atPath: directory + "/SIM-00000001.advert") && terminal.output.contains("control on \(control)")
        }, "\(terminal.output)")
        let pattern = directory + "/*"
        let gw = "127.0.0.1:\(port)"

        // Discovery lists the terminal from its advertisement.
        let listed = try await runCommand(BridgeProcess.binary, ["reader", "discover", "--pattern", pattern, "--timeout", "1"], timeout: 30)
        #expect(listed.status == 0 && listed.output.contains("found: SIM-00000001 (SIM-00000001,") && listed.output.contains("-45 dBm"), "\(listed.output)")

        // A payment found by discovery, with its capture.
        let pcap = directory + "/pay.pcap"
        let paid = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "10.50", "--currency", "EUR", "--gateway", gw, "--pattern", pattern,
                                                         "--transaction-id", "0001CLI", "--pcap", pcap], timeout: 60)
        #expect(paid.status == 0, "\(paid.output)")
        let receipt = try #require(Self.receipt(paid.output), "\(paid.output)")
        #expect(paid.output.contains("result: approved 10.50 EUR, authorisation code \(receipt.code), operation \(receipt.operation), response 00, card 411111******1111, PIN verified"), "\(paid.output)")
        for state in ["state: login", "state: discovery", "state: connecting", "state: interaction", "state: authorizing", "state: finished"] {
            #expect(paid.output.contains(state), "\(state) missing")
        }
        let capture = try #require(FileManager.default.contents(atPath: pcap))
        #expect(capture.count > 1000 && capture.range(of: Data("4111111111111111".utf8)) == nil, "a clear PAN in the capture")

        // Exponents: JPY has none, KWD three; amounts are taken exactly or refused.
        let yen = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "1050", "--currency", "JPY", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(yen.status == 0 && yen.output.contains("result: approved 1050 JPY"), "\(yen.output)")
        // Authorisation codes are drawn at random: the next payment's is not the next number.
        let yenCode = try #require(Self.receipt(yen.output)?.code)
        #expect(yenCode != receipt.code && Int(yenCode) != Int(receipt.code)! + 1, "\(receipt.code) then \(yenCode)")
        let dinar = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "1.250", "--currency", "KWD", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(dinar.status == 0 && dinar.output.contains("result: approved 1.250 KWD"), "\(dinar.output)")
        let fractionalYen = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "10.5", "--currency", "JPY", "--gateway", gw], timeout: 30)
        #expect(fractionalYen.status == 2 && fractionalYen.output.contains("is not an amount in JPY"), "\(fractionalYen.output)")

        // A declined payment exits 1.
        let declined = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "1.05", "--currency", "EUR", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(declined.status == 1 && declined.output.contains("result: declined 1.05 EUR") && declined.output.contains("response 05"), "\(declined.output)")

        // Refund by the authorisation code on the receipt, then one too many.
        // Another merchant cannot refund it, by code or by operation: not found (3008), exit 1.
        for reference in [receipt.code, receipt.operation] {
            let stranger = try await runCommand(BridgeProcess.binary, ["refund", "--auth", reference, "--amount", "1.00", "--currency", "EUR", "--gateway", gw,
                                                                 "--device", directory + "/SIM-00000001", "--licence", "LIC-TEST-B", "--user", "bob",
                                                                 "--password", "hunter2"], timeout: 60)
            #expect(stranger.status == 1 && stranger.output.contains("3008"), "\(stranger.output)")
        }
        let refunded = try await runCommand(BridgeProcess.binary, ["refund", "--auth", receipt.code, "--amount", "10.00", "--currency", "EUR", "--gateway", gw,
                                                             "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(refunded.status == 0 && refunded.output.contains("result: approved 10.00 EUR"), "\(refunded.output)")
        let tooMuch = try await runCommand(BridgeProcess.binary, ["refund", "--auth", receipt.code, "--amount", "0.51", "--currency", "EUR", "--gateway", gw,
                                                            "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(tooMuch.status == 1 && tooMuch.output.contains("3007"), "\(tooMuch.output)")

        // The optional update the gateway offers, installed with progress; the reader says so.
        let updated = try await runCommand(BridgeProcess.binary, ["reader", "update", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 90)
        #expect(updated.status == 0 && updated.output.contains("update: 100%") && updated.output.contains("reader: now running 1.1.0"),
                "\(updated.output)\n\(terminal.output)\n\(gateway.output)")
        let connected = try await runCommand(BridgeProcess.binary, ["reader", "connect", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(connected.status == 0 && connected.output.contains("software 1.1.0") && connected.output.contains("diagnosis:"), "\(connected.output)")

        // `pay` reaches the reader through our stack inside the process: no listening socket.
        let strace = try #require(["/usr/bin/strace", "/bin/strace"].first { FileManager.default.isExecutableFile(atPath: $0) }, "strace is not installed")
        let traced = try await runCommand(strace, ["-f", "-e", "trace=listen", "-o", directory + "/pay.strace", BridgeProcess.binary, "pay", "--amount", "2.00",
                                             "--currency", "EUR", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(traced.status == 0 && traced.output.contains("result: approved 2.00 EUR"), "\(traced.output)")
        let calls = String(decoding: FileManager.default.contents(atPath: directory + "/pay.strace") ?? Data(), as: UTF8.self)
        #expect(!calls.isEmpty && !calls.contains("listen("), "\(calls)")

        // The control socket: this user's alone, and nothing sent to it stops the simulator.
        var st = stat()
        #expect(lstat(control, &st) == 0 && st.st_mode & S_IFMT == S_IFSOCK && st.st_mode & 0o777 == 0o600)
        for command in [#"{"cmd":"dropLink","downFor":1e300}"#, #"{"cmd":"setBattery","level":1e300}"#, #"{"cmd":"dropLinkAfterAuthorise","downFor":-1}"#] {
            let answer = try await runCommand(BridgeProcess.binary, ["control", control, command], timeout: 30)
            #expect(answer.status == 1 && answer.output.contains(#""ok":false"#), "\(command): \(answer.output)")
        }
        let longLine = try Self.send(line: [UInt8](repeating: 0x41, count: 10 << 20) + [0x0A], to: control)
        #expect(longLine.contains(#""ok":false"#) && longLine.contains("line longer than"), "\(longLine)")
        let status = try await runCommand(BridgeProcess.binary, ["control", control, #"{"cmd":"status"}"#], timeout: 30)
        #expect(status.status == 0 && status.output.contains(#""ok":true"#) && !status.output.contains("passkey"), "\(status.output)")

        // A restart goes on counting where the state file says: the gateway takes its next payment.
        let counter = try #require(Self.ksnCounter(terminal.output), "\(terminal.output)")
        #expect(counter == 0, "a fresh state starts at 0")
        #expect(await terminal.stop() == 0)
        let saved = String(decoding: FileManager.default.contents(atPath: state) ?? Data(), as: UTF8.self)
        #expect(lstat(state, &st) == 0 && st.st_mode & 0o777 == 0o600 && saved.contains("\"Counter\""), "\(saved)")
        try? FileManager.default.removeItem(atPath: directory + "/terminal.log")
        terminal = try Service(terminalArguments, log: directory + "/terminal.log")
        #expect(await eventually(10) { Self.ksnCounter(terminal.output) != nil }, "\(terminal.output)")
        let restartedAt = try #require(Self.ksnCounter(terminal.output))
        #expect(restartedAt > 5, "the counter went on from \(restartedAt)")
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: directory + "/SIM-00000001.advert") }, "\(terminal.output)")
        let afterRestart = try await runCommand(BridgeProcess.binary, ["pay", "--amount", "3.00", "--currency", "EUR", "--gateway", gw,
                                                                 "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(afterRestart.status == 0 && afterRestart.output.contains("result: approved 3.00 EUR"), "\(afterRestart.output)\n\(gateway.output)")

        #expect(await terminal.stop() == 0)
        #expect(await gateway.stop() == 0)
        #expect(gateway.output.contains("Authorise 0001CLI Normal 1050 978 → approved 00 \(receipt.operation)"), "\(gateway.output)")
        #expect(!gateway.output.contains("replay"), "\(gateway.output)")
    }

    /// The authorisation code and operation a `pay` printed.
    static func receipt(_ output: String) -> (code: String, operation: String)? {
        guard let line = output.split(separator: "\n").first(where: { $0.contains("authorisation code ") }) else { return nil }
        let words = line.split(separator: " ").map { String($0.trimmingCharacters(in: CharacterSet(charactersIn: ","))) }
        guard let c = words.firstIndex(of: "code"), c + 1 < words.count, let o = words.firstIndex(of: "operation"), o + 1 < words.count else { return nil }
        return (words[c + 1], words[o + 1])
    }

    /// The counter the terminal said it starts from ("KSN counter N kept in FILE").
    static func ksnCounter(_ output: String) -> Int? {
        guard let line = output.split(separator: "\n").first(where: { $0.contains("KSN counter ") }) else { return nil }
        let words = line.split(separator: " ")
        guard let i = words.firstIndex(of: "counter"), i + 1 < words.count else { return nil }
        return Int(words[i + 1])
    }

    /// Sends `line` to the Unix socket at `path` and returns the first line that comes back.
    static func send(line: [UInt8], to path: String) throws -> String {
        let socket = try UnixSocket.connect(to: path)
        defer { socket.close() }
        let fd = socket.rawValue
        var tv = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var sent = 0
        while sent < line.count {
            let n = line[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            sent += n
        }
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !answer.contains(0x0A) {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            answer += chunk[0..<n]
        }
        return String(decoding: answer, as: UTF8.self)
    }
}
