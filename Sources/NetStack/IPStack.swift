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

/// The host side of IPv4 on one point-to-point link: ICMP, UDP sockets and TCP connections,
/// sans-IO. Packets and `now` in; packets, events and `pollAt` out. Nothing calls back.
public struct IPStack: Sendable {
    public private(set) var configuration: IPStackConfiguration
    private var counterBase = StackCounters()
    private var closedConnections = TCPConnectionCounters()
    private var reassembly: FragmentReassembly
    private var connections = ConnectionTable()
    private var demux: [FourTuple: ConnectionID] = [:]
    private var listeners: [UInt16: Listener] = [:]
    /// Passive connections not yet handed out, by id: the port they arrived on.
    private var pendingAccept: [ConnectionID: UInt16] = [:]
    /// Passive connections, by id: the listening port they arrived on (for its limit).
    private var origin: [ConnectionID: UInt16] = [:]
    /// Events of connections not yet accepted, delivered on `accept`.
    private var eventsBeforeAccept: [ConnectionID: [TCPEvent]] = [:]
    private var released: Set<ConnectionID> = []
    private var udpSockets: [UInt16: [(TCPEndpoint, [UInt8])]] = [:]
    private var outgoing: [[UInt8]] = []
    /// Arrays of packets already sent, handed back (`recycle`) for the next segments.
    private var packetPool = BufferPool(limit: 64, smallest: 2048)
    private var events: [StackEvent] = []
    private var nextConnection = 1
    private var nextEphemeralPort: UInt16
    private var identification: UInt16
    private let isnKey: SipHash24
    private var icmpTokens: Double
    private var icmpRefilled: Instant = .zero

    struct FourTuple: Hashable, Sendable {
        var localPort: UInt16
        var remote: TCPEndpoint
    }

    struct Listener: Sendable {
        var ready: [ConnectionID] = []
        var configuration: TCPConfiguration
        var connectionLimit: Int
        /// Every live connection that arrived on this port, accepted or not.
        var live: Set<ConnectionID> = []
    }

    /// `random` supplies the stack's secrets: the RFC 6528 ISN key, the first ephemeral port
    /// and IP identification. Production passes the CSPRNG (`Crypto.CSPRNG`); tests a seeded one.
    public init(configuration: IPStackConfiguration, random: inout some RandomNumberGenerator) {
        self.configuration = configuration
        reassembly = FragmentReassembly(limits: configuration.reassembly)
        isnKey = SipHash24(key0: random.next(), key1: random.next())
        nextEphemeralPort = 49152 + UInt16(truncatingIfNeeded: random.next() % 16384)
        identification = UInt16(truncatingIfNeeded: random.next())
        icmpTokens = Double(configuration.icmpErrorsPerSecond)
        setMTU(configuration.mtu)
    }

    /// A stack whose secrets come from a seeded generator: for tests and simulations only.
    public init(configuration: IPStackConfiguration, seed: UInt64) {
        var random = SplitMix64(seed: seed)
        self.init(configuration: configuration, random: &random)
    }

    public var address: IPv4Address { configuration.address }

    /// Follows the link: new connections use MSS = MTU - 40.
    public mutating func setMTU(_ mtu: Int) {
        configuration.mtu = max(mtu, 68)
        configuration.tcp.maximumSegmentSize = configuration.mtu - 40
    }

    public var counters: StackCounters {
        var c = counterBase
        c.datagramsReassembled = reassembly.reassembled
        c.reassemblyTimeouts = reassembly.timedOut
        c.reassemblyDrops = reassembly.dropped
        c.reassemblyDropReasons = reassembly.drops
        c.tcp = closedConnections
        for i in connections.positions { if let counters = connections.read(position: i, { $0.counters }) { c.tcp = c.tcp + counters } }
        return c
    }

    /// Bytes the stack holds for reassembly: IP fragments and out-of-order TCP segments.
    public var reassemblyBytes: (fragments: Int, outOfOrder: Int) {
        var outOfOrder = 0
        for i in connections.positions { outOfOrder += connections.read(position: i) { $0.outOfOrderBytes } ?? 0 }
        return (reassembly.bytesHeld, outOfOrder)
    }

    public var connectionCount: Int { connections.count }

    // MARK: Input

