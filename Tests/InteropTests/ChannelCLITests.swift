import Channel
import ChannelTestSupport
import Foundation
import Glibc
import NetStack
import Simulation
import Testing
import TestSupport

/// `pppbridge run` with bridges and the proxy, against a simulated terminal (our stack in the
/// terminal role, in this process) on the pty the tool creates.
@Suite(.serialized) struct ChannelCLITests {
    @Test func runBridgesToTheTerminalAndWritesItsStatus() async throws {
        let directory = try TemporaryDirectory.make("cli")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let link = directory + "/line", status = directory + "/status.json"
        let port = Host.freePort()
        let bridge = try BridgeProcess(["--pty", "--link", link, "--bridge", "host:\(port)", "--bridge", "local:\(Host.freePort())",
                                        "--keepalive", "60,10,5", "--no-dns-relay", "--status-json", status])
        defer { bridge.cleanUp() }
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: link) }, "\(bridge.output)")
        let terminal = try SimulatedTerminal(line: .device(link), echoPorts: [port])
        try terminal.start()
        let up = await terminal.waitUntilUp()
        #expect(up != nil)
        #expect(await eventually(10) { bridge.has("bridge host→terminal on port \(port)") }, "\(bridge.output)")

        let payload = Host.random(300_000, seed: 5)
        let r = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), payload))
        #expect(r.clean && Host.sha(r.bytes) == Host.sha(payload))

        // The status file is rewritten every second.
        var json: [String: Any] = [:]
        #expect(await eventually(5) {
            guard let d = FileManager.default.contents(atPath: status), let j = try? JSONSerialization.jsonObject(with: d) as? [String: Any],
                  let b = j["bridges"] as? [[String: Any]], (b.first?["bytes_to_host"] as? Int) == payload.count else { return false }
            json = j
            return true
        }, "\(String(decoding: FileManager.default.contents(atPath: status) ?? Data(), as: UTF8.self))")
        #expect(json["state"] as? String == "open")
        #expect(json["terminal_ip"] as? String == "192.168.53.2")
        #expect((json["bridges"] as? [[String: Any]])?.map { $0["kind"] as? String } == ["host", "local"])
        #expect((json["proxy"] as? [String: Any])?["refused"] as? Int == 0)
        #expect((json["proxy"] as? [String: Any])?["refused_by_policy"] as? Int == 0)
        // The bounds against a hostile peer are in the file too.
        #expect((json["line_queue"] as? [String: Any])?["dropped_packets"] as? Int == 0)
        #expect(json["listen_refusals"] as? Int == 0 && json["accept_backoffs"] as? Int == 0)
        #expect((json["bridges"] as? [[String: Any]])?.first?["refused"] as? Int == 0)

        // SIGTERM: Terminate on the line, exit 0; the terminal sees the peer end the link.
        #expect(await bridge.terminate() == 0)
        #expect(await eventually(5) { terminal.downReason != nil })
        await terminal.stop()
    }

    @Test func aBridgePortInUseIsReportedWithItsCode() async throws {
        let directory = try TemporaryDirectory.make("cli")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let link = directory + "/line"
        let port = Host.freePort()
        let squatter = try LoopbackServer(port: port, mode: .hold, address: IPv4Address(0))
        defer { squatter.stop() }
        let bridge = try BridgeProcess(["--pty", "--link", link, "--bridge", "host:\(port)", "--no-dns-relay"])
        defer { bridge.cleanUp() }
        #expect(await eventually(10) { FileManager.default.fileExists(atPath: link) })
        let terminal = try SimulatedTerminal(line: .device(link))
        try terminal.start()
        // The link comes up, the bridge cannot start, the tool closes the link and says why.
        #expect(await bridge.waitForExit(20) == 7, "\(bridge.output)")
        #expect(bridge.has("bridge host:\(port): the bridge could not be initialised (its port is in use) (-4)"), "\(bridge.output)")
        await terminal.stop()
    }
}
