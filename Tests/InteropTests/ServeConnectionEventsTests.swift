import Channel
import ChannelTestSupport
import Foundation
import NetStack
import Simulation
import Testing
import TestSupport

/// `serve`'s control socket streams every connection through a terminal's proxy and bridges
/// (`pppbridge ctl events`): a proxy request refused by the rules, with what was asked and
/// why, and one that carried data, opened and closed under one number with its bytes.
@Suite(.serialized, .timeLimit(.minutes(3))) struct ServeConnectionEventsTests {
    @Test func theControlSocketStreamsEachProxyConnection() async throws {
        let dir = try TemporaryDirectory.make("events")
        try FileManager.default.createDirectory(atPath: dir + "/conf", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let port = Host.freePort(), refusedPort = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .echo)
        defer { server.stop() }
        // The terminal: our stack in the terminal role on a pty, in this process, to make
        // SOCKS requests of the served channel.
        let terminal = try SimulatedTerminal(line: .pty(linkedAt: dir + "/t1"))
        try terminal.start()
        let file = dir + "/conf/t1.conf"
        try "device \(dir)/t1\nsocks-allow 127.0.0.1:\(port)\n".write(toFile: file, atomically: true, encoding: .utf8)
        chmod(file, 0o600)
        let control = dir + "/control"
        let serve = try ChildProcess(BridgeProcess.binary, ["serve", "--config", dir + "/conf", "--control", control], output: dir + "/serve.log")
        var events: ChildProcess?
        defer {
            events?.reap()
            serve.signal(SIGTERM)
            _ = serve.waitBlocking(10)
            serve.reap()
        }
        #expect(await eventually(15) { FileManager.default.fileExists(atPath: control) })
        events = try ChildProcess(BridgeProcess.binary, ["ctl", "--control", control, "events"], output: dir + "/events.log")
        // Subscribed (its first line is the answer) before anything happens.
        #expect(await eventually(10) { ((try? String(contentsOfFile: dir + "/events.log", encoding: .utf8)) ?? "").contains("\"ok\":true") })
        let up = await terminal.waitUntilUp()
        let ours = try #require(up, "the link did not come up").peerAddress
        let socks = TCPEndpoint(ours, 1080)

        func transfer(to target: TCPEndpoint, _ payload: [UInt8]) async -> TransferResult? {
            await withCheckedContinuation { c in
                terminal.loop.execute { terminal.beginTransfer(to: target, via: socks, payload: payload) { c.resume(returning: $0) } }
            }
        }
        let refused = await transfer(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), refusedPort), Array("no".utf8))
        #expect(refused?.outcome == "socks reply 2")
        let payload = Host.random(4000, seed: 8)
        let carried = await transfer(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), port), payload)
        #expect(carried?.outcome == "closed" && carried?.received == payload)

        var lines: [[String: Any]] = []
        #expect(await eventually(10) {
            let text = (try? String(contentsOfFile: dir + "/events.log", encoding: .utf8)) ?? ""
            lines = text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            return lines.contains { $0["event"] as? String == "connection-closed" }
        }, "\((try? String(contentsOfFile: dir + "/events.log", encoding: .utf8)) ?? "")")
        let text = (try? String(contentsOfFile: dir + "/events.log", encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n") where line.contains("connection-") { print("ctl events: \(line)") }
        let refusal = lines.first { $0["event"] as? String == "connection-refused" }
        #expect(refusal?["terminal"] as? String == "t1" && refusal?["proxy"] as? Bool == true)
        #expect(refusal?["destination"] as? String == "127.0.0.1:\(refusedPort)" && refusal?["failure"] as? String == "not on the allow-list")
        let opened = lines.first { $0["event"] as? String == "connection-opened" }
        let closed = lines.first { $0["event"] as? String == "connection-closed" }
        #expect(opened?["destination"] as? String == "127.0.0.1:\(port)")
        #expect(opened?["connection"] as? Int == closed?["connection"] as? Int && (opened?["connection"] as? Int ?? 0) > 0)
        #expect(closed?["bytes_to_host"] as? Int == 4000 && closed?["bytes_to_terminal"] as? Int == 4000 && closed?["failure"] == nil)
        await terminal.stop()
    }
}
