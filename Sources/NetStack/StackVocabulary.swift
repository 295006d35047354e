/// A connection's handle in an `IPStack`.
public struct ConnectionID: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let rawValue: Int
    public static func < (a: ConnectionID, b: ConnectionID) -> Bool { a.rawValue < b.rawValue }
    public var description: String { "#\(rawValue)" }
}

public enum StackEvent: Sendable, Equatable {
    /// A connection to a listening port finished its handshake; take it with `accept`.
    case acceptable(port: UInt16)
    case tcp(ConnectionID, TCPEvent)
    /// A datagram is queued on a bound UDP port; take it with `receiveDatagram`.
    case datagram(port: UInt16)
    case echoReply(from: IPv4Address, identifier: UInt16, sequence: UInt16, payload: [UInt8])
    /// An ICMP error arrived about a packet we sent.
    case icmpError(from: IPv4Address, type: UInt8, code: UInt8, about: IPv4Address)
}

public enum StackError: Error, Equatable, Sendable, CustomStringConvertible {
    case portInUse(UInt16)
    case noSuchConnection(ConnectionID)
    case noEphemeralPort
    case tooManyConnections

    public var description: String {
        switch self {
        case let .portInUse(p): return "port \(p) is in use"
        case let .noSuchConnection(id): return "no connection \(id)"
        case .noEphemeralPort: return "no free local port"
        case .tooManyConnections: return "connection limit reached"
        }
    }
}

public struct IPStackConfiguration: Sendable, Equatable {
    public var address: IPv4Address
    /// The largest IP packet the link carries (the peer's MRU on PPP).
    public var mtu = 1500
    /// Template for every connection; its MSS follows `mtu`.
    public var tcp = TCPConfiguration()
    public var timeToLive: UInt8 = 64
    /// ICMP errors we send per second at most (RFC 1122 §3.2.2).
    public var icmpErrorsPerSecond = 10
    /// Fragment reassembly's bounds: bytes held, datagrams pending in total and per source,
    /// and how long a datagram may wait for its last hole.
    public var reassembly = FragmentReassembly.Limits()
    public var maximumConnections = 4096
    /// Connections a listening port holds at once (handshaking, waiting to be accepted or
    /// accepted and still open); a SYN beyond them is refused with a reset. A listener may
    /// set its own.
    public var connectionsPerListener = 64
    /// Connections finished but not yet accepted, per listening port.
    public var listenBacklog = 128
    /// Datagrams queued per UDP port before new ones are dropped.
    public var udpQueueLimit = 64
    /// An ACK that falls due while a segment comes in waits until the output is collected
    /// (`takeOutgoing`, `poll`): one ACK then answers every segment that came in meanwhile,
    /// after the applications have read them, with the window they reopened, and a reply
    /// written meanwhile carries it. Linux does as much with GRO and its deferred ACK check.
    /// For a caller that collects after each batch of packets it feeds (the channel does).
    public var acknowledgeAtCollection = false

    public init(address: IPv4Address) { self.address = address }
}

public struct StackCounters: Sendable, Equatable, CustomStringConvertible {
    public var ipReceived = 0
    public var ipSent = 0
    public var ipMalformed = 0
    public var ipChecksumErrors = 0
    public var ipNotForUs = 0
    public var ipUnknownProtocol = 0
    public var fragmentsReceived = 0
    public var fragmentsSent = 0
    public var datagramsReassembled = 0
    public var reassemblyTimeouts = 0
    public var reassemblyDrops = 0
    /// The same drops by reason.
    public var reassemblyDropReasons = FragmentReassembly.Drops()
    public var icmpReceived = 0
    public var icmpEchoRequests = 0
    public var icmpEchoReplies = 0
    public var icmpErrorsSent = 0
    public var icmpRateLimited = 0
    public var icmpChecksumErrors = 0
    public var udpReceived = 0
    public var udpSent = 0
    public var udpNoPort = 0
    public var udpChecksumErrors = 0
    public var udpQueueDrops = 0
    public var tcpChecksumErrors = 0
    public var tcpMalformed = 0
    public var tcpResetsSent = 0
    public var tcpResetsReceived = 0
    public var tcpActiveOpens = 0
    public var tcpPassiveOpens = 0
    public var tcpListenDrops = 0
    /// SYNs refused with a reset because their listening port held its limit of connections.
    public var tcpListenRefused = 0
    /// Totals over every connection, closed ones included.
    public var tcp = TCPConnectionCounters()

    public init() {}

    public var description: String {
        "ip in \(ipReceived) out \(ipSent) bad \(ipMalformed) cksum \(ipChecksumErrors) not-for-us \(ipNotForUs) "
            + "frag in \(fragmentsReceived) reasm \(datagramsReassembled) timeout \(reassemblyTimeouts) dropped \(reassemblyDrops); "
            + "icmp in \(icmpReceived) echo \(icmpEchoRequests) errors-sent \(icmpErrorsSent) limited \(icmpRateLimited); "
            + "udp in \(udpReceived) out \(udpSent) no-port \(udpNoPort) cksum \(udpChecksumErrors); "
            + "tcp in \(tcp.segmentsReceived) out \(tcp.segmentsSent) retrans \(tcp.retransmittedSegments) "
            + "fast-retrans \(tcp.fastRetransmits) timeouts \(tcp.timeouts) out-of-order \(tcp.outOfOrderSegments) "
            + "cksum \(tcpChecksumErrors) resets in \(tcpResetsReceived) out \(tcpResetsSent)"
    }
}

extension TCPConnectionCounters {
    static func + (a: TCPConnectionCounters, b: TCPConnectionCounters) -> TCPConnectionCounters {
        var c = a
        c.segmentsSent += b.segmentsSent
        c.segmentsReceived += b.segmentsReceived
        c.bytesSent += b.bytesSent
        c.bytesReceived += b.bytesReceived
        c.retransmittedSegments += b.retransmittedSegments
        c.fastRetransmits += b.fastRetransmits
        c.timeouts += b.timeouts
        c.outOfOrderSegments += b.outOfOrderSegments
        c.outOfOrderDropped += b.outOfOrderDropped
        c.duplicateSegments += b.duplicateSegments
        c.challengeAcks += b.challengeAcks
        c.zeroWindowProbes += b.zeroWindowProbes
        c.keepAliveProbes += b.keepAliveProbes
        return c
    }
}
