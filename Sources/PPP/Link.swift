import Framing
import Wire

/// The phases of RFC 1661 §3.2 as pppd names them.
public enum LinkPhase: String, Sendable, Equatable {
    case dead, establish, authenticate, network, open = "running", terminate
}

/// Why the link went down.
public enum LinkDownReason: Sendable, Equatable, CustomStringConvertible {
    case closedByUs
    case peerTerminated(String)
    /// Configure-Requests went unanswered or negotiation did not converge.
    case negotiationFailed(String)
    case echoTimeout(missed: Int)
    case loopback
    case authenticationFailed(String)
    case networkFailed(String)
    /// IPCP could not agree on addresses: each side insisted on its own.
    case addressConflict(AddressConflict)
    case lineHangUp

    public var description: String {
        switch self {
        case .closedByUs: return "closed by us"
        case let .peerTerminated(m): return "peer terminated the link" + (m.isEmpty ? "" : " (\"\(m)\")")
        case let .negotiationFailed(m): return "negotiation failed: \(m)"
        case let .echoTimeout(n): return "no response to \(n) echo-requests"
        case .loopback: return "serial line is looped back"
        case let .authenticationFailed(m): return "authentication failed: \(m)"
        case let .networkFailed(m): return "IPCP failed: \(m)"
        case let .addressConflict(c): return "IPCP failed: \(c)"
        case .lineHangUp: return "line hang-up"
        }
    }
}

/// What the link tells its owner.
public enum LinkEvent: Sendable, Equatable {
    case phase(LinkPhase)
    case lcpOpened(LCPResult)
    case authenticated(peerName: String?)
    case ipcpOpened(IPCPResult)
    case ipcpClosed
    /// An Echo-Request went unanswered; `missed` in a row so far.
    case echoMissed(Int)
    case down(LinkDownReason)
    /// pppd-style debug lines: `sent [LCP ConfReq id=0x1 ...]`.
    case debug(String)
}

/// LCP keep-alive (pppd's `lcp-echo-interval`, `lcp-echo-failure`, `lcp-echo-adaptive`).
///
/// On by default, unlike pppd: a payment terminal's cable gets pulled, and a link that never
/// notices keeps the host's connections to it open for good. An Echo-Request every 5 s with
/// the link down after 4 unanswered in a row notices a dead peer in about 20 s, and costs a
/// few bytes a second. An echo is 16 bytes on the line (1.4 ms at 115200 baud), but on a busy
/// line it waits for what is ahead of it: the channel writes control frames before queued IP
/// data, after the rest of the IP frame being written (up to 0.3 s for a 1500-byte frame at
/// 115200 baud, 3 s at 9600, escapes counted), and keeps about 2 s of line time queued, so
/// its reading pauses (the peer's reply waiting) are about a second. A misses count that
/// starts when the request is queued is sound only for such short queues.
public struct EchoConfiguration: Sendable, Equatable {
    public static let defaultInterval: Duration = .seconds(5)
    public static let defaultFailureLimit = 4

    /// Zero turns echoes off.
    public var interval: Duration = EchoConfiguration.defaultInterval
    /// Unanswered requests in a row that bring the link down; zero never does.
    public var failureLimit = EchoConfiguration.defaultFailureLimit
    /// Only probe when nothing has been received for an interval.
    public var adaptive = false
    public init() {}
}

public struct LinkConfiguration: Sendable, Equatable {
    public var lcp = LCPConfiguration()
    public var ipcp = IPCPConfiguration()
    public var authentication = AuthenticationConfiguration()
    public var echo = EchoConfiguration()
    public var negotiation = NegotiationConfiguration()
    /// Extra byte values we always escape (pppd's `escape`).
    public var extraEscapes: [UInt8] = []
    /// Produce `.debug` events for control packets.
    public var debug = false
    /// Keep every frame sent and received for `takeCapturedFrames` (for pcap output).
    public var captureFrames = false

    public init() {}

    /// The ICPPP host role: we assign the terminal its address and take ours.
    public static func host(local: IPv4Address, terminal: IPv4Address, dns: [IPv4Address] = []) -> LinkConfiguration {
        var c = LinkConfiguration()
        c.ipcp.localAddress = local
        c.ipcp.peerAddress = terminal
        c.ipcp.dnsServers = Array(dns.prefix(2))
        return c
    }