    public mutating func receive(packet: [UInt8], now: Instant) {
        counterBase.ipReceived += 1
        let parsed: IPv4Header
        do {
            parsed = try packet.withUnsafeBytes { b throws(PacketError) in try IPv4Header(parsing: b) }
        } catch {
            counterBase.ipMalformed += 1
            return
        }
        let valid = packet.withUnsafeBytes { IPv4Header.checksumValid(UnsafeRawBufferPointer(rebasing: $0[0..<parsed.headerLength])) }
        guard valid else {
            counterBase.ipChecksumErrors += 1
            return
        }
        guard parsed.destination == configuration.address else {
            counterBase.ipNotForUs += 1
            return
        }
        var header = parsed
        // A slice of the packet: an in-order TCP segment's bytes are copied once, into the
        // receive buffer (fragments are copied for reassembly, out-of-order segments to be held).
        var payload = packet[header.headerLength..<header.totalLength]
        if header.isFragment {
            counterBase.fragmentsReceived += 1
            guard let (whole, bytes) = reassembly.add(header: header, payload: Array(payload), now: now) else { return }
            header = whole
            payload = bytes[...]
        }
        switch header.protocol {
        case IPProtocol.tcp: receiveTCP(header, payload, now: now)
        case IPProtocol.udp: receiveUDP(header, Array(payload), now: now)
        case IPProtocol.icmp: receiveICMP(header, Array(payload), now: now)
        default:
            counterBase.ipUnknownProtocol += 1
            // RFC 1122 §3.2.2.1: protocol unreachable.
            sendICMPError(type: ICMPHeader.destinationUnreachable, code: 2, about: header, payload: Array(payload), now: now)
        }
    }

    private mutating func receiveICMP(_ ip: IPv4Header, _ payload: [UInt8], now: Instant) {
        counterBase.icmpReceived += 1
        guard InternetChecksum.checksum(payload) == 0 else {
            counterBase.icmpChecksumErrors += 1
            return
        }
        guard let icmp = try? payload.withUnsafeBytes({ b throws(PacketError) in try ICMPHeader(parsing: b) }) else { return }
        let data = Array(payload[8...])
        switch icmp.type {
        case ICMPHeader.echoRequest:
            counterBase.icmpEchoRequests += 1
            var reply = ICMPHeader(type: ICMPHeader.echoReply, code: 0, restOfHeader: icmp.restOfHeader)
            reply.checksum = 0
            send(protocol: IPProtocol.icmp, to: ip.source, payload: reply.emit(payload: data) + data)
        case ICMPHeader.echoReply:
            counterBase.icmpEchoReplies += 1
            events.append(.echoReply(from: ip.source, identifier: icmp.identifier, sequence: icmp.sequence, payload: data))
        case ICMPHeader.destinationUnreachable, ICMPHeader.timeExceeded:
            // The quoted header's destination tells which of our packets it concerns.
            if data.count >= 20 && data[0] >> 4 == 4 {
                let about = IPv4Address(data[16], data[17], data[18], data[19])
                events.append(.icmpError(from: ip.source, type: icmp.type, code: icmp.code, about: about))
            }
        default:
            break
        }
    }

    // MARK: UDP

    public mutating func bindUDP(port: UInt16) throws(StackError) {
        guard udpSockets[port] == nil else { throw .portInUse(port) }
        udpSockets[port] = []
    }

    public mutating func unbindUDP(port: UInt16) { udpSockets[port] = nil }

    /// The oldest datagram queued on `port`: sender and payload.
    public mutating func receiveDatagram(port: UInt16) -> (from: TCPEndpoint, payload: [UInt8])? {
        guard var queue = udpSockets[port], !queue.isEmpty else { return nil }
        let first = queue.removeFirst()
        udpSockets[port] = queue
        return first
    }

    public mutating func sendDatagram(from port: UInt16, to destination: TCPEndpoint, payload: [UInt8], now: Instant) {
        let udp = UDPHeader(sourcePort: port, destinationPort: destination.port, payloadLength: payload.count)
        counterBase.udpSent += 1
        send(protocol: IPProtocol.udp, to: destination.address, payload: udp.emit(source: configuration.address, destination: destination.address, payload: payload) + payload)
    }

