import Framing
import NetStack
import PPP
import Wire

/// The role our stack plays in a replay: the host assigns the terminal its address (what
/// `pppbridge run` is), the terminal takes what it is given (what `run --terminal` and the
/// payment terminal are).
public enum ReplayRole: String, Sendable, Equatable {
    case host, terminal
}

/// A control packet (LCP, an NCP, PAP, CHAP) read from a frame, or nil.
func controlPacket(_ frame: PPPFrame) -> ControlPacket? {
    guard frame.protocol.isControl else { return nil }
    return try? ControlPacket(parsing: frame.information)
}

/// The options of a Configure-Request, -Ack, -Nak or -Reject, or [] when unreadable.
func options(_ packet: ControlPacket) -> [ConfigurationOption] {
    (try? ConfigurationOption.parseList(packet.data)) ?? []
}

/// How a recording is played: which side is the peer, what our link is told so that it asks
/// what the recorded side asked, and what the recorded side reached.
public struct ReplayPlan: Sendable {
    public var session: RecordedSession
    /// The side whose frames are fed to our stack, and the side we play.
    public var peerSide: String
    public var ourSide: String
    public var role: ReplayRole
    public var link: LinkConfiguration
    /// TCP settings per port of ours (the recorded side's SYN or SYN-ACK options).
    public var tcpByPort: [UInt16: TCPConfiguration] = [:]
    public var states: [RecordedState]
    /// What the plan took from the recording, for the report's head.
    public var notes: [String] = []

    /// - Parameter peer: the side to feed ("sent", "rcvd" or a sender's address); nil picks the
    ///   terminal's side, so that we play the host.
    public init(session: RecordedSession, peer: String?) throws(ReplayError) {
        self.session = session
        let where_ = session.label.isEmpty ? "" : " (\(session.label))"
        guard session.sides.count == 2 else {
            if session.sides.count < 2 {
                throw ReplayError("one-sided capture\(where_): every frame comes from \(session.sides.first ?? "nobody"); a replay needs both sides")
            }
            throw ReplayError("more than two senders\(where_): \(session.sides.joined(separator: ", "))")
        }
        let sides = session.sides
        guard session.frames.contains(where: { $0.frame.protocol == ProtocolNumber.lcp && controlPacket($0.frame)?.code == ControlCode.configureRequest }) else {
            throw ReplayError("no LCP Configure-Request from either side\(where_): the capture starts after the link was negotiated, so there is nothing to negotiate against")
        }
        var chosen: String
        if let peer {
            guard sides.contains(peer) else {
                throw ReplayError("--peer \(peer): this session's sides are \(sides.joined(separator: " and "))")
            }
            chosen = peer
        } else {
            guard let terminal = ReplayPlan.terminalSide(session) else {
                throw ReplayError("cannot tell which side is the terminal\(where_): neither asked for an address, authenticated nor was given one; pass --peer \(sides.joined(separator: "|"))")
            }
            chosen = terminal
        }
        let us = sides.first { $0 != chosen } ?? chosen
        peerSide = chosen
        ourSide = us
        let terminal = ReplayPlan.terminalSide(session)
        role = terminal == us ? .terminal : .host
        let ours = session.frames.filter { $0.side == us }
        let theirs = session.frames.filter { $0.side == chosen }
        for (side, frames) in [(us, ours), (chosen, theirs)] {
            guard frames.contains(where: { $0.frame.protocol == ProtocolNumber.lcp && controlPacket($0.frame)?.code == ControlCode.configureRequest }) else {
                throw ReplayError("no LCP Configure-Request from \(side)\(where_): the capture starts after the link was negotiated, so there is nothing to negotiate against")
            }
        }
        var notes: [String] = []
        link = try ReplayPlan.linkConfiguration(session: session, ours: us, role: terminal == us ? .terminal : .host, notes: &notes)
        // What the recording's own faults changed in how it is played.
        if session.timeStampsBackwards > 0 { notes.append("\(session.timeStampsBackwards) time stamps went backwards: played with no gap") }
        if session.gapsShortened > 0 { notes.append("\(session.gapsShortened) silences longer than the limit played as the limit") }
        if session.vjUnreadable > 0 { notes.append("\(session.vjUnreadable) VJ frames could not be rebuilt into IPv4 packets") }
        if session.sessionsLeftOut > 0 { notes.append("\(session.sessionsLeftOut) more sessions in the capture, past the limit, not played") }
        self.notes = notes
        tcpByPort = ReplayPlan.tcpConfigurations(ours: ours)
        states = RecordedState.derive(session: session, ours: us)
    }