    /// The terminal role: we accept the addresses we are given and ask for DNS.
    public static func terminal() -> LinkConfiguration {
        var c = LinkConfiguration()
        c.ipcp.acceptLocal = true
        c.ipcp.acceptRemote = true
        c.ipcp.requestDNS = true
        return c
    }
}

/// A whole PPP link, sans-IO: line bytes and `now` in; line bytes, IP packets, events and the
/// next deadline out. It runs LCP, authentication and IPCP over our RFC 1662 framer and applies
/// what LCP negotiates to the framer when LCP opens (RFC 1662 §7.1).
public struct PPPLink: Sendable {
    public let configuration: LinkConfiguration
    public private(set) var phase: LinkPhase = .dead
    public private(set) var lcp: OptionNegotiator<LCPPolicy>
    public private(set) var ipcp: OptionNegotiator<IPCPPolicy>
    public private(set) var authenticator: Authenticator?
    public private(set) var encoder: HDLCEncoder
    public private(set) var decoder: HDLCDecoder
    /// Set once the link has gone down; a new link starts a new PPPLink.
    public private(set) var downReason: LinkDownReason?
    /// Frames received for protocols we do not run (answered with Protocol-Reject).
    public private(set) var unknownProtocolFrames = 0
    /// Frames handed to the encoder (received ones: `decoder.counters.frames`).
    public private(set) var framesSent = 0

    private var transmit: [UInt8] = []
    private var events: [LinkEvent] = []
    private var receivedIP: [[UInt8]] = []
    /// Arrays of received packets handed back (`recycle`), for the frames that follow.
    private var packetPool = BufferPool(limit: 32)
    private var captured: [(Direction, PPPFrame)] = []
    private var pendingDown: LinkDownReason?
    private var lcpIdentifier: UInt8 = 0x80
    private var nextEcho: Instant?
    private var echoesOutstanding = 0
    private var lastReceive: Instant = .zero

    /// Packets not sent because they would not fit their length field (counted, never trapped on).
    public private(set) var unsendablePackets = 0

    /// - Parameter random: where magic numbers and CHAP challenges come from: Crypto's
    ///   `CSPRNG` in production, a seeded generator in tests. The link draws every value from
    ///   this one source.
    public init(configuration: LinkConfiguration, random: some RandomNumberGenerator & Sendable) {
        self.configuration = configuration
        lcp = OptionNegotiator(protocolNumber: ProtocolNumber.lcp,
                               policy: LCPPolicy(configuration: configuration.lcp, random: LinkRandom(random)),
                               configuration: configuration.negotiation)
        // Passive waiting is LCP's alone (as in pppd): an IPCP nobody answers ends the link.
        var ipcpNegotiation = configuration.negotiation
        ipcpNegotiation.passive = false
        ipcp = OptionNegotiator(protocolNumber: ProtocolNumber.ipcp, policy: IPCPPolicy(configuration: configuration.ipcp),
                                configuration: ipcpNegotiation)
        encoder = HDLCEncoder(fcs: .fcs16, escapes: EscapeSet(accm: 0xFFFF_FFFF, extra: configuration.extraEscapes))
        decoder = HDLCDecoder(fcs: .fcs16, mru: 1500, receiveACCM: 0xFFFF_FFFF)
    }

    // MARK: Owner's interface

    /// The line is up: start negotiating (RFC 1661 Up and Open events for LCP).
    public mutating func open(now: Instant) {
        lastReceive = now
        setPhase(.establish)
        lcp.open(now: now)
        lcp.up(now: now)
        process(now: now)
    }

    /// Close the link with LCP Terminate-Request (pppd's "User request").
    public mutating func close(now: Instant, reason: String = "User request") {
        guard downReason == nil else { return }
        pendingDown = .closedByUs
        // LCP's Terminate takes the NCPs down with it (RFC 1661 §3.7), as pppd does.
        if lcp.state == .opened || [.requestSent, .ackReceived, .ackSent].contains(lcp.state) { setPhase(.terminate) }
        let wasStopped = lcp.state == .stopped
        lcp.close(now: now, reason: reason)
        process(now: now)
        // Stopped → Closed has no Terminate exchange to wait for (pppd finishes at once too).
        if wasStopped { finish(.closedByUs) }
    }