    private mutating func receiveUDP(_ ip: IPv4Header, _ payload: [UInt8], now: Instant) {
        counterBase.udpReceived += 1
        guard let udp = try? payload.withUnsafeBytes({ b throws(PacketError) in try UDPHeader(parsing: b) }), udp.length <= payload.count else {
            counterBase.udpChecksumErrors += 1
            return
        }
        // RFC 768: a zero checksum means none was computed.
        if udp.checksum != 0 {
            let pseudo = InternetChecksum.pseudoHeaderSum(source: ip.source, destination: ip.destination, protocol: IPProtocol.udp, length: udp.length)
            guard InternetChecksum.finish(InternetChecksum.sum(payload[0..<udp.length], into: pseudo)) == 0 else {
                counterBase.udpChecksumErrors += 1
                return
            }
        }
        guard var queue = udpSockets[udp.destinationPort] else {
            counterBase.udpNoPort += 1
            sendICMPError(type: ICMPHeader.destinationUnreachable, code: 3, about: ip, payload: payload, now: now)
            return
        }
        guard queue.count < configuration.udpQueueLimit else {
            counterBase.udpQueueDrops += 1
            return
        }
        queue.append((TCPEndpoint(ip.source, udp.sourcePort), Array(payload[8..<udp.length])))
        udpSockets[udp.destinationPort] = queue
        events.append(.datagram(port: udp.destinationPort))
    }

    // MARK: ICMP

    /// Sends an echo request; the reply arrives as `.echoReply`.
    public mutating func ping(_ destination: IPv4Address, identifier: UInt16, sequence: UInt16, payload: [UInt8], now: Instant) {
        let icmp = ICMPHeader(type: ICMPHeader.echoRequest, code: 0, restOfHeader: UInt32(identifier) << 16 | UInt32(sequence))
        send(protocol: IPProtocol.icmp, to: destination, payload: icmp.emit(payload: payload) + payload)
    }

    /// RFC 1122 §3.2.2: never about an ICMP error, a non-initial fragment, or a packet from a
    /// non-unicast source; rate-limited by a token bucket.
    private mutating func sendICMPError(type: UInt8, code: UInt8, about ip: IPv4Header, payload: [UInt8], now: Instant) {
        if ip.protocol == IPProtocol.icmp, let t = payload.first, t != ICMPHeader.echoRequest && t != ICMPHeader.echoReply { return }
        if ip.fragmentOffset != 0 { return }
        let s = ip.source.value
        if s == 0 || s == 0xFFFF_FFFF || (s >> 28) == 0xE { return }
        let elapsed = Double((now - icmpRefilled).nanoseconds) / 1e9
        icmpRefilled = now
        let limit = Double(configuration.icmpErrorsPerSecond)
        icmpTokens = min(limit, icmpTokens + elapsed * limit)
        guard icmpTokens >= 1 else {
            counterBase.icmpRateLimited += 1
            return
        }
        icmpTokens -= 1
        counterBase.icmpErrorsSent += 1
        var quoted = ip
        quoted.payloadLength = payload.count
        let body = quoted.emit() + payload.prefix(8)
        let icmp = ICMPHeader(type: type, code: code, restOfHeader: 0)
        send(protocol: IPProtocol.icmp, to: ip.source, payload: icmp.emit(payload: body) + body)
    }

    // MARK: IP output

    private mutating func send(protocol proto: UInt8, to destination: IPv4Address, payload: [UInt8]) {
        identification &+= 1
        var h = IPv4Header(protocol: proto, source: configuration.address, destination: destination, payloadLength: payload.count)
        h.identification = identification
        h.timeToLive = configuration.timeToLive
        // TCP sizes its segments to the MTU, so it may forbid fragmentation; others are split.
        if proto == IPProtocol.tcp { h.dontFragment = true }
        if h.totalLength <= configuration.mtu {
            // One buffer for the packet: the header written into it, then the payload.
            var packet: [UInt8] = []
            packet.reserveCapacity(h.totalLength)
            h.emit(into: &packet)
            packet += payload
            outgoing.append(packet)
            counterBase.ipSent += 1
            return
        }
        let chunk = (configuration.mtu - h.headerLength) / 8 * 8
        var offset = 0
        while offset < payload.count {
            let n = min(chunk, payload.count - offset)
            var f = h
            f.dontFragment = false
            f.fragmentOffset = offset
            f.moreFragments = offset + n < payload.count
            f.payloadLength = n
            outgoing.append(f.emit() + payload[offset..<(offset + n)])
            counterBase.ipSent += 1
            counterBase.fragmentsSent += 1
            offset += n
        }
    }

