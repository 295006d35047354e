import Foundation
import Testing

/// Two `pppbridge run` processes on a pty pair: the host creates the pty (`--pty --link`), the
/// terminal attaches to it (`--device`). Real descriptors, termios, epoll and signals.
@Suite(.serialized) struct PtyLinkTests {
    @Test func hostOnACreatedPtyAndTerminalOnItsLink() async throws {
        let link = NSTemporaryDirectory() + "pppbridge-pty-" + UUID().uuidString
        let record = link + ".pppd"
        defer { try? FileManager.default.removeItem(atPath: record) }
        let host = try BridgeProcess(["--pty", "--link", link, "--local-ip", "10.9.0.1", "--terminal-ip", "10.9.0.2",
                                      "--dns", "10.9.0.53", "--record", record])
        defer { host.cleanUp() }
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: link) }, "no pty link: \(host.output)")
        let terminal = try BridgeProcess(["--device", link, "--role", "terminal"])
        defer { terminal.cleanUp() }
        let opened = await eventually(10) { host.has("IPCP opened") && terminal.has("IPCP opened") }
        #expect(opened, "host:\n\(host.output)\nterminal:\n\(terminal.output)")
        #expect(host.has("local  IP address 10.9.0.1") && host.has("remote IP address 10.9.0.2"))
        #expect(terminal.has("local  IP address 10.9.0.2") && terminal.has("remote IP address 10.9.0.1"))
        #expect(terminal.has("primary   DNS address 10.9.0.53"))

        #expect(await host.terminate() == 0, "host:\n\(host.output)")
        #expect(await terminal.waitForExit(10) == 22, "terminal:\n\(terminal.output)")
        #expect(terminal.has("link down: peer terminated the link (\"User request\")"))
        // The symlink goes with the pty.
        #expect(!FileManager.default.fileExists(atPath: link))

        // The record file reads back with every frame intact.
        let decode = try await runCommand(BridgeProcess.binary, ["decode", record], timeout: 30)
        #expect(decode.status == 0)
        #expect(decode.output.contains("errors: 0 malformed packets, 0 dropped frames"), "\(decode.output)")
        #expect(decode.output.contains("sent [LCP TermReq id="))
    }

    @Test func aMissingDeviceIsExitStatusSeven() async throws {
        let r = try await runCommand(BridgeProcess.binary, ["run", "--device", "/nonexistent/tty"], timeout: 10)
        #expect(r.status == 7)
        #expect(r.output.contains("pppbridge: open /nonexistent/tty: No such file or directory"))
    }
}
