import ChannelTestSupport
import Foundation
import NetStack
import Testing
import TestSupport

/// Debian's ser2net, a real serial device server, with a simulated terminal's pty on its far
/// side: our lines as `tcp:HOST:PORT` (raw) and `rfc2217:HOST:PORT` (telnet with
/// COM-PORT-OPTION). Traffic stays on loopback and the pty.
final class DeviceServer {
    static let binary = "/usr/sbin/ser2net"
    let directory: String
    let rawPort: UInt16
    let telnetPort: UInt16
    let log: String
    private(set) var child: ChildProcess?

    /// `device` is the pty's terminal side (its real path: ser2net opens the device itself).
    init(device: String, directory: String) throws {
        self.directory = directory
        rawPort = Host.freePort()
        telnetPort = Host.freePort()
        log = directory + "/ser2net.log"
        // ser2net 4's YAML; `local`: a pty has no modem lines to wait for.
        let yaml = """
            connection: &raw
              accepter: tcp,127.0.0.1,\(rawPort)
              connector: serialdev,\(device),115200n81,local
            connection: &rfc2217
              accepter: telnet(rfc2217),tcp,127.0.0.1,\(telnetPort)
              connector: serialdev,\(device),115200n81,local

            """
        try yaml.write(toFile: directory + "/ser2net.yaml", atomically: true, encoding: .utf8)
    }

    /// Starts it in the foreground (no daemon, no mDNS worth waiting for) and waits until both
    /// ports listen. Seen in the kernel's table rather than by connecting: a connection would
    /// have ser2net open the device, and hold it a moment after, refusing the next client.
    func start() async throws {
        child = try ChildProcess(Self.binary, ["-n", "-d", "-c", directory + "/ser2net.yaml"], output: log)
        let up = await eventually(15) { Self.listening(self.rawPort) && Self.listening(self.telnetPort) }
        guard up else { throw InteropError("ser2net did not listen: \(output)") }
    }

    /// A socket in LISTEN (state 0A) on 127.0.0.1:`port` in /proc/net/tcp.
    static func listening(_ port: UInt16) -> Bool {
        guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return false }
        let local = "0100007F:" + String(format: "%04X", port)
        return table.split(separator: "\n").contains { line in
            let fields = line.split(separator: " ")
            return fields.count > 3 && fields[1] == local && fields[3] == "0A"
        }
    }

    func stop() async {
        child?.signal(SIGTERM)
        _ = await child?.wait(10)
        child?.reap()
        child = nil
    }

    /// `stop` for cleanup in a `defer` (the thread waits; a stopped ser2net exits at once).
    func stopBlocking() {
        child?.signal(SIGTERM)
        _ = child?.waitBlocking(5)
        child?.reap()
        child = nil
    }

    var output: String { String(decoding: FileManager.default.contents(atPath: log) ?? Data(), as: UTF8.self) }
}

/// One simulated terminal (`pppbridge simulate`) on a pty, echo on `echoPort`: it starts again
/// on the same pty when its link goes down, as a terminal does.
final class SimulatorProcess {
    let child: ChildProcess
    let link: String
    let echoPort: UInt16

    init(directory: String) throws {
        echoPort = Host.freePort()
        link = directory + "/t0"
        child = try ChildProcess(BridgeProcess.binary, ["simulate", "--terminals", "1", "--dir", directory, "--echo-base", String(echoPort)],
                                 output: directory + "/simulate.log")
    }

    /// The pty's terminal side, once the simulator made it.
    func device() async -> String? {
        _ = await eventually(10) { (try? FileManager.default.destinationOfSymbolicLink(atPath: self.link)) != nil }
        return try? FileManager.default.destinationOfSymbolicLink(atPath: link)
    }

    func stop() {
        child.signal(SIGTERM)
        _ = child.waitBlocking(5)
        child.reap()
    }
}

