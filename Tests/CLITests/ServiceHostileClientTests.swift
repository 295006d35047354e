import Channel
import Foundation
import Glibc
import NetStack
import Testing
import TestSupport
@testable import PPPBridgeCLI
@testable import Service

/// A scratch directory (mode 0700) removed when the test ends.
typealias ServiceScratch = ScratchDirectory

/// A blocking client of a Unix socket, with a receive timeout so a test never hangs.
private func connectUnix(_ path: String) throws -> Int32 {
    try UnixSocket.connect(to: path, timeout: .seconds(5)).rawValue
}

private func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var sent = 0
    while sent < bytes.count {
        let n = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return sent > 0 }
        guard n > 0 else { return false }
        sent += n
    }
    return true
}

/// Whatever the socket has now, without waiting; nil once the peer closed (or reset) it.
private func receiveNow(_ fd: Int32) -> [UInt8]? {
    var out: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n > 0 {
            out += buffer[..<n]
            continue
        }
        if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { return out.isEmpty ? nil : out }
        return out
    }
}

/// The control socket and the metrics port on a loop of virtual time: each turn's budget, the
/// time a client has to ask, and room for a new client whatever the others do.
@Suite struct ControlServerBudgetTests {
    final class Rig {
        let scratch: ServiceScratch
        let loop: EventLoop
        let control: ControlServer
        var answered = 0
        init(clientLimit: Int = ControlServer.defaultClientLimit) throws {
            scratch = try ServiceScratch()
            loop = try EventLoop(clock: VirtualClock())
            var count = 0
            control = try ControlServer(path: scratch.path + "/control", loop: loop, clientLimit: clientLimit) { _ in
                count += 1
                return ["ok": true, "n": count]
            }
        }
        func turns(_ n: Int = 1) { for _ in 0..<n { loop.runTurn() } }
    }

    /// One client floods requests (and blank lines); another's request is answered on the next
    /// turn, and the flooder gets at most `requestsPerTurn` answers a turn.
    @Test func aFloodingClientGetsItsBudgetAndTheOthersTheirAnswers() throws {
        let rig = try Rig()
        let flooder = try connectUnix(rig.control.path)
        defer { close(flooder) }
        let polite = try connectUnix(rig.control.path)
        defer { close(polite) }
        rig.turns(2)
        let flood = Array(String(repeating: "\n\n   \n{\"cmd\":\"list\"}\n", count: 2_000).utf8)
        #expect(sendAll(flooder, flood))
        rig.turns()
        let firstTurn = receiveNow(flooder) ?? []
        #expect(firstTurn.filter { $0 == 0x0A }.count == ControlServer.requestsPerTurn)
        #expect(sendAll(polite, Array("{\"cmd\":\"list\"}\n".utf8)))
        rig.turns()
        let reply = receiveNow(polite) ?? []
        #expect(reply.filter { $0 == 0x0A }.count == 1, "the polite client waited behind the flood")
        // The flood is worked through a budget at a time, and none of it is lost.
        let secondTurn = (receiveNow(flooder) ?? []).filter { $0 == 0x0A }.count
        #expect(secondTurn == ControlServer.requestsPerTurn)
        var answers = firstTurn.filter { $0 == 0x0A }.count + secondTurn
        for _ in 0..<400 where answers < 2_000 {
            rig.turns()
            let got = (receiveNow(flooder) ?? []).filter { $0 == 0x0A }.count
            #expect(got <= ControlServer.requestsPerTurn)
            answers += got
        }
        #expect(answers == 2_000)
    }

    /// A client that sends only blank lines is let go after `bytesWithoutRequest` of them,
    /// long before its idle time is up.
    @Test func aClientSendingNothingButBlankLinesIsLetGo() throws {
        let rig = try Rig()
        let blank = try connectUnix(rig.control.path)
        defer { close(blank) }
        rig.turns(2)
        let block = [UInt8](repeating: 0x0A, count: 16_384)
        var sent = 0
        for _ in 0..<40 where receiveNow(blank) != nil {
            if sendAll(blank, block) { sent += block.count }
            rig.turns()
        }
        #expect(receiveNow(blank) == nil, "still connected after \(sent) bytes of blank lines")
        #expect(sent > ControlServer.bytesWithoutRequest && sent <= ControlServer.bytesWithoutRequest + 3 * block.count)
        #expect(rig.control.clientsSendingNothing == 1)
    }