    /// A segment as one IP packet built in one buffer (IP header, TCP header, payload); one
    /// larger than the MTU (which TCP does not make) goes through `send`.
    private mutating func sendTCP(_ s: TCPSegment, from local: IPv4Address, to remote: IPv4Address) {
        let ipLength = 20, tcpLength = s.header.emittedLength
        guard ipLength + tcpLength + s.payload.count <= configuration.mtu else {
            var bytes = s.header.emit(source: local, destination: remote, payload: s.payload)
            bytes += s.payload
            return send(protocol: IPProtocol.tcp, to: remote, payload: bytes)
        }
        identification &+= 1
        var h = IPv4Header(protocol: IPProtocol.tcp, source: configuration.address, destination: remote, payloadLength: tcpLength + s.payload.count)
        h.identification = identification
        h.timeToLive = configuration.timeToLive
        h.dontFragment = true
        var packet = packetPool.take(capacity: h.totalLength)
        h.emit(into: &packet)
        s.header.emit(into: &packet, source: local, destination: remote, payload: s.payload)
        packet += s.payload
        outgoing.append(packet)
        counterBase.ipSent += 1
    }

    // See `TCPConnection.takeSegments`: handed over whole, nothing allocated when empty.
    public mutating func takeOutgoing() -> [[UInt8]] {
        collectSegments(releasingAcks: true)
        guard !outgoing.isEmpty else { return [] }
        defer { outgoing = [] }
        return outgoing
    }

    public mutating func takeEvents() -> [StackEvent] {
        collectSegments()
        guard !events.isEmpty else { return [] }
        defer { events = [] }
        return events
    }

    /// `takeOutgoing` into the caller's array, which it keeps from batch to batch: the two
    /// trade places (what `packets` held is dropped), so a steady stream allocates no array
    /// for the list itself.
    public mutating func takeOutgoing(into packets: inout [[UInt8]]) {
        collectSegments(releasingAcks: true)
        packets.removeAll(keepingCapacity: true)
        swap(&outgoing, &packets)
    }

    /// Arrays kept for the next packets (`recycle`).
    public var pooledPacketBuffers: Int { packetPool.count }

    /// Hands back packets taken with `takeOutgoing` once their bytes are framed: their arrays
    /// carry later segments. Leaves `packets` empty.
    public mutating func recycle(_ packets: inout [[UInt8]]) {
        packetPool.give(all: &packets)
    }

    /// `takeEvents` into the caller's array, kept from batch to batch as in `takeOutgoing(into:)`.
    public mutating func takeEvents(into buffer: inout [StackEvent]) {
        collectSegments()
        buffer.removeAll(keepingCapacity: true)
        swap(&events, &buffer)
    }

    // MARK: Time

    /// `pollAt` through a mutating access, which reaches the stack and each connection where
    /// they lie: the channel asks on every turn of the loop, and the getter, called on a stack
    /// held in an object's property, first copies the whole stack (and each connection out of
    /// the table), retaining and releasing every buffer in it.
    public mutating func pollAtInPlace() -> Instant? {
        var t = reassembly.pollAt
        for i in connections.positions {
            if let p = connections.modify(position: i, { $0.pollAt }) ?? nil { t = t.map { min($0, p) } ?? p }
        }
        return t
    }

    /// When `poll` must next be called. (The channel asks `pollAtInPlace`, every turn.)
    public var pollAt: Instant? {
        var stack = self
        return stack.pollAtInPlace()
    }

    public mutating func poll(now: Instant) {
        for (header, firstBytes) in reassembly.expire(now: now) {
            // RFC 792: fragment reassembly time exceeded.
            sendICMPError(type: ICMPHeader.timeExceeded, code: 1, about: header, payload: firstBytes, now: now)
        }
        // In place, without lookups (polling adds or removes no connection).
        for i in connections.positions {
            connections.modify(position: i) { c in
                if let p = c.pollAt, p <= now { c.poll(now: now) }
            }
        }
        collectSegments(releasingAcks: true)
    }
}

// MARK: - TCP

extension IPStack {
    /// Accepts connections on `port`, at most `maximumConnections` at once (default
    /// `IPStackConfiguration.connectionsPerListener`).
    public mutating func listen(port: UInt16, configuration tcp: TCPConfiguration? = nil, maximumConnections: Int? = nil) throws(StackError) {
        guard listeners[port] == nil else { throw .portInUse(port) }
        var c = tcp ?? configuration.tcp
        c.maximumSegmentSize = configuration.tcp.maximumSegmentSize
        listeners[port] = Listener(configuration: c, connectionLimit: max(maximumConnections ?? configuration.connectionsPerListener, 0))
    }

