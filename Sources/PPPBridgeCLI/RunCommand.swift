import Capture
import Channel
import Service
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
      --device PATH          a serial device or an existing pty, put in raw mode; or a
                             serial line on a device server: tcp:HOST:PORT (raw TCP) or
                             rfc2217:HOST:PORT (telnet, the port set to --speed and
                             --crtscts, a carrier drop ends the link); HOST numeric or
                             localhost; with --persist a refused connection is retried
      --pty                  create a pty and print its name for another program to open
      --link PATH            with --pty: also make PATH a symlink to it
      --speed N              line speed (default 115200; on a network line, the serial
                             side's, which sizes the output queue)
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
      --socks-outbound-address A  make the proxy's outbound connections from this host
                             address (one of this host's; for a firewall that knows the
                             terminals by it)
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
      --line-poll-interval US  while frames arrive steadily at 1,000 to 10,000 and 1 to 16
                             MB a second, read the line every US microseconds instead of
                             on every arrival: fewer wakeups per MB, up to US more latency
                             while busy (0 to 20000; default 2000; 0 reads on every arrival)
      --rearm                add the bridges again when the link comes back (with --persist)
      --persist              reopen the link when it goes down (until SIGINT/SIGTERM)
      --status-json FILE     write the channel's status as JSON every second and on SIGUSR2
    IP on the link (our own TCP/IP stack unless --tun):
      --services LIST        answer echo (7), discard (9), chargen (19), daytime (13) on our
                             PPP address (comma-separated; off by default); NAME:PORT moves
                             one to another port (echo:5000)
      --ping ADDR            ping ADDR through the link once it is up (our stack)
      --ping-count N         how many pings (default 3), a second apart; without --services
                             the link is closed after the last reply (or 10 s without it)
      --tun NAME             hand IP packets to TUN interface NAME instead (given the
                             negotiated addresses and MTU; needs CAP_NET_ADMIN)
      --tcp-no-sack --tcp-no-window-scaling --tcp-no-timestamps
                             do not offer these TCP options
      --tcp-no-delayed-ack   acknowledge what each read of the line brings at once, not
                             after two full segments or 40 ms
      --tcp-receive-window BYTES  each connection's receive buffer, the most we advertise
                             (default 262144); a smaller one holds back a terminal that
                             writes in small pieces, which is not faster (docs/PERFORMANCE.md)
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

    typealias Role = RunOptions.Role

    func run(_ arguments: [String]) -> Int32 {
        var o = RunOptions()
        let complain: (String) -> Void = { error("pppbridge run: " + $0) }
        let usage = CommandLineTool.Status.usage
        var it = ArgumentCursor(arguments)
        while let a = it.next() {
            if a == "-h" || a == "--help" {
                output(RunCommand.usage)
                return CommandLineTool.Status.success
            }
            guard o.take(a, from: &it, complain: complain) else { return usage }
        }
        guard o.validate(environment: environment, complain: complain) else { return usage }
        if o.tunName == nil {
            return ChannelRun(configuration: o.channelConfiguration, bridges: o.bridges, persist: o.persist, statusPath: o.statusPath,
                              debug: o.debug, output: output, error: error).run()
        }
        let (device, link, lineOptions, debug) = (o.device, o.link, o.lineOptions, o.debug)
        let (pcapPath, recordPath, captureSecrets, captureLimit) = (o.pcapPath, o.recordPath, o.captureSecrets, o.captureLimit)
        let (tunName, services, tcp, pingTarget, pingCount) = (o.tunName, o.services, o.tcp, o.pingTarget, o.pingCount)
        let (frameLoss, lineQueueLimit, configuration) = (o.frameLoss, o.lineQueueLimit, o.linkConfiguration)
        let readModeration = o.lineReadModeration
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
            let stack = StackAttachment(services: services, servicePorts: o.servicePorts, tcp: tcp, output: output)
            if let pingTarget { stack.ping(pingTarget, count: pingCount) }
            attachment = stack
        }
        let session = LinkSession(line: line, link: PPPLink(configuration: configuration, random: CSPRNG()), pcap: pcap, record: record,
                                  attachment: attachment, frameLoss: frameLoss, seed: seed &+ 2) { event in
            for text in RunCommand.describe(event, debug: debug) { output(text) }
        }
        session.report = output
        if let lineQueueLimit { session.lineQueueLimit = lineQueueLimit }
        session.readModeration = readModeration
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
        static func of(_ reason: ChannelCloseReason) -> Int32 { reason.code }

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