    /// Clients that ask nothing are let go after `requestTimeout`; a subscriber stays.
    @Test func silentClientsAreLetGoAndSubscribersStay() throws {
        let rig = try Rig()
        let silent = try connectUnix(rig.control.path)
        defer { close(silent) }
        let subscriber = try connectUnix(rig.control.path)
        defer { close(subscriber) }
        let asker = try connectUnix(rig.control.path)
        defer { close(asker) }
        rig.turns(2)
        #expect(sendAll(subscriber, Array("{\"cmd\":\"subscribe\"}\n".utf8)))
        rig.turns()
        rig.loop.advance(by: .seconds(3))
        #expect(sendAll(asker, Array("{\"cmd\":\"list\"}\n".utf8)))
        rig.loop.advance(by: .seconds(3))
        #expect(receiveNow(silent) == nil, "the silent client is gone")
        #expect(receiveNow(subscriber) != nil)
        #expect(receiveNow(asker) != nil, "asked 3 s ago: it has its time again")
        #expect(rig.control.clientsTimedOut == 1)
        rig.loop.advance(by: .seconds(3))
        #expect(receiveNow(asker) == nil)
        #expect(rig.control.clientCount == 1)
    }

    /// With every place taken by idle clients, a new one gets in at once: the one that has
    /// waited longest without asking makes room.
    @Test func aFullServerMakesRoomForANewClient() throws {
        let rig = try Rig(clientLimit: 4)
        var idle: [Int32] = []
        defer { idle.forEach { close($0) } }
        for i in 0..<4 {
            idle.append(try connectUnix(rig.control.path))
            rig.loop.advance(by: .milliseconds(250 * Int64(i + 1)))
        }
        #expect(rig.control.clientCount == 4)
        let newcomer = try connectUnix(rig.control.path)
        defer { close(newcomer) }
        #expect(sendAll(newcomer, Array("{\"cmd\":\"list\"}\n".utf8)))
        rig.turns(2)
        #expect((receiveNow(newcomer) ?? []).contains(0x0A))
        #expect(rig.control.clientsEvicted == 1)
        #expect(receiveNow(idle[0]) == nil, "the oldest idle client made room")
        #expect(receiveNow(idle[1]) != nil)
    }

    /// A flood of connections cannot push out a client before it has had a second to ask:
    /// with every place taken by clients that young, the newcomer is the one turned away.
    @Test func aFloodOfConnectionsCannotPushOutAFreshClient() throws {
        let rig = try Rig(clientLimit: 4)
        var fresh: [Int32] = []
        defer { fresh.forEach { close($0) } }
        for _ in 0..<4 { fresh.append(try connectUnix(rig.control.path)) }
        rig.turns(2)
        let flood = try (0..<8).map { _ in try connectUnix(rig.control.path) }
        defer { flood.forEach { close($0) } }
        rig.turns(2)
        #expect(rig.control.clientsEvicted == 0 && rig.control.clientsRefused == 8)
        #expect(sendAll(fresh[0], Array("{\"cmd\":\"list\"}\n".utf8)))
        rig.turns(2)
        #expect((receiveNow(fresh[0]) ?? []).contains(0x0A), "the first client was heard")
    }

    /// Subscribers are capped below the client limit, so subscribing cannot fill the server.
    @Test func subscribersAreFewerThanClients() throws {
        let rig = try Rig()
        var fds: [Int32] = []
        defer { fds.forEach { close($0) } }
        var refused = 0
        for _ in 0..<(ControlServer.subscriberLimit + 3) {
            let fd = try connectUnix(rig.control.path)
            fds.append(fd)
            rig.turns()
            #expect(sendAll(fd, Array("{\"cmd\":\"subscribe\"}\n".utf8)))
            rig.turns()
            if String(decoding: receiveNow(fd) ?? [], as: UTF8.self).contains("too many subscribers") { refused += 1 }
        }
        #expect(refused == 3)
        #expect(rig.control.subscriberCount == ControlServer.subscriberLimit)
    }

