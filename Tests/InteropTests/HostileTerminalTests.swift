import ChannelTestSupport
import Foundation
import NetStack
import Testing
import TestSupport

/// A hostile terminal, end to end: our host role (`pppbridge run`) on a pty; on the other end
/// our terminal role hands IP to the kernel through TUN in a network namespace the test makes,
/// where Tools/interop/hostile-peer.py sends crafted packets from a raw socket. After each
/// attack the host process is alive, its memory within bound, and its echo service answers.
@Suite(.serialized, .enabled(if: KernelPeer.available, "needs root, /dev/net/tun and iproute2"))
struct HostileTerminalTests {
    static var script: String {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.appendingPathComponent("Tools/interop/hostile-peer.py").path
    }

    static func attack(_ link: KernelLink, _ arguments: [String], timeout: TimeInterval = 300) async throws -> String {
        let r = try await runCommand(KernelPeer.ip, ["netns", "exec", link.namespace, "python3", script] + arguments, timeout: timeout)
        guard r.status == 0 else { throw InteropError("hostile-peer \(arguments) exited \(r.status): \(r.output)") }
        return r.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Resident memory of a process, in KiB (VmRSS in /proc/PID/status).
    static func residentKiB(_ pid: pid_t) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return -1 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    }

    static func alive(_ link: KernelLink) -> Bool { kill(link.host.child.pid, 0) == 0 && link.host.child.status == nil }

    /// Each attack of the hostile-peer issue in turn against one host process: three fragments
    /// with a piece beyond the end, a datagram over 65535 bytes, 200000 empty first fragments from
    /// random sources (at most 32 MB of growth), a SYN flood and 5000 connection attempts at a
    /// terminal→host bridge. Prints one line per attack with the host's memory before and after.
    @Test func theHostSurvivesEveryAttackAndStillEchoes() async throws {
        let (server, bridgePort) = try LoopbackServer.onFreePort(mode: .echo)
        defer { server.stop() }
        let link = try await KernelLink(hostOptions: ["--bridge", "terminal:\(bridgePort)"])
        defer { link.stop() }
        let pid = link.host.child.pid
        // Warm up: the echo service and the bridge each carry one exchange first, so what is
        // measured below is the attack, not the first use.
        _ = try await Self.attack(link, ["echo", KernelLink.hostAddress, "65536"])
        let attacks: [(name: String, arguments: [String], growthLimitKiB: Int)] = [
            ("three fragments, one beyond the end", ["fragments-beyond-end", KernelLink.hostAddress], 4096),
            ("a datagram over 65535 bytes", ["oversized-datagram", KernelLink.hostAddress], 4096),
            ("200000 empty fragments, random sources", ["empty-fragments", KernelLink.hostAddress, "200000"], 32 * 1024),
            ("SYN flood at a terminal→host bridge", ["syn-flood", KernelLink.hostAddress, String(bridgePort), "20000"], 32 * 1024),
            ("5000 connections at a terminal→host bridge", ["connect-storm", KernelLink.hostAddress, String(bridgePort), "5000"], 32 * 1024),
        ]
        for attack in attacks {
            let before = Self.residentKiB(pid)
            let figures = try await Self.attack(link, attack.arguments)
            let echo = try await Self.attack(link, ["echo", KernelLink.hostAddress, "65536"])
            let after = Self.residentKiB(pid)
            print("hostile peer: \(attack.name): \(figures); host alive \(Self.alive(link)), RSS \(before) → \(after) KiB; \(echo)")
            #expect(Self.alive(link), "\(attack.name): the host died\n\(link.host.output)")
            #expect(echo.contains("echo intact"), "\(attack.name): \(echo)")
            #expect(after - before <= attack.growthLimitKiB, "\(attack.name): RSS grew from \(before) to \(after) KiB")
        }
        let counters = await link.hostCounters()
        print("hostile peer: host counters after the attacks: \(counters.split(separator: "\n").first ?? "")")
        // The attacks reached the stack: tens of thousands of the 200000 empty fragments were
        // counted (how many depends on the load: the terminal side's kernel and line queue drop
        // what the line cannot carry, as they should).
        let fragmentsIn = counters.range(of: "frag in ").map { Int(counters[$0.upperBound...].prefix { $0.isNumber }) ?? 0 } ?? 0
        #expect(fragmentsIn >= 20_000, "\(counters)")
    }

    /// The SOCKS proxy does not open the host's loopback to the terminal: curl in the namespace
    /// asking for a server on the host's 127.0.0.1 is refused (SOCKS5 reply 2, curl's exit 97);
    /// an allow entry naming exactly that host:port lets it through.
    @Test func theProxyRefusesTheHostsLoopbackUnlessAllowed() async throws {
        let port = Host.freePort()
        let http = try ChildProcess("/usr/bin/python3", ["-m", "http.server", "--bind", "127.0.0.1", String(port)],
                                    output: NSTemporaryDirectory() + "pppbridge-http-\(port).log")
        defer { http.signal(SIGKILL); _ = http.waitBlocking(5) }
        let serving = await eventually(within: .seconds(10), every: .milliseconds(100)) {
            (try? await runCommand("/usr/bin/curl", ["-s", "-o", "/dev/null", "http://127.0.0.1:\(port)/"], timeout: 5).status) == 0
        }
        #expect(serving, "the loopback web server did not answer")
        let url = "http://127.0.0.1:\(port)/"
        let curl = ["netns", "exec", "NS", "/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                    "--max-time", "20", "--socks5-hostname", "\(KernelLink.hostAddress):1080", url]
        do {
            let link = try await KernelLink()
            defer { link.stop() }
            let r = try await runCommand(KernelPeer.ip, curl.map { $0 == "NS" ? link.namespace : $0 }, timeout: 30)
            print("socks, default: curl exit \(r.status): \(r.output.trimmingCharacters(in: .whitespacesAndNewlines))")
            #expect(r.status == 97, "curl should fail the SOCKS handshake: \(r.output)")
            #expect(r.output.contains("(2)") || r.output.contains("not allowed"), "\(r.output)")
        }
        do {
            let link = try await KernelLink(hostOptions: ["--socks-allow", "127.0.0.1:\(port)"])
            defer { link.stop() }
            let r = try await runCommand(KernelPeer.ip, curl.map { $0 == "NS" ? link.namespace : $0 }, timeout: 30)
            print("socks, --socks-allow 127.0.0.1:\(port): curl exit \(r.status): \(r.output.trimmingCharacters(in: .whitespacesAndNewlines))")
            #expect(r.status == 0 && r.output.hasSuffix("200"), "\(r.output)")
        }
    }
}
