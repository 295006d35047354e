import Dispatch
import Foundation
import Glibc
@testable import NetStack
import PPP
import Proxy
import Simulation
import Testing
import TestSupport
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
            // RFC 6890 §2.2.2's other blocks no host on the internet has.
            ("191.255.255.255", .global), ("192.0.0.0", .protocolAssignments), ("192.0.0.255", .protocolAssignments),
            ("192.0.1.0", .global), ("192.0.1.255", .global), ("192.0.2.0", .documentation), ("192.0.2.255", .documentation),
            ("192.0.3.0", .global), ("198.17.255.255", .global), ("198.18.0.0", .benchmarking), ("198.19.255.255", .benchmarking),
            ("198.20.0.0", .global), ("198.51.99.255", .global), ("198.51.100.0", .documentation), ("198.51.100.255", .documentation),
            ("198.51.101.0", .global), ("203.0.112.255", .global), ("203.0.113.0", .documentation), ("203.0.113.255", .documentation),
            ("203.0.114.0", .global),
        ]
        for (address, expected) in cases {
            #expect(scope(address) == expected, "\(address)")
        }
    }

    func destination(_ host: String, _ port: UInt16) -> SocksDestination { SocksDestination(host: host, port: port) }
    let loopback = IPv4Address(127, 0, 0, 1)

    /// Public-looking addresses standing for the host's interfaces (never sent anything).
    let hostInterfaces = [IPv4Address(8, 8, 4, 4), IPv4Address(10, 0, 0, 7)]
    let byTheRules = SocksPolicy.Decision.connect(openedByOperator: false)
    let byTheOperator = SocksPolicy.Decision.connect(openedByOperator: true)

    @Test func byDefaultOnlyGlobalDestinationsThatAreNotTheLinksOwn() {
        let ours = IPv4Address(198, 51, 100, 1), terminal = IPv4Address(198, 51, 100, 2)
        let policy = SocksPolicy(allow: nil, allowPrivate: false, ownAddresses: [ours, terminal])
        #expect(policy.decide(destination("93.184.216.34", 443), address: IPv4Address(93, 184, 216, 34), hostAddresses: []) == byTheRules)
        #expect(policy.decide(destination("127.0.0.1", 8080), address: loopback, hostAddresses: []) == .restricted(.loopback))
        // A name is judged by the address it resolved to.
        #expect(policy.decide(destination("localhost", 8080), address: loopback, hostAddresses: []) == .restricted(.loopback))
        #expect(policy.decide(destination("metadata.internal", 80), address: IPv4Address(169, 254, 169, 254), hostAddresses: []) == .restricted(.linkLocal))
        #expect(policy.decide(destination("10.1.2.3", 22), address: IPv4Address(10, 1, 2, 3), hostAddresses: []) == .restricted(.privateUse))
        #expect(policy.decide(destination("0.0.0.0", 22), address: IPv4Address(0), hostAddresses: []) == .restricted(.thisNetwork))
        #expect(policy.decide(destination("198.51.100.1", 1080), address: ours, hostAddresses: []) == .ownAddress)
        #expect(policy.decide(destination("terminal.example", 80), address: terminal, hostAddresses: []) == .ownAddress)
        #expect(policy.decide(destination("192.0.2.10", 443), address: IPv4Address(192, 0, 2, 10), hostAddresses: []) == .restricted(.documentation))
        #expect(policy.decide(destination("198.18.0.1", 443), address: IPv4Address(198, 18, 0, 1), hostAddresses: []) == .restricted(.benchmarking))
    }

    /// The host's interface addresses reach its services (sshd, admin pages on 0.0.0.0) as
    /// loopback does, however global they look.
    @Test func theHostsOwnInterfaceAddressesAreRefusedUnlessAnEntryNamesThemOrPrivateIsAllowed() {
        let policy = SocksPolicy(allow: nil, allowPrivate: false)
        let hostPublic = hostInterfaces[0]
        #expect(policy.decide(destination(hostPublic.description, 22), address: hostPublic, hostAddresses: hostInterfaces) == .hostAddress)
        #expect(policy.decide(destination("ssh.example", 22), address: hostPublic, hostAddresses: hostInterfaces) == .hostAddress)
        // The same address is an ordinary destination on a host that does not have it.
        #expect(policy.decide(destination(hostPublic.description, 22), address: hostPublic, hostAddresses: []) == byTheRules)
        let named = SocksPolicy(allow: [destination(hostPublic.description, 8443)])
        #expect(named.decide(destination(hostPublic.description, 8443), address: hostPublic, hostAddresses: hostInterfaces) == byTheOperator)
        let open = SocksPolicy(allow: nil, allowPrivate: true)
        #expect(open.decide(destination(hostPublic.description, 22), address: hostPublic, hostAddresses: hostInterfaces) == byTheOperator)
    }

    @Test func anAllowListEntryOpensExactlyTheAddressAndPortItNames() {
        let policy = SocksPolicy(allow: [destination("127.0.0.1", 8080), destination("LocalHost", 9090)])
        #expect(policy.decide(destination("127.0.0.1", 8080), address: loopback, hostAddresses: []) == byTheOperator)
        #expect(policy.decide(destination("127.0.0.1", 8081), address: loopback, hostAddresses: []) == .notListed)
        #expect(!policy.listed(destination("127.0.0.1", 8081)))
        // An entry for the address does not open a name that leads there, nor the reverse.
        #expect(!policy.listed(destination("localhost", 8080)))
        #expect(!policy.listed(destination("127.0.0.1", 9090)))
        #expect(policy.decide(destination("93.184.216.34", 443), address: IPv4Address(93, 184, 216, 34), hostAddresses: []) == .notListed)
        // Addresses are compared in their plain form.
        #expect(destination("127.000.000.001", 8080) == destination("127.0.0.1", 8080))
    }

    /// A name on the allow-list may be asked for, but it leads wherever its DNS says: to the
    /// internet as any global address, to loopback or the metadata service only when that
    /// address and port are listed too (or private destinations allowed).
    @Test func aNameOnTheAllowListIsStillJudgedByTheAddressItResolvesTo() {
        let metadata = IPv4Address(169, 254, 169, 254)
        let policy = SocksPolicy(allow: [destination("pay.example", 443), destination("LocalHost", 9090)])
        #expect(policy.decide(destination("pay.example", 443), address: IPv4Address(93, 184, 216, 34), hostAddresses: []) == byTheRules)
        #expect(policy.decide(destination("pay.example", 443), address: loopback, hostAddresses: []) == .restricted(.loopback))
        #expect(policy.decide(destination("pay.example", 443), address: metadata, hostAddresses: []) == .restricted(.linkLocal))
        #expect(policy.decide(destination("pay.example", 443), address: hostInterfaces[0], hostAddresses: hostInterfaces) == .hostAddress)
        #expect(policy.decide(destination("localhost", 9090), address: loopback, hostAddresses: []) == .restricted(.loopback))
        let alsoTheAddress = SocksPolicy(allow: [destination("localhost", 9090), destination("127.0.0.1", 9090)])
        #expect(alsoTheAddress.decide(destination("localhost", 9090), address: loopback, hostAddresses: []) == byTheOperator)
        let privateAllowed = SocksPolicy(allow: [destination("pay.example", 443)], allowPrivate: true)
        #expect(privateAllowed.decide(destination("pay.example", 443), address: metadata, hostAddresses: []) == byTheOperator)
    }

    @Test func allowingPrivateDestinationsOpensEveryRange() {
        let ours = IPv4Address(192, 168, 53, 1)
        let policy = SocksPolicy(allow: nil, allowPrivate: true, ownAddresses: [ours])
        for a in [loopback, IPv4Address(10, 0, 0, 1), IPv4Address(169, 254, 1, 1), IPv4Address(203, 0, 113, 9), ours] {
            #expect(policy.decide(destination(a.description, 80), address: a, hostAddresses: []) == byTheOperator)
        }
        // The allow-list still limits what may be asked for.
        let listed = SocksPolicy(allow: [destination("10.0.0.1", 80)], allowPrivate: true)
        #expect(listed.decide(destination("10.0.0.2", 80), address: IPv4Address(10, 0, 0, 2), hostAddresses: []) == .notListed)
    }

    @Test func peerCausedLogLinesAreOnePerKindPerIntervalWithTheCountHeldBack() {
        var lines = ThrottledLog<String>(interval: .seconds(60))
        let t0 = Instant(nanoseconds: 1_000_000_000)
        #expect(lines.admit("bad handshake", now: t0) == 0)
        #expect(lines.admit("bad handshake", now: t0 + .seconds(1)) == nil)
        #expect(lines.admit("bad handshake", now: t0 + .seconds(59)) == nil)
        // Another kind has its own first line.
        #expect(lines.admit("lookup failed", now: t0 + .seconds(30)) == 0)
        #expect(lines.held == 2)
        #expect(lines.admit("bad handshake", now: t0 + .seconds(60)) == 2)
        #expect(lines.admit("bad handshake", now: t0 + .seconds(61)) == nil)
        #expect(lines.occurrences["bad handshake"] == 5)
        #expect(lines.held == 1)
    }

    @Test func aLookupWhoseClientResetStillCountsUntilItComesBack() {
        var lookups = PendingLookups()
        let id = ConnectionID(rawValue: 1)
        let token = lookups.begin(id)
        lookups.cancel(id)
        #expect(lookups.count == 0)
        #expect(lookups.running == 1)
        let answered = lookups.returned(id, token: token)
        #expect(!answered)
        #expect(lookups.running == 0)
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
        let earlyAnswer = lookups.returned(id, token: early)
        #expect(!earlyAnswer)
        #expect(lookups.contains(id))
        let lateAnswer = lookups.returned(id, token: late)
        #expect(lateAnswer)
        #expect(lookups.count == 0)
        #expect(lookups.running == 0)
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

        let firstIDs = try await loop.perform {
            Result { () throws -> [ConnectionID] in
                try attachment.linkUp(result, mtu: 1500, now: loop.now)
                _ = try ask("first.test")
                return attachment.stack?.connectionIDs ?? []
            }
        }.get()
        try await waitUntil { asked.value.contains("first.test") }
        // The link renegotiates: a new stack whose ids start again, and a new client asking.
        let (secondID, secondIDs) = try await loop.perform {
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
        // Until the late answer is in: the first lookup has returned, the second still runs.
        #expect(await eventually(within: .seconds(5), every: .milliseconds(10)) { await loop.perform { proxy.lookupsRunning } <= 1 })
        #expect(await loop.perform { proxy.lookupsRunning } == 1)
        await loop.perform { shuttle() }
        #expect(await loop.perform { proxy.connections.isEmpty }, "the late answer connected a client that asked for something else")
        let greeting = await loop.perform { terminal.read(secondID, now: loop.now) }
        #expect(greeting == [5, 0])
        // The second client's own answer (no address) is what it gets.
        gates.value["second.test"]?.signal()
        #expect(await eventually(within: .seconds(2), every: .milliseconds(10)) {
            await loop.perform { () -> Bool in
                shuttle()
                return terminal.state(secondID) != .established || terminal.atEndOfStream(secondID)
            }
        })
        let refusal = await loop.perform { terminal.read(secondID, now: loop.now) }
        #expect(refusal == SocksNegotiation.failureReply(for: .socks5, .hostUnreachable))
        await loop.perform { attachment.linkDown() }
    }

    /// The proxy must not reach this host's services through the addresses of its interfaces
    /// (sshd or an admin page bound to 0.0.0.0 answer there as on loopback), however global
    /// they look. A server on 0.0.0.0 would take the connection if the proxy made it.
    @Test func aRequestForOneOfThisMachinesInterfaceAddressesIsRefusedWithReplyTwo() async throws {
        guard let hostAddress = Self.nonLoopbackInterfaceAddress() else {
            // The policy's own test covers the rule with addresses given to it.
            print("skipped: this machine has no IPv4 address besides loopback")
            return
        }
        let port = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .hold, address: .any)
        defer { server.stop() }
        let pair = try await ProxyOnAStack()
        let id = try await pair.ask(address: hostAddress, port: port)
        let reply = try await pair.reply(id)
        #expect(reply == [5, 0] + SocksNegotiation.failureReply(for: .socks5, .notAllowed), "\(hostAddress)")
        // The reason given: a special range where the address is in one (this machine's may be
        // a documentation address), otherwise that it is the host's.
        let scope = IPv4AddressScope(hostAddress)
        let why = scope == .global ? "\(hostAddress) is an address of this host" : "\(scope) destination"
        #expect(pair.logs.value.contains { $0.hasPrefix("socks: \(hostAddress):\(port) refused: \(why)") }, "\(pair.logs.value)")
        #expect(server.acceptedCount == 0)
        #expect(await pair.loop.perform { pair.proxy.policyRefusals } == 1)
        await pair.close()
    }

    /// glibc reads these as numbers (inet_aton forms), without asking DNS: each is loopback or
    /// 0.0.0.0 and must meet the rules as the address it names.
    @Test func numericNamesAreJudgedAsTheAddressTheResolverMakesOfThem() async throws {
        let port = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .hold)
        defer { server.stop() }
        let pair = try await ProxyOnAStack()
        let names: [(String, String)] = [("0x7f.1", "loopback destination (127.0.0.1)"), ("2130706433", "loopback destination (127.0.0.1)"),
                                         ("127.1", "loopback destination (127.0.0.1)"), ("0", "this-network (0/8) destination (0.0.0.0)")]
        for (name, why) in names {
            let id = try await pair.ask(name: name, port: port)
            let reply = try await pair.reply(id)
            #expect(reply == [5, 0] + SocksNegotiation.failureReply(for: .socks5, .notAllowed), "\(name)")
            #expect(pair.logs.value.contains { $0.hasPrefix("socks: \(name):\(port) refused: \(why)") }, "\(name): \(pair.logs.value)")
        }
        #expect(server.acceptedCount == 0)
        await pair.close()
    }

    /// A client asking for a slow name and resetting frees its outbound slot at once, but its
    /// lookup still holds a thread: lookups count until they come back, and one more is refused.
    @Test func lookupsOfClientsThatResetStillCountAgainstTheCap() async throws {
        let gate = DispatchSemaphore(value: 0)
        let asked = Locked<[String]>([])
        let pair = try await ProxyOnAStack { proxy in
            proxy.resolve = { name in
                asked.mutate { $0.append(name) }
                if name.hasPrefix("slow") { gate.wait() }
                return nil
            }
        }
        let cap = SocksConfiguration().maximumConnections
        for i in 0..<cap {
            let id = try await pair.ask(name: "slow\(i).test", port: 443)
            await pair.reset(id)
        }
        #expect(await pair.loop.perform { pair.proxy.outbound } == 0, "the clients are gone")
        #expect(await pair.loop.perform { pair.proxy.lookupsRunning } == cap)
        let refused = try await pair.ask(name: "slow\(cap).test", port: 443)
        #expect(try await pair.reply(refused) == [5, 0] + SocksNegotiation.failureReply(for: .socks5, .generalFailure))
        #expect(await pair.loop.perform { pair.proxy.lookupRefusals } == 1)
        #expect(try await pair.waitUntil { asked.value.count == cap })
        #expect(!asked.value.contains("slow\(cap).test"))
        // Once the lookups come back, a name may be looked up again.
        for _ in 0..<cap { gate.signal() }
        #expect(try await pair.waitUntil { pair.proxy.lookupsRunning == 0 })
        let later = try await pair.ask(name: "fast.test", port: 443)
        #expect(try await pair.reply(later) == [5, 0] + SocksNegotiation.failureReply(for: .socks5, .hostUnreachable))
        await pair.close()
    }

    /// A terminal sending garbage again and again writes one line, not one a request.
    @Test func aFloodOfMalformedHandshakesWritesOneLogLine() async throws {
        let pair = try await ProxyOnAStack()
        let started = monotonicNow()
        for _ in 0..<20 {
            let id = try await pair.connect()
            await pair.send(id, Array("GET / HTTP/1.0\r\n\r\n".utf8))
        }
        let lines = pair.logs.value.filter { $0.contains("not a SOCKS request") }
        // One line, and one more for each `logInterval` the flood lasted (the loop's clock is
        // real: beside the other suites these 20 requests can take most of a minute).
        let intervals = Int((monotonicNow() - started) / SocksProxy.logInterval)
        #expect(!lines.isEmpty && lines.count <= 1 + intervals, "\(pair.logs.value)")
        #expect(await pair.loop.perform { pair.proxy.refusals } == 20)
        await pair.close()
    }

    /// The first IPv4 address of an interface that is not loopback (getifaddrs(3)).
    static func nonLoopbackInterfaceAddress() -> IPv4Address? {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return nil }
        defer { freeifaddrs(list) }
        var next = list
        while let entry = next {
            next = entry.pointee.ifa_next
            guard let a = entry.pointee.ifa_addr, a.pointee.sa_family == sa_family_t(AF_INET) else { continue }
            let address = a.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { IPv4Address(UInt32(bigEndian: $0.pointee.sin_addr.s_addr)) }
            if IPv4AddressScope(address) != .loopback { return address }
        }
        return nil
    }

    func waitUntil(_ condition: () -> Bool) async throws {
        #expect(await eventually(within: .seconds(2), every: .milliseconds(10), condition))
    }
}

