import Dispatch
import Foundation
import Glibc
import NetStack
import PPP
import Simulation
import Testing
import TestSupport
@testable import Channel
import ChannelTestSupport

/// A channel (host role) and a simulated terminal (our stack in terminal role) on the two
/// ends of a pty pair, the terminal on the process's event loop, the channel on it too unless
/// a test gives one of its own (on a `LeapingClock`, to move the channel's timers ahead).
final class PtyRig: @unchecked Sendable {
    let directory: String
    let linePath: String
    var terminal: SimulatedTerminal
    let channel: Channel
    let echoPorts: [UInt16]

    init(echoPorts: [UInt16] = [], loop: EventLoop = .shared, configure: (inout ChannelConfiguration) -> Void = { _ in }) throws {
        directory = try TemporaryDirectory.make("channel")
        linePath = directory + "/line"
        self.echoPorts = echoPorts
        terminal = try SimulatedTerminal(line: .pty(linkedAt: linePath), echoPorts: echoPorts)
        try terminal.start()
        var c = ChannelConfiguration(line: .device(linePath))
        c.link.negotiation.restartInterval = .seconds(1)
        c.relayDNS = false
        configure(&c)
        channel = Channel(configuration: c, loop: loop)
    }

    /// A new terminal on a new pty at the same path (the old one hung up or stopped).
    func replaceTerminal() throws {
        terminal = try SimulatedTerminal(line: .pty(linkedAt: linePath), echoPorts: echoPorts)
        try terminal.start()
    }

    /// Opens the channel and waits until the terminal's side is up too.
    func open() async throws -> ChannelAddresses {
        let a = try await channel.open()
        _ = await terminal.waitUntilUp()
        return a
    }

    func cleanUp() async {
        await channel.close()
        await terminal.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

@Suite(.serialized, .timeLimit(.minutes(5)))
struct ChannelTests {
    @Test func bridgesCarryOneMebibyteEachWayWithHalfClose() async throws {
        let terminalPort = Host.freePort()
        let hostPort = Host.freePort()
        let rig = try PtyRig(echoPorts: [terminalPort])
        let server = try LoopbackServer(port: hostPort, mode: .echo)
        defer { server.stop() }
        let addresses = try await rig.open()
        #expect(addresses.terminalIP == IPv4Address(192, 168, 53, 2))
        #expect(rig.channel.ip == "192.168.53.1")
        try rig.channel.addBridge(.hostToTerminal, port: terminalPort)
        try rig.channel.addBridge(.terminalToHost, port: hostPort)
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30))
            for l in rig.channel.report() { print("channel:", l) }
            for l in rig.terminal.report() { print("terminal:", l) }
        }
        defer { watchdog.cancel() }

