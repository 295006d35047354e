import Crypto
import Foundation
import Testing

/// pppbridge against Debian's pppd 2.4.9 and Linux 6.1 in a QEMU VM on a pty. Each test boots
/// its own VM with the pppd options under test (Tools/vmpeer), attaches `pppbridge run`, and
/// checks both sides' logs: pppd's debug log on the guest console, and ours.
@Suite(.serialized, .enabled(if: VMPeer.unavailable == nil, "\(VMPeer.unavailable ?? "")"))
struct PPPDInteropTests {
    /// Both sides must report IPCP opened within this long after we attach to the line.
    static let openWithin: TimeInterval = 10

    struct Session {
        var vm: VMPeer
        var bridge: BridgeProcess
        var openedAfter: TimeInterval
    }

    /// Boots pppd with `vmOptions`, starts `pppbridge run --device PTY ourOptions`, waits for
    /// IPCP on both sides, runs `body`, then closes everything.
    func withSession(vm vmOptions: [String], ours: [String], expectOpen: Bool = true,
                     _ body: (Session) async throws -> Void) async throws {
        let vm = try await VMPeer(vmOptions)
        defer { vm.stop() }
        let started = Date()
        let bridge = try BridgeProcess(["--device", vm.pty] + ours)
        defer { bridge.cleanUp() }
        var opened: TimeInterval = .infinity
        if expectOpen {
            let ok = await eventually(PPPDInteropTests.openWithin) { bridge.has("IPCP opened") && vm.log.contains("VMPEER: LINK UP") }
            opened = Date().timeIntervalSince(started)
            print("pppd interop: IPCP opened on both sides \(String(format: "%.1f", opened)) s after attaching (VM boot \(vm.bootSeconds) s, pppd \(vmOptions.joined(separator: " ")))")
            #expect(ok, "IPCP did not open on both sides within \(PPPDInteropTests.openWithin) s (boot took \(vm.bootSeconds) s)\n--- pppbridge:\n\(bridge.output)\n--- pppd:\n\(vm.log.suffix(3000))")
            guard ok else { return }
        }
        try await body(Session(vm: vm, bridge: bridge, openedAfter: opened))
        // Whatever happened, our capture of the live link decodes cleanly.
        try await expectCleanPcap(bridge)
    }

    /// pppd's own summary of the addresses it settled.
    func expectPppdAddresses(_ vm: VMPeer, local: String, remote: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(vm.log.contains("local  IP address \(local)"), "pppd log:\n\(vm.log.suffix(2000))", sourceLocation: sourceLocation)
        #expect(vm.log.contains("remote IP address \(remote)"), sourceLocation: sourceLocation)
    }

    func expectOurAddresses(_ b: BridgeProcess, local: String, remote: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(b.has("local  IP address \(local)"), "pppbridge:\n\(b.output)", sourceLocation: sourceLocation)
        #expect(b.has("remote IP address \(remote)"), sourceLocation: sourceLocation)
    }

    @Test func pppdAcceptsOurAddressesAndDNSAndSeesOurTerminate() async throws {
        try await withSession(vm: ["-r", "client", "-x", "noipv6 usepeerdns"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--dns", "10.0.2.3"]) { s in
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            expectOurAddresses(s.bridge, local: "10.0.2.2", remote: "10.0.2.15")
            #expect(await eventually(5) { s.vm.log.contains("primary   DNS address 10.0.2.3") }, "pppd did not take our DNS")
            // SIGTERM: LCP Terminate on the line, pppd acknowledges it, we exit 0.
            #expect(await s.bridge.terminate() == 0)
            #expect(await eventually(5) { s.vm.log.contains("rcvd [LCP TermReq") && s.vm.log.contains("sent [LCP TermAck") },
                    "pppd log:\n\(s.vm.log.suffix(1500))")
            #expect(s.bridge.has("link down: closed by us"))
        }
    }

