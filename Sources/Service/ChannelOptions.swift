import Capture
import Channel
import RemoteSerial
import Foundation
import Framing
import NetStack
import PPP

/// `run`'s options, taken one at a time: from the command line (`--mru 1500`) or from a line of a
/// `serve` configuration file (`mru 1500`), with the same checks and the same messages. Messages
/// go to `complain` without a prefix; the caller says where the option came from.
public struct RunOptions {
    /// `--tcp-receive-window`: at least two full segments; at most 1 MiB, which a terminal
    /// can fill on each of the stack's 256 connections (256 MiB in all).
    public static let receiveWindowRange = 2920...(1 << 20)
    public enum Role: String, Sendable { case host, terminal }

    public var device: String?
    public var makePty = false
    public var link: String?
    public var lineOptions = SerialLine.Options()
    public var role = Role.host
    public var localIP: IPv4Address?
    public var terminalIP: IPv4Address?
    public var dns: [IPv4Address] = []
    public var netmask: IPv4Address?
    public var lcp = LCPConfiguration()
    public var echo = EchoConfiguration()
    public var negotiation = NegotiationConfiguration()
    public var auth = AuthenticationConfiguration()
    public var user: String?
    public var password: String?
    public var extraEscapes: [UInt8] = []
    public var debug = false
    public var pcapPath: String?
    public var recordPath: String?
    public var services: [DiagnosticService] = []
    public var servicePorts: [DiagnosticService: UInt16] = [:]
    public var pingTarget: IPv4Address?
    public var pingCount = 3
    public var tunName: String?
    public var tcp = TCPConfiguration()
    public var frameLoss = 0.0
    public var vj = true
    public var bridges: [BridgeSpec] = []
    public var socks: SocksConfiguration? = SocksConfiguration()
    public var socksAllow: [SocksDestination] = []
    public var socksAllowPrivate = false
    public var socksOutboundAddress: IPv4Address?
    public var socksUsers: [String: String] = [:]
    public var keepAlive: KeepAliveSettings?
    public var dnsUpstream: TCPEndpoint?
    public var relayDNS = true
    public var rearm = false
    public var bridgeConnectionLimit = 64
    public var stackConnectionLimit = 256
    public var userTimeout: Duration? = .seconds(120)
    public var lineQueueLimit: Int?
    public var lineReadModeration = LineReadModeration.Settings.standard
    public var persist = false
    public var statusPath: String?
    public var captureSecrets = false
    public var captureLimit = CaptureFile.defaultLimit

    public init() {}

