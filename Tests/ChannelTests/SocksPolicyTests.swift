import Dispatch
import Foundation
import Glibc
@testable import NetStack
import PPP
import Testing
@testable import Channel
import ChannelTestSupport

/// Where the proxy may connect: the address ranges, the rule, and the proxy keeping to it.
@Suite struct SocksPolicyTests {
    typealias Scope = IPv4AddressScope

    func scope(_ text: String) -> Scope { Scope(IPv4Address(text)!) }

    @Test func eachRangeAndItsEdges() {
        let cases: [(String, Scope)] = [
            ("0.0.0.0", .thisNetwork), ("0.255.255.255", .thisNetwork), ("1.0.0.0", .global),
            ("9.255.255.255", .global), ("10.0.0.0", .privateUse), ("10.255.255.255", .privateUse), ("11.0.0.0", .global),
            ("100.63.255.255", .global), ("100.64.0.0", .sharedAddressSpace), ("100.127.255.255", .sharedAddressSpace), ("100.128.0.0", .global),
            ("126.255.255.255", .global), ("127.0.0.0", .loopback), ("127.0.0.1", .loopback), ("127.255.255.255", .loopback), ("128.0.0.0", .global),
            ("169.253.255.255", .global), ("169.254.0.0", .linkLocal), ("169.254.169.254", .linkLocal), ("169.254.255.255", .linkLocal),
            ("169.255.0.0", .global),
            ("172.15.255.255", .global), ("172.16.0.0", .privateUse), ("172.31.255.255", .privateUse), ("172.32.0.0", .global),
            ("192.167.255.255", .global), ("192.168.0.0", .privateUse), ("192.168.255.255", .privateUse), ("192.169.0.0", .global),
            ("223.255.255.255", .global), ("224.0.0.0", .multicast), ("239.255.255.255", .multicast),
            ("240.0.0.0", .reserved), ("255.255.255.254", .reserved), ("255.255.255.255", .limitedBroadcast),
            ("8.8.8.8", .global), ("93.184.216.34", .global),
        ]
        for (address, expected) in cases {
            #expect(scope(address) == expected, "\(address)")
        }
    }

    func destination(_ host: String, _ port: UInt16) -> SocksDestination { SocksDestination(host: host, port: port) }
    let loopback = IPv4Address(127, 0, 0, 1)

    @Test func byDefaultOnlyGlobalDestinationsThatAreNotTheLinksOwn() {
        let ours = IPv4Address(198, 51, 100, 1), terminal = IPv4Address(198, 51, 100, 2)
        let policy = SocksPolicy(allow: nil, allowPrivate: false, ownAddresses: [ours, terminal])
        #expect(policy.decide(destination("93.184.216.34", 443), address: IPv4Address(93, 184, 216, 34)) == .connect)
        #expect(policy.decide(destination("127.0.0.1", 8080), address: loopback) == .restricted(.loopback))
        // A name is judged by the address it resolved to.
        #expect(policy.decide(destination("localhost", 8080), address: loopback) == .restricted(.loopback))
        #expect(policy.decide(destination("metadata.internal", 80), address: IPv4Address(169, 254, 169, 254)) == .restricted(.linkLocal))
        #expect(policy.decide(destination("10.1.2.3", 22), address: IPv4Address(10, 1, 2, 3)) == .restricted(.privateUse))
        #expect(policy.decide(destination("0.0.0.0", 22), address: IPv4Address(0)) == .restricted(.thisNetwork))
        #expect(policy.decide(destination("198.51.100.1", 1080), address: ours) == .ownAddress)
        #expect(policy.decide(destination("terminal.example", 80), address: terminal) == .ownAddress)
    }

    @Test func anAllowListEntryOpensExactlyTheHostAndPortItNames() {
        let policy = SocksPolicy(allow: [destination("127.0.0.1", 8080), destination("LocalHost", 9090)])
        #expect(policy.decide(destination("127.0.0.1", 8080), address: loopback) == .connect)
        #expect(policy.decide(destination("localhost", 9090), address: loopback) == .connect)
        #expect(policy.decide(destination("127.0.0.1", 8081), address: loopback) == .notListed)
        #expect(!policy.listed(destination("127.0.0.1", 8081)))
        // An entry for the address does not open a name that leads there, nor the reverse.
        #expect(!policy.listed(destination("localhost", 8080)))
        #expect(!policy.listed(destination("127.0.0.1", 9090)))
        #expect(policy.decide(destination("93.184.216.34", 443), address: IPv4Address(93, 184, 216, 34)) == .notListed)
        // Addresses are compared in their plain form.
        #expect(destination("127.000.000.001", 8080) == destination("127.0.0.1", 8080))
    }

