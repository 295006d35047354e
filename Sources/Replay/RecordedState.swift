import Framing
import PPP
import Wire

/// One TCP connection as the recording shows it, seen from the side we play.
public struct RecordedConnection: Sendable, Equatable, CustomStringConvertible {
    public var ourPort: UInt16
    public var peerPort: UInt16
    /// Where the recorded side's packets came from and the peer's went (addresses as recorded).
    public var ourAddress: IPv4Address
    public var peerAddress: IPv4Address
    /// True when the recorded side sent the SYN.
    public var openedByUs = false
    public var established = false
    public var closed = false
    public var reset = false
    public var bytesFromPeer = 0
    public var bytesToPeer = 0
    public var finFromUs = false
    public var finFromPeer = false

    public var description: String {
        let arrow = openedByUs ? "\(ourAddress):\(ourPort) → \(peerAddress):\(peerPort)" : "\(peerAddress):\(peerPort) → \(ourAddress):\(ourPort)"
        return "TCP \(arrow)"
    }
}

/// A state the recorded side reached, which our stack must reach too.
public enum RecordedState: Sendable, Equatable, CustomStringConvertible {
    case lcpOpened
    /// PAP succeeded; the name the terminal gave.
    case authenticated(String)
    case ipcpOpened(local: IPv4Address, peer: IPv4Address)
    case tcp(RecordedConnection)
    /// The link was ended with Terminate-Request and -Ack; true when the recorded side asked.
    case terminated(byUs: Bool)

    public var description: String {
        switch self {
        case .lcpOpened: return "LCP opened"
        case let .authenticated(name): return "PAP authenticated \"\(PeerText.escaped(name))\""
        case let .ipcpOpened(local, peer): return "IPCP opened, local \(local), peer \(peer)"
        case let .tcp(c):
            var parts = [c.description]
            if c.established { parts.append("established") }
            parts.append("\(c.bytesFromPeer) B in, \(c.bytesToPeer) B out")
            if c.reset { parts.append("reset") } else if c.closed { parts.append("closed") }
            return parts.joined(separator: ", ")
        case let .terminated(byUs): return "LCP terminated by " + (byUs ? "us" : "the peer")
        }
    }