    @Test func pppdProposesBothAddresses() async throws {
        try await withSession(vm: ["-r", "server", "-L", "10.0.2.15", "-R", "10.0.2.2", "-x", "noipv6 ms-dns 10.0.2.53"],
                        ours: ["--role", "terminal"]) { s in
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            expectOurAddresses(s.bridge, local: "10.0.2.2", remote: "10.0.2.15")
            // ms-dns: the terminal role asks and is given pppd's DNS server.
            #expect(s.bridge.has("primary   DNS address 10.0.2.53"), "pppbridge:\n\(s.bridge.output)")
            #expect(await s.bridge.terminate() == 0)
        }
    }

    /// The host role given no addresses, against a pppd that insists on its own pair (no
    /// accept options): like pppd, we take what the peer proposes, and both sides agree.
    @Test func hostRoleWithoutAddressesTakesPppdsProposal() async throws {
        try await withSession(vm: ["-r", "server", "-L", "10.0.2.15", "-R", "10.0.2.2", "-x", "noipv6"], ours: []) { s in
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            expectOurAddresses(s.bridge, local: "10.0.2.2", remote: "10.0.2.15")
            #expect(!s.vm.log.contains("Refused our IP address"), "pppd log:\n\(s.vm.log.suffix(2000))")
            #expect(await s.bridge.terminate() == 0)
        }
    }

    /// Given addresses of our own against a pppd insisting on its pair, neither side can give
    /// in: the link ends at once with both sides' addresses named, exit 10, instead of an IPCP
    /// we would report opened with addresses pppd never took.
    @Test func conflictingAddressesEndTheLinkNamingBothSides() async throws {
        try await withSession(vm: ["-r", "server", "-L", "10.0.2.15", "-R", "10.0.2.2", "-x", "noipv6"],
                        ours: ["--local-ip", "192.168.53.1", "--terminal-ip", "192.168.53.2"], expectOpen: false) { s in
            let status = await s.bridge.waitForExit(60)
            #expect(status == 10, "pppbridge:\n\(s.bridge.output)")
            #expect(s.bridge.has("we insisted on 192.168.53.1 for us and 192.168.53.2 for the peer"), "pppbridge:\n\(s.bridge.output)")
            #expect(s.bridge.has("the peer insisted on 10.0.2.15 for itself and 10.0.2.2 for us"), "pppbridge:\n\(s.bridge.output)")
            #expect(!s.bridge.has("IPCP opened"), "pppbridge:\n\(s.bridge.output)")
        }
    }