    @Test func allowingPrivateDestinationsOpensEveryRange() {
        let ours = IPv4Address(192, 168, 53, 1)
        let policy = SocksPolicy(allow: nil, allowPrivate: true, ownAddresses: [ours])
        for a in [loopback, IPv4Address(10, 0, 0, 1), IPv4Address(169, 254, 1, 1), ours] {
            #expect(policy.decide(destination(a.description, 80), address: a) == .connect)
        }
        // The allow-list still limits what may be asked for.
        let listed = SocksPolicy(allow: [destination("10.0.0.1", 80)], allowPrivate: true)
        #expect(listed.decide(destination("10.0.0.2", 80), address: IPv4Address(10, 0, 0, 2)) == .notListed)
    }

    @Test func refusedDestinationsAreReportedOnceAndCountedBeyondWhatIsRemembered() {
        var once = ReportedOnce(capacity: 2)
        let reported = ["a", "a", "b", "c", "c", "a"].map { once.first($0) }
        #expect(reported == [true, false, true, false, false, false])
        #expect(once.unreported == 2)
    }

    @Test func aLookupTokenFromAnEarlierStackMatchesNoLaterClient() {
        var lookups = PendingLookups()
        let id = ConnectionID(rawValue: 1)
        let early = lookups.begin(id)
        lookups.removeAll()
        let late = lookups.begin(id)
        let earlyAnswer = lookups.finish(id, token: early)
        #expect(!earlyAnswer)
        #expect(lookups.contains(id))
        let lateAnswer = lookups.finish(id, token: late)
        let again = lookups.finish(id, token: late)
        #expect(lateAnswer && !again)
        #expect(lookups.count == 0)
    }

    /// The proxy on a stack of its own, fed by a terminal's stack in this process: a client
    /// asks for a name, the link goes down and up (connection ids start again at 1), a new client
    /// asks for another name; the first lookup's late answer must not connect the new client.
    @Test func aLateLookupFromABeforeRenegotiationDoesNotReachTheNewClient() async throws {
        let loop = EventLoop.shared
        let ours = IPv4Address(10, 99, 0, 1), terminalAddress = IPv4Address(10, 99, 0, 2)
        let hostPort = Host.freePort()
        let server = try LoopbackServer(port: hostPort, mode: .hold)
        defer { server.stop() }
        let gates = Locked<[String: DispatchSemaphore]>(["first.test": DispatchSemaphore(value: 0), "second.test": DispatchSemaphore(value: 0)])
        let asked = Locked<[String]>([])
        var configuration = SocksConfiguration()
        configuration.allowPrivate = true
        let proxy = SocksProxy(configuration: configuration, loop: loop)
        proxy.resolve = { name in
            asked.mutate { $0.append(name) }
            gates.value[name]?.wait()
            return name == "first.test" ? IPv4Address(127, 0, 0, 1) : nil
        }
        let attachment = StackAttachment(seed: 1) { _ in }
        attachment.add(proxy)
        let result = IPCPResult(localAddress: ours, peerAddress: terminalAddress, dnsServers: [], netmask: IPv4Address(255, 255, 255, 255))
        var terminal = IPStack(configuration: IPStackConfiguration(address: terminalAddress), seed: 2)

        /// Moves packets both ways until neither side has any.
        func shuttle() {
            for _ in 0..<50 {
                let down = attachment.takeOutgoing(now: loop.now)
                for p in down { terminal.receive(packet: p, now: loop.now) }
                let up = terminal.takeOutgoing()
                for p in up { attachment.receive(packet: p, now: loop.now) }
                if down.isEmpty && up.isEmpty { return }
            }
        }
        /// A client on the terminal's stack asking SOCKS5 for `name`:`hostPort`.
        func ask(_ name: String) throws -> ConnectionID {
            let id = try terminal.connect(to: TCPEndpoint(ours, 1080), now: loop.now)
            shuttle()
            terminal.write(id, [5, 1, 0, 5, 1, 0, 3, UInt8(name.utf8.count)] + Array(name.utf8) + BigEndian.bytes(hostPort), now: loop.now)
            shuttle()
            return id
        }

        let firstIDs = try loop.sync {
            Result { () throws -> [ConnectionID] in
                try attachment.linkUp(result, mtu: 1500, now: loop.now)
                _ = try ask("first.test")
                return attachment.stack?.connectionIDs ?? []
            }
        }.get()
        try await waitUntil { asked.value.contains("first.test") }
        // The link renegotiates: a new stack whose ids start again, and a new client asking.
        let (secondID, secondIDs) = try loop.sync {
            Result { () throws -> (ConnectionID, [ConnectionID]) in
                attachment.linkDown()
                terminal = IPStack(configuration: IPStackConfiguration(address: terminalAddress), seed: 3)
                try attachment.linkUp(result, mtu: 1500, now: loop.now)
                let id = try ask("second.test")
                return (id, attachment.stack?.connectionIDs ?? [])
            }
        }.get()
        try await waitUntil { asked.value.contains("second.test") }
        #expect(firstIDs.count == 1 && secondIDs == firstIDs, "the proxy's side should reuse the id: \(firstIDs) \(secondIDs)")
        // The first lookup answers late, for an id the second client now has.
        gates.value["first.test"]?.signal()
        try await Task.sleep(for: .milliseconds(300))
        loop.sync { shuttle() }
        #expect(loop.sync { proxy.connections.isEmpty }, "the late answer connected a client that asked for something else")
        let greeting = loop.sync { terminal.read(secondID, now: loop.now) }
        #expect(greeting == [5, 0])
        // The second client's own answer (no address) is what it gets.
        gates.value["second.test"]?.signal()
        try await waitUntil { loop.sync { () -> Bool in
            shuttle()
            return terminal.state(secondID) != .established || terminal.atEndOfStream(secondID)
        } }
        let refusal = loop.sync { terminal.read(secondID, now: loop.now) }
        #expect(refusal == SocksNegotiation.failureReply(for: .socks5, .hostUnreachable))
        loop.sync { attachment.linkDown() }
    }