    /// Stops accepting. Connections not handed out yet, those still in their handshake
    /// included, are reset: no one would ever read them. Accepted ones live on.
    public mutating func unlisten(port: UInt16) {
        guard listeners.removeValue(forKey: port) != nil else { return }
        for (id, p) in pendingAccept where p == port {
            pendingAccept[id] = nil
            eventsBeforeAccept[id] = nil
            abort(id, now: nil)
        }
    }

    public var listeningPorts: [UInt16] { listeners.keys.sorted() }

    /// An established connection from `port`'s queue.
    public mutating func accept(port: UInt16) -> ConnectionID? {
        collectSegments()
        guard var l = listeners[port], !l.ready.isEmpty else { return nil }
        let id = l.ready.removeFirst()
        listeners[port] = l
        pendingAccept[id] = nil
        for e in eventsBeforeAccept.removeValue(forKey: id) ?? [] { events.append(.tcp(id, e)) }
        return id
    }

    /// Active open from an ephemeral port (or `localPort`) to `remote`.
    public mutating func connect(to remote: TCPEndpoint, localPort: UInt16? = nil, configuration tcp: TCPConfiguration? = nil, now: Instant) throws(StackError) -> ConnectionID {
        guard connections.count < configuration.maximumConnections else { throw .tooManyConnections }
        let port: UInt16
        if let p = localPort {
            guard demux[FourTuple(localPort: p, remote: remote)] == nil else { throw .portInUse(p) }
            port = p
        } else {
            port = try ephemeralPort(for: remote)
        }
        var c = tcp ?? configuration.tcp
        c.maximumSegmentSize = configuration.tcp.maximumSegmentSize
        let local = TCPEndpoint(configuration.address, port)
        let conn = TCPConnection(local: local, remote: remote, initialSequence: initialSequence(local: local, remote: remote, now: now), configuration: c, now: now)
        let id = register(conn)
        counterBase.tcpActiveOpens += 1
        return id
    }

    private mutating func ephemeralPort(for remote: TCPEndpoint) throws(StackError) -> UInt16 {
        for _ in 0..<16384 {
            let p = nextEphemeralPort
            nextEphemeralPort = p == 65535 ? 49152 : p + 1
            if demux[FourTuple(localPort: p, remote: remote)] == nil && listeners[p] == nil { return p }
        }
        throw .noEphemeralPort
    }

    /// RFC 6528: ISN = M + F(4-tuple, secret), M a 4-microsecond clock.
    private func initialSequence(local: TCPEndpoint, remote: TCPEndpoint, now: Instant) -> SequenceNumber {
        let tuple = local.address.bytes + BigEndian.bytes(local.port) + remote.address.bytes + BigEndian.bytes(remote.port)
        let f = UInt32(truncatingIfNeeded: isnKey.hash(tuple))
        return SequenceNumber(UInt32(truncatingIfNeeded: now.nanoseconds / 4000) &+ f)
    }

    private mutating func register(_ conn: TCPConnection) -> ConnectionID {
        let id = ConnectionID(rawValue: nextConnection)
        nextConnection += 1
        connections.insert(conn, id: id)
        demux[FourTuple(localPort: conn.local.port, remote: conn.remote)] = id
        return id
    }

    public func state(_ id: ConnectionID) -> TCPState? { connections.read(id) { $0.state } }
    public func connection(_ id: ConnectionID) -> TCPConnection? { connections.copy(id) }
    public var connectionIDs: [ConnectionID] { connections.keys.sorted() }

    @discardableResult
    public mutating func write<C: Collection<UInt8>>(_ id: ConnectionID, _ bytes: C, now: Instant) -> Int {
        connections.modify(id) { $0.write(bytes, now: now) } ?? 0
    }

    /// A `.writable` event once the send buffer has room again (see `TCPConnection.notifyWhenWritable`).
    public mutating func notifyWhenWritable(_ id: ConnectionID) { connections.modify(id) { $0.notifyWhenWritable() } }

    public mutating func read(_ id: ConnectionID, maximum: Int = .max, now: Instant) -> [UInt8] {
        connections.modify(id) { $0.read(maximum: maximum, now: now) } ?? []
    }