/// The proxy on a stack of its own, fed by a terminal's stack in this process: packets move
/// between the two stacks when the test says so, on the shared loop's thread.
final class ProxyOnAStack: @unchecked Sendable {
    let loop = EventLoop.shared
    let ours = IPv4Address(10, 99, 0, 1), terminalAddress = IPv4Address(10, 99, 0, 2)
    let proxy: SocksProxy
    let attachment: StackAttachment
    /// Loop thread only.
    private var terminal: IPStack
    private var received: [ConnectionID: [UInt8]] = [:]
    let logs = Locked<[String]>([])

    init(_ configuration: SocksConfiguration = SocksConfiguration(), setUp: (SocksProxy) -> Void = { _ in }) async throws {
        proxy = SocksProxy(configuration: configuration, loop: loop)
        proxy.log = { [logs] line in logs.mutate { $0.append(line) } }
        setUp(proxy)
        attachment = StackAttachment(seed: 1) { _ in }
        terminal = IPStack(configuration: IPStackConfiguration(address: terminalAddress), seed: 2)
        let result = IPCPResult(localAddress: ours, peerAddress: terminalAddress, dnsServers: [], netmask: IPv4Address(255, 255, 255, 255))
        let (loop, attachment, proxy) = (loop, attachment, proxy)
        try await loop.perform {
            Result { () throws -> Void in
                attachment.add(proxy)
                try attachment.linkUp(result, mtu: 1500, now: loop.now)
            }
        }.get()
    }

