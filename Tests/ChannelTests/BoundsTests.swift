import Foundation
import Glibc
import NetStack
import PPP
import Testing
@testable import Channel
import ChannelTestSupport

/// The terminal's end of a pty driven by the test itself: a PPP link and an IP stack whose
/// bytes the test reads only when it chooses, so it can flood the line and never read, or
/// hold a handshake half-open.
final class ScriptedTerminal {
    let line: SerialLine
    var link = PPPLink(configuration: .terminal(), random: SplitMix64(seed: 7))
    var stack: IPStack?
    var result: IPCPResult?
    /// What the stack reported (echo replies, connection events), for the test to look at.
    var events: [StackEvent] = []
    private var unsent: [UInt8] = []
    private var buffer = [UInt8](repeating: 0, count: 65536)

    init(linkedAt path: String) throws {
        line = try SerialLine(ptyLinkedAt: path)
        link.open(now: monotonicNow())
    }

    var unsentBytes: Int { unsent.count }

    /// One round: reads what the line has (when `reading`), runs the timers, writes what is due.
    func turn(reading: Bool = true) {
        let now = monotonicNow()
        while reading {
            let n = read(line.descriptor, &buffer, buffer.count)
            guard n > 0 else { break }
            line.peerAttached()
            link.receive(Array(buffer[0..<n]), now: now)
        }
        if let p = link.pollAt, p <= now { link.poll(now: now) }
        for e in link.takeEvents() {
            guard case let .ipcpOpened(r) = e else { continue }
            result = r
            stack = IPStack(configuration: IPStackConfiguration(address: r.localAddress), seed: 9)
        }
        let packets = link.takeReceivedIPPackets()
        if var s = stack {
            for p in packets { s.receive(packet: p, now: now) }
            if let p = s.pollAt, p <= now { s.poll(now: now) }
            for p in s.takeOutgoing() { link.send(ipPacket: p, now: now) }
            events += s.takeEvents()
            stack = s
        }
        unsent += link.takeTransmit()
        flush()
    }

    /// Queues bytes for the line as they are (frames the test built).
    func send(raw bytes: [UInt8]) {
        unsent += bytes
        flush()
    }

    private func flush() {
        guard !unsent.isEmpty else { return }
        let n = unsent.withUnsafeBytes { write(line.descriptor, $0.baseAddress, $0.count) }
        if n > 0 { unsent.removeFirst(n) }
    }

    /// Turns until `done` or `timeout`; true when `done`.
    @discardableResult
    func run(for timeout: Duration, reading: Bool = true, until done: () -> Bool) -> Bool {
        let end = monotonicNow() + timeout
        while monotonicNow() < end {
            turn(reading: reading)
            if done() { return true }
            usleep(1000)
        }
        return false
    }

    /// An LCP Echo-Request frame (RFC 1661 §5.8) with `size` bytes of data after the magic number.
    func echoRequestFrame(identifier: UInt8, size: Int) throws -> [UInt8] {
        let data = BigEndian.bytes(link.lcp.policy.result.localMagic) + (0..<size).map { UInt8(truncatingIfNeeded: $0) }
        return link.encoder.encode(protocol: ProtocolNumber.lcp, information: try ControlPacket(code: ControlCode.echoRequest, identifier: identifier, data: data).emit())
    }

    /// An ICMP echo request to `target`, framed for the line.
    func pingFrame(_ target: IPv4Address, sequence: UInt16, size: Int) -> [UInt8] {
        let now = monotonicNow()
        stack?.ping(target, identifier: 0x4242, sequence: sequence, payload: [UInt8](repeating: 0x5A, count: size), now: now)
        for p in stack?.takeOutgoing() ?? [] { link.send(ipPacket: p, now: now) }
        return link.takeTransmit()
    }
}

/// A terminal application that accepts every connection on `port` and never reads: its
/// window closes once its receive buffer is full, and stays closed.
final class ClosedWindowSink: StackApplication {
    let port: UInt16
    private(set) var accepted: [ConnectionID] = []
    init(port: UInt16) { self.port = port }
    func start(_ host: StackAttachment, now: Instant) { try? host.listen(port: port, for: self) }
    func stop() { accepted = [] }
    func acceptable(port: UInt16, now: Instant) {}
    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {}
    func step(now: Instant) {}
}