    /// The terminal is the side that asks for its address (0.0.0.0) or for DNS servers,
    /// authenticates itself, or is told its address; the host the side that asks for an
    /// address of its own or requires authentication. Each kind of evidence counts once; on a
    /// tie the side that sent the first LCP Configure-Request (the side that dials) is the
    /// terminal. nil when the recording shows none of these.
    static func terminalSide(_ session: RecordedSession) -> String? {
        var evidence: [String: Set<String>] = [:]
        let other = { (side: String) in session.sides.first { $0 != side } ?? side }
        var firstIPCPRequest: Set<String> = []
        var firstLCPRequest: String?
        for f in session.frames {
            guard let p = controlPacket(f.frame) else { continue }
            switch (f.frame.protocol, p.code) {
            case (ProtocolNumber.lcp, ControlCode.configureRequest):
                if firstLCPRequest == nil { firstLCPRequest = f.side }
                if options(p).contains(where: { $0.isKind(LCPOption.Kind.authenticationProtocol) }) {
                    evidence[other(f.side), default: []].insert("authenticated by the other")
                }
            case (ProtocolNumber.ipcp, ControlCode.configureRequest):
                let first = firstIPCPRequest.insert(f.side).inserted
                for o in options(p) {
                    switch IPCPOption(o) {
                    case .ipAddress(.any): evidence[f.side, default: []].insert("asks for an address")
                    case .ipAddress: if first { evidence[other(f.side), default: []].insert("the other has its own address") }
                    case .primaryDNS, .secondaryDNS: evidence[f.side, default: []].insert("asks for DNS")
                    default: break
                    }
                }
            case (ProtocolNumber.ipcp, ControlCode.configureNak):
                if options(p).contains(where: { if case .ipAddress(let a) = IPCPOption($0), a != .any { return true } else { return false } }) {
                    evidence[other(f.side), default: []].insert("is given an address")
                }
            case (ProtocolNumber.pap, PAPPacket.Code.request), (ProtocolNumber.chap, CHAPPacket.Code.response):
                evidence[f.side, default: []].insert("authenticates")
            default: break
            }
        }
        let ranked = session.sides.map { ($0, evidence[$0]?.count ?? 0) }.sorted { $0.1 > $1.1 }
        guard let best = ranked.first else { return nil }
        if best.1 == 0 { return firstLCPRequest }
        if ranked.count > 1 && ranked[1].1 == best.1 { return firstLCPRequest }
        return best.0
    }

