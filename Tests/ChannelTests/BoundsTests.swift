import Foundation
import Framing
import Glibc
import NetStack
import PPP
import Testing
import TestSupport
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
    /// Every byte read from the line while not nil, in order.
    var received: [UInt8]?
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
            let n = read(line.descriptor.rawValue, &buffer, buffer.count)
            guard n > 0 else { break }
            line.peerAttached()
            received?.append(contentsOf: buffer[0..<n])
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
        let n = unsent.withUnsafeBytes { write(line.descriptor.rawValue, $0.baseAddress, $0.count) }
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

@Suite(.serialized, .timeLimit(.minutes(10)))
struct BoundsTests {
    private static func directory() throws -> String {
        let d = try TemporaryDirectory.make("bounds")
        return d
    }

    /// A channel on `path` and a scripted terminal on its other end, up to IPCP on both.
    private static func scripted(_ path: String, loop: EventLoop = .shared,
                                 configure: (inout ChannelConfiguration) -> Void = { _ in }) throws -> (Channel, ScriptedTerminal) {
        let terminal = try ScriptedTerminal(linkedAt: path)
        var c = ChannelConfiguration(line: .device(path))
        c.link.negotiation.restartInterval = .seconds(1)
        c.relayDNS = false
        c.socks = nil
        configure(&c)
        let channel = Channel(configuration: c, loop: loop)
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
        // The scripted peer is driven in one tight loop on a thread of its own, from the flood to
        // the last ping: a pause between its stages (the test's task waiting for a runner
        // thread under load) would be a peer that stops answering echoes.
        struct Flood { var written: Int; var flooded: LineQueueCounters; var unsentAfterFlood: Int; var drained: Bool; var answered: Bool }
        let r = await offThePool { () -> Flood in
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
            let unsent = terminal.unsentBytes
            // The peer reads again: the queue drains, and the link still answers a ping.
            let drained = terminal.run(for: .seconds(20)) { channel.status.lineQueue.queued == 0 }
            terminal.events.removeAll()
            terminal.send(raw: terminal.pingFrame(ours, sequence: 9999, size: 56))
            let answered = terminal.run(for: .seconds(10)) {
                terminal.events.contains { if case .echoReply(_, 0x4242, 9999, _) = $0 { return true } else { return false } }
            }
            return Flood(written: written, flooded: flooded, unsentAfterFlood: unsent, drained: drained, answered: answered)
        }
        let flooded = r.flooded
        print("flood: offered \(r.written) B; \(flooded)")
        // The control reserve (16 KiB) is the most the queue may hold beyond the limit.
        #expect(flooded.peak <= limit + 16 * 1024, "\(flooded)")
        #expect(flooded.droppedPackets > 0)
        #expect(flooded.readPauses > 0)
        // The flood backed up on the terminal's side: the line is not read while our queue is full.
        #expect(r.unsentAfterFlood > 0, "the whole flood (\(r.written) B) was taken")
        #expect(r.drained)
        let answered = r.answered
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
        _ = await eventually(within: .seconds(5)) { rig.channel.bridgeStatus[0].traffic.active >= 2 }
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
        _ = await eventually(within: .seconds(5)) { server.acceptedCount >= 2 }
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

    @Test func dataThatCameInTheSameLineReadAsAResetStillReachesTheHost() async throws {
        // The terminal writes and resets at once: data segments and the RST leave in one line
        // write, so our stack takes them in one batch and reports the data and the reset
        // together. The host must get the bytes, then the reset.
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let hostPort = Host.freePort()
        let listener = try Host.listener(port: hostPort)
        defer { close(listener) }
        let accepted = Locked(false)
        let received = Locked<(bytes: [UInt8], clean: Bool)?>(nil)
        Thread.detachNewThread {
            let c = accept(listener, nil, nil)
            guard c >= 0 else { return }
            accepted.mutate { $0 = true }
            Host.setTimeout(c, seconds: 30)
            // Its arrival at the terminal shows the channel has the host socket connected.
            _ = Host.sendAll(c, Array("hi".utf8))
            let r = Host.readAll(c)
            close(c)
            received.mutate { $0 = r }
        }
        let (channel, terminal) = try Self.scripted(directory + "/line")
        let ours = try #require(channel.currentAddresses?.ip)
        try channel.addBridge(.terminalToHost, port: hostPort)
        let id = try #require(try terminal.stack?.connect(to: TCPEndpoint(ours, hostPort), now: monotonicNow()))
        let greeted = terminal.run(for: .seconds(10)) { terminal.stack!.readableBytes(id) == 2 }
        try #require(greeted)
        #expect(accepted.value)

        let payload = Host.random(3000, seed: 31)
        let now = monotonicNow()
        // Without Nagle the short last segment leaves before the reset too.
        terminal.stack!.setNagle(id, false, now: now)
        #expect(terminal.stack!.write(id, payload[...], now: now) == payload.count)
        terminal.stack!.abort(id, now: now)
        terminal.turn()
        #expect(terminal.unsentBytes == 0)
        terminal.run(for: .seconds(10)) { received.value != nil }
        let r = try #require(received.value)
        #expect(Host.sha(r.bytes) == Host.sha(payload), "the host got \(r.bytes.count) of \(payload.count) bytes")
        #expect(!r.clean)
        #expect(channel.bridgeStatus[0].traffic.failures == 1)
        await channel.close()
    }

    @Test func aTerminalHoldingItsWindowShutIsDroppedAfterTheUserTimeout() async throws {
        let port = Host.freePort()
        // The channel's loop on a clock the test moves ahead: the user timeout falls due when
        // the test says, not after seconds of waiting.
        let clock = LeapingClock()
        let loop = try EventLoop(clock: clock)
        try loop.startThread()
        let rig = try PtyRig(loop: loop) { $0.connectionUserTimeout = .seconds(2) }
        let sink = ClosedWindowSink(port: port)
        let terminal = rig.terminal
        await terminal.loop.perform { terminal.add(sink) }
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminalLocal, port: port)
        guard case let .success(client) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) else { Issue.record("connect"); return }
        // The host sends far more than the terminal's receive buffer; the terminal never reads.
        let sender = Task.detached { () -> Bool in
            Host.setTimeout(client, seconds: 60)
            return Host.sendAll(client, Host.random(8 << 20, seed: 5))
        }
        let started = clock.now
        func traffic() async -> TrafficCounters { await loop.perform { rig.channel.bridgeStatus[0].traffic } }
        // A quarter of a second at a time: the data fills the terminal's window on real I/O
        // meanwhile, then the window probes go unanswered for the user timeout.
        var leaps = 0
        for _ in 0..<1200 {
            let t = await traffic()
            if t.connections == 1 && t.active == 0 { break }
            clock.leap(by: .milliseconds(250))
            await loop.fullTurn()
            leaps += 1
            try await Task.sleep(for: .milliseconds(20))
        }
        let counters = await traffic()
        #expect(counters.connections == 1 && counters.active == 0, "still open after \(clock.now - started): \(counters)")
        #expect(counters.failures == 1)
        // Not before the timeout: the data went unacknowledged for it after the bridge opened.
        #expect(clock.now - started >= .seconds(2), "dropped after \(clock.now - started)")
        // The host client learns it: its send fails (reset) instead of blocking for ever.
        #expect(await sender.value == false)
        close(client)
        print("user timeout: the bridged connection ended \(clock.now - started) after it opened (\(leaps) leaps of 250 ms)")
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
        // Sized from the line's speed when the line is open (see the next tests).
        #expect(c.lineQueueLimit == nil)
        #expect(c.bridgeConnectionLimit == 64)
        #expect(c.stackConnectionLimit == 256)
        #expect(c.connectionUserTimeout == .seconds(120))
    }
}