    /// The line itself went away (hang-up, device error).
    public mutating func lineDown(now: Instant) {
        guard downReason == nil else { return }
        pendingDown = pendingDown ?? .lineHangUp
        ipcp.down(now: now)
        lcp.down(now: now)
        process(now: now)
        finish(pendingDown ?? .lineHangUp)
    }

    /// Bytes read from the line.
    public mutating func receive(_ bytes: UnsafeRawBufferPointer, now: Instant) {
        // Frame by frame: each one is read with the settings the previous one left. The
        // Configure-Ack that opens LCP changes the receive ACCM, and the peer's next frame
        // (in the same read, often) already uses the new map.
        var offset = 0
        // IP frames skip `PPPFrame` (an array of their own): their information field is copied
        // into a kept buffer (`packetPool`) and handled from there. Not while frames are
        // captured, which keeps every frame whole.
        let ipFastPath = !configuration.captureFrames
        while offset < bytes.count {
            var frame: PPPFrame?
            var ipProtocol: ProtocolNumber?
            // Sized once the frame is known: a peer's run of tiny frames must not cost a
            // full-sized array each.
            var information = ipFastPath ? packetPool.take(capacity: 0) : []
            let damagedBefore = decoder.counters.droppedFrames
            // A VJ-compressed frame is rebuilt straight from the decoder's buffer into
            // `information`, its payload copied once. The decompressor is taken out of `self`
            // meanwhile: the decoder holds `self` for its whole call.
            var vj: VJDecompressor?
            if ipFastPath { swap(&vj, &vjDecompressor) }
            var rebuilt: Bool?
            offset += decoder.decode(UnsafeRawBufferPointer(rebasing: bytes[offset...]), stopAfterFrame: true) { decoded in
                if ipFastPath && decoded.protocol.isIPData {
                    ipProtocol = decoded.protocol
                    if decoded.protocol == .vjCompressedTCP, vj != nil {
                        // RFC 1144 §3.3.4, as below, for a damaged frame before this one.
                        if decoded.droppedBefore != damagedBefore { vj!.toss() }
                        rebuilt = vj!.compressed(decoded.information, into: &information)
                        return
                    }
                    information.reserveCapacity(decoded.information.count)
                    information.append(contentsOf: decoded.information)
                } else {
                    frame = decoded.frame
                }
            }
            if ipFastPath { swap(&vj, &vjDecompressor) }
            if let rebuilt {
                lastReceive = now
                if rebuilt { receivedIP.append(information) } else { packetPool.give(information) }
                // Tossed already if a damaged frame came first; one after it waits for the next.
                continue
            }
            // RFC 1144 §3.3.4: after a damaged frame, VJ state may be out of step with the peer's.
            if decoder.counters.droppedFrames != damagedBefore { vjDecompressor?.toss() }
            if let proto = ipProtocol {
                lastReceive = now
                // Only a frame that reached the automata (an unknown protocol's reject) gives
                // `process` anything to do.
                if handleIP(proto, consume information, now: now) { process(now: now) }
                continue
            }
            packetPool.give(information)
            guard let frame else { break }
            lastReceive = now
            handle(frame, now: now)
            process(now: now)
        }
    }

    /// Arrays kept for the frames to come (`recycle`).
    public var pooledPacketBuffers: Int { packetPool.count }

    /// Packets from `takeReceivedIPPackets`, handed back once read, for their arrays to be
    /// reused. Leaves `packets` empty.
    public mutating func recycle(_ packets: inout [[UInt8]]) {
        packetPool.give(all: &packets)
    }

    public mutating func receive(_ bytes: [UInt8], now: Instant) {
        bytes.withUnsafeBytes { receive($0, now: now) }
    }

    /// The largest packet the peer takes (its MRU as LCP negotiated; 1500 before).
    public var transmitMRU: Int { lcp.policy.result.transmitMRU }

    /// Sends an IPv4 packet (VJ-compressed when IPCP negotiated it); false when IPCP is not open
    /// or the packet exceeds the peer's MRU.
    @discardableResult
    public mutating func send(ipPacket: [UInt8], now: Instant) -> Bool {
        guard ipcp.state == .opened, ipPacket.count <= lcp.policy.result.transmitMRU else { return false }
        if let (proto, bytes) = vjCompressor?.compress(ipPacket) {
            sendFrame(ProtocolNumber(proto), bytes)
        } else {
            sendFrame(ProtocolNumber.ipv4, ipPacket)
        }
        return true
    }

