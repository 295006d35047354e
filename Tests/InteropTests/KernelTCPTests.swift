import Foundation
import Testing
import TestSupport

/// The Linux kernel's TCP as our stack's peer: the terminal side of the link runs
/// `pppbridge run --role terminal --tun` inside a network namespace the test creates, so the
/// kernel routes to our host-role stack (with its echo/discard/chargen services) over a pty.
enum KernelPeer {
    static let ip = "/usr/sbin/ip"
    static var available: Bool {
        getuid() == 0 && FileManager.default.fileExists(atPath: "/dev/net/tun") && FileManager.default.fileExists(atPath: ip)
    }
    static var client: String {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.appendingPathComponent("Tools/interop/kernel-tcp-client.py").path
    }
}

final class KernelLink {
    static let hostAddress = "10.88.0.1"
    let namespace = "pppbridge-" + String(UUID().uuidString.prefix(8)).lowercased()
    let ptyLink = NSTemporaryDirectory() + "pppbridge-tun-" + UUID().uuidString
    var host: BridgeProcess!
    var terminal: BridgeProcess!

    /// `vj: false` refuses VJ compression on both ends of the link (it is on by default).
    init(hostOptions: [String] = [], vj: Bool = true) async throws {
        let novj = vj ? [] : ["--novj"]
        let made = try await runCommand(KernelPeer.ip, ["netns", "add", namespace], timeout: 10)
        guard made.status == 0 else { throw InteropError("ip netns add: \(made.output)") }
        host = try BridgeProcess(["--pty", "--link", ptyLink, "--local-ip", Self.hostAddress, "--terminal-ip", "10.88.0.2",
                                  "--services", "echo,discard,chargen,daytime"] + hostOptions + novj, capture: false)
        guard await eventually(10, { FileManager.default.fileExists(atPath: ptyLink) }) else { throw InteropError("no pty: \(host.output)") }
        terminal = try BridgeProcess(["--device", ptyLink, "--role", "terminal", "--tun", "pb0"] + novj, capture: false, namespace: namespace)
        guard await eventually(20, { terminal.has("tun: pb0 up") && host.has("answers echo") }) else {
            throw InteropError("link not up\nhost:\n\(host.output)\nterminal:\n\(terminal.output)")
        }
    }

    /// Runs the kernel-side client in the namespace; returns its output.
    func client(_ arguments: [String], timeout: TimeInterval = 600) async throws -> String {
        let r = try await runCommand(KernelPeer.ip, ["netns", "exec", namespace, "python3", KernelPeer.client] + arguments, timeout: timeout)
        guard r.status == 0 else { throw InteropError("client \(arguments) exited \(r.status): \(r.output)") }
        return r.output
    }

    /// The host stack's counters, printed on SIGUSR1.
    func hostCounters() async -> String {
        let before = host.output.count
        host.child.signal(SIGUSR1)
        _ = await eventually(5) { host.output.count > before }
        return String(host.output.dropFirst(before))
    }

    /// "resets in N" from the host's counters.
    func resetsReceived() async -> Int {
        let text = await hostCounters()
        guard let r = text.range(of: "resets in ") else { return -1 }
        return Int(text[r.upperBound...].prefix { $0.isNumber }) ?? -1
    }

    /// Blocking: it runs from `defer`.
    func stop() {
        host?.terminateBlocking()
        _ = terminal?.child.waitBlocking(10)
        terminal?.child.signal(SIGKILL)
        host?.cleanUp()
        terminal?.cleanUp()
        runCommandBlocking(KernelPeer.ip, ["netns", "del", namespace], timeout: 10)
    }
}

@Suite(.serialized, .enabled(if: KernelPeer.available, "needs root, /dev/net/tun and iproute2"))
struct KernelTCPTests {
    /// 16 MiB from the kernel to our echo service and back: both directions at once, the
    /// kernel half-closing first while our side keeps sending. Without loss the link runs VJ
    /// compression both ways (the default); with 1% of frames lost it runs without, so SACK
    /// recovery is what is measured (lost frames put VJ's state out of step until a timeout).
    @Test(arguments: [0, 1])
    func sixteenMebibytesEachWay(lossPercent: Int) async throws {
        let link = try await KernelLink(hostOptions: lossPercent > 0 ? ["--frame-loss", String(lossPercent)] : [], vj: lossPercent == 0)
        defer { link.stop() }
        let out = try await link.client(["echo", KernelLink.hostAddress, "7", String(16 << 20)])
        #expect(out.contains("echo sent=16777216 received=16777216 equal=True"), "\(out)")
        let counters = await link.hostCounters()
        print("kernel echo, \(lossPercent)% frame loss: \(out.trimmingCharacters(in: .whitespacesAndNewlines)) | \(counters.split(separator: "\n").first ?? "")")
        if lossPercent > 0 { #expect(!counters.contains("retrans 0 "), "\(counters)") }
    }

    /// Fifty echoes at once, 256 KiB each: what is shown is the demultiplexing and the sharing of
    /// the line, not throughput (the suite's build is a debug build, CPU-bound at about 1 MB/s
    /// here, and the sixteen-mebibyte test above moves the volume).
    @Test func fiftyConcurrentConnections() async throws {
        let link = try await KernelLink()
        defer { link.stop() }
        let out = try await link.client(["concurrent", KernelLink.hostAddress, "7", "50", String(256 << 10)])
        #expect(out.contains("concurrent ok=50 of 50"), "\(out)")
    }

    @Test func chargenResetsAndNegotiatedOptions() async throws {
        let link = try await KernelLink()
        defer { link.stop() }
        let chargen = try await link.client(["chargen", KernelLink.hostAddress, "19", String(1 << 20)])
        #expect(chargen.contains("chargen ok=True bytes=1048576"), "\(chargen)")
        // Half-close from our side: daytime sends the time and its FIN first; the kernel keeps
        // sending 1 MiB into our still-open receive direction, then closes, with no reset.
        let daytime = try await link.client(["daytime", KernelLink.hostAddress, "13", String(1 << 20)])
        #expect(daytime.contains("daytime sent_after_eof=1048576 clean=True line='"), "\(daytime)")
        #expect(daytime.contains("-UTC'"), "\(daytime)")
        // Our RST reaches the kernel: nobody listens on 5555.
        #expect(try await link.client(["refused", KernelLink.hostAddress, "5555"]).contains("refused"))
        // The kernel's RST reaches us.
        let before = await link.resetsReceived()
        #expect(try await link.client(["reset", KernelLink.hostAddress, "9"]).contains("reset sent"))
        _ = await eventually(within: .seconds(5), every: .milliseconds(100)) { await link.resetsReceived() > before }
        let after = await link.resetsReceived()
        #expect(after > before, "resets in went from \(before) to \(after)")
        // The kernel's view: we offered window scaling and SACK, and it took them. With VJ on
        // the link we leave timestamps out (they would defeat the compression).
        let ss = try await link.client(["ss", KernelLink.hostAddress, "9"])
        #expect(ss.contains("wscale:3,"), "\(ss)")
        #expect(ss.contains("tcp_info options: sack wscale snd_wscale=3"), "\(ss)")
    }

    @Test func timestampsTooWithoutVJ() async throws {
        let link = try await KernelLink(vj: false)
        defer { link.stop() }
        let ss = try await link.client(["ss", KernelLink.hostAddress, "9"])
        #expect(ss.contains("tcp_info options: ts sack wscale snd_wscale=3"), "\(ss)")
    }
}