    /// Metrics: slow clients are let go after the timeout, a new client at the limit takes the
    /// oldest's place, and the page is rendered once a turn however many ask in it.
    @Test func metricsClientsCannotHoldTheDoor() throws {
        let loop = try EventLoop(clock: VirtualClock())
        var renders = 0
        let metrics = try MetricsServer(on: TCPEndpoint(IPv4Address(127, 0, 0, 1), 0), loop: loop, clientLimit: 3) {
            renders += 1
            return "pppbridge_up 1\n"
        }
        defer { metrics.close() }
        let endpoint = try #require(metrics.endpoint)
        func client() throws -> Int32 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_port = endpoint.port.bigEndian
            a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
            let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard r == 0 else { throw SystemError("connect") }
            return fd
        }
        let slow = try (0..<3).map { _ in try client() }
        defer { slow.forEach { close($0) } }
        loop.advance(by: .seconds(2))
        let scrapers = try (0..<2).map { _ in try client() }
        defer { scrapers.forEach { close($0) } }
        loop.advance(by: .zero)
        for s in scrapers { #expect(sendAll(s, Array("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".utf8))) }
        loop.advance(by: .zero)
        loop.advance(by: .zero)
        for s in scrapers { #expect(String(decoding: receiveNow(s) ?? [], as: UTF8.self).contains("pppbridge_up 1")) }
        #expect(renders == 1)
        #expect(metrics.evicted == 2)
        loop.advance(by: .seconds(2))
        #expect(receiveNow(slow[2]) == nil)
        #expect(metrics.timedOut >= 1)
    }
}

/// The descriptors as a budget: a terminal's share, the pool, and what is refused.
@Suite struct DescriptorBudgetTests {
    @Test func aShareIsCappedAtItsPartAndThePoolIsNeverExceeded() {
        let budget = DescriptorBudget(limit: 100, reserve: 40)
        let a = budget.makeShare(), b = budget.makeShare()
        #expect(budget.pool == 60 && budget.shareCap == 30)
        var taken = 0
        while a.acquire() { taken += 1 }
        #expect(taken == 30 && a.refused == 1)
        #expect((0..<30).allSatisfy { _ in b.acquire() })
        #expect(!b.acquire())
        #expect(budget.held == 60 && budget.refused == 2)
        a.release()
        #expect(b.held == 30 && !b.acquire(), "b is at its cap even with room in the pool")
        #expect(a.acquire())
        // A larger reserve (a terminal added) shrinks the pool; what is held stays held.
        budget.reserve = 90
        #expect(budget.pool == 10 && !a.acquire())
        for _ in 0..<30 { a.release() }
        #expect(a.held == 0 && budget.held == 30)
    }

    @Test func aSmallPoolStillGivesEachShareSomething() {
        let budget = DescriptorBudget(limit: 64, reserve: 32)
        let shares = (0..<10).map { _ in budget.makeShare() }
        #expect(budget.shareCap == DescriptorBudget.minimumShare)
        #expect(shares[0].acquire())
        let none = DescriptorBudget(limit: 64, reserve: 80)
        #expect(!none.makeShare().acquire())
    }

    @Test func theSoftLimitIsRaisedToTheHardOne() {
        let (soft, hard) = DescriptorBudget.raiseSoftLimit()
        #expect(soft == hard)
        #expect((DescriptorBudget.openDescriptors() ?? 0) > 2)
    }

    /// Under a small limit the local clients' places shrink and the terminals keep a pool.
    @Test func serviceLimitsShrinkWithTheProcess() {
        let small = ServiceLimits(descriptorLimit: 64)
        #expect(small.controlClients == 4 && small.metricsClients == 2)
        #expect(small.baseReserve(openNow: 12) == 12 + 4 + 2 + ServiceLimits.margin)
        let large = ServiceLimits(descriptorLimit: 65_536)
        #expect(large.controlClients == ControlServer.defaultClientLimit && large.metricsClients == MetricsServer.defaultClientLimit)
    }
}

/// Configuration files are trusted only when they are regular files of the service's user (or
/// root) that others cannot write; a refusal names the file and why, and quotes nothing of it.
@Suite struct ConfigurationTrustTests {
    @Test func aLinkAnotherUsersFileAndAWritableFileAreRefused() throws {
        let scratch = try ServiceScratch()
        let secret = "db_password=SECRET-\(UInt64.random(in: 1 ... .max))"
        let target = scratch.path + "/elsewhere"
        #expect(FileManager.default.createFile(atPath: target, contents: Data((secret + "\ndevice /dev/null\n").utf8),
                                               attributes: [.posixPermissions: 0o600]))
        let link = scratch.path + "/evil.conf"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        guard case let .failure(e) = TerminalFile.read(link) else {
            Issue.record("a link was read")
            return
        }
        #expect(e.messages == ["\(link): a symbolic link, refused (a configuration file must be a regular file)"])