    func waitUntil(_ condition: () -> Bool) async throws {
        for _ in 0..<200 where !condition() { try await Task.sleep(for: .milliseconds(10)) }
        #expect(condition())
    }
}

/// The proxy's rules over a real link: a pty, the channel, a simulated terminal.
@Suite(.serialized, .timeLimit(.minutes(2)))
struct SocksPolicyChannelTests {
    @Test func loopbackIsRefusedWithReplyTwoUnlessTheAllowListNamesIt() async throws {
        let port = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .echo)
        defer { server.stop() }
        let target = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)

        let closed = try PtyRig()
        let logs = Locked<[String]>([])
        closed.channel.observe { if case let .log(l) = $0 { logs.mutate { $0.append(l) } } }
        let a = try await closed.open()
        let socks = TCPEndpoint(a.ip, 1080)
        #expect(await closed.terminal.transfer(to: target, via: socks, payload: Array("no".utf8)).outcome == "socks reply 2")
        #expect(await closed.terminal.transfer(to: target, via: socks, payload: Array("again".utf8)).outcome == "socks reply 2")
        // A name that resolves to loopback (from the hosts file, no DNS traffic) meets the same rule.
        #expect(await closed.terminal.transfer(to: target, via: socks, name: "localhost", payload: Array("by name".utf8)).outcome == "socks reply 2")
        // Our own PPP address too.
        #expect(await closed.terminal.transfer(to: TCPEndpoint(a.ip, port), via: socks, payload: Array("ours".utf8)).outcome == "socks reply 2")
        let status = closed.channel.status
        #expect(status.proxyPolicyRefusals == 4)
        #expect(status.proxyRefusals == 4)
        #expect(status.proxy?.connections == 0)
        // One line per destination, however often it is asked for.
        #expect(logs.value.filter { $0.hasPrefix("socks: 127.0.0.1:\(port) refused") }.count == 1, "\(logs.value)")
        #expect(logs.value.filter { $0.hasPrefix("socks: localhost:\(port) refused") }.count == 1, "\(logs.value)")
        await closed.cleanUp()

        let opened = try PtyRig { $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)] }
        let b = try await opened.open()
        let r = await opened.terminal.transfer(to: target, via: TCPEndpoint(b.ip, 1080), payload: Array("allowed".utf8))
        #expect(r.outcome == "closed")
        #expect(r.received == Array("allowed".utf8))
        #expect(opened.channel.status.proxyPolicyRefusals == 0)
        await opened.cleanUp()
    }

    @Test func aClientThatNeverFinishesItsHandshakeIsResetAfterTheTimeout() async throws {
        let rig = try PtyRig { $0.socks?.handshakeTimeout = .seconds(1) }
        let a = try await rig.open()
        let silent = SilentClient(target: TCPEndpoint(a.ip, 1080))
        let started = monotonicNow()
        rig.terminal.loop.sync { rig.terminal.add(silent) }
        for _ in 0..<100 where rig.terminal.loop.sync({ silent.closed }) == nil { try await Task.sleep(for: .milliseconds(50)) }
        let elapsed = monotonicNow() - started
        #expect(rig.terminal.loop.sync { silent.established })
        #expect(rig.terminal.loop.sync { silent.closed } == .reset)
        #expect(elapsed >= .seconds(1) && elapsed < .seconds(4), "\(elapsed)")
        #expect(rig.channel.status.proxyHandshakeTimeouts == 1)
        await rig.cleanUp()
    }
}

/// A client on the terminal's stack that connects and then says nothing.
final class SilentClient: StackApplication {
    let target: TCPEndpoint
    var established = false
    var closed: TCPCloseReason?

    init(target: TCPEndpoint) { self.target = target }

    func start(_ host: StackAttachment, now: Instant) { _ = try? host.connect(to: target, for: self, now: now) }
    func stop() {}
    func step(now: Instant) {}
    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        switch event {
        case .established: established = true
        case let .closed(reason): closed = reason
        default: break
        }
    }
}