        // host → terminal: a host client through the bridge to the terminal's echo; the client
        // half-closes after sending and still gets every byte back.
        let up = Host.random(1 << 20, seed: 1)
        let echoed = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), terminalPort), up))
        #expect(echoed.clean)
        #expect(Host.sha(echoed.bytes) == Host.sha(up))

        // terminal → host: the terminal connects to our PPP address, the bridge to the host's echo.
        let down = Host.random(1 << 20, seed: 2)
        let r = await rig.terminal.transfer(to: TCPEndpoint(addresses.ip, hostPort), payload: down)
        #expect(r.outcome == "closed")
        #expect(r.sent == down.count)
        #expect(Host.sha(r.received) == Host.sha(down))

        let status = rig.channel.bridgeStatus
        #expect(status.map(\.traffic.bytesToTerminal) == [1 << 20, 1 << 20])
        #expect(status.map(\.traffic.bytesToHost) == [1 << 20, 1 << 20])
        #expect(status.map(\.traffic.connections) == [1, 1])
        await rig.cleanUp()
    }

    @Test func oneBridgeCarriesManyConnectionsAtOnce() async throws {
        let port = Host.freePort()
        let rig = try PtyRig(echoPorts: [port])
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminal, port: port)
        let results = await withTaskGroup(of: Bool.self) { group in
            for i in 0..<25 {
                group.addTask {
                    let payload = Host.random(40_000 + i * 997, seed: UInt64(100 + i))
                    let r = await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), payload)
                    return r?.clean == true && r?.bytes == payload
                }
            }
            var all: [Bool] = []
            for await ok in group { all.append(ok) }
            return all
        }
        #expect(results.count == 25 && results.allSatisfy { $0 })
        if !results.allSatisfy({ $0 }) {
            for l in rig.channel.report() { print("channel:", l) }
            for l in rig.terminal.report() { print("terminal:", l) }
        }
        let traffic = try #require(rig.channel.bridgeStatus.first?.traffic)
        #expect(traffic.connections == 25 && traffic.failures == 0)
        #expect(traffic.bytesToTerminal == (0..<25).reduce(0) { $0 + 40_000 + $1 * 997 })
        await rig.cleanUp()
    }

    @Test func aHostThatDoesNotReadClosesTheTerminalsWindow() async throws {
        let hostPort = Host.freePort()
        // A host server that accepts and never reads, with a small socket buffer.
        let server = try LoopbackServer(port: hostPort, mode: .hold, receiveBuffer: 32 * 1024)
        defer { server.stop() }
        let rig = try PtyRig()
        let a = try await rig.open()
        try rig.channel.addBridge(.terminalToHost, port: hostPort)
        let total = 16 << 20
        let transfer = Task { await rig.terminal.transfer(to: TCPEndpoint(a.ip, hostPort), payload: Host.random(total, seed: 9)) }
        // What our stack took in from the terminal on that connection (its `in` counter), and
        // what of it waits unread in our receive buffer (its `unread`).
        func connection() -> (taken: Int, unread: Int)? {
            rig.channel.report().first { $0.contains(":\(hostPort) <-> ") }.flatMap { line in
                let words = line.split(separator: " ")
                guard let i = words.firstIndex(of: "in"), let u = words.firstIndex(of: "unread"), i + 1 < words.count, u + 1 < words.count,
                      let taken = Int(words[i + 1]), let unread = Int(words[u + 1]) else { return nil }
                return (taken, unread)
            }
        }
        // The terminal is stalled when our receive buffer is full (the window it sees is
        // closed, less than a segment left): the relay stopped reading it because the host's
        // socket took no more.
        let full = TCPConfiguration().receiveBufferSize - 2 * 1460
        // What the terminal had sent when our buffer filled, taken in the same look.
        var second = 0
        let stalled = await eventually(within: .seconds(60)) {
            guard let c = connection(), c.unread >= full else { return false }
            second = c.taken
            return true
        }
        let toHost = rig.channel.bridgeStatus[0].traffic.bytesToHost
        #expect(stalled, "our receive buffer never filled: \(String(describing: connection()))")
        // The host's socket buffers are full; beyond them we hold at most one relay chunk and
        // our receive buffer: the terminal is held by a closed window, not by our memory.
        #expect(second - toHost <= 65536 + TCPConfiguration().receiveBufferSize, "in \(second), to host \(toHost)")
        #expect(second < total)
        print("back-pressure: host not reading; terminal stalled after \(second) B (host socket took \(toHost) B)")
        await rig.cleanUp()
        _ = await transfer.value
    }

    @Test func everyByteReachesAHostThatClosesItsSideFirstAndReadsLate() async throws {
        // The host answers and half-closes at once, then reads the terminal's 2 MiB slowly:
        // both FINs are through long before the bytes are, and none may be lost.
        let port = Host.freePort()
        let listener = try Host.listener(port: port)
        defer { close(listener) }
        let received = Locked<[UInt8]?>(nil)
        Thread.detachNewThread {
            let c = accept(listener, nil, nil)
            guard c >= 0 else { return }
            Host.setTimeout(c, seconds: 60)
            _ = Host.sendAll(c, Array("bye".utf8))
            shutdown(c, Int32(SHUT_WR))
            usleep(1_500_000)
            let r = Host.readAll(c)
            close(c)
            received.mutate { $0 = r.bytes }
        }
        let rig = try PtyRig()
        let a = try await rig.open()
        try rig.channel.addBridge(.terminalToHost, port: port)
        let payload = Host.random(2 << 20, seed: 21)
        let r = await rig.terminal.transfer(to: TCPEndpoint(a.ip, port), payload: payload)
        #expect(r.received == Array("bye".utf8))
        _ = await eventually(within: .seconds(20)) { received.value != nil }
        #expect(received.value.map(Host.sha) == Host.sha(payload), "host got \(received.value?.count ?? -1) of \(payload.count) bytes")
        _ = await eventually(within: .seconds(5)) { rig.channel.bridgeStatus[0].traffic.active == 0 }
        #expect(rig.channel.bridgeStatus[0].traffic.active == 0)
        await rig.cleanUp()
    }

    @Test func bridgeReturnCodesFollowTheHeader() async throws {
        let rig = try PtyRig()
        // Before the channel is open: -3.
        #expect(throws: BridgeError.couldNotStart) { try rig.channel.addBridge(.hostToTerminal, port: 40000) }
        _ = try await rig.open()
        var ports: [UInt16] = []
        while ports.count < 13 { let p = Host.freePort(); if !ports.contains(p) { ports.append(p) } }
        let kinds: [BridgeKind] = [.hostToTerminal, .hostToTerminalLocal, .terminalToHost]
        for i in 0..<12 { try rig.channel.addBridge(kinds[i % 3], port: ports[i]) }
        #expect(rig.channel.bridgeStatus.count == 12)
        #expect(throws: BridgeError.noMoreBridges) { try rig.channel.addBridge(.hostToTerminal, port: ports[12]) }
        #expect(rig.channel.removeBridge(kinds[0], port: ports[0]))
        // Same port, same side: -2 (host and local both listen on the host).
        #expect(throws: BridgeError.alreadyExists) { try rig.channel.addBridge(.hostToTerminal, port: ports[1]) }
        #expect(throws: BridgeError.alreadyExists) { try rig.channel.addBridge(.terminalToHost, port: ports[2]) }
        // A host port someone else holds: -4.
        let squatter = try LoopbackServer(port: ports[12], mode: .hold, address: IPv4Address(0))
        defer { squatter.stop() }
        #expect(throws: BridgeError.initialisationFailed) { try rig.channel.addBridge(.hostToTerminal, port: ports[12]) }
        #expect(BridgeError.initialisationFailed.rawValue == -4 && BridgeError.noMoreBridges.rawValue == -1)
        // Bridges die with the channel and are not re-created on reopen.
        await rig.channel.close()
        try rig.replaceTerminal()
        _ = try await rig.open()
        #expect(rig.channel.bridgeStatus.isEmpty)
        await rig.cleanUp()
    }

    @Test func rearmedBridgesComeBackOnReopen() async throws {
        let port = Host.freePort()
        let rig = try PtyRig(echoPorts: [port]) { $0.rearmBridgesOnReopen = true }
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminalLocal, port: port)
        await rig.channel.close()
        await rig.terminal.stop()
        try rig.replaceTerminal()
        _ = try await rig.open()
        #expect(rig.channel.bridgeStatus.map(\.port) == [port])
        let r = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), Array("again".utf8)))
        #expect(r.bytes == Array("again".utf8))
        await rig.cleanUp()
    }

    @Test func proxyAllowsFiveOutboundConnectionsAndRefusesTheSixth() async throws {
        let port = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .hold)
        defer { server.stop() }
        let rig = try PtyRig {
            $0.keepAlive = KeepAliveSettings(idleSeconds: 30, probeIntervalSeconds: 7, probeCount: 4)
            $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)]
        }
        let a = try await rig.open()
        let socks = TCPEndpoint(a.ip, 1080)
        let target = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        // Five held open by the server: each gets its SOCKS success and stays connected.
        let group = DispatchGroup()
        let results = Locked<[TransferResult]>([])
        for i in 0..<5 {
            group.enter()
            Task {
                let r = await rig.terminal.transfer(to: target, via: socks, payload: Array("hello \(i)".utf8))
                results.mutate { $0.append(r) }
                group.leave()
            }
        }
        // Wait until all five are relayed.
        _ = await eventually(within: .seconds(5)) { rig.channel.proxyConnections.count >= 5 }
        let open = rig.channel.proxyConnections
        #expect(open.count == 5)
        if open.count != 5 {
            for l in rig.channel.report() { print("channel:", l) }
            for l in rig.terminal.report() { print("terminal:", l) }
            print("results:", results.value.map(\.outcome))
            Issue.record("not five")
            return
        }
        #expect(open.allSatisfy { $0.keepAlive == KeepAliveSettings(idleSeconds: 30, probeIntervalSeconds: 7, probeCount: 4) })
        let sixth = await rig.terminal.transfer(to: target, via: socks, payload: Array("one too many".utf8))
        #expect(sixth.outcome == "socks reply 1")
        #expect(rig.channel.status.proxyRefusals == 1)
        // The server lets go: the five finish cleanly.
        server.stop()
        await withCheckedContinuation { c in group.notify(queue: .global()) { c.resume() } }
        #expect(results.value.count == 5)
        #expect(results.value.allSatisfy { $0.outcome == "closed" })
        #expect(rig.channel.status.proxy?.bytesToHost == (0..<5).reduce(0) { $0 + "hello \($1)".utf8.count })
        await rig.cleanUp()
    }

    @Test func proxyHonoursTheAllowListAndNames() async throws {
        let allowed = Host.freePort()
        let other = Host.freePort()
        let s1 = try LoopbackServer(port: allowed, mode: .echo)
        let s2 = try LoopbackServer(port: other, mode: .echo)
        defer { s1.stop(); s2.stop() }
        // A name entry lets the terminal ask for the name; reaching loopback through it takes the
        // address's entry too (DNS could point the name anywhere).
        let rig = try PtyRig {
            $0.socks?.allow = [SocksDestination(host: "localhost", port: allowed), SocksDestination(host: "127.0.0.1", port: allowed)]
        }
        let a = try await rig.open()
        let socks = TCPEndpoint(a.ip, 1080)
        let ok = await rig.terminal.transfer(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), allowed), via: socks, name: "localhost", payload: Array("by name".utf8))
        #expect(ok.outcome == "closed")
        #expect(ok.received == Array("by name".utf8))
        let refused = await rig.terminal.transfer(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), other), via: socks, payload: Array("no".utf8))
        #expect(refused.outcome == "socks reply 2")
        await rig.cleanUp()
    }

    @Test func dnsQueriesAreRelayedToTheUpstream() async throws {
        // A tiny resolver on loopback that answers every query with 10.9.8.7.
        let port = Host.freePort()
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var a = Host.address(TCPEndpoint(IPv4Address(127, 0, 0, 1), port))
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        Host.setTimeout(fd, seconds: 20)
        let resolver = Thread {
            var buffer = [UInt8](repeating: 0, count: 512)
            var from = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let n = withUnsafeMutablePointer(to: &from) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(fd, &buffer, buffer.count, 0, $0, &length) }
            }
            guard n >= 12 else { return }
            var answer = Array(buffer[0..<n])
            answer[2] = 0x81; answer[3] = 0x80; answer[7] = 1
            answer += [0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 9, 8, 7]
            _ = withUnsafePointer(to: &from) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, answer, answer.count, 0, $0, length) }
            }
        }
        resolver.start()
        defer { close(fd) }
        let rig = try PtyRig {
            $0.relayDNS = true
            $0.dnsUpstream = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        }
        let addresses = try await rig.open()
        let dns = try #require(addresses.dns)
        #expect(dns == addresses.ip)
        // example.test A?
        let query: [UInt8] = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7] + Array("example".utf8) + [4] + Array("test".utf8) + [0, 0, 1, 0, 1]
        let reply = try #require(await rig.terminal.exchangeDatagram(to: TCPEndpoint(dns, 53), payload: query))
        #expect(reply.prefix(2) == [0x12, 0x34])
        #expect(reply.suffix(4) == [10, 9, 8, 7])
        await rig.cleanUp()
    }

    @Test func hangUpClosesEveryBridgedConnectionAndLeaksNothing() async throws {
        let port = Host.freePort()
        let hostPort = Host.freePort()
        let server = try LoopbackServer(port: hostPort, mode: .hold)
        defer { server.stop() }
        let rig = try PtyRig(echoPorts: [port]) {
            $0.link.echo.interval = .seconds(1)
            $0.link.echo.failureLimit = 3
        }
        _ = try await rig.open()
        // The pty the channel holds: resolved now, since the link goes with the terminal.
        let lineDevice = try #require(realpath(rig.linePath, nil).map { p in defer { free(p) }; return String(cString: p) })
        #expect(Host.descriptors(openOn: lineDevice) >= 1)
        try rig.channel.addBridge(.hostToTerminal, port: port)
        try rig.channel.addBridge(.terminalToHost, port: hostPort)
        let events = rig.channel.events()
        // Bridged connections in the middle of transfers: a host client that keeps sending,
        // and a terminal connection the host server holds.
        guard case let .success(client) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) else { Issue.record("connect"); return }
        _ = Host.sendAll(client, Host.random(200_000, seed: 3))
        let held = Task { await rig.terminal.transfer(to: TCPEndpoint(rig.channel.currentAddresses!.ip, hostPort), payload: Host.random(100_000, seed: 4)) }
        _ = await eventually(within: .seconds(5)) { server.acceptedCount >= 1 }
        #expect(server.acceptedCount == 1)
        let hungUp = monotonicNow()
        rig.terminal.hangUp()
        var reason: ChannelCloseReason?
        for await e in events { if case let .closed(r) = e { reason = r; break } }
        let took = monotonicNow() - hungUp
        #expect(reason == .lineHangUp)
        #expect(took < .seconds(3))
        // The host client sees its connection end (reset or end of stream), not a hang.
        let r = Host.readAll(client)
        #expect(!r.clean || r.bytes.count < 200_000)
        close(client)
        _ = await held.value
        #expect(rig.channel.bridgeStatus.isEmpty)
        // No socket of ours is left on either bridge's port: not the listener or a relay's
        // socket on the host→terminal one, not a relay's socket connected to the host server
        // (whose own listener and accepted socket are in this process too, at the local end).
        // Counted by port: suites running beside this one open descriptors of their own.
        #expect(Host.socketsOnPort(port) == 0)
        #expect(Host.socketsOnPort(hostPort, at: .remote) == 0)
        // Nor is the line's pty still open: the channel let go of its descriptor when the
        // line hung up. (The process's whole count is no measure here: suites running beside
        // this one open and hold descriptors of their own for as long as they like.)
        #expect(Host.descriptors(openOn: lineDevice) == 0)

        // Reopen works with a terminal on a fresh line.
        try rig.replaceTerminal()
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminal, port: port)
        let e = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), Array("after".utf8)))
        #expect(e.bytes == Array("after".utf8))
        await rig.cleanUp()
    }

    @Test func aFrozenTerminalIsNoticedByEchoes() async throws {
        let rig = try PtyRig {
            $0.link.echo.interval = .seconds(1)
            $0.link.echo.failureLimit = 2
        }
        _ = try await rig.open()
        let events = rig.channel.events()
        let frozen = monotonicNow()
        rig.terminal.freeze()
        var reason: ChannelCloseReason?
        for await e in events { if case let .closed(r) = e { reason = r; break } }
        #expect(reason == .echoTimeout)
        // Two unanswered echoes a second apart (plus the one in flight): about 3 s, well before
        // anything else would end the link (bounded loosely: a loaded machine runs late).
        #expect(monotonicNow() - frozen < .seconds(15))
        await rig.cleanUp()
    }

    @Test func twoHundredOpenCloseCyclesLeakNothing() async throws {
        let port = Host.freePort()
        let rig = try PtyRig(echoPorts: [port])
        _ = try await rig.open()
        await rig.channel.close()
        await rig.terminal.stop()
        let before = Host.openDescriptors()
        for i in 0..<200 {
            try rig.replaceTerminal()
            _ = try await rig.open()
            try rig.channel.addBridge(.hostToTerminal, port: port)
            if i % 10 == 0 {
                let e = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), port), [UInt8(i)]))
                #expect(e.bytes == [UInt8(i)])
            }
            #expect(await rig.channel.close() == .closedByUs)
            await rig.terminal.stop()
        }
        // The count is the whole process's, and other suites open and keep descriptors while
        // this one runs: a leak here would be one per cycle (200) or per exchange (20), so a
        // small difference is theirs, not ours.
        let after = Host.openDescriptors()
        #expect(after - before < 16, "\(before) descriptors before 200 cycles, \(after) after")
        #expect(rig.channel.status.opens == 201)
        try? FileManager.default.removeItem(atPath: rig.directory)
    }

    @Test func theICPPPFacadeAcceptsABridgeAddedInDidOpenAtOnce() async throws {
        let port = Host.freePort()
        let rig = try PtyRig(echoPorts: [port])
        final class Delegate: ICPPPDelegate, @unchecked Sendable {
            let ppp: ICPPP
            let port: Int
            var codes: [Int32] = []
            var result = Locked<(bytes: [UInt8], clean: Bool)?>(nil)
            let done = DispatchSemaphore(value: 0)
            var closed = 0
            init(_ ppp: ICPPP, port: Int) { self.ppp = ppp; self.port = port }
            func pppChannelDidOpen() {
                codes.append(ppp.addiOSToTerminalBridgeLocalOnPort(port))
                codes.append(ppp.addiOSToTerminalBridgeLocalOnPort(port))
                codes.append(ppp.setKeepAliveDelay(10, interval: 5, count: 3) == .success ? 0 : 1)
                codes.append(ppp.setKeepAliveDelay(0, interval: 5, count: 3) == .success ? 0 : 1)
                // No sleep: a client connects the moment the bridge is added.
                let port = UInt16(self.port)
                let result = self.result
                let done = self.done
                Thread.detachNewThread {
                    guard case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) else { done.signal(); return }
                    _ = Host.sendAll(fd, Array("ready".utf8))
                    shutdown(fd, Int32(SHUT_WR))
                    result.mutate { $0 = Host.readAll(fd) }
                    close(fd)
                    done.signal()
                }
            }
            func pppChannelDidClose() { closed += 1 }
        }
        var c = ChannelConfiguration(line: .device(rig.linePath))
        c.relayDNS = false
        let ppp = ICPPP(configuration: c)
        let d = Delegate(ppp, port: Int(port))
        ppp.delegate = d
        #expect(ppp.openChannel() == .success)
        await withCheckedContinuation { (k: CheckedContinuation<Void, Never>) in DispatchQueue.global().async { _ = d.done.wait(timeout: .now() + 30); k.resume() } }
        #expect(d.codes == [0, -2, 0, 1])
        #expect(d.result.value?.bytes == Array("ready".utf8))
        #expect(ppp.IP == "192.168.53.1" && ppp.terminalIP == "192.168.53.2" && ppp.submask == "255.255.255.255")
        ppp.closeChannel()
        _ = await ppp.channel.close()
        #expect(d.closed == 1)
        #expect(ppp.IP == "")
        await rig.terminal.stop()
        await rig.channel.close()
        try? FileManager.default.removeItem(atPath: rig.directory)
    }
}