        let writable = scratch.path + "/open.conf"
        #expect(FileManager.default.createFile(atPath: writable, contents: Data("device /dev/null\n".utf8)))
        chmod(writable, 0o646)
        guard case let .failure(w) = TerminalFile.read(writable) else {
            Issue.record("a file others can write was read")
            return
        }
        #expect(w.messages == ["\(writable): writable by group or others, refused"])
        chmod(writable, 0o660)
        guard case .failure = TerminalFile.read(writable) else {
            Issue.record("a file the group can write was read")
            return
        }

        if geteuid() == 0 {
            let theirs = scratch.path + "/theirs.conf"
            #expect(FileManager.default.createFile(atPath: theirs, contents: Data((secret + "\n").utf8), attributes: [.posixPermissions: 0o600]))
            #expect(chown(theirs, 65_534, 65_534) == 0)
            guard case let .failure(o) = TerminalFile.read(theirs) else {
                Issue.record("another user's file was read")
                return
            }
            #expect(o.messages.joined().contains("owned by user 65534"))
            #expect(!o.messages.joined().contains("SECRET"))
        }
        let good = scratch.path + "/good.conf"
        #expect(FileManager.default.createFile(atPath: good, contents: Data("device /dev/null\n".utf8), attributes: [.posixPermissions: 0o640]))
        #expect((try? TerminalFile.read(good).get()) == Array("device /dev/null\n".utf8))
    }
}

/// Hotplug by name: a change in a device directory costs work only for the terminals whose
/// device it names.
@Suite struct HotplugByNameTests {
    @Test func unrelatedNamesInADeviceDirectoryCostNothing() throws {
        let scratch = try ServiceScratch()
        let config = scratch.path + "/conf", devices = scratch.path + "/dev"
        try FileManager.default.createDirectory(atPath: config, withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: devices, withIntermediateDirectories: false)
        for n in 0..<64 {
            #expect(FileManager.default.createFile(atPath: config + "/t\(n).conf", contents: Data("device \(devices)/t\(n)\n".utf8),
                                                   attributes: [.posixPermissions: 0o600]))
        }
        let loop = try EventLoop(clock: VirtualClock())
        let service = try Service(directory: config, defaults: TerminalFile.Defaults(), environment: [:], loop: loop,
                                  descriptors: DescriptorBudget(limit: 4_096, reserve: 0), baseReserve: 0, say: { _ in }, complain: { _ in })
        service.scan()
        loop.advance(by: .seconds(1))
        #expect(service.terminals.count == 64)
        #expect(service.terminals.values.allSatisfy { $0.state == .waiting })
        let checks = service.deviceChecks, passes = service.rewatchPasses
        for i in 0..<2_000 {
            let path = devices + "/noise\(i)"
            let fd = open(path, O_CREAT | O_WRONLY, 0o600)
            close(fd)
            unlink(path)
            if i % 100 == 0 { loop.advance(by: .zero) }
        }
        loop.advance(by: .seconds(1))
        #expect(service.deviceChecks == checks, "unrelated names were shown to terminals")
        #expect(service.rewatchPasses == passes, "unrelated names moved the watches")
        // The device of one terminal appearing concerns that terminal alone.
        #expect(symlink("/dev/null", devices + "/t5") == 0)
        loop.advance(by: .zero)
        #expect(service.deviceChecks == checks + 1)
        service.closeAll {}
        loop.advance(by: .seconds(10))
    }
}

/// The smaller doors: numbers written as people write them, a watchdog that cannot spin, a
/// control socket made at its mode, and a client that neither hangs nor talks to a stranger.
@Suite struct ServiceSmallDoorsTests {
    @Test func numbersAreDecimalDigitsOnly() {
        #expect(BridgeSpec(parsing: "host:+17002") == nil)
        #expect(BridgeSpec(parsing: "host: 17002") == nil)
        #expect(BridgeSpec(parsing: "host:17002")?.port == 17002)
        #expect(decimal("0x10", as: Int.self) == nil && decimal("-1", as: Int.self) == nil && decimal("", as: Int.self) == nil)
        #expect(decimal("99999", as: UInt16.self) == nil && decimal("65535", as: UInt16.self) == 65535)
        func parses(_ text: String) -> Bool {
            if case .success = TerminalFile.parse(Array(text.utf8), name: "t", path: "/t.conf", defaults: .init(), environment: [:]) { return true }
            return false
        }
        #expect(!parses("device /dev/ttyACM0\nkeepalive 60,x,10,5\n"))
        #expect(!parses("device /dev/ttyACM0\nkeepalive 60,,10\n"))
        #expect(!parses("device /dev/ttyACM0\nbridge host:+17002\n"))
        #expect(parses("device /dev/ttyACM0\nkeepalive 60,10,5\nbridge host:17002\n"))
        #expect(CtlCommand.request(["set-keepalive", "t", "60,x,10,5"]) == nil)
        #expect(CtlCommand.request(["set-keepalive", "t", "60,10,5"]) != nil)
    }