    /// Moves packets both ways until neither side has any. Loop thread.
    private func shuttle() {
        for _ in 0..<50 {
            let down = attachment.takeOutgoing(now: loop.now)
            for p in down { terminal.receive(packet: p, now: loop.now) }
            let up = terminal.takeOutgoing()
            for p in up { attachment.receive(packet: p, now: loop.now) }
            if down.isEmpty && up.isEmpty { return }
        }
    }

    /// A connection from the terminal to the proxy, established.
    func connect() async throws -> ConnectionID {
        try await loop.perform { [self] in
            Result { () throws -> ConnectionID in
                let id = try terminal.connect(to: TCPEndpoint(ours, 1080), now: loop.now)
                shuttle()
                return id
            }
        }.get()
    }

    func send(_ id: ConnectionID, _ bytes: [UInt8]) async {
        await loop.perform { [self] in
            _ = terminal.write(id, bytes, now: loop.now)
            shuttle()
        }
    }

    /// A SOCKS5 client (no authentication) asking for `name`:`port`.
    func ask(name: String, port: UInt16) async throws -> ConnectionID {
        let id = try await connect()
        await send(id, [5, 1, 0, 5, 1, 0, 3, UInt8(name.utf8.count)] + Array(name.utf8) + BigEndian.bytes(port))
        return id
    }

