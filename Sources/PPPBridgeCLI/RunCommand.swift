import Capture
import Channel
import Crypto
import Foundation
import Framing
import NetStack
import PPP

/// `pppbridge run`: brings a PPP link up on a serial device or pty and keeps it up.
struct RunCommand {
    var output: (String) -> Void
    var error: (String) -> Void
    /// Where PPPBRIDGE_PASSWORD is looked up (the process's environment; tests give their own).
    var environment: [String: String] = ProcessInfo.processInfo.environment

    static let usage = """
    usage: pppbridge run (--device PATH | --pty [--link PATH]) [options]

    Brings a PPP link up on a serial line and keeps it up until the link goes down or
    SIGINT/SIGTERM closes it with LCP Terminate-Request.

    line:
      --device PATH          a serial device or an existing pty, put in raw mode
      --pty                  create a pty and print its name for another program to open
      --link PATH            with --pty: also make PATH a symlink to it
      --speed N              line speed (default 115200)
      --crtscts              RTS/CTS hardware flow control
    role and addresses:
      --role host|terminal   host (default, the ICPPP role): assign the terminal its address;
                             terminal: accept the addresses the peer gives, ask for DNS
      --local-ip A           our address (host default 192.168.53.1)
      --terminal-ip A        the peer's address (host default 192.168.53.2)
                             without these the host proposes the defaults and takes the
                             addresses a peer insists on (pppd's ipcp-accept-local and
                             -remote), never 0/8, loopback, multicast, 240/4, broadcast or
                             one address for both ends; --tun needs both; with them a peer
                             that insists on others ends the link (exit status 10)
      --dns A                a DNS server given to the peer (twice for a secondary)
      --netmask A            reported as the link's submask (default 255.255.255.255)
    LCP (pppd's names):
      --mru N                our MRU (default 1500)
      --asyncmap HEX         control characters the peer must escape for us (default 0)
      --default-asyncmap     do not negotiate the map (both sides escape all control characters)
      --escape HEX[,HEX...]  extra byte values we always escape
      --nopcomp --noaccomp   refuse protocol / address-control field compression
      --novj                 refuse VJ header compression (RFC 1144; on by default, 16 slots)
      --lcp-echo-interval S  send an LCP Echo-Request every S seconds (default 5; 0: off)
      --lcp-echo-failure N   take the link down after N unanswered ones (default 4; 0: never)
                             the defaults notice a pulled cable or a dead terminal in about
                             20 s, for 16 bytes on the line every 5 s
      --lcp-echo-adaptive    only probe when nothing was received for an interval
      --lcp-restart S        the restart timer (default 3)
      --lcp-max-configure N  Configure-Requests before giving up (default 10)
    authentication:
      --require-pap | --require-chap   the peer must authenticate (PAP, or CHAP-MD5); with
                             both, CHAP is asked for first and PAP only if the peer refuses it
      --peer NAME:SECRET     credentials the peer may authenticate with (repeatable)
      --peer-file PATH       the same, one NAME:SECRET per line, from a file (not in argv)
      --user NAME --password SECRET   what we authenticate with when the peer asks
      --password-file PATH   the password from a file (its trailing newline dropped); without
                             either, --user takes PPPBRIDGE_PASSWORD from the environment
      --name NAME            our name in CHAP challenges (default pppbridge)
    bridges and proxy (the ICPPP channel; our own TCP/IP stack):
      --bridge KIND:PORT     host:PORT   listen on every host interface, connect each client
                                         to the terminal's PORT
                             local:PORT  the same, listening on loopback only
                             terminal:PORT  listen on our PPP address, connect each terminal
                                         client to 127.0.0.1:PORT on the host
                             (repeatable, at most 12; added when the link is up)
      --socks [PORT]         the SOCKS4/4a/5 proxy on our PPP address (default port 1080; on
                             unless --no-socks), at most 5 outbound connections at once
      --no-socks             no proxy
      --socks-allow HOST:PORT  only these destinations (repeatable); an entry naming an address
                             also opens exactly that ADDRESS:PORT when it is on the host or a
                             private network; a name still leads only where the rules allow
                             (its address:port must be listed too to reach the host or a
                             private network, as DNS may point it anywhere)
      --socks-allow-private  let the terminal reach loopback, private (RFC 1918), link-local,
                             CGNAT, multicast, reserved and documentation addresses, the host's
                             interface addresses and the link's own (refused by default: SOCKS5
                             reply 2, SOCKS4 0x5B)
      --socks-user NAME:PASSWORD  SOCKS5 must authenticate (RFC 1929; repeatable)
      --socks-user-file PATH the same, one NAME:PASSWORD per line, from a file
      --keepalive IDLE,INTERVAL,COUNT  TCP keep-alive for the proxy's outbound sockets:
                             idle seconds before the first probe, seconds between probes,
                             unanswered probes before the connection is dropped
      --dns-upstream ADDR[:PORT]  relay the terminal's DNS queries (sent to our PPP address,
                             handed out as its DNS server) to this resolver (default: the
                             first nameserver in /etc/resolv.conf)
      --no-dns-relay         do not relay DNS
      --bridge-max-connections N  connections one bridge carries at once (default 64); more
                             are reset at once
      --max-connections N    connections our stack holds at once, half-open ones included
                             (default 256)
      --user-timeout S       abort a bridged, proxied or service connection whose data the
                             terminal leaves unacknowledged for S seconds, a closed window
                             included (default 120; 0: never)
      --line-queue-limit N   bytes queued for the line beyond which IP packets are dropped
                             and the line is not read until it is down to half (4096 to
                             67108864; default about 2 s of line time at --speed, at least
                             8192, and 262144 on a pty); LCP echoes pass the queued data,
                             but a limit of many seconds of line time delays their replies
      --rearm                add the bridges again when the link comes back (with --persist)
      --persist              reopen the link when it goes down (until SIGINT/SIGTERM)
      --status-json FILE     write the channel's status as JSON every second and on SIGUSR2
    IP on the link (our own TCP/IP stack unless --tun):
      --services LIST        answer echo (7), discard (9), chargen (19), daytime (13) on our
                             PPP address (comma-separated; off by default)
      --ping ADDR            ping ADDR through the link once it is up (our stack)
      --ping-count N         how many pings (default 3), a second apart; without --services
                             the link is closed after the last reply (or 10 s without it)
      --tun NAME             hand IP packets to TUN interface NAME instead (given the
                             negotiated addresses and MTU; needs CAP_NET_ADMIN)
      --tcp-no-sack --tcp-no-window-scaling --tcp-no-timestamps
                             do not offer these TCP options
      --frame-loss PERCENT   drop this share of frames both ways, seeded (testing only)
      SIGUSR1 prints the stack's counters (or the TUN's packet counts). On a terminal, a
      status line shows the link, its addresses, bridges, connections, bytes and errors.
    output:
      --debug                print every control packet as pppd does (sent [...] / rcvd [...])
      --pcap FILE            write every frame to a pcap (link type 204, with direction)
      --record FILE          write the raw line both ways in pppd's record format
                             (captures and the status file are created 0600 and never
                             written through a symbolic link)
      --capture-secrets      keep PAP and SOCKS5 passwords in the captures; by default each
                             password byte is written as '*' (lengths and checksums kept)
      --capture-limit MIB    stop each capture at this size (default 256)

    Exit status: 0 closed on request; 2 bad usage; 7 the line (or a capture file, or a
    --bridge) could not be opened;
    10 negotiation failed; 11 authentication failed; 15 no answer to LCP echoes; 16 line
    hang-up; 17 looped-back line; 22 the peer terminated the link.
    """