    /// Takes `option` (with its dashes, as on the command line) and the values it needs from
    /// `it`; false when it is unknown or a value is wrong (said through `complain`).
    public mutating func take(_ a: String, from it: inout ArgumentCursor, complain: (String) -> Void) -> Bool {
        func value(_ flag: String) -> String? {
            let v = it.next()
            if v == nil { complain("\(flag) needs a value (see `pppbridge run --help`)") }
            return v
        }
        func address(_ flag: String) -> IPv4Address?? {
            guard let v = value(flag) else { return .none }
            guard let a = IPv4Address(v) else {
                complain("\(flag) takes a dotted-quad IPv4 address, not '\(v)'")
                return .none
            }
            return .some(a)
        }
        func number(_ flag: String) -> Int? {
            guard let v = value(flag) else { return nil }
            guard let n = decimal(v, as: Int.self) else {
                complain("\(flag) takes a non-negative number, not '\(v)'")
                return nil
            }
            return n
        }
        func secretFile(_ path: String) -> String? {
            switch SecretSource.read(path) {
            case let .success(file):
                if let w = file.warning { complain("warning: \(w)") }
                return file.text
            case let .failure(e):
                complain("\(e)")
                return nil
            }
        }
        func secretPairs(_ path: String) -> [(name: String, secret: String)]? {
            guard let text = secretFile(path) else { return nil }
            switch SecretSource.pairs(text, path: path) {
            case let .success(pairs): return pairs
            case let .failure(e):
                complain("\(e)")
                return nil
            }
        }
        switch a {
        case "--device": guard let v = value(a) else { return false }; device = v
        case "--pty": makePty = true
        case "--link": guard let v = value(a) else { return false }; link = v
        case "--speed": guard let n = number(a) else { return false }; lineOptions.speed = n
        case "--crtscts": lineOptions.hardwareFlowControl = true
        case "--role":
            guard let v = value(a) else { return false }
            guard let r = Role(rawValue: v) else { complain("--role is host or terminal"); return false }
            role = r
        case "--local-ip": guard case let .some(.some(x)) = address(a) else { return false }; localIP = x
        case "--terminal-ip": guard case let .some(.some(x)) = address(a) else { return false }; terminalIP = x
        case "--dns": guard case let .some(.some(x)) = address(a) else { return false }; dns.append(x)
        case "--netmask": guard case let .some(.some(x)) = address(a) else { return false }; netmask = x
        case "--mru":
            guard let n = number(a) else { return false }
            guard (128...16384).contains(n) else { complain("--mru must be 128–16384"); return false }
            lcp.mru = UInt16(n)
        case "--asyncmap":
            guard let v = value(a) else { return false }
            guard let m = UInt32(v.hasPrefix("0x") ? String(v.dropFirst(2)) : v, radix: 16) else {
                complain("--asyncmap takes a hexadecimal map"); return false
            }
            lcp.asyncMap = m
        case "--default-asyncmap": lcp.asyncMap = nil
        case "--escape":
            guard let v = value(a) else { return false }
            for part in v.split(separator: ",") {
                guard let b = UInt8(part.hasPrefix("0x") ? String(part.dropFirst(2)) : String(part), radix: 16),
                      EscapeSet.isEscapable(b) else {
                    complain("--escape takes hex bytes outside 0x20–0x3f and 0x5d–0x5e"); return false
                }
                extraEscapes.append(b)
            }
        case "--nopcomp": lcp.protocolFieldCompression = false
        case "--noaccomp": lcp.addressControlCompression = false
        case "--novj": vj = false
        case "--lcp-echo-interval": guard let n = number(a) else { return false }; echo.interval = .seconds(n)
        case "--lcp-echo-failure": guard let n = number(a) else { return false }; echo.failureLimit = n
        case "--lcp-echo-adaptive": echo.adaptive = true
        case "--lcp-restart":
            guard let n = number(a), n > 0 else { complain("--lcp-restart takes seconds > 0"); return false }
            negotiation.restartInterval = .seconds(n)
        case "--lcp-max-configure":
            guard let n = number(a), n > 0 else { complain("--lcp-max-configure takes a count > 0"); return false }
            negotiation.maxConfigure = n
        case "--require-pap": lcp.requireAuthentication.insert(.pap)
        case "--require-chap": lcp.requireAuthentication.insert(.chapMD5)
        case "--peer":
            guard let v = value(a) else { return false }
            guard let colon = v.firstIndex(of: ":") else { complain("--peer takes NAME:SECRET"); return false }
            auth.peers.append(Credentials(name: String(v[..<colon]), secret: String(v[v.index(after: colon)...])))
        case "--user": guard let v = value(a) else { return false }; user = v
        case "--password": guard let v = value(a) else { return false }; password = v
        case "--password-file":
            guard let v = value(a), let text = secretFile(v) else { return false }
            password = text
        case "--peer-file":
            guard let v = value(a), let pairs = secretPairs(v) else { return false }
            auth.peers += pairs.map { Credentials(name: $0.name, secret: $0.secret) }
        case "--socks-user-file":
            guard let v = value(a), let pairs = secretPairs(v) else { return false }
            for p in pairs { socksUsers[p.name] = p.secret }
        case "--capture-secrets": captureSecrets = true
        case "--capture-limit":
            guard let n = number(a), (1...(1 << 20)).contains(n) else {
                complain("--capture-limit takes MiB, 1–1048576"); return false
            }
            captureLimit = n * 1024 * 1024
        case "--name": guard let v = value(a) else { return false }; auth.localName = v
        case "--debug": debug = true
        case "--pcap": guard let v = value(a) else { return false }; pcapPath = v
        case "--record": guard let v = value(a) else { return false }; recordPath = v
        case "--services":
            guard let v = value(a) else { return false }
            for item in v.split(separator: ",") {
                let parts = item.split(separator: ":", omittingEmptySubsequences: false)
                guard (1...2).contains(parts.count), let service = DiagnosticService(rawValue: String(parts[0])) else {
                    complain("--services takes echo, discard, chargen and daytime, not '\(item)'"); return false
                }
                if parts.count == 2 {
                    guard let port = decimal(parts[1], as: UInt16.self), port > 0 else { complain("--services: '\(item)' is not NAME:PORT"); return false }
                    servicePorts[service] = port
                }
                services.append(service)
            }
        case "--ping": guard case let .some(.some(x)) = address(a) else { return false }; pingTarget = x
        case "--ping-count":
            guard let n = number(a), n > 0 else { complain("--ping-count takes a count > 0"); return false }
            pingCount = n
        case "--tun": guard let v = value(a) else { return false }; tunName = v
        case "--tcp-no-sack": tcp.selectiveAcknowledgments = false
        case "--tcp-no-window-scaling": tcp.windowScaling = false
        case "--tcp-no-timestamps": tcp.timestamps = false
        case "--tcp-no-delayed-ack": tcp.delayedAck = nil
        case "--tcp-receive-window":
            guard let n = number(a) else { return false }
            guard RunOptions.receiveWindowRange.contains(n) else {
                complain("--tcp-receive-window takes \(RunOptions.receiveWindowRange.lowerBound) to \(RunOptions.receiveWindowRange.upperBound) bytes")
                return false
            }
            tcp.receiveBufferSize = n
        case "--frame-loss":
            guard let v = value(a) else { return false }
            guard let p = Double(v), p >= 0, p < 100 else { complain("--frame-loss takes a percentage below 100"); return false }
            frameLoss = p / 100
        case "--bridge":
            guard let v = value(a) else { return false }
            let parts = v.split(separator: ":")
            guard parts.count == 2, let kind = BridgeKind(rawValue: String(parts[0])), let port = decimal(parts[1], as: UInt16.self), port > 0 else {
                complain("--bridge takes host:PORT, local:PORT or terminal:PORT, not '\(v)'"); return false
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
            guard let v = value(a) else { return false }
            guard let d = SocksDestination(v) else { complain("--socks-allow takes HOST:PORT"); return false }
            socksAllow.append(d)
        case "--socks-allow-private": socksAllowPrivate = true
        case "--socks-outbound-address": guard case let .some(.some(x)) = address(a) else { return false }; socksOutboundAddress = x
        case "--socks-user":
            guard let v = value(a) else { return false }
            guard let colon = v.firstIndex(of: ":") else { complain("--socks-user takes NAME:PASSWORD"); return false }
            socksUsers[String(v[..<colon])] = String(v[v.index(after: colon)...])
        case "--keepalive":
            guard let v = value(a) else { return false }
            let words = v.split(separator: ",", omittingEmptySubsequences: false)
            let n = words.compactMap { decimal($0, as: Int32.self) }
            guard words.count == 3, n.count == 3, KeepAliveSettings(idleSeconds: n[0], probeIntervalSeconds: n[1], probeCount: n[2]).isValid else {
                complain("--keepalive takes IDLE,INTERVAL,COUNT (seconds, seconds, probes; 1–32767, 1–32767, 1–127)"); return false
            }
            keepAlive = KeepAliveSettings(idleSeconds: n[0], probeIntervalSeconds: n[1], probeCount: n[2])
        case "--dns-upstream":
            guard let v = value(a) else { return false }
            let parts = v.split(separator: ":")
            guard (1...2).contains(parts.count), let address = IPv4Address(String(parts[0])),
                  let port = parts.count == 2 ? decimal(parts[1], as: UInt16.self) : 53 else {
                complain("--dns-upstream takes ADDR[:PORT]"); return false
            }
            dnsUpstream = TCPEndpoint(address, port)
        case "--no-dns-relay": relayDNS = false
        case "--rearm": rearm = true
        case "--bridge-max-connections":
            guard let n = number(a) else { return false }
            guard n > 0 else { complain("--bridge-max-connections takes at least 1"); return false }
            bridgeConnectionLimit = n
        case "--max-connections":
            guard let n = number(a) else { return false }
            guard n > 0 else { complain("--max-connections takes at least 1"); return false }
            stackConnectionLimit = n
        case "--user-timeout":
            guard let n = number(a) else { return false }
            guard n <= 86_400 else { complain("--user-timeout takes at most 86400 seconds"); return false }
            userTimeout = n == 0 ? nil : .seconds(n)
        case "--line-queue-limit":
            guard let n = number(a) else { return false }
            guard n >= LineFlowControl.minimumLimit, n <= LineFlowControl.maximumLimit else {
                complain("--line-queue-limit takes \(LineFlowControl.minimumLimit) to \(LineFlowControl.maximumLimit) bytes")
                return false
            }
            lineQueueLimit = n
        case "--line-poll-interval":
            guard let n = number(a) else { return false }
            let limit = LineReadModeration.Settings.maximumInterval / .microseconds(1)
            guard Double(n) <= limit else {
                complain("--line-poll-interval takes 0 to \(Int(limit)) microseconds")
                return false
            }
            lineReadModeration.interval = .microseconds(n)
        case "--persist": persist = true
        case "--status-json": guard let v = value(a) else { return false }; statusPath = v
        default:
            complain("unknown option \(a) (see `pppbridge run --help`)")
            return false
        }
        return true
    }

    /// Checks the options together; false when they do not fit (said through `complain`).
    /// Fills the password from `environment` when only a user was given.
    public mutating func validate(environment: [String: String], complain: (String) -> Void) -> Bool {
        guard (device != nil) != makePty else {
            complain("give exactly one of --device PATH and --pty")
            return false
        }
        if link != nil && !makePty { complain("--link goes with --pty"); return false }
        if let device, RemoteLineAddress.isNetworkName(device), case let .failure(e) = RemoteLineAddress.parse(device) {
            complain("--device \(PeerText.escaped(device)): \(e)")
            return false
        }
        if tunName != nil && (!services.isEmpty || pingTarget != nil || !bridges.isEmpty) {
            complain("--tun hands IP to the kernel; --services, --ping and --bridge need our stack"); return false
        }
        // The kernel routes to the addresses the link settles on: a host taking the terminal's
        // choice would let it claim any address (the host's resolver, a gateway) for itself.
        if tunName != nil && role == .host && (localIP == nil || terminalIP == nil) {
            complain("--tun in the host role needs --local-ip and --terminal-ip (the kernel routes to the link's addresses; the terminal must not choose them)")
            return false
        }
        if bridges.count > 12 { complain("at most 12 bridges"); return false }
        if !lcp.requireAuthentication.isEmpty && auth.peers.isEmpty {
            complain("--require-pap/--require-chap need at least one --peer NAME:SECRET")
            return false
        }
        if user != nil && password == nil { password = environment[SecretSource.passwordVariable] }
        if (user == nil) != (password == nil) { complain("--user and --password go together"); return false }
        // PAP and CHAP carry names and secrets behind one-byte lengths.
        let credentials = [user, password].compactMap { $0 } + auth.peers.flatMap { [$0.name, $0.secret] } + [auth.localName]
        if credentials.contains(where: { $0.utf8.count > 255 }) {
            complain("names and secrets are at most 255 bytes")
            return false
        }
        if let user, let password {
            auth.local = Credentials(name: user, secret: password)
            lcp.authenticateWith = [.pap, .chapMD5]
        }
        return true
    }

    /// The PPP link these options describe (after `validate`).
    public var linkConfiguration: LinkConfiguration {
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

        return configuration
    }

    /// The channel these options describe, on our own stack (after `validate`; not with --tun).
    public var channelConfiguration: ChannelConfiguration {
        var c = ChannelConfiguration(line: device.map { .device($0, lineOptions) } ?? .pty(linkedAt: link, lineOptions), link: linkConfiguration)
        c.tcp = tcp
        if var s = socks {
            if !socksAllow.isEmpty { s.allow = socksAllow }
            s.allowPrivate = socksAllowPrivate
            s.outboundAddress = socksOutboundAddress
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
        c.servicePorts = servicePorts
        c.pcapPath = pcapPath
        c.recordPath = recordPath
        c.captureSecrets = captureSecrets
        c.captureLimit = captureLimit
        c.rearmBridgesOnReopen = rearm
        c.bridgeConnectionLimit = bridgeConnectionLimit
        c.stackConnectionLimit = stackConnectionLimit
        c.connectionUserTimeout = userTimeout
        c.lineQueueLimit = lineQueueLimit
        c.lineReadModeration = lineReadModeration
        c.frameLoss = frameLoss
        if let pingTarget {
            c.ping = (pingTarget, pingCount)
            c.closeAfterPing = services.isEmpty && bridges.isEmpty
        }
        return c
    }
}