    /// A SOCKS5 client (no authentication) asking for `address`:`port`.
    func ask(address: IPv4Address, port: UInt16) async throws -> ConnectionID {
        let id = try await connect()
        await send(id, [5, 1, 0, 5, 1, 0, 1] + address.bytes + BigEndian.bytes(port))
        return id
    }

    /// The client resets its connection.
    func reset(_ id: ConnectionID) async {
        await loop.perform { [self] in
            terminal.abort(id, now: loop.now)
            shuttle()
        }
    }

    /// What the proxy sent `id` once a whole greeting and CONNECT reply (2 + 10 bytes) came or
    /// the proxy closed; lookups answer from their own threads, so this waits (generously).
    func reply(_ id: ConnectionID) async throws -> [UInt8] {
        var bytes: [UInt8] = []
        _ = try await waitUntil {
            bytes = self.received[id, default: []] + self.terminal.read(id, now: self.loop.now)
            self.received[id] = bytes
            return bytes.count >= 12 || self.terminal.atEndOfStream(id)
        }
        return bytes
    }

    /// Moves packets and checks `condition` on the loop until it holds, for up to `limit`.
    func waitUntil(upTo limit: Duration = .seconds(30), _ condition: @escaping () -> Bool) async throws -> Bool {
        await eventually(within: limit, every: .milliseconds(5)) {
            await loop.perform { [self] () -> Bool in
                shuttle()
                return condition()
            }
        }
    }