    /// `send(ipPacket:)` on the data path: the packet is VJ-compressed in place (it is the
    /// caller's and changes) and framed straight onto the end of `out`, the caller's line
    /// buffer, rather than into a frame of its own.
    public mutating func send(ipPacket: inout [UInt8], now: Instant, framingInto out: inout [UInt8]) -> Bool {
        guard ipcp.state == .opened, ipPacket.count <= lcp.policy.result.transmitMRU else { return false }
        let compressed = vjCompressor?.compress(&ipPacket)
        let (proto, start) = compressed.map { (ProtocolNumber($0.protocol), $0.start) } ?? (ProtocolNumber.ipv4, 0)
        ipPacket.withUnsafeBytes { packet in
            let information = UnsafeRawBufferPointer(rebasing: packet[start...])
            noteSent(proto, information)
            encoder.encode(protocol: proto, information: information, into: &out)
        }
        return true
    }

    /// VJ compression of what we send and decompression of what we receive, while IPCP is up
    /// with it negotiated.
    public private(set) var vjCompressor: VJCompressor?
    public private(set) var vjDecompressor: VJDecompressor?

    /// When `poll(now:)` must next be called.
    public var pollAt: Instant? {
        guard downReason == nil else { return nil }
        return earliest(lcp.deadline, ipcp.deadline, authenticator?.deadline, nextEcho)
    }

    /// Runs the timers that are due.
    public mutating func poll(now: Instant) {
        guard downReason == nil else { return }
        lcp.timerExpired(now: now)
        ipcp.timerExpired(now: now)
        authenticator?.timerExpired(now: now)
        if let e = nextEcho, now >= e { echoTimer(now: now) }
        process(now: now)
    }

    public mutating func takeTransmit() -> [UInt8] {
        defer { transmit = [] }
        return transmit
    }

    public mutating func takeEvents() -> [LinkEvent] {
        defer { events = [] }
        return events
    }

    public mutating func takeReceivedIPPackets() -> [[UInt8]] {
        defer { receivedIP = [] }
        return receivedIP
    }

    /// `takeReceivedIPPackets` into the caller's array, which it keeps from read to read: the
    /// two trade places, so the list itself is not allocated anew for every read.
    public mutating func takeReceivedIPPackets(into packets: inout [[UInt8]]) {
        packets.removeAll(keepingCapacity: true)
        swap(&receivedIP, &packets)
    }

    public mutating func takeCapturedFrames() -> [(Direction, PPPFrame)] {
        defer { captured = [] }
        return captured
    }

    // MARK: Frames in

    private mutating func handle(_ frame: PPPFrame, now: Instant) {
        if configuration.captureFrames { captured.append((.received, frame)) }
        let proto = frame.protocol
        if proto.isControl, configuration.debug,
           let text = ControlProtocolPrinter.describe(protocol: proto, information: frame.information) {
            events.append(.debug("rcvd [\(text.text)]"))
        }
        switch proto {
        case ProtocolNumber.lcp:
            guard let packet = try? ControlPacket(parsing: frame.information) else { return }
            if packet.code == ControlCode.terminateRequest && lcp.state == .opened && pendingDown == nil {
                // Whatever happens to the line next, the peer ended the link.
                pendingDown = .peerTerminated(PeerText.event(packet.data))
            }
            lcp.receive(packet, now: now)
        case ProtocolNumber.pap, ProtocolNumber.chap:
            // RFC 1661 §3.5: only in the Authenticate phase (and answering repeats after it).
            guard let packet = try? ControlPacket(parsing: frame.information) else { return }
            authenticator?.receive(protocol: proto, packet, now: now)
        case ProtocolNumber.ipcp:
            guard phase == .network || phase == .open, let packet = try? ControlPacket(parsing: frame.information) else { return }
            ipcp.receive(packet, now: now)
        case ProtocolNumber.ipv4 where ipcp.state == .opened,
             ProtocolNumber.vjUncompressedTCP where vjDecompressor != nil,
             ProtocolNumber.vjCompressedTCP where vjDecompressor != nil:
            _ = handleIP(proto, frame.information, now: now)
        case ProtocolNumber.ipv4:
            break
        default:
            // RFC 1661 §5.7: unknown protocols get a Protocol-Reject once LCP is open; during
            // authentication everything else is silently discarded (§3.5).
            guard lcp.state == .opened, phase == .network || phase == .open else { return }
            unknownProtocolFrames += 1
            lcpIdentifier &+= 1
            let room = max(0, lcp.policy.result.transmitMRU - 6)
            let data = BigEndian.bytes(proto.rawValue) + frame.information.prefix(room)
            sendControl(ProtocolNumber.lcp, ControlPacket(code: ControlCode.protocolReject, identifier: lcpIdentifier, data: data))
        }
    }