extension ClosedWindowSink {
    /// Takes what finished its handshake (and reads nothing).
    func take(from host: StackAttachment) {
        while let id = host.accept(port: port, for: self) { accepted.append(id) }
    }
}

@Suite(.serialized, .timeLimit(.minutes(5)))
struct BoundsTests {
    private static func directory() throws -> String {
        let d = NSTemporaryDirectory() + "pppbridge-bounds-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    /// A channel on `path` and a scripted terminal on its other end, up to IPCP on both.
    private static func scripted(_ path: String, configure: (inout ChannelConfiguration) -> Void = { _ in }) throws -> (Channel, ScriptedTerminal) {
        let terminal = try ScriptedTerminal(linkedAt: path)
        var c = ChannelConfiguration(line: .device(path))
        c.link.negotiation.restartInterval = .seconds(1)
        c.relayDNS = false
        c.socks = nil
        configure(&c)
        let channel = Channel(configuration: c)
        try channel.start()
        let up = terminal.run(for: .seconds(20)) { terminal.result != nil && channel.isOpen }
        try #require(up, "the link did not come up")
        return (channel, terminal)
    }

    @Test func theLineQueueStaysBoundedAgainstAPeerThatFloodsAndNeverReads() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let limit = 64 * 1024
        let (channel, terminal) = try Self.scripted(directory + "/line") { $0.lineQueueLimit = limit }
        let ours = try #require(channel.currentAddresses?.ip)
        // A burst of valid LCP Echo-Requests and ICMP echo requests, each answered in full.
        var burst: [UInt8] = []
        for i in 0..<64 {
            burst += try terminal.echoRequestFrame(identifier: UInt8(i), size: 16)
            burst += terminal.pingFrame(ours, sequence: UInt16(i), size: 1400)
        }
        // Flood for three seconds without reading a byte of the answers.
        let end = monotonicNow() + .seconds(3)
        var written = 0
        while monotonicNow() < end {
            if terminal.unsentBytes < burst.count {
                terminal.send(raw: burst)
                written += burst.count
            } else {
                terminal.turn(reading: false)
                usleep(500)
            }
        }
        let flooded = channel.status.lineQueue
        print("flood: offered \(written) B; \(flooded)")
        // The control reserve (16 KiB) is the most the queue may hold beyond the limit.
        #expect(flooded.peak <= limit + 16 * 1024, "\(flooded)")
        #expect(flooded.droppedPackets > 0)
        #expect(flooded.readPauses > 0)
        // The flood backed up on the terminal's side: the line is not read while our queue is full.
        #expect(terminal.unsentBytes > 0, "the whole flood (\(written) B) was taken")

        // The peer reads again: the queue drains, and the link still answers a ping.
        let drained = terminal.run(for: .seconds(20)) { channel.status.lineQueue.queued == 0 }
        #expect(drained)
        terminal.events.removeAll()
        terminal.send(raw: terminal.pingFrame(ours, sequence: 9999, size: 56))
        let answered = terminal.run(for: .seconds(10)) {
            terminal.events.contains { if case .echoReply(_, 0x4242, 9999, _) = $0 { return true } else { return false } }
        }
        #expect(answered)
        #expect(channel.isOpen)
        await channel.close()
    }