    func close() async {
        let attachment = attachment
        await loop.perform { attachment.linkDown() }
    }
}

/// The proxy's rules over a real link: a pty, the channel, a simulated terminal.
@Suite(.serialized, .timeLimit(.minutes(10)))
struct SocksPolicyChannelTests {
    /// A transfer through the proxy, posted to the loop instead of waited for with a semaphore on
    /// the cooperative pool, and bounded: one with no answer in `limit` (generous: each takes
    /// milliseconds unloaded) fails the test there rather than at the suite's time limit.
    func transfer(_ rig: PtyRig, to target: TCPEndpoint, via socks: TCPEndpoint, name: String? = nil, payload: [UInt8],
                  limit: Duration = .seconds(40)) async throws -> TransferResult {
        let result = await withCheckedContinuation { (c: CheckedContinuation<TransferResult?, Never>) in
            let loop = rig.terminal.loop
            let answered = Locked(false)
            let finish: @Sendable (TransferResult?) -> Void = { r in
                var first = false
                answered.mutate { first = !$0; $0 = true }
                if first { c.resume(returning: r) }
            }
            loop.execute {
                let timer = loop.schedule(at: loop.now + limit) { finish(nil) }
                rig.terminal.beginTransfer(to: target, via: socks, name: name, payload: payload) { r in
                    loop.cancelTimer(timer)
                    finish(r)
                }
            }
        }
        return try #require(result, "no answer through the proxy in \(limit) for \(name ?? target.description)")
    }