    /// An IPv4 or VJ frame's information field (RFC 1332, RFC 1144). IPv4 before IPCP is open
    /// is dropped; VJ that IPCP did not negotiate goes the way of any unknown protocol
    /// (`handle`: a Protocol-Reject).
    /// Returns whether the frame went to the automata (`handle`), which `process` then acts on.
    private mutating func handleIP(_ proto: ProtocolNumber, _ information: consuming [UInt8], now: Instant) -> Bool {
        switch proto {
        case ProtocolNumber.ipv4 where ipcp.state == .opened:
            receivedIP.append(information)
        case ProtocolNumber.ipv4:
            packetPool.give(information)
        case ProtocolNumber.vjUncompressedTCP where vjDecompressor != nil:
            // In place: the frame's array (handed over, not shared) becomes the packet.
            if vjDecompressor!.uncompressed(&information) { receivedIP.append(information) } else { packetPool.give(information) }
        case ProtocolNumber.vjCompressedTCP where vjDecompressor != nil:
            var packet = packetPool.take(capacity: information.count + 60)
            if vjDecompressor!.compressed(information, into: &packet) {
                receivedIP.append(packet)
            } else {
                packetPool.give(packet)
            }
            packetPool.give(information)
        default:
            handle(PPPFrame(protocol: proto, information: information), now: now)
            return true
        }
        return false
    }

    // MARK: Driving the layers

    /// Acts on what the automata and the authenticator produced, until nothing new happens.
    private mutating func process(now: Instant) {
        var progress = true
        while progress && downReason == nil {
            progress = false
            for output in lcp.takeOutputs() {
                progress = true
                lcpOutput(output, now: now)
            }
            for output in ipcp.takeOutputs() {
                progress = true
                ipcpOutput(output, now: now)
            }
            if var auth = authenticator {
                for (proto, packet) in auth.takeOutputs() {
                    progress = true
                    sendControl(proto, packet)
                }
                authenticator = auth
                if phase == .authenticate, let outcome = auth.outcome {
                    progress = true
                    switch outcome {
                    case let .succeeded(name):
                        events.append(.authenticated(peerName: name))
                        startNetwork(now: now)
                    case let .failed(reason):
                        closeFor(.authenticationFailed(reason), now: now)
                    }
                }
            }
            if let failure = lcp.policy.failure, phase == .establish, pendingDown == nil {
                progress = true
                closeFor(.negotiationFailed(failure), now: now)
            }
            if lcp.policy.loopbackDetected, pendingDown == nil {
                progress = true
                closeFor(.loopback, now: now)
            }
            if let conflict = ipcp.policy.conflict, pendingDown == nil {
                progress = true
                closeFor(.addressConflict(conflict), now: now)
            }
        }
    }

    private mutating func lcpOutput(_ output: NegotiationOutput, now: Instant) {
        switch output {
        case let .send(packet):
            sendControl(ProtocolNumber.lcp, packet)
        case .layerUp:
            let r = lcp.policy.result
            applyNegotiated(r)
            lcp.peerMRU = r.transmitMRU
            ipcp.peerMRU = r.transmitMRU
            authenticator = nil
            events.append(.lcpOpened(r))
            startEcho(now: now)
            if r.localAuthentication != nil || r.peerAuthentication != nil {
                setPhase(.authenticate)
                // The challenge is a fresh draw from the link's one random source.
                let challenge = r.peerAuthentication == .chapMD5 ? lcp.policy.random.bytes(Authenticator.challengeLength) : []
                var auth = Authenticator(configuration: configuration.authentication, local: r.localAuthentication,
                                         peer: r.peerAuthentication, challenge: challenge)
                auth.start(now: now)
                authenticator = auth
            } else {
                startNetwork(now: now)
            }
        case .layerDown:
            // RFC 1661: the NCPs go down with LCP; framing goes back to its defaults.
            nextEcho = nil
            authenticator = nil
            ipcp.down(now: now)
            applyDefaults()
            lcp.peerMRU = 1500
            ipcp.peerMRU = 1500
            setPhase(lcp.state == .stopping || lcp.state == .closing ? .terminate : .establish)
        case .layerStarted:
            break
        case let .layerFinished(reason):
            let down: LinkDownReason
            switch reason {
            case .closed: down = pendingDown ?? .closedByUs
            case let .peerTerminated(m): down = pendingDown ?? .peerTerminated(m)
            case .noResponse: down = pendingDown ?? .negotiationFailed("no response to LCP Configure-Requests")
            case let .rejected(m): down = pendingDown ?? .negotiationFailed(m)
            case .lowerLayerDown: down = pendingDown ?? .lineHangUp
            }
            finish(down)
        case let .extended(packet):
            lcpExtended(packet, now: now)
        }
    }