    @Test func aBridgeRefusesConnectionsBeyondItsLimitBothWays() async throws {
        let terminalPort = Host.freePort()
        let hostPort = Host.freePort()
        let server = try LoopbackServer(port: hostPort, mode: .hold)
        defer { server.stop() }
        let rig = try PtyRig(echoPorts: [terminalPort]) { $0.bridgeConnectionLimit = 2 }
        let a = try await rig.open()
        try rig.channel.addBridge(.hostToTerminalLocal, port: terminalPort)
        try rig.channel.addBridge(.terminalToHost, port: hostPort)

        // host → terminal: two clients held open, the third reset at once.
        var clients: [Int32] = []
        for _ in 0..<2 {
            guard case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), terminalPort)) else { Issue.record("connect"); return }
            clients.append(fd)
        }
        for _ in 0..<200 where rig.channel.bridgeStatus[0].traffic.active < 2 { try await Task.sleep(for: .milliseconds(25)) }
        #expect(rig.channel.bridgeStatus[0].traffic.active == 2)
        guard case let .success(third) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), terminalPort)) else { Issue.record("connect"); return }
        Host.setTimeout(third, seconds: 10)
        let r = Host.readAll(third)
        close(third)
        #expect(r.bytes.isEmpty && !r.clean, "the third client was not reset")
        #expect(rig.channel.bridgeStatus[0].traffic.refused == 1)
        #expect(rig.channel.bridgeStatus[0].traffic.active == 2)
        // The two still work.
        #expect(Host.sendAll(clients[0], Array("still".utf8)))
        var echo = [UInt8](repeating: 0, count: 5)
        Host.setTimeout(clients[0], seconds: 10)
        #expect(recv(clients[0], &echo, 5, Int32(MSG_WAITALL)) == 5 && echo == Array("still".utf8))
        for c in clients { close(c) }

        // terminal → host: two held by the host server, the third's SYN reset by our stack.
        let target = TCPEndpoint(a.ip, hostPort)
        let held = (0..<2).map { i in Task { await rig.terminal.transfer(to: target, payload: Array("held \(i)".utf8)) } }
        for _ in 0..<200 where server.acceptedCount < 2 { try await Task.sleep(for: .milliseconds(25)) }
        #expect(server.acceptedCount == 2)
        let third2 = await rig.terminal.transfer(to: target, payload: Array("one too many".utf8))
        #expect(third2.outcome == TCPCloseReason.refused.rawValue)
        #expect(rig.channel.status.listenRefusals == 1)
        #expect(server.acceptedCount == 2)
        #expect(rig.channel.report().contains { $0.contains("refused at the limit of 2 1") })
        #expect(rig.channel.report().contains { $0.contains("SYNs reset at a listener's limit 1") })
        server.stop()
        for t in held { #expect(await t.value.outcome == "closed") }
        await rig.cleanUp()
    }

    @Test func removingABridgeLeavesNoHalfOpenOrphanAndThePortWorksAgain() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let hostPort = Host.freePort()
        let server = try LoopbackServer(port: hostPort, mode: .echo)
        defer { server.stop() }
        let (channel, terminal) = try Self.scripted(directory + "/line")
        let ours = try #require(channel.currentAddresses?.ip)
        try channel.addBridge(.terminalToHost, port: hostPort)
        func onPort() -> [String] { channel.report().filter { $0.contains(":\(hostPort) <-> ") } }

        // Three SYNs to the bridge's port; their SYN-ACKs are left unread, so our side holds
        // three handshakes in SYN-RECEIVED.
        let now = monotonicNow()
        for _ in 0..<3 { _ = try terminal.stack?.connect(to: TCPEndpoint(ours, hostPort), now: now) }
        terminal.run(for: .seconds(5), reading: false) { onPort().filter { $0.contains("SYN-RECEIVED") }.count == 3 }
        #expect(onPort().filter { $0.contains("SYN-RECEIVED") }.count == 3, "\(onPort())")
        #expect(channel.removeBridge(.terminalToHost, port: hostPort))

        // The terminal finishes its handshakes now: none may become an established connection
        // that no one reads (they are answered with resets).
        terminal.run(for: .seconds(3)) { false }
        #expect(onPort().isEmpty, "\(onPort())")
        #expect(server.acceptedCount == 0)

        // The port can be bridged again and carries a connection.
        terminal.events.removeAll()
        try channel.addBridge(.terminalToHost, port: hostPort)
        let id = try #require(try terminal.stack?.connect(to: TCPEndpoint(ours, hostPort), now: monotonicNow()))
        let established = terminal.run(for: .seconds(10)) {
            terminal.events.contains(.tcp(id, .established)) && server.acceptedCount == 1
        }
        #expect(established)
        await channel.close()
    }

    @Test func aTerminalHoldingItsWindowShutIsDroppedAfterTheUserTimeout() async throws {
        let port = Host.freePort()
        let rig = try PtyRig { $0.connectionUserTimeout = .seconds(2) }
        let sink = ClosedWindowSink(port: port)
        rig.terminal.loop.sync { rig.terminal.add(sink) }
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminalLocal, port: port)
        guard case let .success(client) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) else { Issue.record("connect"); return }
        // The host sends far more than the terminal's receive buffer; the terminal never reads.
        let sender = Task.detached { () -> Bool in
            Host.setTimeout(client, seconds: 60)
            return Host.sendAll(client, Host.random(8 << 20, seed: 5))
        }
        let started = monotonicNow()
        for _ in 0..<1200 {
            try await Task.sleep(for: .milliseconds(50))
            let t = rig.channel.bridgeStatus[0].traffic
            if t.connections == 1 && t.active == 0 { break }
        }
        let traffic = rig.channel.bridgeStatus[0].traffic
        #expect(traffic.connections == 1 && traffic.active == 0, "still open after \(monotonicNow() - started): \(traffic)")
        #expect(traffic.failures == 1)
        // The host client learns it: its send fails (reset) instead of blocking for ever.
        #expect(await sender.value == false)
        close(client)
        print("user timeout: the bridged connection ended \(monotonicNow() - started) after it opened")
        await rig.cleanUp()
    }

    @Test func chargenGoesOnAfterTheCallersFinUntilItResets() throws {
        // Our stack with chargen, and a caller's stack, wired packet for packet in virtual time.
        let ours = IPv4Address(10, 0, 0, 1), theirs = IPv4Address(10, 0, 0, 2)
        let server = StackAttachment(services: [.chargen], seed: 1) { _ in }
        var now = Instant.seconds(1)
        try server.linkUp(IPCPResult(localAddress: ours, peerAddress: theirs, dnsServers: [], netmask: IPv4Address(255, 255, 255, 255)), mtu: 1500, now: now)
        var caller = IPStack(configuration: IPStackConfiguration(address: theirs), seed: 2)
        let id = try caller.connect(to: TCPEndpoint(ours, 19), now: now)
        var received = 0
        var finished = false
        func exchange(rounds: Int) {
            for _ in 0..<rounds {
                now = now + .milliseconds(1)
                if let p = server.pollAt, p <= now { server.poll(now: now) }
                if let p = caller.pollAt, p <= now { caller.poll(now: now) }
                for p in server.takeOutgoing(now: now) { caller.receive(packet: p, now: now) }
                received += caller.read(id, now: now).count
                for e in caller.takeEvents() where e == .tcp(id, .peerFinished) { finished = true }
                for p in caller.takeOutgoing() { server.receive(packet: p, now: now) }
            }
        }
        exchange(rounds: 50)
        #expect(caller.state(id) == .established)
        // `nc HOST 19 < /dev/null`: the caller half-closes at once, then reads.
        caller.shutdownWrite(id, now: now)
        let sendBuffer = TCPConfiguration().sendBufferSize
        for _ in 0..<200 where received < 4 * sendBuffer && !finished { exchange(rounds: 100) }
        #expect(!finished, "chargen closed after the caller's FIN")
        #expect(received >= 4 * sendBuffer, "got \(received) B")
        // The caller closes for good (a reset, as its kernel sends for data after close): the
        // session ends and our stack forgets the connection.
        caller.abort(id, now: now)
        exchange(rounds: 200)
        #expect(server.stack?.connectionCount == 0)
    }

    @Test func acceptBackoffDoublesFromAHundredMillisecondsToTwoSecondsAndResetsOnAClient() {
        var b = AcceptBackoff()
        let pauses = (0..<7).map { _ in b.failed() }
        #expect(pauses == [.milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600), .seconds(2), .seconds(2)])
        #expect(b.count == 7)
        b.succeeded()
        #expect(b.failed() == .milliseconds(100))
        #expect(b.count == 8)
    }

    @Test func theChannelsDefaultsBoundWhatAPeerCanHold() {
        let c = ChannelConfiguration(line: .device("/dev/null"))
        #expect(c.lineQueueLimit == 256 * 1024)
        #expect(c.bridgeConnectionLimit == 64)
        #expect(c.stackConnectionLimit == 256)
        #expect(c.connectionUserTimeout == .seconds(120))
    }
}