    /// What the recorded side `ours` reached in `session`, in the order it reached them.
    static func derive(session: RecordedSession, ours: String) -> [RecordedState] {
        var states: [RecordedState] = []
        var lcpAckedByUs = false, lcpAckedByPeer = false, lcpOpened = false
        var ipcpLocal: IPv4Address?, ipcpPeer: IPv4Address?, ipcpOpened = false
        var ipFromUs: IPv4Address?, ipFromPeer: IPv4Address?
        var termRequestBy: Bool?
        var terminated = false
        var connections: [RecordedConnection] = []
        var isn: [Int: (ours: SequenceNumber?, peer: SequenceNumber?)] = [:]
        func add(_ s: RecordedState) { if !states.contains(s) { states.append(s) } }
        // The last PAP frame each side sent (0: ours, 1: the peer's): what an Ack answers.
        var lastPAP: [RecordedFrame?] = [nil, nil]
        // The connection open on each port pair (ours << 16 | peer's), by index.
        var open: [UInt32: Int] = [:]
        for f in session.frames {
            let fromUs = f.side == ours
            if let p = controlPacket(f.frame) {
                defer { if f.frame.protocol == ProtocolNumber.pap && p.code == PAPPacket.Code.request { lastPAP[fromUs ? 0 : 1] = f } }
                switch (f.frame.protocol, p.code) {
                case (ProtocolNumber.lcp, ControlCode.configureAck):
                    if fromUs { lcpAckedByUs = true } else { lcpAckedByPeer = true }
                    if lcpAckedByUs && lcpAckedByPeer && !lcpOpened {
                        lcpOpened = true
                        add(.lcpOpened)
                    }
                case (ProtocolNumber.lcp, ControlCode.terminateRequest):
                    if termRequestBy == nil { termRequestBy = fromUs }
                case (ProtocolNumber.lcp, ControlCode.terminateAck):
                    if let by = termRequestBy, by != fromUs, !terminated {
                        terminated = true
                        states.append(.terminated(byUs: by))
                    }
                case (ProtocolNumber.pap, PAPPacket.Code.ack):
                    // The first success counts; a peer may authenticate again and again.
                    guard !states.contains(where: { if case .authenticated = $0 { return true } else { return false } }) else { break }
                    let request = lastPAP[fromUs ? 1 : 0]
                    var name = ""
                    if let request, let rp = controlPacket(request.frame), case let .authenticateRequest(_, peerID, _)? = try? PAPPacket(rp) {
                        name = String(decoding: peerID, as: UTF8.self)
                    }
                    add(.authenticated(name))
                case (ProtocolNumber.ipcp, ControlCode.configureAck):
                    for o in options(p) {
                        if case let .ipAddress(a) = IPCPOption(o) {
                            // Our Ack names the peer's address; the peer's Ack names ours.
                            if fromUs { ipcpPeer = a } else { ipcpLocal = a }
                        }
                    }
                    if let l = ipcpLocal, let r = ipcpPeer, !ipcpOpened {
                        ipcpOpened = true
                        add(.ipcpOpened(local: l, peer: r))
                    }
                default: break
                }
                continue
            }
            guard let ip = f.ip else { continue }
            // Evidence of IPCP without the Acks in view: packets both ways.
            if let h = ip.withUnsafeBytes({ try? IPv4Header(parsing: $0) }) {
                if fromUs { ipFromUs = ipFromUs ?? h.source } else { ipFromPeer = ipFromPeer ?? h.source }
                // Or the recorded side sending IP after it acknowledged the peer's IPCP
                // request: network-layer packets flow only on an opened NCP (RFC 1661 §3.4).
                if !ipcpOpened, fromUs, let r = ipcpPeer, h.destination == r {
                    ipcpOpened = true
                    add(.ipcpOpened(local: h.source, peer: r))
                }
                if !ipcpOpened, let l = ipFromUs, let r = ipFromPeer {
                    if !lcpOpened {
                        lcpOpened = true
                        add(.lcpOpened)
                    }
                    ipcpOpened = true
                    add(.ipcpOpened(local: l, peer: r))
                }
            }
            guard let s = TCPView(ip) else { continue }
            let ourPort = fromUs ? s.sourcePort : s.destinationPort
            let peerPort = fromUs ? s.destinationPort : s.sourcePort
            let pair = UInt32(ourPort) << 16 | UInt32(peerPort)
            var index = open[pair]
            if index == nil {
                // A connection starts with a SYN; a segment of one that began before the capture
                // is left out, as are connections past the replay's bound.
                guard s.flags.contains(.syn) && !s.flags.contains(.ack), connections.count < ReplayBounds().connections else { continue }
                connections.append(RecordedConnection(ourPort: ourPort, peerPort: peerPort,
                                                      ourAddress: fromUs ? s.ip.source : s.ip.destination,
                                                      peerAddress: fromUs ? s.ip.destination : s.ip.source, openedByUs: fromUs))
                index = connections.count - 1
                open[pair] = index
            }
            guard let i = index else { continue }
            var c = connections[i]
            var start = isn[i] ?? (nil, nil)
            if s.flags.contains(.syn) {
                if fromUs { start.ours = s.header.sequenceNumber } else { start.peer = s.header.sequenceNumber }
                isn[i] = start
            }
            if s.flags.contains(.ack) && start.ours != nil && start.peer != nil && !s.flags.contains(.syn) { c.established = true }
            // Bytes carried: the end of the furthest segment with data (a FIN's sequence
            // number, and every ACK after it, are one past the last byte).
            if !s.payload.isEmpty, let first = fromUs ? start.ours : start.peer {
                let end = s.header.sequenceNumber.offset(from: first + 1) + s.payload.count
                if end <= 1 << 30 {
                    if fromUs { c.bytesToPeer = max(c.bytesToPeer, end) } else { c.bytesFromPeer = max(c.bytesFromPeer, end) }
                }
            }
            if s.flags.contains(.rst) { c.reset = true }
            if s.flags.contains(.fin) {
                if fromUs { c.finFromUs = true } else { c.finFromPeer = true }
                if c.finFromUs && c.finFromPeer { c.closed = true }
            }
            connections[i] = c
            if c.closed || c.reset { open[pair] = nil }
        }
        return states + connections.filter(\.established).map { .tcp($0) }
    }
}