    private mutating func ipcpOutput(_ output: NegotiationOutput, now: Instant) {
        switch output {
        case let .send(packet):
            sendControl(ProtocolNumber.ipcp, packet)
        case .layerUp:
            if let failure = ipcp.policy.failure {
                closeFor(.networkFailed(failure), now: now)
                return
            }
            setPhase(.open)
            let r = ipcp.policy.result
            vjCompressor = r.transmitVJ.map(VJCompressor.init)
            vjDecompressor = r.receiveVJ.map(VJDecompressor.init)
            events.append(.ipcpOpened(r))
        case .layerDown:
            vjCompressor = nil
            vjDecompressor = nil
            events.append(.ipcpClosed)
            if phase == .open { setPhase(.network) }
        case .layerStarted:
            break
        case let .layerFinished(reason):
            // With no network protocol left the link has no purpose (pppd does the same).
            guard pendingDown == nil else { return }
            switch reason {
            case .noResponse: closeFor(.networkFailed("no response to IPCP Configure-Requests"), now: now)
            case let .rejected(m): closeFor(.networkFailed(m), now: now)
            case let .peerTerminated(m): closeFor(.networkFailed("peer closed IPCP" + (m.isEmpty ? "" : " (\"\(m)\")")), now: now)
            case .closed, .lowerLayerDown: break
            }
        case .extended:
            break
        }
    }

    /// LCP codes 8–13 received in Opened.
    private mutating func lcpExtended(_ packet: ControlPacket, now: Instant) {
        switch packet.code {
        case ControlCode.protocolReject:
            guard packet.data.count >= 2 else { return }
            let rejected = ProtocolNumber(BigEndian.uint16(packet.data, 0))
            if rejected == ProtocolNumber.ipcp {
                // An NCP the peer rejects is stopped, not retried forever.
                ipcp.protocolRejected(now: now)
            } else if rejected == ProtocolNumber.lcp {
                closeFor(.negotiationFailed("peer rejected LCP"), now: now)
            }
        case ControlCode.echoRequest:
            // RFC 1661 §5.8: answer with our magic number and the same data.
            let ours = lcp.policy.result.localMagic
            let data = BigEndian.bytes(ours) + packet.data.dropFirst(4)
            sendControl(ProtocolNumber.lcp, ControlPacket(code: ControlCode.echoReply, identifier: packet.identifier, data: data))
        case ControlCode.echoReply:
            guard packet.data.count >= 4 else { return }
            let magic = BigEndian.uint32(packet.data, 0)
            // Our own reply coming back is not the peer answering (pppd ignores it too).
            if magic != 0 && magic == lcp.policy.result.localMagic { return }
            echoesOutstanding = 0
        default:
            // Discard-Request, Identification, Time-Remaining: read and dropped (RFC 1570).
            break
        }
    }

    // MARK: Phases

    private mutating func startNetwork(now: Instant) {
        setPhase(.network)
        ipcp.open(now: now)
        ipcp.up(now: now)
    }