    /// The channel's status read on the loop's thread (no semaphore on the cooperative pool).
    func channelStatus(_ rig: PtyRig) async -> ChannelStatus {
        await withCheckedContinuation { c in
            rig.terminal.loop.execute { c.resume(returning: rig.channel.status) }
        }
    }

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
        #expect(try await transfer(closed, to: target, via: socks, payload: Array("no".utf8)).outcome == "socks reply 2")
        #expect(try await transfer(closed, to: target, via: socks, payload: Array("again".utf8)).outcome == "socks reply 2")
        // A name that resolves to loopback (from the hosts file, no DNS traffic) meets the same rule.
        #expect(try await transfer(closed, to: target, via: socks, name: "localhost", payload: Array("by name".utf8)).outcome == "socks reply 2")
        // Our own PPP address too.
        #expect(try await transfer(closed, to: TCPEndpoint(a.ip, port), via: socks, payload: Array("ours".utf8)).outcome == "socks reply 2")
        let status = await channelStatus(closed)
        #expect(status.proxyPolicyRefusals == 4)
        #expect(status.proxyRefusals == 4)
        #expect(status.proxy?.connections == 0)
        // One line per destination, however often it is asked for.
        #expect(logs.value.filter { $0.hasPrefix("socks: 127.0.0.1:\(port) refused") }.count == 1, "\(logs.value)")
        #expect(logs.value.filter { $0.hasPrefix("socks: localhost:\(port) refused") }.count == 1, "\(logs.value)")
        await closed.cleanUp()