    @Test func asyncmapZeroMRU296AndNoVJ() async throws {
        try await withSession(vm: ["-x", "noipv6 asyncmap 0 mru 296 novj"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--novj"]) { s in
            // pppd's MRU 296 limits what we send; the map is 0 both ways.
            #expect(s.bridge.has("LCP opened: mru 1500/296, asyncmap rx 0x0 tx 0x0, pcomp, accomp"), "pppbridge:\n\(s.bridge.output)")
            #expect(!s.vm.log.contains("compress VJ"), "pppd asked for VJ despite novj")
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            #expect(await s.bridge.terminate() == 0)
        }
    }

    @Test func defaultAsyncmapWithoutHeaderCompression() async throws {
        try await withSession(vm: ["-x", "noipv6 default-asyncmap nopcomp noaccomp"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15"]) { s in
            // pppd neither asks for a map nor takes ours; nor any header compression.
            #expect(s.bridge.has("LCP opened: mru 1500/1500, asyncmap rx 0xffffffff tx 0xffffffff\n"), "pppbridge:\n\(s.bridge.output)")
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            #expect(await s.bridge.terminate() == 0)
        }
    }

    /// pppd requires us to authenticate (`+pap` / `+chap`) and checks our credentials against
    /// its secrets file.
    @Test(arguments: [("pap", "pap-secrets", "rcvd [PAP AuthReq id=0x1 user=\"pbuser\""),
                      ("chap", "chap-secrets", "rcvd [CHAP Response")])
    func pppdRequiresUsToAuthenticate(method: String, secrets: String, request: String) async throws {
        try await withSession(vm: ["-x", "noipv6 +\(method)"], ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15",
                                                              "--user", "pbuser", "--password", "pb-secret"], expectOpen: false) { s in
            s.vm.guest("echo 'pbuser * pb-secret *' > /etc/ppp/\(secrets)")
            let ok = await eventually(20) { s.bridge.has("IPCP opened") && s.vm.log.contains("VMPEER: LINK UP") }
            #expect(ok, "pppbridge:\n\(s.bridge.output)\n--- pppd:\n\(s.vm.log.suffix(2500))")
            #expect(s.bridge.has("we authenticate with \(method == "pap" ? "pap" : "chap-md5")"))
            #expect(s.vm.log.contains(request), "pppd log:\n\(s.vm.log.suffix(2000))")
            #expect(s.vm.log.contains(method == "pap" ? "PAP peer authentication succeeded for pbuser" : "sent [CHAP Success"))
            #expect(await s.bridge.terminate() == 0)
        }
    }

    @Test func weRequirePppdToAuthenticateWithPAP() async throws {
        try await withSession(vm: ["-x", "noipv6 user vmpeer password vmpeer-secret"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--require-pap", "--peer", "vmpeer:vmpeer-secret"]) { s in
            #expect(s.bridge.has("authentication succeeded (peer \"vmpeer\")"), "pppbridge:\n\(s.bridge.output)")
            #expect(s.vm.log.contains("PAP authentication succeeded"))
            expectPppdAddresses(s.vm, local: "10.0.2.15", remote: "10.0.2.2")
            #expect(await s.bridge.terminate() == 0)
        }
    }

    @Test func wrongPAPSecretIsRefusedWithAReason() async throws {
        try await withSession(vm: ["-x", "noipv6 user vmpeer password wrong"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--require-pap", "--peer", "vmpeer:vmpeer-secret"],
                        expectOpen: false) { s in
            let status = await s.bridge.waitForExit(30)
            #expect(status == 11, "pppbridge:\n\(s.bridge.output)")
            #expect(s.bridge.has("link down: authentication failed: peer \"vmpeer\" failed PAP authentication"))
        }
    }

    @Test func echoesKeepTheLinkUpThenDetectPppdGone() async throws {
        try await withSession(vm: ["-x", "noipv6 lcp-echo-interval 1 lcp-echo-failure 3"],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--lcp-echo-interval", "1", "--lcp-echo-failure", "3"]) { s in
            // Ten seconds of echoes both ways, no failure on either side.
            try await Task.sleep(for: .seconds(10))
            #expect(s.bridge.isRunning && !s.bridge.has("link down"), "pppbridge:\n\(s.bridge.output)")
            #expect(!s.vm.log.contains("VMPEER: LINK DOWN"))
            // Echoes went both ways: ours answered, and we answered pppd's.
            #expect(s.bridge.has("sent [LCP EchoReq") && s.bridge.has("rcvd [LCP EchoRep"), "pppbridge:\n\(s.bridge.output.suffix(1500))")
            #expect(s.bridge.has("rcvd [LCP EchoReq") && s.bridge.has("sent [LCP EchoRep"))
            // pppd killed outright: nothing more on the line; our echoes find out.
            let killed = Date()
            s.vm.guest("vmpeer-pppd kill")
            let status = await s.bridge.waitForExit(15)
            let after = Date().timeIntervalSince(killed)
            #expect(status == 15, "pppbridge:\n\(s.bridge.output)")
            #expect(s.bridge.has("link down: no response to 3 echo-requests"))
            // interval × failures + 1 s, with the guest's command latency on top.
            #expect(after <= 1 * 3 + 1 + 1.5, "took \(after) s")
        }
    }

    @Test func theVMGoingAwayIsALineHangUp() async throws {
        try await withSession(vm: ["-x", "noipv6"], ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15"]) { s in
            s.vm.stop()
            let status = await s.bridge.waitForExit(10)
            #expect(status == 16, "pppbridge:\n\(s.bridge.output)")
            #expect(s.bridge.has("link down: line hang-up"))
        }
    }

    /// Our capture of the live link decodes in tshark without a malformed frame.
    /// Our stack serves the guest: busybox `nc` sends 1 MiB of random data to our echo
    /// service and gets it back, reads 1 MiB from chargen; the guest pings us and we ping it.
    /// With VJ on (pppd's default) both directions carry compressed TCP (protocol 0x002d).
    /// The guest's line is the flow-controlled virtio port (`-P`): the emulated 16550 moves
    /// about 0.15 MB/s, and these 3 MiB took a minute a case on it.
    @Test(arguments: [true, false])
    func ourStackServesTheGuest(vj: Bool) async throws {
        try await withSession(vm: ["-P", "-x", "noipv6" + (vj ? "" : " novj")],
                        ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--services", "echo,discard,chargen",
                               "--ping", "10.0.2.15", "--ping-count", "3"] + (vj ? [] : ["--novj"])) { s in
            #expect(s.vm.log.contains(vj ? "compress VJ" : "IPCP") && (vj || !s.vm.log.contains("sent [IPCP ConfReq id=0x1 <compress VJ")))
            s.vm.guest("head -c 1048576 /dev/urandom > /tmp/d; busybox nc 10.0.2.2 7 < /tmp/d > /tmp/e; "
                       + "echo \"VMPEER-T echo $(sha256sum < /tmp/d | cut -c1-64) $(sha256sum < /tmp/e | cut -c1-64) $(wc -c < /tmp/e)\" > /dev/console")
            // Result lines start with the marker; the guest also logs each command it runs.
            func result(_ marker: String) -> Substring? { s.vm.completeLines.first { $0.hasPrefix(marker) } }
            let echoed = await eventually(180) { result("VMPEER-T echo ") != nil }
            #expect(echoed, "no echo result\n--- pppbridge:\n\(s.bridge.output.suffix(2000))\n--- guest:\n\(s.vm.log.suffix(2000))")
            if let line = result("VMPEER-T echo ") {
                let f = line.split(separator: " ").suffix(3).map(String.init)
                #expect(f.count == 3 && f[0] == f[1] && f[2] == "1048576", "\(line)")
                print("pppd interop (\(vj ? "VJ" : "novj")): guest nc -> our echo: \(line)")
            }
            // In the background: the guest runs its command lines one after another, and `sleep`
            // (which keeps nc's input open, so it does not half-close) outlives the read.
            s.vm.guest("(sleep 600 | busybox nc 10.0.2.2 19 | head -c 1048576 | sha256sum | cut -c1-64 | sed 's/^/VMPEER-T chargen /' > /dev/console) &")
            var pattern: [UInt8] = []
            var i = 0
            while pattern.count < 1 << 20 {
                let line: [UInt8] = (0..<72).map { UInt8(0x20 + (i + $0) % 95) }
                pattern += line
                pattern += [13, 10]
                i += 1
            }
            let expected = Digest.hex(Digest.hash(.sha256, Array(pattern.prefix(1 << 20)))!)
            #expect(await eventually(180) { result("VMPEER-T chargen ") != nil }, "no chargen result\n\(s.vm.log.suffix(2000))")
            #expect(result("VMPEER-T chargen ") == "VMPEER-T chargen \(expected)"[...], "chargen's 1 MiB differs from RFC 864's pattern")
            s.vm.guest("ping -c 3 10.0.2.2 > /dev/console 2>&1")
            #expect(await eventually(30) { s.vm.log.contains("3 packets transmitted, 3 packets received") }, "\(s.vm.log.suffix(1500))")
            #expect(await eventually(30) { s.bridge.has("ping 10.0.2.15: 3 sent, 3 received") }, "\(s.bridge.output.suffix(1500))")
            #expect(await s.bridge.terminate() == 0)
            // The capture shows what went over the line: VJ-compressed TCP both ways, or none.
            if let tshark = ["/usr/bin/tshark", "/usr/local/bin/tshark"].first(where: FileManager.default.isExecutableFile) {
                let r = try await runCommand(tshark, ["-r", s.bridge.pcapPath, "-T", "fields", "-e", "ppp.direction", "-e", "ppp.protocol"], timeout: 120)
                let rows = r.output.split(separator: "\n")
                let compressed = rows.filter { $0.hasSuffix("0x002d") }
                let sent = compressed.filter { $0.hasPrefix("0") }.count  // ppp.direction 0: sent by us
                print("pppd interop (\(vj ? "VJ" : "novj")): \(rows.count) frames captured, \(compressed.count) VJ-compressed (\(sent) sent by us)")
                if vj {
                    #expect(compressed.count > 500, "\(r.output.suffix(500))")
                    #expect(sent > 100 && compressed.count - sent > 100, "compressed frames both ways")
                } else {
                    #expect(compressed.isEmpty)
                }
            }
        }
    }

    /// The field workflow end to end (docs/REPLAY.md): a session with pppd recorded by
    /// `run --record` (LCP, IPCP, the guest's nc through our echo service, its pings, our
    /// Terminate), then replayed against this build: exit 0 and every state reached.
    @Test func aSessionRecordedAgainstPppdReplaysToEveryState() async throws {
        let record = NSTemporaryDirectory() + "pppbridge-replay-" + UUID().uuidString + ".pppd"
        defer { try? FileManager.default.removeItem(atPath: record) }
        try await withSession(vm: ["-r", "client", "-x", "noipv6"],
                              ours: ["--local-ip", "10.0.2.2", "--terminal-ip", "10.0.2.15", "--services", "echo", "--record", record]) { s in
            s.vm.guest("head -c 20000 /dev/urandom > /tmp/d; busybox nc 10.0.2.2 7 < /tmp/d > /tmp/e; "
                       + "echo \"VMPEER-T replay $(sha256sum < /tmp/d | cut -c1-64) $(sha256sum < /tmp/e | cut -c1-64) $(wc -c < /tmp/e)\" > /dev/console")
            func result() -> Substring? { s.vm.completeLines.first { $0.hasPrefix("VMPEER-T replay ") } }
            #expect(await eventually(120) { result() != nil }, "no echo result\n--- pppbridge:\n\(s.bridge.output.suffix(2000))\n--- guest:\n\(s.vm.log.suffix(2000))")
            if let line = result() {
                let f = line.split(separator: " ").suffix(3).map(String.init)
                #expect(f.count == 3 && f[0] == f[1] && f[2] == "20000", "\(line)")
            }
            s.vm.guest("ping -c 2 10.0.2.2 > /dev/console 2>&1")
            #expect(await eventually(30) { s.vm.log.contains("2 packets transmitted, 2 packets received") }, "\(s.vm.log.suffix(1500))")
            #expect(await s.bridge.terminate() == 0)
        }
        let r = try await runCommand(BridgeProcess.binary, ["replay", record], timeout: 120)
        print("replay of a session recorded against pppd:\n\(r.output)")
        #expect(r.status == 0, "\(r.output)")
        let lines = r.output.split(separator: "\n").map(String.init)
        #expect(lines.contains("session: the peer is rcvd, we play sent as the host"), "\(r.output)")
        #expect(lines.contains("  reached  LCP opened"))
        #expect(lines.contains("  reached  IPCP opened, local 10.0.2.2, peer 10.0.2.15"))
        #expect(lines.contains("  reached  LCP terminated by us"))
        #expect(lines.contains { $0.hasPrefix("  reached  TCP 10.0.2.15:") && $0.hasSuffix(" → 10.0.2.2:7, established, 20000 B in, 20000 B out, closed") }, "\(r.output)")
        #expect(lines.last == "result: every recorded state reached")
    }

    func expectCleanPcap(_ bridge: BridgeProcess) async throws {
        guard let tshark = ["/usr/bin/tshark", "/usr/local/bin/tshark"].first(where: FileManager.default.isExecutableFile) else {
            if ProcessInfo.processInfo.environment["CI"] != nil { Issue.record("tshark is missing; CI installs it") }
            return
        }
        let r = try await runCommand(tshark, ["-r", bridge.pcapPath, "-T", "fields", "-e", "frame.number", "-e", "ppp.protocol", "-e", "_ws.malformed"], timeout: 60)
        #expect(r.status == 0, "\(r.output)")
        let rows = r.output.split(separator: "\n").filter { $0.first?.isNumber == true }
        #expect(rows.count >= 4, "\(r.output)")
        #expect(!r.output.contains("_ws.malformed") && !r.output.lowercased().contains("malformed"), "\(r.output)")
    }
}