    private mutating func closeFor(_ reason: LinkDownReason, now: Instant) {
        guard pendingDown == nil, downReason == nil else { return }
        pendingDown = reason
        setPhase(.terminate)
        let message: String
        switch reason {
        case .loopback: message = "Loopback detected"
        case .authenticationFailed: message = "Authentication failed"
        case .echoTimeout: message = "Peer not responding"
        case .addressConflict: message = "Refused our IP address"
        default: message = "Failed to negotiate"
        }
        lcp.close(now: now, reason: message)
        switch reason {
        case .echoTimeout, .loopback:
            // Nobody (else) is listening: the Terminate-Request goes out once and the link is
            // down now, not after Max-Terminate restart intervals.
            lcp.down(now: now)
            for output in lcp.takeOutputs() { lcpOutput(output, now: now) }
            finish(reason)
        default:
            // A Closed LCP finishes at once; otherwise layerFinished follows the Terminate exchange.
            if lcp.state == .closed || lcp.state == .initial { finish(reason) }
        }
    }

    private mutating func finish(_ reason: LinkDownReason) {
        guard downReason == nil else { return }
        downReason = reason
        nextEcho = nil
        setPhase(.dead)
        events.append(.down(reason))
    }

    private mutating func setPhase(_ p: LinkPhase) {
        guard p != phase else { return }
        phase = p
        events.append(.phase(p))
    }

    // MARK: Keep-alive

    private mutating func startEcho(now: Instant) {
        echoesOutstanding = 0
        nextEcho = configuration.echo.interval > .zero ? now + configuration.echo.interval : nil
    }

    private mutating func echoTimer(now: Instant) {
        let e = configuration.echo
        guard lcp.state == .opened else { nextEcho = nil; return }
        if echoesOutstanding > 0 { events.append(.echoMissed(echoesOutstanding)) }
        if e.failureLimit > 0 && echoesOutstanding >= e.failureLimit {
            closeFor(.echoTimeout(missed: echoesOutstanding), now: now)
            return
        }
        if e.adaptive && now - lastReceive < e.interval {
            // Traffic arrived within the interval: the peer is alive, no probe needed.
            echoesOutstanding = 0
        } else {
            lcpIdentifier &+= 1
            let ours = lcp.policy.result.localMagic
            sendControl(ProtocolNumber.lcp, ControlPacket(code: ControlCode.echoRequest, identifier: lcpIdentifier,
                                                          data: BigEndian.bytes(ours)))
            echoesOutstanding += 1
        }
        nextEcho = now + e.interval
    }

    // MARK: Framing

    private mutating func applyNegotiated(_ r: LCPResult) {
        encoder.escapes = EscapeSet(accm: r.transmitACCM, extra: configuration.extraEscapes)
        encoder.compressProtocol = r.transmitProtocolCompression
        encoder.compressAddressControl = r.transmitAddressControlCompression
        decoder.receiveACCM = r.receiveACCM
        // We keep accepting at least the default 1500 whatever MRU was agreed.
        decoder.setMRU(max(r.receiveMRU, 1500))
    }

    private mutating func applyDefaults() {
        encoder.escapes = EscapeSet(accm: 0xFFFF_FFFF, extra: configuration.extraEscapes)
        encoder.compressProtocol = false
        encoder.compressAddressControl = false
        decoder.receiveACCM = 0xFFFF_FFFF
        decoder.setMRU(1500)
    }

    private mutating func sendControl(_ proto: ProtocolNumber, _ packet: ControlPacket) {
        guard let bytes = try? packet.emit() else {
            unsendablePackets += 1
            return
        }
        if configuration.debug, let text = ControlProtocolPrinter.describe(protocol: proto, information: bytes) {
            events.append(.debug("sent [\(text.text)]"))
        }
        sendFrame(proto, bytes)
    }

    private mutating func sendFrame(_ proto: ProtocolNumber, _ information: [UInt8]) {
        information.withUnsafeBytes { noteSent(proto, $0) }
        encoder.encode(protocol: proto, information: information, into: &transmit)
    }

    /// Counts a frame about to be encoded, and keeps a copy when frames are captured.
    private mutating func noteSent(_ proto: ProtocolNumber, _ information: UnsafeRawBufferPointer) {
        framesSent &+= 1
        if configuration.captureFrames {
            let lcpPacket = proto == ProtocolNumber.lcp
            captured.append((.sent, PPPFrame(protocol: proto, information: Array(information),
                                             addressControlPresent: lcpPacket || !encoder.compressAddressControl,
                                             protocolCompressed: !lcpPacket && encoder.compressProtocol && proto.rawValue < 0x100)))
        }
    }
}