    /// `read` onto the end of the caller's buffer; returns how many bytes came.
    @discardableResult
    public mutating func read(_ id: ConnectionID, maximum: Int = .max, appendingTo out: inout [UInt8], now: Instant) -> Int {
        connections.modify(id) { $0.read(maximum: maximum, appendingTo: &out, now: now) } ?? 0
    }

    public func writableBytes(_ id: ConnectionID) -> Int { connections.read(id) { $0.writableBytes } ?? 0 }
    /// Bytes written to `id` that the peer has not acknowledged yet (sent or not).
    public func unacknowledgedBytes(_ id: ConnectionID) -> Int { connections.read(id) { $0.unacknowledgedBytes } ?? 0 }
    public func readableBytes(_ id: ConnectionID) -> Int { connections.read(id) { $0.readableBytes } ?? 0 }
    /// True once the peer's FIN is read past, or the connection is gone.
    public func atEndOfStream(_ id: ConnectionID) -> Bool { connections.read(id) { $0.atEndOfStream || $0.state == .closed } ?? true }

    public mutating func shutdownWrite(_ id: ConnectionID, now: Instant) {
        connections.modify(id) { $0.shutdownWrite(now: now) }
    }

    /// Full close; the stack forgets the connection once it has finished.
    public mutating func close(_ id: ConnectionID, now: Instant) {
        guard connections.contains(id) else { return }
        released.insert(id)
        connections.modify(id) { $0.close(now: now) }
    }

    public mutating func abort(_ id: ConnectionID, now: Instant?) {
        guard connections.contains(id) else { return }
        released.insert(id)
        connections.modify(id) { $0.abort(now: now ?? .zero) }
    }

    public mutating func setNagle(_ id: ConnectionID, _ on: Bool, now: Instant) { connections.modify(id) { $0.setNagle(on, now: now) } }
    public mutating func setDelayedAck(_ id: ConnectionID, _ delay: Duration?) { connections.modify(id) { $0.setDelayedAck(delay) } }
    public mutating func setKeepAlive(_ id: ConnectionID, _ keepAlive: TCPKeepAlive?) { connections.modify(id) { $0.setKeepAlive(keepAlive) } }
    public mutating func setUserTimeout(_ id: ConnectionID, _ timeout: Duration?) { connections.modify(id) { $0.setUserTimeout(timeout) } }

    private mutating func receiveTCP(_ ip: IPv4Header, _ segment: ArraySlice<UInt8>, now: Instant) {
        let pseudo = InternetChecksum.pseudoHeaderSum(source: ip.source, destination: ip.destination, protocol: IPProtocol.tcp, length: segment.count)
        guard InternetChecksum.finish(InternetChecksum.sum(segment, into: pseudo)) == 0 else {
            counterBase.tcpChecksumErrors += 1
            return
        }
        guard let h = try? segment.withUnsafeBytes({ b throws(PacketError) in try TCPHeader(parsing: b) }) else {
            counterBase.tcpMalformed += 1
            return
        }
        let payload = segment[(segment.startIndex + h.headerLength)...]
        let remote = TCPEndpoint(ip.source, h.sourcePort)
        if h.flags.contains(.rst) { counterBase.tcpResetsReceived += 1 }
        if let id = demux[FourTuple(localPort: h.destinationPort, remote: remote)] {
            let hold = configuration.acknowledgeAtCollection
            let taken = connections.modify(id) { c in
                if hold { c.holdAcks(now: now) }
                c.receive(h, payload: payload, now: now)
            }
            if taken != nil { return }
            // A four-tuple left behind by a connection that is gone: forgotten, and the segment
            // is treated as one for no connection.
            demux[FourTuple(localPort: h.destinationPort, remote: remote)] = nil
        }
        if h.flags.contains(.syn) && !h.flags.contains(.ack) && !h.flags.contains(.rst), var listener = listeners[h.destinationPort] {
            let waiting = listener.live.count(where: { pendingAccept[$0] != nil })
            guard waiting < configuration.listenBacklog, connections.count < configuration.maximumConnections else {
                counterBase.tcpListenDrops += 1
                return
            }
            guard listener.live.count < listener.connectionLimit else {
                counterBase.tcpListenRefused += 1
                sendReset(answering: h, payloadLength: payload.count, to: ip.source)
                return
            }
            let local = TCPEndpoint(configuration.address, h.destinationPort)
            let conn = TCPConnection(local: local, remote: remote, initialSequence: initialSequence(local: local, remote: remote, now: now),
                                     configuration: listener.configuration, syn: h, now: now)
            let id = register(conn)
            pendingAccept[id] = h.destinationPort
            listener.live.insert(id)
            listeners[h.destinationPort] = listener
            origin[id] = h.destinationPort
            counterBase.tcpPassiveOpens += 1
            return
        }
        // RFC 9293 §3.10.7.1: a segment for no connection gets a reset.
        guard !h.flags.contains(.rst) else { return }
        sendReset(answering: h, payloadLength: payload.count, to: ip.source)
    }