    @Test func aTinyWatchdogTimeoutStillLeavesTheLoopIdle() {
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "1"]) == .milliseconds(100))
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "30000000"]) == .seconds(15))
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "0"]) == nil)
    }

    @Test func theControlSocketIsMadeAtItsMode() throws {
        let scratch = try ServiceScratch()
        let path = scratch.path + "/control"
        let fd = try UnixSocket.listen(at: path, mode: 0o660)
        defer { fd.close() }
        var st = stat()
        #expect(lstat(path, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o660)
    }

    /// A socket that takes the connection and never answers: ctl gives up after its timeout.
    @Test func ctlGivesUpOnAServiceThatDoesNotAnswer() throws {
        let scratch = try ServiceScratch()
        let path = scratch.path + "/control"
        let fd = try UnixSocket.listen(at: path, mode: 0o600)
        defer { fd.close() }
        var errors: [String] = []
        let started = monotonicNow()
        let status = CtlCommand(output: { _ in }, error: { errors.append($0) }).run(["--control", path, "--timeout", "0.3", "list"])
        #expect(status == 1)
        #expect(monotonicNow() - started < .seconds(5))
        #expect(errors.joined().contains("no reply within"), "\(errors)")
    }

    /// A socket another user planted in a directory others may write: ctl does not send it a
    /// word.
    @Test func ctlTalksOnlyToAServiceThatOwnsItsSocket() throws {
        guard geteuid() == 0 else { return }
        let scratch = try ServiceScratch()
        let shared = scratch.path + "/shared"
        #expect(mkdir(shared, 0o1777) == 0 && chmod(shared, 0o1777) == 0 && chmod(scratch.path, 0o755) == 0)
        let path = shared + "/control"
        let planter = Process()
        planter.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        planter.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                             "import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); print('up', flush=True); c,_=s.accept(); d=c.recv(100); print('got', len(d), flush=True); time.sleep(2)",
                             path]
        let out = Pipe()
        planter.standardOutput = out
        try planter.run()
        defer { planter.terminate() }
        let up = out.fileHandleForReading.availableData
        #expect(String(decoding: up, as: UTF8.self).hasPrefix("up"))
        var errors: [String] = []
        let status = CtlCommand(output: { _ in }, error: { errors.append($0) }).run(["--control", path, "--timeout", "1", "list"])
        #expect(status == 1)
        #expect(errors.joined().contains("does not own the socket and its directory"), "\(errors)")
        planter.waitUntilExit()
        let said = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(said.contains("got 0"), "the planted socket was sent: \(said)")
    }
}

/// A `pcap` or `record` line naming a file that is not a capture of ours is the file's error,
/// found when it is read; the file is left as it was.
@Suite struct CaptureLineTests {
    @Test func aCaptureLineNamingAnotherFileIsRefusedAtRead() throws {
        let scratch = try ServiceScratch()
        let precious = scratch.path + "/accounts.db"
        let contents = Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        #expect(FileManager.default.createFile(atPath: precious, contents: contents, attributes: [.posixPermissions: 0o600]))
        for option in ["pcap", "record"] {
            guard case let .failure(e) = TerminalFile.parse(Array("device /dev/ttyACM0\n\(option) \(precious)\n".utf8), name: "t", path: "/t.conf",
                                                            defaults: .init(), environment: [:]) else {
                Issue.record("\(option) accepted")
                continue
            }
            #expect(e.messages == ["/t.conf:2: \(option): \(precious) exists and is not a capture of this kind; not replaced (remove it, or name another file)"])
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: precious)) == contents)
        // A path not there yet is fine.
        if case .failure = TerminalFile.parse(Array("device /dev/ttyACM0\npcap \(scratch.path)/new.pcap\n".utf8), name: "t", path: "/t.conf",
                                              defaults: .init(), environment: [:]) { Issue.record("a new capture path was refused") }
    }
}