    /// Our link asks what the recorded side asked: its LCP options, its authentication, its
    /// IPCP requests and the addresses it gave, its keep-alive.
    static func linkConfiguration(session: RecordedSession, ours: String, role: ReplayRole, notes: inout [String]) throws(ReplayError) -> LinkConfiguration {
        var c = LinkConfiguration()
        c.captureFrames = true
        c.debug = true
        c.echo.interval = .zero
        c.echo.failureLimit = 0
        let mine = session.frames.filter { $0.side == ours }
        let theirs = session.frames.filter { $0.side != ours }
        func first(_ proto: ProtocolNumber, _ code: ControlCode, in frames: [RecordedFrame]) -> ControlPacket? {
            for f in frames where f.frame.protocol == proto {
                if let p = controlPacket(f.frame), p.code == code { return p }
            }
            return nil
        }
        // LCP: what the recorded side asked for (RFC 1661 §6).
        if let request = first(ProtocolNumber.lcp, ControlCode.configureRequest, in: mine) {
            let list = options(request).map(LCPOption.init)
            c.lcp.mru = 1500
            c.lcp.asyncMap = nil
            c.lcp.magicNumber = false
            c.lcp.protocolFieldCompression = false
            c.lcp.addressControlCompression = false
            for o in list {
                switch o {
                case let .maximumReceiveUnit(m): c.lcp.mru = min(max(m, LCPConfiguration.minimumMRU), LCPConfiguration.maximumMRU)
                case let .asyncControlCharacterMap(m): c.lcp.asyncMap = m
                case .magicNumber: c.lcp.magicNumber = true
                case .protocolFieldCompression: c.lcp.protocolFieldCompression = true
                case .addressControlFieldCompression: c.lcp.addressControlCompression = true
                case let .authenticationProtocol(proto, data):
                    if proto == ProtocolNumber.pap {
                        c.lcp.requireAuthentication = [.pap]
                    } else if proto == ProtocolNumber.chap {
                        // RFC 1994 §2 MD5 is 5; RFC 2433 MS-CHAP 0x80; RFC 2759 MS-CHAPv2 0x81.
                        let algorithm: String
                        switch data.first {
                        case 5?: algorithm = "CHAP with MD5"
                        case 0x80?: algorithm = "MS-CHAP"
                        case 0x81?: algorithm = "MS-CHAPv2"
                        default: algorithm = "CHAP with algorithm " + (data.first.map { "0x" + String($0, radix: 16) } ?? "none")
                        }
                        throw ReplayError("the recorded side requires \(algorithm): the peer's response is computed from our challenge and a secret the capture does not hold")
                    } else {
                        throw ReplayError("the recorded side requires authentication protocol 0x\(String(proto.rawValue, radix: 16)), which this stack does not run")
                    }
                default: break
                }
            }
        }
        // PAP (RFC 1334 §2.2): the credentials are in the clear, so both ends can be played.
        for f in session.frames where f.frame.protocol == ProtocolNumber.pap {
            guard let p = controlPacket(f.frame), let pap = try? PAPPacket(p, lenient: true),
                  case let .authenticateRequest(_, peerID, password) = pap else { continue }
            let credentials = Credentials(name: String(decoding: peerID, as: UTF8.self), secret: String(decoding: password, as: UTF8.self))
            if f.side == ours {
                c.lcp.authenticateWith = [.pap]
                c.authentication.local = credentials
            } else if c.authentication.peers.count < 16 && !c.authentication.peers.contains(credentials) {
                // A handful of names at most: a terminal has one; a capture of thousands is a
                // flood, whose later requests our side refuses as a live host would.
                c.authentication.peers.append(credentials)
            }
        }
        if session.frames.contains(where: { $0.frame.protocol == ProtocolNumber.chap }) && c.lcp.requireAuthentication.isEmpty {
            throw ReplayError("the session authenticates with CHAP: the response is computed from a challenge and a secret the capture does not hold")
        }
        // IPCP (RFC 1332, RFC 1877): our requests as the recorded side's first, and the
        // addresses it gave the peer.
        c.ipcp.vj = nil
        if let request = first(ProtocolNumber.ipcp, ControlCode.configureRequest, in: mine) {
            for o in options(request) {
                switch IPCPOption(o) {
                case let .ipAddress(a):
                    if a == .any { c.ipcp.acceptLocal = true } else { c.ipcp.localAddress = a }
                case let .compression(proto, data) where proto == .vjCompressedTCP && data.count == 2:
                    c.ipcp.vj = VJParameters(maxSlotID: data[0], compressSlotID: data[1] == 1)
                case .primaryDNS, .secondaryDNS: c.ipcp.requestDNS = true
                default: break
                }
            }
        }
        var dns: [IPv4Address] = []
        for f in mine where f.frame.protocol == ProtocolNumber.ipcp {
            guard let p = controlPacket(f.frame), p.code == ControlCode.configureNak || p.code == ControlCode.configureAck else { continue }
            for o in options(p) {
                switch IPCPOption(o) {
                case let .ipAddress(a) where a != .any:
                    if p.code == ControlCode.configureNak && c.ipcp.peerAddress == nil { c.ipcp.peerAddress = a }
                case let .primaryDNS(a) where a != .any:
                    if dns.isEmpty { dns.append(a) }
                case let .secondaryDNS(a) where a != .any:
                    if dns.count == 1 { dns.append(a) }
                default: break
                }
            }
        }
        if c.ipcp.peerAddress == nil {
            // The recorded side took the address the peer asked for.
            c.ipcp.acceptRemote = true
            for f in theirs where f.frame.protocol == ProtocolNumber.ipcp {
                guard let p = controlPacket(f.frame), p.code == ControlCode.configureRequest else { continue }
                for o in options(p) { if case let .ipAddress(a) = IPCPOption(o), a != .any { c.ipcp.peerAddress = a } }
            }
        }
        if c.ipcp.localAddress == nil && !c.ipcp.acceptLocal { c.ipcp.acceptLocal = true }
        c.ipcp.dnsServers = dns
        // Keep-alive: as often as the recorded side sent Echo-Requests; never fatal, since the
        // recording decides what the peer answers.
        let echoes = mine.filter { $0.frame.protocol == ProtocolNumber.lcp && controlPacket($0.frame)?.code == ControlCode.echoRequest }
        if let first = echoes.first {
            // One request: as long after LCP opened (the last Configure-Ack before it) as it came.
            let opened = session.frames.last { $0.number < first.number && $0.frame.protocol == ProtocolNumber.lcp && controlPacket($0.frame)?.code == ControlCode.configureAck }
            var gaps = zip(echoes.dropFirst(), echoes).map { $0.time - $1.time }.sorted()
            // A single request gives no period: ours sends its first as long after opening as
            // the recorded one came, and then no faster than once a second.
            let single = gaps.isEmpty
            if single { gaps = [first.time - (opened?.time ?? 0)] }
            let median = max(gaps[gaps.count / 2], single ? 1 : 0.5)
            c.echo.interval = .milliseconds(Int64((median * 1000).rounded()))
            notes.append(single ? "LCP Echo-Request every \(median) s (the recorded side sent one, which gives no period)"
                                : "LCP Echo-Request every \(median) s, as the recorded side sent them")
        }
        notes.append("we play the \(role.rawValue)" + (c.ipcp.localAddress.map { " at \($0)" } ?? "") + (c.ipcp.peerAddress.map { ", peer \($0)" } ?? ""))
        return c
    }

    /// TCP options as the recorded side offered them on each of its ports (RFC 9293 §3.1,
    /// RFC 7323, RFC 2018): the peer's later segments carry only what was agreed then.
    static func tcpConfigurations(ours: [RecordedFrame]) -> [UInt16: TCPConfiguration] {
        var out: [UInt16: TCPConfiguration] = [:]
        for f in ours {
            guard let ip = f.ip, let s = TCPView(ip), s.flags.contains(.syn), out[s.sourcePort] == nil else { continue }
            var t = TCPConfiguration()
            t.windowScaling = false
            t.selectiveAcknowledgments = false
            t.timestamps = false
            for o in s.header.options {
                switch o {
                case let .maximumSegmentSize(m): t.maximumSegmentSize = max(Int(m), 64)
                case .windowScale: t.windowScaling = true
                case .sackPermitted: t.selectiveAcknowledgments = true
                case .timestamps: t.timestamps = true
                default: break
                }
            }
            // Acknowledge as a peer sees fit; the recorded side's ACK timing is not compared.
            out[s.sourcePort] = t
        }
        return out
    }
}
