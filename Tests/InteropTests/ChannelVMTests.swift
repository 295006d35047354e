import Channel
import ChannelTestSupport
import Crypto
import Foundation
import Glibc
import NetStack
import Testing
import TestSupport

/// The channel (in this process) against Debian's pppd and Linux in the VM as the terminal:
/// bridges both ways to and from servers in the guest, the ICPPP return codes, a local-only
/// bridge seen from a network namespace, and the guest's connections through the SOCKS proxy.
@Suite(.serialized, .enabled(if: VMPeer.unavailable == nil, "\(VMPeer.unavailable ?? "")"))
struct ChannelVMTests {
    static let local = IPv4Address(10, 0, 2, 2)
    static let guestAddress = IPv4Address(10, 0, 2, 15)

    /// `VMPEER-T <name> ...` result lines the guest writes to its console.
    func result(_ vm: VMPeer, _ name: String) -> [String]? {
        vm.completeLines.first { $0.hasPrefix("VMPEER-T \(name) ") }.map { $0.split(separator: " ").dropFirst(2).map(String.init) }
    }

    @Test func bridgesAndProxyWithPPPDAsTheTerminal() async throws {
        let vm = try await VMPeer(["-x", "noipv6"])
        defer { vm.stop() }
        let capture = NSTemporaryDirectory() + "pppbridge-channel-vm-\(UUID().uuidString.prefix(8)).pcap"
        defer { try? FileManager.default.removeItem(atPath: capture) }
        var c = ChannelConfiguration(line: .device(vm.pty), link: .host(local: Self.local, terminal: Self.guestAddress))
        c.relayDNS = false
        c.pcapPath = capture
        c.keepAlive = KeepAliveSettings(idleSeconds: 45, probeIntervalSeconds: 9, probeCount: 6)
        // The guest's proxied connections go to servers on the host's loopback, named here.
        let hostPort = Host.freePort()
        let holdPort = Host.freePort()
        c.socks?.allow = [SocksDestination(host: "127.0.0.1", port: hostPort), SocksDestination(host: "127.0.0.1", port: holdPort)]
        let channel = Channel(configuration: c)
        let a = try await channel.open()
        #expect(a.terminalIP == Self.guestAddress)
        #expect(await eventually(30) { vm.log.contains("VMPEER: LINK UP") }, "\(vm.log.suffix(1500))")

        // host → terminal: a host client through the bridge to `nc -e cat` in the guest.
        let guestPort: UInt16 = 5000
        vm.guest("(while true; do busybox nc -l -p \(guestPort) -e cat; done) > /dev/null 2>&1 &")
        try channel.addBridge(.hostToTerminal, port: guestPort)
        let up = Host.random(1 << 20, seed: 11)
        var echoed: (bytes: [UInt8], clean: Bool)?
        // Tried again while the guest's listener is not up yet.
        _ = await eventually(within: .seconds(120), every: .milliseconds(500)) {
            echoed = await Host.exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), guestPort), up)
            return echoed?.bytes.count == up.count
        }
        #expect(echoed?.clean == true)
        #expect(echoed.map { Host.sha($0.bytes) } == Host.sha(up), "host→terminal bridge: \(echoed?.bytes.count ?? -1) bytes back")
        print("channel vm: host→terminal bridge to the guest's nc -e cat: \(echoed?.bytes.count ?? 0) bytes echoed, SHA-256 equal \(echoed.map { Host.sha($0.bytes) } == Host.sha(up))")

        // terminal → host: the guest's nc half-closes after its file; our host echo answers.
        let echo = try LoopbackServer(port: hostPort, mode: .echo)
        defer { echo.stop() }
        try channel.addBridge(.terminalToHost, port: hostPort)
        vm.guest("head -c 1048576 /dev/urandom > /tmp/u; busybox nc \(Self.local) \(hostPort) < /tmp/u > /tmp/v; "
                 + "echo \"VMPEER-T up $(sha256sum < /tmp/u | cut -c1-64) $(sha256sum < /tmp/v | cut -c1-64) $(wc -c < /tmp/v)\" > /dev/console")
        #expect(await eventually(180) { result(vm, "up") != nil }, "\(vm.log.suffix(1500))")
        if let r = result(vm, "up") {
            #expect(r.count == 3 && r[0] == r[1] && r[2] == "1048576", "\(r)")
            print("channel vm: terminal→host bridge from the guest's nc (half-close) to a host echo: \(r.joined(separator: " "))")
        }

        // The header's return codes: 12 bridges at most, duplicates, a port in use.
        var ports: [UInt16] = []
        while ports.count < 11 { let p = Host.freePort(); if !ports.contains(p) && p != hostPort && p != holdPort { ports.append(p) } }
        for (i, p) in ports.prefix(10).enumerated() { try channel.addBridge(i % 2 == 0 ? .hostToTerminalLocal : .terminalToHost, port: p) }
        #expect(channel.bridgeStatus.count == 12)
        #expect(throws: BridgeError.noMoreBridges) { try channel.addBridge(.hostToTerminal, port: ports[10]) }
        #expect(channel.removeBridge(.terminalToHost, port: ports[1]))
        #expect(throws: BridgeError.alreadyExists) { try channel.addBridge(.hostToTerminal, port: guestPort) }
        let squatter = try LoopbackServer(port: ports[10], mode: .hold, address: IPv4Address(0))
        #expect(throws: BridgeError.initialisationFailed) { try channel.addBridge(.hostToTerminal, port: ports[10]) }
        squatter.stop()
        print("channel vm: 12 bridges accepted; the 13th -1, a duplicate -2, a host port in use -4")

        // A local-only bridge refuses a client from another network namespace, where the
        // all-interfaces bridge to the same guest accepts one.
        if getuid() == 0 {
            let localPort = ports[0]  // hostToTerminalLocal
            let outcome = try await fromNamespace(allInterfacesPort: guestPort, localOnlyPort: localPort)
            #expect(outcome.allInterfaces == "connected", "\(outcome)")
            #expect(outcome.localOnly == "refused", "\(outcome)")
            print("channel vm: from a network namespace: all-interfaces bridge \(outcome.allInterfaces), local-only bridge \(outcome.localOnly)")
        }

        // The guest through the SOCKS proxy: SOCKS5 by hand (printf), 1 MiB to a host echo.
        let hp = [UInt8(hostPort >> 8), UInt8(hostPort & 0xFF)]
        func octal(_ b: [UInt8]) -> String { b.map { "\\" + String($0, radix: 8) }.joined() }
        let request = octal([5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1] + hp)
        vm.guest("(printf '\(request)'; cat /tmp/u) | busybox nc \(a.ip) 1080 > /tmp/s; "
                 + "echo \"VMPEER-T socks $(head -c 12 /tmp/s | od -An -tx1 | tr -d ' \\n') $(tail -c +13 /tmp/s | sha256sum | cut -c1-64) $(sha256sum < /tmp/u | cut -c1-64)\" > /dev/console")
        #expect(await eventually(180) { result(vm, "socks") != nil }, "\(vm.log.suffix(1500))")
        if let r = result(vm, "socks") {
            #expect(r.count == 3 && r[0].hasPrefix("0500050000017f000001") && r[1] == r[2], "\(r)")
            print("channel vm: guest SOCKS5 → 127.0.0.1:\(hostPort): reply \(r[0]), 1 MiB echoed equal \(r.count == 3 && r[1] == r[2])")
        }

        // Five held connections through the proxy, then a sixth refused; keep-alive read back.
        let hold = try LoopbackServer(port: holdPort, mode: .hold)
        defer { hold.stop() }
        let holdRequest = octal([5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, UInt8(holdPort >> 8), UInt8(holdPort & 0xFF)])
        vm.guest("for i in 1 2 3 4 5; do ((printf '\(holdRequest)'; sleep 60) | busybox nc \(a.ip) 1080 > /dev/null &) ; done")
        #expect(await eventually(60) { channel.proxyConnections.count == 5 }, "\(channel.report())")
        let open = channel.proxyConnections
        #expect(open.count == 5)
        #expect(open.allSatisfy { $0.keepAlive == KeepAliveSettings(idleSeconds: 45, probeIntervalSeconds: 9, probeCount: 6) }, "\(open)")
        // `echo` ends the line: the harness reads only finished console lines.
        vm.guest("( (printf '\(holdRequest)'; sleep 5) | busybox nc \(a.ip) 1080 | od -An -tx1 | tr -d ' \\n'; echo) | sed 's/^/VMPEER-T sixth /' > /dev/console")
        #expect(await eventually(60) { result(vm, "sixth") != nil }, "\(vm.log.suffix(1000))")
        #expect(result(vm, "sixth")?.first == "050005010001000000000000", "\(result(vm, "sixth") ?? [])")
        print("channel vm: 5 proxied connections open with keep-alive \(open.first?.keepAlive.map { "\($0)" } ?? "-"); the sixth refused: \(result(vm, "sixth")?.first ?? "-")")

        #expect(await channel.close() == .closedByUs)
        if let tshark = ["/usr/bin/tshark", "/usr/local/bin/tshark"].first(where: FileManager.default.isExecutableFile) {
            // The payloads are random bytes: on the ports used here tshark would read them as the
            // protocols registered there (GSM's IPA on 5000; SOCKS past the handshake on 1080),
            // so they are decoded as plain data and only our own layers are judged.
            let decodeAsData: [String] = [guestPort, hostPort, holdPort, 1080].flatMap { (p: UInt16) -> [String] in ["-d", "tcp.port==\(p),data"] }
            // VJ-compressed frames (0x002d) are judged by our decoder below: tshark rebuilds their
            // headers only in part (docs: "tshark cannot decompress VJ") and has been seen to call
            // some compressed ACKs malformed while the guest's pppd took every one of them.
            let r = try await runCommand(tshark, ["-r", capture] + decodeAsData + ["-Y", "_ws.malformed && ppp.protocol != 0x002d"], timeout: 120)
            let bad = r.output.split(whereSeparator: \.isNewline).filter { $0.first?.isWhitespace == true || $0.first?.isNumber == true }
            #expect(r.status == 0 && bad.isEmpty, "\(r.output.suffix(1500))")
        }
        // Our decoder decompresses every VJ frame with RFC 1144's state: none may be malformed.
        let decoded = try await runCommand(BridgeProcess.binary, ["decode", capture], timeout: 120)
        #expect(decoded.status == 0 && decoded.output.contains("errors: 0 malformed packets"), "\(decoded.output.suffix(1500))")
    }

    /// Connects from a network namespace of our own (a veth pair to this one) to the host's
    /// veth address on both ports.
    func fromNamespace(allInterfacesPort: UInt16, localOnlyPort: UInt16) async throws -> (allInterfaces: String, localOnly: String) {
        let ns = "pbch\(getpid() % 10000)"
        let hostSide = "pbh\(getpid() % 10000)", nsSide = "pbn\(getpid() % 10000)"
        func ip(_ args: [String]) async throws { _ = try await runCommand("/sbin/ip", args, timeout: 20) }
        try await ip(["netns", "add", ns])
        defer {
            runCommandBlocking("/sbin/ip", ["link", "del", hostSide], timeout: 20)
            runCommandBlocking("/sbin/ip", ["netns", "del", ns], timeout: 20)
        }
        try await ip(["link", "add", hostSide, "type", "veth", "peer", "name", nsSide])
        try await ip(["link", "set", nsSide, "netns", ns])
        try await ip(["addr", "add", "10.231.0.1/30", "dev", hostSide])
        try await ip(["link", "set", hostSide, "up"])
        try await ip(["netns", "exec", ns, "ip", "addr", "add", "10.231.0.2/30", "dev", nsSide])
        try await ip(["netns", "exec", ns, "ip", "link", "set", nsSide, "up"])
        let script = """
        import socket, sys
        for port in sys.argv[1:]:
            s = socket.socket(); s.settimeout(10)
            try:
                s.connect(("10.231.0.1", int(port))); print("connected")
            except ConnectionRefusedError:
                print("refused")
            except Exception as e:
                print(type(e).__name__)
            s.close()
        """
        let r = try await runCommand("/sbin/ip", ["netns", "exec", ns, "python3", "-c", script, String(allInterfacesPort), String(localOnlyPort)], timeout: 60)
        let lines = r.output.split(whereSeparator: \.isNewline).map(String.init).filter { !$0.isEmpty }
        return (lines.first ?? r.output, lines.dropFirst().first ?? r.output)
    }
}