/// The line's output queue against LCP keep-alive: control frames go ahead of IP data, and the
/// queue holds about two seconds of line time, so echoes are neither stuck behind a bulk
/// transfer nor their replies left unread for long (RFC 1661 §5.8).
extension BoundsTests {
    @Test func theDefaultLineQueueLimitIsTwoSecondsOfLineTimeWithAFloorAndAPtyKeeps256KiB() throws {
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 115_200) == 23040)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 921_600) == 184_320)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 4_000_000) == 800_000)
        // 9600 baud: 1920 B would not hold two full-size frames; the floor does.
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: 9600) == 8192)
        #expect(LineFlowControl.defaultLimit(bitsPerSecond: nil) == 256 * 1024)

        // A pty ignores its speed: both its ends, created or opened as a device, have none.
        var slow = SerialLine.Options()
        slow.speed = 9600
        let pty = try SerialLine(ptyLinkedAt: nil, options: slow)
        defer { pty.close() }
        #expect(pty.bitsPerSecond == nil)
        let path = try #require(pty.peerPath)
        let device = try SerialLine(device: path)
        defer { device.close() }
        #expect(device.bitsPerSecond == nil)
        let session = LinkSession(line: device, link: PPPLink(configuration: .terminal(), random: SplitMix64(seed: 1))) { _ in }
        #expect(session.lineQueueLimit == 256 * 1024)
        // A socket has none either.
        var pair: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        close(pair[1])
        let socket = try SerialLine(descriptor: FileDescriptor(pair[0]))
        defer { socket.close() }
        #expect(socket.bitsPerSecond == nil)
    }

    @Test func anOverriddenLineQueueLimitIsCappedSoTheReserveCannotOverflow() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Int.max plus the control reserve overflowed (a trap) on the first frame queued.
        let (channel, terminal) = try Self.scripted(directory + "/line") { $0.lineQueueLimit = Int.max }
        #expect(channel.status.lineQueue.limit == LineFlowControl.maximumLimit)
        // Frames both ways after the limit was set: a ping is answered.
        let ours = try #require(channel.currentAddresses?.ip)
        terminal.send(raw: terminal.pingFrame(ours, sequence: 1, size: 56))
        let answered = terminal.run(for: .seconds(10)) {
            terminal.events.contains { if case .echoReply(_, 0x4242, 1, _) = $0 { return true } else { return false } }
        }
        #expect(answered)
        #expect(LineFlowControl.maximumLimit == 64 << 20)
        await channel.close()

        let line = try SerialLine(ptyLinkedAt: nil)
        defer { line.close() }
        let session = LinkSession(line: line, link: PPPLink(configuration: .terminal(), random: SplitMix64(seed: 1))) { _ in }
        session.lineQueueLimit = 0
        #expect(session.lineQueueLimit == LineFlowControl.minimumLimit)
    }

    /// A TUN descriptor is watched only when a read can take something: with the queue at its
    /// limit by control frames alone (a peer flooding Echo-Requests, reading nothing), not at
    /// all, or the loop would spin on a readable descriptor whose handler reads nothing.
    @Test func aFastSourceIsReadOnlyWhenThereIsRoomForWhatItReads() {
        let encoder = HDLCEncoder()
        var queue = LineOutputQueue()
        #expect(queue.sourceMayRead(limit: 4096, largestPacket: 1500))
        // A limit below the MTU: one packet at a time while no IP data is queued.
        #expect(queue.sourceMayRead(limit: 4096, largestPacket: 16384))
        // Echo-Replies up to the limit and beyond (the control reserve), no IP data.
        while queue.count < 4096 + 100 {
            queue.append(control: encoder.encode(protocol: ProtocolNumber.lcp, information: [10, 1, 0, 8] + [UInt8](repeating: 0, count: 600)))
        }
        #expect(queue.dataCount == 0)
        #expect(!queue.sourceMayRead(limit: 4096, largestPacket: 1500))
        #expect(!queue.sourceMayRead(limit: 4096, largestPacket: 16384))
        // With IP data queued, a read needs room for the largest packet.
        var data = LineOutputQueue()
        data.append(dataFrame: encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8](repeating: 1, count: 3000)))
        #expect(!data.sourceMayRead(limit: 4096, largestPacket: 1500))
        #expect(data.sourceMayRead(limit: 8192, largestPacket: 1500))
    }

    /// IP data of flag bytes doubles on the line; control frames still fit in their reserve.
    @Test func escapedIPDataDoesNotCrowdOutControlFrames() {
        let encoder = HDLCEncoder()
        var queue = LineOutputQueue()
        for _ in 0..<12 {
            queue.append(dataFrame: encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8](repeating: 0x7E, count: 1000)))
        }
        // Past the limit and the reserve together: the whole queue would leave no room.
        #expect(queue.dataCount > 4096 + 16 * 1024)
        #expect(queue.controlFits(1000, limit: 4096, reserve: 16 * 1024))
        queue.append(control: [UInt8](repeating: 0x7E, count: 16 * 1024))
        #expect(!queue.controlFits(1000, limit: 4096, reserve: 16 * 1024))
    }

    /// A queue kept busy past its first 64 KiB written: frames appended from then on wait
    /// behind what is left (nothing written is moved to make room), and the line still gets
    /// every frame whole, in order.
    @Test func aQueueKeptBusyWritesEveryFrameInOrder() {
        let encoder = HDLCEncoder()
        var queue = LineOutputQueue()
        var line: [UInt8] = []
        var sent: [[UInt8]] = []
        var state: UInt64 = 7
        func next(_ bound: Int) -> Int {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Int((state >> 33) % UInt64(bound))
        }
        while line.count < 700_000 {
            while queue.dataCount < 100_000 {
                let information = [UInt8](repeating: UInt8(truncatingIfNeeded: sent.count), count: 40 + next(1400))
                sent.append(information)
                #expect(queue.appendDataFrame { out in
                    encoder.encode(protocol: ProtocolNumber.ipv4, information: information, into: &out)
                    return true
                })
            }
            Self.write(&queue, upTo: 1 + next(6000), onto: &line)
        }
        while queue.count > 0 { Self.write(&queue, upTo: 4096, onto: &line) }
        #expect(queue.dataStored == 0)
        var decoder = HDLCDecoder()
        let frames = decoder.decode(line)
        #expect(frames.count == sent.count)
        #expect(frames.map(\.information) == sent)
        #expect(decoder.counters.droppedFrames == 0)
    }

    /// A kernel that takes at most `n` bytes of what the queue offers, onto `line`.
    static func write(_ queue: inout LineOutputQueue, upTo n: Int, onto line: inout [UInt8]) {
        let chunk = queue.next
        let taken = min(n, chunk.count)
        line += chunk.prefix(taken)
        queue.written(taken)
    }

    @Test func aControlFrameQueuedBehindIPDataIsWrittenFirstButNeverInsideAFrameBegun() throws {
        let encoder = HDLCEncoder()
        let ip = (0..<3).map { i in encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8](repeating: UInt8(i), count: 1000)) }
        let echo = encoder.encode(protocol: ProtocolNumber.lcp, information: [9, 1, 0, 8, 0xDE, 0xAD, 0xBE, 0xEF])
        var queue = LineOutputQueue()
        for f in ip { queue.append(dataFrame: f) }
        var line: [UInt8] = []
        func write(upTo n: Int) { Self.write(&queue, upTo: n, onto: &line) }
        write(upTo: 300)
        // The Echo-Request arrives with 2700 B of IP data queued, 300 B of the first frame on the line.
        queue.append(control: echo)
        #expect(queue.count == ip.map(\.count).reduce(0, +) - 300 + echo.count)
        // Offered next: only the rest of the frame begun, taken in two writes.
        #expect(queue.next.count == ip[0].count - 300)
        write(upTo: 200)
        #expect(queue.next.count == ip[0].count - 500)
        write(upTo: 10_000)
        // Then the echo, ahead of the two IP frames queued before it.
        #expect(Array(queue.next) == echo)
        write(upTo: 5)
        write(upTo: 10_000)
        write(upTo: 10_000)
        #expect(queue.isEmpty)

        var decoder = HDLCDecoder()
        let frames = decoder.decode(line)
        #expect(frames.map(\.protocol) == [ProtocolNumber.ipv4, ProtocolNumber.lcp, ProtocolNumber.ipv4, ProtocolNumber.ipv4])
        #expect(frames.map { $0.information.first } == [0, 9, 1, 2])
        #expect(decoder.counters.droppedFrames == 0)
    }

    /// A queue kept full while the line takes odd amounts: what is written is compacted away
    /// (the array never holds much more than twice what is queued, plus 64 KiB), and the line
    /// carries every frame whole and in order, control frames never inside an IP frame begun.
    @Test func aQueueKeptFullCompactsAndKeepsEveryFrameWhole() throws {
        let encoder = HDLCEncoder()
        var queue = LineOutputQueue()
        var line: [UInt8] = []
        var rng = SplitMix64(seed: 5)
        var sent = 0
        var expected: [(ProtocolNumber, UInt8)] = []
        var mostStored = 0
        var mostQueued = 0
        while sent < 1200 || !queue.isEmpty {
            // Topped up to about 200 KiB with frames of 40 to 1500 bytes (some of flags, escaped).
            while sent < 1200 && queue.count < 200 * 1024 {
                let length = 40 + Int(rng.next() % 1461)
                let fill = sent % 7 == 0 ? 0x7E : UInt8(truncatingIfNeeded: sent)
                let frame = encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8(truncatingIfNeeded: sent)] + [UInt8](repeating: fill, count: length - 1))
                queue.append(dataFrame: frame)
                expected.append((ProtocolNumber.ipv4, UInt8(truncatingIfNeeded: sent)))
                sent += 1
                if sent % 97 == 0 {
                    // An Echo-Request queued behind the data: it goes out at the next frame boundary.
                    queue.append(control: encoder.encode(protocol: ProtocolNumber.lcp, information: [9, UInt8(truncatingIfNeeded: sent), 0, 8, 1, 2, 3, 4]))
                }
            }
            mostQueued = max(mostQueued, queue.count)
            Self.write(&queue, upTo: 1 + Int(rng.next() % 5000), onto: &line)
            mostStored = max(mostStored, queue.dataStored)
        }
        #expect(mostStored <= 2 * mostQueued + 64 * 1024 + 5000)
        #expect(line.count > 900_000, "enough passed through for several compactions")
        var decoder = HDLCDecoder()
        let frames = decoder.decode(line)
        #expect(decoder.counters.droppedFrames == 0)
        let ip = frames.filter { $0.protocol == ProtocolNumber.ipv4 }
        #expect(ip.count == expected.count)
        #expect(ip.map { $0.information.first } == expected.map { $0.1 })
        #expect(frames.filter { $0.protocol == ProtocolNumber.lcp }.count == 1200 / 97)
    }

    /// Frames encoded straight into the queue share their flags (RFC 1662 §4.1) and keep
    /// their boundaries: a control frame still waits for the end of the frame begun.
    @Test func framesEncodedIntoTheQueueShareFlagsAndKeepTheirBoundaries() throws {
        let encoder = HDLCEncoder()
        let echo = encoder.encode(protocol: ProtocolNumber.lcp, information: [9, 1, 0, 8, 0xDE, 0xAD, 0xBE, 0xEF])
        var queue = LineOutputQueue()
        for i in 0..<3 {
            let appended = queue.appendDataFrame { out in
                encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8](repeating: UInt8(i), count: 500), into: &out)
                return true
            }
            #expect(appended)
        }
        #expect(!queue.appendDataFrame { _ in false })
        let one = encoder.encode(protocol: ProtocolNumber.ipv4, information: [UInt8](repeating: 0, count: 500))
        #expect(queue.dataCount == 3 * one.count - 2, "the second and third frames open on the flag before them")
        var line: [UInt8] = []
        func write(upTo n: Int) { Self.write(&queue, upTo: n, onto: &line) }
        write(upTo: 100)
        queue.append(control: echo)
        #expect(queue.next.count == one.count - 100)
        while !queue.isEmpty { write(upTo: 10_000) }
        var decoder = HDLCDecoder()
        let frames = decoder.decode(line)
        #expect(frames.map(\.protocol) == [ProtocolNumber.ipv4, ProtocolNumber.lcp, ProtocolNumber.ipv4, ProtocolNumber.ipv4])
        #expect(frames.map { $0.information.first } == [0, 9, 1, 2])
        #expect(frames.map(\.information.count) == [500, 8, 500, 500])
        #expect(decoder.counters.droppedFrames == 0)
    }

    @Test func anEchoRequestGeneratedWhileTheLineQueueHoldsIPDataIsWrittenBeforeThatData() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // An Echo-Request a second, so some are due while the queue is full; four missed in a
        // row (4 s) would end the link, longer than the terminal stops reading here. The
        // channel's loop is on a clock the test moves ahead: the echoes fall due when it says.
        let clock = LeapingClock()
        let loop = try EventLoop(clock: clock)
        try loop.startThread()
        let (channel, terminal) = try Self.scripted(directory + "/line", loop: loop) { $0.link.echo.interval = .seconds(1) }
        let ours = try #require(channel.currentAddresses?.ip)
        // The line is a pty: no speed, the unpaced limit.
        #expect(channel.status.lineQueue.limit == 256 * 1024)

        // 150 pings of 1400 B, all read by us (their replies, about 215 KB, stay under the
        // limit, so nothing is dropped and reading never pauses); the terminal reads nothing,
        // so what the pty does not hold waits in our queue.
        var burst: [UInt8] = []
        for i in 0..<150 { burst += terminal.pingFrame(ours, sequence: UInt16(i), size: 1400) }
        // One tight loop on a thread of its own from the burst to the last read: a pause between
        // stages (the test's task waiting for a runner thread under load) would add to the time
        // the terminal does not read, and four missed echoes end the link.
        struct Stages { var sent: Bool; var queuedDuringWait: Int; var read: Bool }
        let r = await offThePool { () -> Stages in
            terminal.send(raw: burst)
            terminal.run(for: .seconds(5), reading: false) { terminal.unsentBytes == 0 }
            let sent = terminal.unsentBytes == 0
            // Two echo intervals without reading: two Echo-Requests fall due and are queued.
            terminal.received = []
            var queued = channel.status.lineQueue.queued
            for _ in 0..<2 {
                clock.leap(by: .seconds(1))
                // A whole turn after the leap took the echo timer (and wrote what the pty
                // holds); two posted calls could both run in a turn that read the time before
                // the leap, and the next leap then came before the echo's new deadline.
                loop.waitForFullTurn()
                terminal.turn(reading: false)
                queued = min(queued, channel.status.lineQueue.queued)
            }
            // The terminal reads it all (and answers the echoes).
            let read = terminal.run(for: .seconds(10)) {
                terminal.events.filter { if case .echoReply(_, 0x4242, _, _) = $0 { return true } else { return false } }.count >= 150
            }
            return Stages(sent: sent, queuedDuringWait: queued, read: read)
        }
        try #require(r.sent)
        try #require(r.queuedDuringWait >= 64 * 1024, "the pty took the replies; nothing waited in our queue")
        let read = r.read
        #expect(read)
        var decoder = HDLCDecoder()
        let frames = decoder.decode(terminal.received ?? [])
        // For each of our Echo-Requests, the IP bytes that came after it.
        var ipAfterEachEcho: [Int] = []
        for f in frames {
            if f.protocol == ProtocolNumber.lcp && f.information.first == ControlCode.echoRequest.rawValue {
                ipAfterEachEcho.append(0)
            } else if f.protocol == ProtocolNumber.ipv4 {
                for i in ipAfterEachEcho.indices { ipAfterEachEcho[i] += f.information.count }
            }
        }
        print("echo requests with IP bytes after them: \(ipAfterEachEcho); queue at least \(r.queuedDuringWait) B while they were due")
        // In one queue they would all come after the replies queued before them (at most one,
        // due while the burst was being answered, could precede some). Ahead of the data,
        // those due in the wait pass the whole backlog.
        #expect(ipAfterEachEcho.filter { $0 >= 48 * 1024 }.count >= 2, "\(ipAfterEachEcho)")
        #expect(channel.isOpen)
        await channel.close()
    }
}