    /// RFC 9293 §3.10.7.1: the reset that answers `h`, which no connection takes.
    private mutating func sendReset(answering h: TCPHeader, payloadLength: Int, to source: IPv4Address) {
        var reset = TCPHeader(sourcePort: h.destinationPort, destinationPort: h.sourcePort, sequenceNumber: 0, flags: [.rst], window: 0)
        if h.flags.contains(.ack) {
            reset.sequenceNumber = h.acknowledgmentNumber
        } else {
            reset.flags.insert(.ack)
            let length = payloadLength + (h.flags.contains(.syn) ? 1 : 0) + (h.flags.contains(.fin) ? 1 : 0)
            reset.acknowledgmentNumber = h.sequenceNumber &+ UInt32(truncatingIfNeeded: length)
        }
        counterBase.tcpResetsSent += 1
        send(protocol: IPProtocol.tcp, to: source, payload: reset.emit(source: configuration.address, destination: source, payload: []))
    }

    /// Moves every connection's segments and events out, and forgets finished connections.
    /// `releasingAcks`: ACKs held while segments came in go now (the caller takes the output).
    private mutating func collectSegments(releasingAcks: Bool = false) {
        var finished: [ConnectionID] = []
        // In place, without lookups (nothing here adds or removes a connection until the loop
        // is over).
        for i in connections.positions {
            guard let id = connections.id(at: i) else { continue }
            if releasingAcks { connections.modify(position: i) { $0.releaseHeldAck() } }
            guard let c = connections.read(position: i, { (pending: $0.hasPending, closed: $0.state == .closed) }),
                  c.pending || c.closed else { continue }
            if c.pending {
                // Read in place, then emptied with their storage kept (`clearPending`): the
                // copies here end with this scope, so the arrays are no longer shared by then.
                let segments = connections.read(position: i) { $0.pendingSegments } ?? []
                let connEvents = connections.read(position: i) { $0.pendingEvents } ?? []
                if !segments.isEmpty, let (local, remote) = connections.read(position: i, { ($0.local.address, $0.remote.address) }) {
                    for s in segments {
                        if s.header.flags.contains(.rst) { counterBase.tcpResetsSent += 1 }
                        sendTCP(s, from: local, to: remote)
                    }
                }
                for e in connEvents {
                    if let port = pendingAccept[id] {
                        // Not handed out yet: only the handshake's end matters.
                        if e == .established, var l = listeners[port], l.ready.count < configuration.listenBacklog {
                            l.ready.append(id)
                            listeners[port] = l
                            events.append(.acceptable(port: port))
                        } else if e != .established {
                            eventsBeforeAccept[id, default: []].append(e)
                        }
                        continue
                    }
                    events.append(.tcp(id, e))
                }
            }
            connections.modify(position: i) { $0.clearPending() }
            if c.closed && (released.contains(id) || pendingAccept[id] != nil || connections.read(position: i, { $0.readableBytes }) == 0) {
                finished.append(id)
            }
        }
        for id in finished {
            guard let conn = connections.removeValue(forKey: id) else { continue }
            closedConnections = closedConnections + conn.counters
            demux[FourTuple(localPort: conn.local.port, remote: conn.remote)] = nil
            if let port = pendingAccept.removeValue(forKey: id), var l = listeners[port] {
                l.ready.removeAll { $0 == id }
                listeners[port] = l
            }
            if let port = origin.removeValue(forKey: id), var l = listeners[port] {
                l.live.remove(id)
                listeners[port] = l
            }
            released.remove(id)
            eventsBeforeAccept[id] = nil
        }
    }
}

/// SplitMix64 (Steele, Lea and Flood): a small seeded generator for the stack's secrets and
/// port choice, the link's magic numbers and the tests' simulations.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