        let opened = try PtyRig { $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)] }
        let b = try await opened.open()
        let r = try await transfer(opened, to: target, via: TCPEndpoint(b.ip, 1080), payload: Array("allowed".utf8))
        #expect(r.outcome == "closed")
        #expect(r.received == Array("allowed".utf8))
        #expect(await channelStatus(opened).proxyPolicyRefusals == 0)
        await opened.cleanUp()
    }

    /// Every connection through the proxy and the bridges is reported: a refusal with what was
    /// asked and why, one that carried data opened and closed under one number with its bytes,
    /// and a bridge's with the host client as its source.
    @Test func connectionsAreReportedOneByOneWithDestinationOutcomeAndBytes() async throws {
        let port = Host.freePort()
        let server = try LoopbackServer(port: port, mode: .echo)
        defer { server.stop() }
        let target = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        let echoPort = Host.freePort()
        let rig = try PtyRig(echoPorts: [echoPort]) { $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)] }
        let reports = Locked<[ConnectionReport]>([])
        rig.channel.observe { if case let .connection(r) = $0 { reports.mutate { $0.append(r) } } }
        let a = try await rig.open()
        let socks = TCPEndpoint(a.ip, 1080)
        // Refused: the port is not on the allow-list.
        let other = Host.freePort()
        #expect(try await transfer(rig, to: TCPEndpoint(IPv4Address(127, 0, 0, 1), other), via: socks, payload: Array("no".utf8)).outcome
            == "socks reply 2")
        // Carried: 3000 bytes there and back.
        let payload = Host.random(3000, seed: 4)
        let r = try await transfer(rig, to: target, via: socks, payload: payload)
        #expect(r.outcome == "closed" && r.received == payload)
        // A bridge from a host client to the terminal's echo.
        try rig.channel.addBridge(.hostToTerminalLocal, port: echoPort)
        let echoed = try #require(await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), echoPort), Host.random(5000, seed: 5)))
        #expect(echoed.bytes.count == 5000)
        #expect(await eventually(within: .seconds(4)) { reports.value.filter({ $0.phase == .closed }).count >= 2 })
        let seen = reports.value
        for report in seen { print("connection report: \(report)") }
        let refused = try #require(seen.first { $0.phase == .refused })
        #expect(refused.carrier == .proxy && refused.destination == "127.0.0.1:\(other)" && refused.number == 0)
        #expect(refused.failure == "not on the allow-list" && refused.source.hasPrefix("\(a.terminalIP):"))
        let proxied = seen.filter { $0.carrier == .proxy && $0.phase != .refused }
        #expect(proxied.map(\.phase) == [.opened, .closed], "\(proxied)")
        #expect(proxied.allSatisfy { $0.number == proxied[0].number && $0.destination == "\(target)" })
        #expect(proxied.last?.bytesToHost == 3000 && proxied.last?.bytesToTerminal == 3000 && proxied.last?.failure == nil)
        let bridged = seen.filter { $0.carrier == .bridge(BridgeSpec(.hostToTerminalLocal, port: echoPort)) }
        #expect(bridged.map(\.phase) == [.opened, .closed], "\(bridged)")
        #expect(bridged.last?.bytesToTerminal == 5000 && bridged.last?.bytesToHost == 5000)
        #expect(bridged.first?.destination == "\(a.terminalIP):\(echoPort)" && bridged.first?.source.hasPrefix("127.0.0.1:") == true)
        #expect(Set(seen.map(\.number)).subtracting([0]).count == 2, "each connection its own number")
        await rig.cleanUp()
    }

    /// `outboundAddress`: the proxy's connections leave from that address of the host (the
    /// server sees it as their source); one that is not the host's is a refusal that says so.
    @Test func outboundConnectionsLeaveFromTheChosenAddress() async throws {
        let port = Host.freePort()
        let listener = try Host.listener(port: port, address: IPv4Address(0, 0, 0, 0))
        defer { close(listener) }
        // accept(2) gives up after that: the thread below never outlives the test for long.
        Host.setTimeout(listener, seconds: 30)
        let peer = Locked<String?>(nil)
        Thread.detachNewThread {
            var a = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let c = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { accept(listener, $0, &length) } }
            guard c >= 0 else { return }
            let bytes = withUnsafeBytes(of: a.sin_addr.s_addr) { Array($0) }
            peer.mutate { $0 = bytes.map(String.init).joined(separator: ".") }
            _ = Host.sendAll(c, Array("hi".utf8))
            close(c)
        }
        let target = TCPEndpoint(IPv4Address(127, 0, 0, 1), port)
        let rig = try PtyRig {
            $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)]
            $0.socks?.outboundAddress = IPv4Address(127, 0, 0, 2)
        }
        let a = try await rig.open()
        let r = try await transfer(rig, to: target, via: TCPEndpoint(a.ip, 1080), payload: [])
        #expect(r.received == Array("hi".utf8), "\(r)")
        #expect(peer.value == "127.0.0.2")
        await rig.cleanUp()

        // An address that is not this host's: refused, and the report says why.
        let elsewhere = try PtyRig {
            $0.socks?.allow = [SocksDestination(host: "127.0.0.1", port: port)]
            $0.socks?.outboundAddress = IPv4Address(192, 0, 2, 1)
        }
        let reports = Locked<[ConnectionReport]>([])
        elsewhere.channel.observe { if case let .connection(r) = $0 { reports.mutate { $0.append(r) } } }
        let b = try await elsewhere.open()
        let refused = try await transfer(elsewhere, to: target, via: TCPEndpoint(b.ip, 1080), payload: [])
        #expect(refused.outcome.hasPrefix("socks reply"), "\(refused)")
        #expect(reports.value.first?.failure?.contains("bind 192.0.2.1") == true, "\(reports.value)")
        await elsewhere.cleanUp()
    }

    /// Refusals a peer makes at will are reported 16 a second at most; the rest are counted
    /// and said with the next report.
    @Test func refusalReportsAreHeldToARateAndTheRestCounted() async throws {
        let clock = LeapingClock()
        let loop = try EventLoop(clock: clock)
        try loop.startThread()
        let port = Host.freePort()
        // A bridge that takes no connection at all: every host client is refused.
        let rig = try PtyRig(loop: loop) { $0.bridgeConnectionLimit = 0 }
        let reports = Locked<[ConnectionReport]>([])
        rig.channel.observe { if case let .connection(r) = $0 { reports.mutate { $0.append(r) } } }
        _ = try await rig.open()
        try rig.channel.addBridge(.hostToTerminalLocal, port: port)
        for _ in 0..<40 {
            if case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) { close(fd) }
        }
        _ = await eventually(within: .seconds(5), every: .milliseconds(10)) { await loop.perform { rig.channel.bridgeStatus[0].traffic.refused } >= 40 }
        #expect(await loop.perform { rig.channel.bridgeStatus[0].traffic.refused } == 40)
        let burst = reports.value.count
        #expect(burst >= 16 && burst < 40, "\(burst) of 40 refusals reported")
        // A second later, the next refusal is reported with how many were held.
        clock.leap(by: .seconds(2))
        await loop.fullTurn()
        if case let .success(fd) = Host.connect(TCPEndpoint(IPv4Address(127, 0, 0, 1), port)) { close(fd) }
        _ = await eventually(within: .seconds(5), every: .milliseconds(10)) { reports.value.count > burst }
        let last = try #require(reports.value.last)
        #expect(last.phase == .refused && last.failure?.contains("and \(40 - burst) more refused since the last report") == true, "\(last)")
        await rig.cleanUp()
    }

    @Test func aClientThatNeverFinishesItsHandshakeIsResetAfterTheTimeout() async throws {
        // The channel's loop on a clock the test moves ahead: the timeout falls due when the
        // test says, not after a second of waiting.
        let clock = LeapingClock()
        let loop = try EventLoop(clock: clock)
        try loop.startThread()
        // A minute: half of it leapt over stays far beyond what a loaded machine's real time
        // adds meanwhile.
        let rig = try PtyRig(loop: loop) { $0.socks?.handshakeTimeout = .seconds(60) }
        let a = try await rig.open()
        let silent = SilentClient(target: TCPEndpoint(a.ip, 1080))
        let terminal = rig.terminal
        await terminal.loop.perform { terminal.add(silent) }
        // Bounded loosely: the full suite runs the VM tests beside this one on two cores.
        #expect(await eventually(within: .seconds(60), every: .milliseconds(50)) { await terminal.loop.perform { silent.established } })
        // Half the timeout on: the client is still there.
        clock.leap(by: .seconds(30))
        await loop.fullTurn()
        #expect(await loop.perform { rig.channel.status.proxyHandshakeTimeouts } == 0, "reset before its timeout")
        #expect(await terminal.loop.perform { silent.closed } == nil)
        // Past it: reset, and the terminal's stack hears of it.
        clock.leap(by: .seconds(31))
        await loop.fullTurn()
        #expect(await loop.perform { rig.channel.status.proxyHandshakeTimeouts } == 1)
        _ = await eventually(within: .seconds(60), every: .milliseconds(50)) { await terminal.loop.perform { silent.closed } != nil }
        #expect(await terminal.loop.perform { silent.closed } == .reset)
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