/// A simulated terminal's pty behind ser2net, in a directory of its own.
final class DeviceServerRig {
    let directory: String
    let simulator: SimulatorProcess
    let device: String
    let server: DeviceServer

    init() async throws {
        directory = try TemporaryDirectory.make("s2n")
        simulator = try SimulatorProcess(directory: directory)
        guard let device = await simulator.device() else {
            simulator.stop()
            throw InteropError("the simulator made no pty")
        }
        self.device = device
        server = try DeviceServer(device: device, directory: directory)
        try await server.start()
    }

    func cleanUp() {
        server.stopBlocking()
        simulator.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

@Suite(.serialized, .timeLimit(.minutes(5))) struct DeviceServerTests {
    /// `count` random bytes through the bridge and back: nil when they came back intact, else
    /// what went wrong (so a failure says whether it was the connect, a stall or the data).
    private static func exchange(_ port: UInt16, _ count: Int, seed: UInt64) async -> String? {
        let payload = Host.random(count, seed: seed)
        let start = Date()
        // A minute without progress ends it: on a loaded machine a few frames lost on the line
        // back TCP's retransmission timer off (1, 2, 4, 8, 16 s) past the usual 20 s.
        guard let r = await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), payload, timeout: 60) else { return "the bridge refused the connection" }
        let took = String(format: "%.1f s", Date().timeIntervalSince(start))
        if !r.clean { return "\(r.bytes.count) of \(count) bytes back, then a timeout or reset after \(took)" }
        if Host.sha(r.bytes) != Host.sha(payload) { return "\(r.bytes.count) of \(count) bytes back in \(took), not what was sent" }
        return nil
    }

    /// The status file's JSON.
    private static func status(_ path: String) -> [String: Any] {
        guard let d = FileManager.default.contents(atPath: path), let j = try? JSONSerialization.jsonObject(with: d) as? [String: Any] else { return [:] }
        return j
    }