    enum Role: String { case host, terminal }

    func run(_ arguments: [String]) -> Int32 {
        var device: String?
        var makePty = false
        var link: String?
        var lineOptions = SerialLine.Options()
        var role = Role.host
        var localIP: IPv4Address?
        var terminalIP: IPv4Address?
        var dns: [IPv4Address] = []
        var netmask: IPv4Address?
        var lcp = LCPConfiguration()
        var echo = EchoConfiguration()
        var negotiation = NegotiationConfiguration()
        var auth = AuthenticationConfiguration()
        var user: String?
        var password: String?
        var extraEscapes: [UInt8] = []
        var debug = false
        var pcapPath: String?
        var recordPath: String?
        var services: [DiagnosticService] = []
        var pingTarget: IPv4Address?
        var pingCount = 3
        var tunName: String?
        var tcp = TCPConfiguration()
        var frameLoss = 0.0
        var vj = true
        var bridges: [BridgeSpec] = []
        var socks: SocksConfiguration? = SocksConfiguration()
        var socksAllow: [SocksDestination] = []
        var socksAllowPrivate = false
        var socksUsers: [String: String] = [:]
        var keepAlive: KeepAliveSettings?
        var dnsUpstream: TCPEndpoint?
        var relayDNS = true
        var rearm = false
        var bridgeConnectionLimit = 64
        var stackConnectionLimit = 256
        var userTimeout: Duration? = .seconds(120)
        var lineQueueLimit: Int?
        var persist = false
        var statusPath: String?
        var captureSecrets = false
        var captureLimit = CaptureFile.defaultLimit

        var it = ArgumentCursor(arguments)
        func value(_ flag: String) -> String? {
            let v = it.next()
            if v == nil { error("pppbridge run: \(flag) needs a value (see `pppbridge run --help`)") }
            return v
        }
        func address(_ flag: String) -> IPv4Address?? {
            guard let v = value(flag) else { return .none }
            guard let a = IPv4Address(v) else {
                error("pppbridge run: \(flag) takes a dotted-quad IPv4 address, not '\(v)'")
                return .none
            }
            return .some(a)
        }
        func number(_ flag: String) -> Int? {
            guard let v = value(flag) else { return nil }
            guard let n = Int(v), n >= 0 else {
                error("pppbridge run: \(flag) takes a non-negative number, not '\(v)'")
                return nil
            }
            return n
        }
        func secretFile(_ path: String) -> String? {
            switch SecretSource.read(path) {
            case let .success(file):
                if let w = file.warning { error("pppbridge run: warning: \(w)") }
                return file.text
            case let .failure(e):
                error("pppbridge run: \(e)")
                return nil
            }
        }
        func secretPairs(_ path: String) -> [(name: String, secret: String)]? {
            guard let text = secretFile(path) else { return nil }
            switch SecretSource.pairs(text, path: path) {
            case let .success(pairs): return pairs
            case let .failure(e):
                error("pppbridge run: \(e)")
                return nil
            }
        }
        let usage = CommandLineTool.Status.usage
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(RunCommand.usage)
                return CommandLineTool.Status.success
            case "--device": guard let v = value(a) else { return usage }; device = v
            case "--pty": makePty = true
            case "--link": guard let v = value(a) else { return usage }; link = v
            case "--speed": guard let n = number(a) else { return usage }; lineOptions.speed = n
            case "--crtscts": lineOptions.hardwareFlowControl = true
            case "--role":
                guard let v = value(a) else { return usage }
                guard let r = Role(rawValue: v) else { error("pppbridge run: --role is host or terminal"); return usage }
                role = r
            case "--local-ip": guard case let .some(.some(x)) = address(a) else { return usage }; localIP = x
            case "--terminal-ip": guard case let .some(.some(x)) = address(a) else { return usage }; terminalIP = x
            case "--dns": guard case let .some(.some(x)) = address(a) else { return usage }; dns.append(x)
            case "--netmask": guard case let .some(.some(x)) = address(a) else { return usage }; netmask = x
            case "--mru":
                guard let n = number(a) else { return usage }
                guard (128...16384).contains(n) else { error("pppbridge run: --mru must be 128–16384"); return usage }
                lcp.mru = UInt16(n)
            case "--asyncmap":
                guard let v = value(a) else { return usage }
                guard let m = UInt32(v.hasPrefix("0x") ? String(v.dropFirst(2)) : v, radix: 16) else {
                    error("pppbridge run: --asyncmap takes a hexadecimal map"); return usage
                }
                lcp.asyncMap = m
            case "--default-asyncmap": lcp.asyncMap = nil
            case "--escape":
                guard let v = value(a) else { return usage }
                for part in v.split(separator: ",") {
                    guard let b = UInt8(part.hasPrefix("0x") ? String(part.dropFirst(2)) : String(part), radix: 16),
                          EscapeSet.isEscapable(b) else {
                        error("pppbridge run: --escape takes hex bytes outside 0x20–0x3f and 0x5d–0x5e"); return usage
                    }
                    extraEscapes.append(b)
                }
            case "--nopcomp": lcp.protocolFieldCompression = false
            case "--noaccomp": lcp.addressControlCompression = false
            case "--novj": vj = false
            case "--lcp-echo-interval": guard let n = number(a) else { return usage }; echo.interval = .seconds(n)
            case "--lcp-echo-failure": guard let n = number(a) else { return usage }; echo.failureLimit = n
            case "--lcp-echo-adaptive": echo.adaptive = true
            case "--lcp-restart":
                guard let n = number(a), n > 0 else { error("pppbridge run: --lcp-restart takes seconds > 0"); return usage }
                negotiation.restartInterval = .seconds(n)
            case "--lcp-max-configure":
                guard let n = number(a), n > 0 else { error("pppbridge run: --lcp-max-configure takes a count > 0"); return usage }
                negotiation.maxConfigure = n
            case "--require-pap": lcp.requireAuthentication.insert(.pap)
            case "--require-chap": lcp.requireAuthentication.insert(.chapMD5)
            case "--peer":
                guard let v = value(a) else { return usage }
                guard let colon = v.firstIndex(of: ":") else { error("pppbridge run: --peer takes NAME:SECRET"); return usage }
                auth.peers.append(Credentials(name: String(v[..<colon]), secret: String(v[v.index(after: colon)...])))
            case "--user": guard let v = value(a) else { return usage }; user = v
            case "--password": guard let v = value(a) else { return usage }; password = v
            case "--password-file":
                guard let v = value(a), let text = secretFile(v) else { return usage }
                password = text
            case "--peer-file":
                guard let v = value(a), let pairs = secretPairs(v) else { return usage }
                auth.peers += pairs.map { Credentials(name: $0.name, secret: $0.secret) }
            case "--socks-user-file":
                guard let v = value(a), let pairs = secretPairs(v) else { return usage }
                for p in pairs { socksUsers[p.name] = p.secret }
            case "--capture-secrets": captureSecrets = true
            case "--capture-limit":
                guard let n = number(a), (1...(1 << 20)).contains(n) else {
                    error("pppbridge run: --capture-limit takes MiB, 1–1048576"); return usage
                }
                captureLimit = n * 1024 * 1024
            case "--name": guard let v = value(a) else { return usage }; auth.localName = v
            case "--debug": debug = true
            case "--pcap": guard let v = value(a) else { return usage }; pcapPath = v
            case "--record": guard let v = value(a) else { return usage }; recordPath = v
            case "--services":
                guard let v = value(a) else { return usage }
                for name in v.split(separator: ",") {
                    guard let service = DiagnosticService(rawValue: String(name)) else {
                        error("pppbridge run: --services takes echo, discard, chargen and daytime, not '\(name)'"); return usage
                    }
                    services.append(service)
                }
            case "--ping": guard case let .some(.some(x)) = address(a) else { return usage }; pingTarget = x
            case "--ping-count":
                guard let n = number(a), n > 0 else { error("pppbridge run: --ping-count takes a count > 0"); return usage }
                pingCount = n
            case "--tun": guard let v = value(a) else { return usage }; tunName = v
            case "--tcp-no-sack": tcp.selectiveAcknowledgments = false
            case "--tcp-no-window-scaling": tcp.windowScaling = false
            case "--tcp-no-timestamps": tcp.timestamps = false
            case "--frame-loss":
                guard let v = value(a) else { return usage }
                guard let p = Double(v), p >= 0, p < 100 else { error("pppbridge run: --frame-loss takes a percentage below 100"); return usage }
                frameLoss = p / 100
            case "--bridge":
                guard let v = value(a) else { return usage }
                let parts = v.split(separator: ":")
                guard parts.count == 2, let kind = BridgeKind(rawValue: String(parts[0])), let port = UInt16(parts[1]), port > 0 else {
                    error("pppbridge run: --bridge takes host:PORT, local:PORT or terminal:PORT, not '\(v)'"); return usage
                }
                bridges.append(BridgeSpec(kind, port: port))
            case "--socks":
                if socks == nil { socks = SocksConfiguration() }
                if let next = it.peek(), let port = UInt16(next), port > 0 {
                    _ = it.next()
                    socks!.port = port
                }
            case "--no-socks": socks = nil
            case "--socks-allow":
                guard let v = value(a) else { return usage }
                guard let d = SocksDestination(v) else { error("pppbridge run: --socks-allow takes HOST:PORT"); return usage }
                socksAllow.append(d)
            case "--socks-allow-private": socksAllowPrivate = true
            case "--socks-user":
                guard let v = value(a) else { return usage }
                guard let colon = v.firstIndex(of: ":") else { error("pppbridge run: --socks-user takes NAME:PASSWORD"); return usage }
                socksUsers[String(v[..<colon])] = String(v[v.index(after: colon)...])
            case "--keepalive":
                guard let v = value(a) else { return usage }
                let n = v.split(separator: ",").compactMap { Int32($0) }
                guard n.count == 3, KeepAliveSettings(idleSeconds: n[0], probeIntervalSeconds: n[1], probeCount: n[2]).isValid else {
                    error("pppbridge run: --keepalive takes IDLE,INTERVAL,COUNT (seconds, seconds, probes; 1–32767, 1–32767, 1–127)"); return usage
                }
                keepAlive = KeepAliveSettings(idleSeconds: n[0], probeIntervalSeconds: n[1], probeCount: n[2])
            case "--dns-upstream":
                guard let v = value(a) else { return usage }
                let parts = v.split(separator: ":")
                guard (1...2).contains(parts.count), let address = IPv4Address(String(parts[0])),
                      let port = parts.count == 2 ? UInt16(parts[1]) : 53 else {
                    error("pppbridge run: --dns-upstream takes ADDR[:PORT]"); return usage
                }
                dnsUpstream = TCPEndpoint(address, port)
            case "--no-dns-relay": relayDNS = false
            case "--rearm": rearm = true
            case "--bridge-max-connections":
                guard let n = number(a) else { return usage }
                guard n > 0 else { error("pppbridge run: --bridge-max-connections takes at least 1"); return usage }
                bridgeConnectionLimit = n
            case "--max-connections":
                guard let n = number(a) else { return usage }
                guard n > 0 else { error("pppbridge run: --max-connections takes at least 1"); return usage }
                stackConnectionLimit = n
            case "--user-timeout":
                guard let n = number(a) else { return usage }
                guard n <= 86_400 else { error("pppbridge run: --user-timeout takes at most 86400 seconds"); return usage }
                userTimeout = n == 0 ? nil : .seconds(n)
            case "--line-queue-limit":
                guard let n = number(a) else { return usage }
                guard n >= LinkSession.minimumLineQueueLimit, n <= LinkSession.maximumLineQueueLimit else {
                    error("pppbridge run: --line-queue-limit takes \(LinkSession.minimumLineQueueLimit) to \(LinkSession.maximumLineQueueLimit) bytes")
                    return usage
                }
                lineQueueLimit = n
            case "--persist": persist = true
            case "--status-json": guard let v = value(a) else { return usage }; statusPath = v
            default:
                error("pppbridge run: unknown option \(a) (see `pppbridge run --help`)")
                return usage
            }
        }
        guard (device != nil) != makePty else {
            error("pppbridge run: give exactly one of --device PATH and --pty")
            return usage
        }
        if link != nil && !makePty { error("pppbridge run: --link goes with --pty"); return usage }
        if tunName != nil && (!services.isEmpty || pingTarget != nil || !bridges.isEmpty) {
            error("pppbridge run: --tun hands IP to the kernel; --services, --ping and --bridge need our stack"); return usage
        }
        // The kernel routes to the addresses the link settles on: a host taking the terminal's
        // choice would let it claim any address (the host's resolver, a gateway) for itself.
        if tunName != nil && role == .host && (localIP == nil || terminalIP == nil) {
            error("pppbridge run: --tun in the host role needs --local-ip and --terminal-ip (the kernel routes to the link's addresses; the terminal must not choose them)")
            return usage
        }
        if bridges.count > 12 { error("pppbridge run: at most 12 bridges"); return usage }
        if !lcp.requireAuthentication.isEmpty && auth.peers.isEmpty {
            error("pppbridge run: --require-pap/--require-chap need at least one --peer NAME:SECRET")
            return usage
        }
        if user != nil && password == nil { password = environment[SecretSource.passwordVariable] }
        if (user == nil) != (password == nil) { error("pppbridge run: --user and --password go together"); return usage }
        // PAP and CHAP carry names and secrets behind one-byte lengths.
        let credentials = [user, password].compactMap { $0 } + auth.peers.flatMap { [$0.name, $0.secret] } + [auth.localName]
        if credentials.contains(where: { $0.utf8.count > 255 }) {
            error("pppbridge run: names and secrets are at most 255 bytes")
            return usage
        }
        if let user, let password {
            auth.local = Credentials(name: user, secret: password)
            lcp.authenticateWith = [.pap, .chapMD5]
        }

        var configuration: LinkConfiguration
        switch role {
        case .host:
            configuration = .host(local: localIP ?? IPv4Address(192, 168, 53, 1), terminal: terminalIP ?? IPv4Address(192, 168, 53, 2), dns: dns)
            // Addresses the user did not choose give way to a peer that insists on its own
            // (only with our own stack: --tun requires both).
            configuration.ipcp.acceptLocal = localIP == nil
            configuration.ipcp.acceptRemote = terminalIP == nil
        case .terminal:
            configuration = .terminal()
            configuration.ipcp.localAddress = localIP
            configuration.ipcp.peerAddress = terminalIP
            configuration.ipcp.dnsServers = dns
        }
        if let netmask { configuration.ipcp.netmask = netmask }
        if !vj { configuration.ipcp.vj = nil }
        configuration.lcp = lcp
        configuration.echo = echo
        configuration.negotiation = negotiation
        configuration.authentication = auth
        configuration.extraEscapes = extraEscapes
        configuration.debug = debug
        configuration.captureFrames = pcapPath != nil

        if tunName == nil {
            var c = ChannelConfiguration(line: device.map { .device($0, lineOptions) } ?? .pty(linkedAt: link, lineOptions), link: configuration)
            c.tcp = tcp
            if var s = socks {
                if !socksAllow.isEmpty { s.allow = socksAllow }
                s.allowPrivate = socksAllowPrivate
                if !socksUsers.isEmpty { s.passwords = socksUsers }
                c.socks = s
            } else {
                c.socks = nil
            }
            c.keepAlive = keepAlive
            // The relay answers on our address; in the terminal role the peer is the host.
            c.relayDNS = relayDNS && role == .host
            c.dnsUpstream = dnsUpstream
            c.services = services
            c.pcapPath = pcapPath
            c.recordPath = recordPath
            c.captureSecrets = captureSecrets
            c.captureLimit = captureLimit
            c.rearmBridgesOnReopen = rearm
            c.bridgeConnectionLimit = bridgeConnectionLimit
            c.stackConnectionLimit = stackConnectionLimit
            c.connectionUserTimeout = userTimeout
            c.lineQueueLimit = lineQueueLimit
            c.frameLoss = frameLoss
            if let pingTarget {
                c.ping = (pingTarget, pingCount)
                c.closeAfterPing = services.isEmpty && bridges.isEmpty
            }
            return ChannelRun(configuration: c, bridges: bridges, persist: persist, statusPath: statusPath, debug: debug,
                              output: output, error: error).run()
        }

        let line: SerialLine
        do {
            if let device {
                line = try SerialLine(device: device, options: lineOptions)
                output("pppbridge: attached to \(device)")
            } else {
                line = try SerialLine(ptyLinkedAt: link, options: lineOptions)
                output("pppbridge: pty \(line.peerPath ?? "?")" + (link.map { " (linked at \($0))" } ?? ""))
            }
        } catch let e {
            error("pppbridge: \(e)")
            return RunCommand.Status.openFailed
        }
        defer { line.close() }

        var pcap: PcapWriter?
        var record: PPPDRecordWriter?
        do {
            let masking = captureSecrets ? nil : SecretMasker()
            if let pcapPath {
                pcap = try PcapWriter(path: pcapPath, linkType: .pppWithDirection, masking: masking, limit: captureLimit, onStop: error)
            }
            if let recordPath {
                record = try PPPDRecordWriter(path: recordPath, startTime: Int64(Date().timeIntervalSince1970), masking: masking,
                                              limit: captureLimit, onStop: error)
            }
        } catch let e {
            error("pppbridge: \(e)")
            return RunCommand.Status.openFailed
        }

        var seed: UInt64 = 0
        withUnsafeMutableBytes(of: &seed) { _ = getentropy($0.baseAddress, $0.count) }
        let attachment: NetworkAttachment
        if let tunName {
            do {
                let tun = try TunAttachment(name: tunName, output: output)
                output("pppbridge: TUN interface \(tun.name)")
                attachment = tun
            } catch let e {
                error("pppbridge: \(e)")
                return RunCommand.Status.openFailed
            }
        } else {
            let stack = StackAttachment(services: services, tcp: tcp, output: output)
            if let pingTarget { stack.ping(pingTarget, count: pingCount) }
            attachment = stack
        }
        let session = LinkSession(line: line, link: PPPLink(configuration: configuration, random: CSPRNG()), pcap: pcap, record: record,
                                  attachment: attachment, frameLoss: frameLoss, seed: seed &+ 2) { event in
            for text in RunCommand.describe(event, debug: debug) { output(text) }
        }
        session.report = output
        if let lineQueueLimit { session.lineQueueLimit = lineQueueLimit }
        session.closeWhenAttachmentFinished = pingTarget != nil && services.isEmpty
        let reason: LinkDownReason
        do {
            reason = try session.run()
        } catch let e {
            error("pppbridge: \(e)")
            return RunCommand.Status.hangUp
        }
        return RunCommand.Status.of(reason)
    }

    /// pppd-like lines for the events a person wants to see.
    static func describe(_ event: LinkEvent, debug: Bool) -> [String] {
        switch event {
        case let .debug(line): return debug ? [line] : []
        case let .phase(p): return debug ? ["phase \(p.rawValue)"] : []
        case let .lcpOpened(r):
            var parts = ["mru \(r.receiveMRU)/\(r.transmitMRU)", "asyncmap rx 0x\(String(r.receiveACCM, radix: 16)) tx 0x\(String(r.transmitACCM, radix: 16))"]
            if r.transmitProtocolCompression { parts.append("pcomp") }
            if r.transmitAddressControlCompression { parts.append("accomp") }
            if let a = r.peerAuthentication { parts.append("peer authenticates with \(a.rawValue)") }
            if let a = r.localAuthentication { parts.append("we authenticate with \(a.rawValue)") }
            return ["LCP opened: " + parts.joined(separator: ", ")]
        case let .authenticated(name): return ["authentication succeeded" + (name.map { " (peer \"\($0)\")" } ?? "")]
        case let .ipcpOpened(r):
            var lines = ["IPCP opened", "local  IP address \(r.localAddress)", "remote IP address \(r.peerAddress)"]
            if r.dnsServers.count > 0 { lines.append("primary   DNS address \(r.dnsServers[0])") }
            if r.dnsServers.count > 1 { lines.append("secondary DNS address \(r.dnsServers[1])") }
            lines.append("submask \(r.netmask)")
            return lines
        case .ipcpClosed: return ["IPCP closed"]
        case let .echoMissed(n): return ["no response to \(n) echo-requests"]
        case let .down(reason): return ["link down: \(reason)"]
        }
    }

    enum Status {
        static let openFailed: Int32 = 7
        static let negotiationFailed: Int32 = 10
        static let authenticationFailed: Int32 = 11
        static let echoTimeout: Int32 = 15
        static let hangUp: Int32 = 16
        static let loopback: Int32 = 17
        static let peerTerminated: Int32 = 22

        /// pppd's exit statuses where pppd has one for the same cause.
        static func of(_ reason: ChannelCloseReason) -> Int32 {
            switch reason {
            case .closedByUs: return CommandLineTool.Status.success
            case .negotiationFailed: return negotiationFailed
            case .authenticationFailed: return authenticationFailed
            case .echoTimeout: return echoTimeout
            case .lineHangUp: return hangUp
            case .loopback: return loopback
            case .peerTerminated: return peerTerminated
            case .lineFailed: return openFailed
            }
        }

        static func of(_ reason: LinkDownReason) -> Int32 {
            switch reason {
            case .closedByUs: return CommandLineTool.Status.success
            case .negotiationFailed, .networkFailed, .addressConflict: return negotiationFailed
            case .authenticationFailed: return authenticationFailed
            case .echoTimeout: return echoTimeout
            case .lineHangUp: return hangUp
            case .loopback: return loopback
            case .peerTerminated: return peerTerminated
            }
        }
    }
}

/// Walks the arguments, with a look at the next one for options whose value is optional.
struct ArgumentCursor {
    private let arguments: [String]
    private var index = 0
    init(_ arguments: [String]) { self.arguments = arguments }
    mutating func next() -> String? {
        guard index < arguments.count else { return nil }
        defer { index += 1 }
        return arguments[index]
    }
    func peek() -> String? { index < arguments.count ? arguments[index] : nil }
}