    /// `run` on the raw TCP port: the link, a mebibyte through a bridge, ser2net restarted and
    /// the link back (`--persist`), and its counters on the status file.
    @Test func aRawTCPLineCarriesTheLinkAndComesBackAfterTheServerRestarts() async throws {
        let rig = try await DeviceServerRig()
        defer { rig.cleanUp() }
        let (dir, simulator, server) = (rig.directory, rig.simulator, rig.server)
        let status = dir + "/status.json"
        let bridge = try BridgeProcess(["--device", "tcp:127.0.0.1:\(server.rawPort)", "--bridge", "host:\(simulator.echoPort)", "--no-dns-relay",
                                        "--persist", "--status-json", status], capture: false)
        defer { bridge.cleanUp() }
        #expect(await eventually(30) { bridge.has("bridge host→terminal on port \(simulator.echoPort)") }, "\(bridge.output)")
        #expect(await Self.exchange(simulator.echoPort, 1 << 20, seed: 11) == nil, "1 MiB through the bridge over ser2net")

        // The device server goes away and comes back: the link ends as a hang-up and opens again.
        await server.stop()
        #expect(await eventually(15) { bridge.has("the server closed the connection") }, "\(bridge.output)")
        try await server.start()
        #expect(await eventually(40) { bridge.output.components(separatedBy: "bridge host→terminal on port \(simulator.echoPort)").count >= 3 },
                "\(bridge.output)")
        #expect(await Self.exchange(simulator.echoPort, 64 * 1024, seed: 12) == nil, "data through the link made again")
        #expect(await eventually(5) { Self.status(status)["state"] as? String == "open" })
        #expect(await bridge.terminate() == 0)
        await server.stop()
        print("ser2net raw: \(bridge.output.split(separator: "\n").filter { $0.contains("tcp:") || $0.contains("closed") || $0.contains("reopening") }.joined(separator: " | "))")
    }

    /// `run` on the RFC 2217 port: our settings reach the pty through ser2net (its termios
    /// says the speed we asked for), the server's answers are on the status file, and a
    /// mebibyte goes through a bridge.
    @Test func anRFC2217LineSetsThePortAndCarriesTheLink() async throws {
        let rig = try await DeviceServerRig()
        defer { rig.cleanUp() }
        let (dir, simulator, device, server) = (rig.directory, rig.simulator, rig.device, rig.server)
        let status = dir + "/status.json"
        let bridge = try BridgeProcess(["--device", "rfc2217:127.0.0.1:\(server.telnetPort)", "--speed", "57600", "--bridge", "host:\(simulator.echoPort)",
                                        "--no-dns-relay", "--persist", "--status-json", status], capture: false)
        defer { bridge.cleanUp() }
        #expect(await eventually(30) { bridge.has("bridge host→terminal on port \(simulator.echoPort)") }, "\(bridge.output)")
        #expect(bridge.has("COM-PORT-OPTION taken; set 57600 8N1"), "\(bridge.output)")
        var port: [String: Any] = [:]
        #expect(await eventually(5) {
            port = Self.status(status)["rfc2217"] as? [String: Any] ?? [:]
            return port["baud"] as? Int == 57600
        }, "\(Self.status(status))")
        #expect(port["data_bits"] as? Int == 8 && port["parity"] as? Int == 1 && port["stop_bits"] as? Int == 1)
        let stty = try await runCommand("/bin/stty", ["-F", device], timeout: 10)
        #expect(stty.output.contains("speed 57600 baud"), "\(stty.output)")
        #expect(await Self.exchange(simulator.echoPort, 1 << 20, seed: 13) == nil, "1 MiB through the bridge over RFC 2217")
        #expect(await bridge.terminate() == 0)
        await server.stop()
        print("ser2net rfc2217: the server answered \(port); the pty: \(stty.output.split(separator: ";").first ?? "")")
    }

    /// A `serve` file naming a raw or an RFC 2217 line: the terminal opens, and data goes
    /// through (over RFC 2217 the server's answers are in its status).
    @Test(arguments: ["tcp", "rfc2217"]) func aServeFileOnANetworkLine(kind: String) async throws {
        let rig = try await DeviceServerRig()
        defer { rig.cleanUp() }
        let (dir, simulator, server) = (rig.directory, rig.simulator, rig.server)
        let conf = dir + "/conf"
        try FileManager.default.createDirectory(atPath: conf, withIntermediateDirectories: true)
        let control = dir + "/control"
        let port = kind == "tcp" ? server.rawPort : server.telnetPort
        try "device \(kind):127.0.0.1:\(port)\nspeed 115200\nbridge host:\(simulator.echoPort)\nholdoff 1\n"
            .write(toFile: conf + "/lane1.conf", atomically: true, encoding: .utf8)
        chmod(conf + "/lane1.conf", 0o600)
        let serve = try ChildProcess(BridgeProcess.binary, ["serve", "--config", conf, "--control", control], output: dir + "/serve.log")
        defer {
            serve.signal(SIGTERM)
            _ = serve.waitBlocking(10)
            serve.reap()
        }
        var list = ""
        #expect(await eventually(30) {
            list = (try? String(contentsOfFile: dir + "/serve.log", encoding: .utf8)) ?? ""
            return list.contains("lane1: open, ")
        }, "\(list)")
        #expect(await Self.exchange(simulator.echoPort, 256 * 1024, seed: 14) == nil, "data through a served \(kind) line")
        let ctl = try await runCommand(BridgeProcess.binary, ["ctl", "--control", control, "status", "lane1"], timeout: 10)
        if kind == "rfc2217" {
            #expect(ctl.output.contains("\"rfc2217\":{") && ctl.output.contains("\"baud\":115200"), "\(ctl.output)")
        } else {
            #expect(ctl.output.contains("\"state\":\"open\"") && !ctl.output.contains("\"rfc2217\""), "\(ctl.output)")
        }
        await server.stop()
    }
}
