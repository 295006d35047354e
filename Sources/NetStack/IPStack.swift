/// The host side of IPv4 on one point-to-point link: ICMP, UDP sockets and TCP connections,
/// sans-IO. Packets and `now` in; packets, events and `pollAt` out. Nothing calls back.
/// Its TCP half (listening, connecting, demultiplexing) is in `IPStackTCP.swift`.
public struct IPStack: Sendable {
    public private(set) var configuration: IPStackConfiguration
    // What TCP (IPStackTCP.swift) shares is internal rather than private; the rest stays here.
    var counterBase = StackCounters()
    var closedConnections = TCPConnectionCounters()
    private var reassembly: FragmentReassembly
    var connections = ConnectionTable()
    var demux: [FourTuple: ConnectionID] = [:]
    var listeners: [UInt16: Listener] = [:]
    /// Passive connections not yet handed out, by id: the port they arrived on.
    var pendingAccept: [ConnectionID: UInt16] = [:]
    /// Passive connections, by id: the listening port they arrived on (for its limit).
    var origin: [ConnectionID: UInt16] = [:]
    /// Events of connections not yet accepted, delivered on `accept`.
    var eventsBeforeAccept: [ConnectionID: [TCPEvent]] = [:]
    var released: Set<ConnectionID> = []
    private var udpSockets: [UInt16: [(TCPEndpoint, [UInt8])]] = [:]
    private var outgoing: [[UInt8]] = []
    /// Arrays of packets already sent, handed back (`recycle`) for the next segments.
    private var packetPool = BufferPool(limit: 64, smallest: 2048)
    var events: [StackEvent] = []
    var nextConnection = 1
    var nextEphemeralPort: UInt16
    private var identification: UInt16
    let isnKey: SipHash24
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
            parsed = try packet.withUnsafeBytes { b throws(WireError) in try IPv4Header(parsing: b) }
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
        guard let icmp = try? payload.withUnsafeBytes({ b throws(WireError) in try ICMPHeader(parsing: b) }) else { return }
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
        guard let udp = try? payload.withUnsafeBytes({ b throws(WireError) in try UDPHeader(parsing: b) }), udp.length <= payload.count else {
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

    mutating func send(protocol proto: IPProtocol, to destination: IPv4Address, payload: [UInt8]) {
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

    /// A queued segment of the connection at `position` as one IP packet built in one buffer:
    /// IP header, TCP header, then the payload copied from the connection's send buffer
    /// straight into place, the checksum summed over it there. One larger than the MTU (which
    /// TCP does not make) goes through `send`.
    mutating func sendTCP(_ s: QueuedSegment, connectionAt position: Int, from local: IPv4Address, to remote: IPv4Address) {
        let ipLength = 20, tcpLength = s.header.emittedLength
        guard ipLength + tcpLength + s.payloadLength <= configuration.mtu else {
            var payload: [UInt8] = []
            guard connections.inspect(position: position, { $0.copyPayload(of: s, appendingTo: &payload) }) == true else { return }
            var bytes = s.header.emit(source: local, destination: remote, payload: payload)
            bytes += payload
            return send(protocol: IPProtocol.tcp, to: remote, payload: bytes)
        }
        identification &+= 1
        var h = IPv4Header(protocol: IPProtocol.tcp, source: configuration.address, destination: remote, payloadLength: tcpLength + s.payloadLength)
        h.identification = identification
        h.timeToLive = configuration.timeToLive
        h.dontFragment = true
        var packet = packetPool.take(capacity: h.totalLength)
        h.emit(into: &packet)
        s.header.emit(into: &packet, source: local, destination: remote, payload: [])
        if s.payloadLength > 0 {
            // Gone only if the connection was reset with it queued: then it is not sent.
            guard connections.inspect(position: position, { $0.copyPayload(of: s, appendingTo: &packet) }) == true else {
                packetPool.give(packet)
                return
            }
            TCPHeader.addPayloadToChecksum(in: &packet, headerAt: ipLength, headerLength: tcpLength)
        }
        outgoing.append(packet)
        counterBase.ipSent += 1
    }

    // Handed over whole and replaced by an empty array, which allocates nothing when empty.
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
    /// they lie: the channel asks after each service of its link session, and the getter, called on a stack
    /// held in an object's property, first copies the whole stack (and each connection out of
    /// the table), retaining and releasing every buffer in it.
    public mutating func pollAtInPlace() -> Instant? {
        var t = reassembly.pollAt
        for i in connections.positions {
            if let p = connections.inspect(position: i, { $0.pollAt }) ?? nil { t = t.map { min($0, p) } ?? p }
        }
        return t
    }

    /// When `poll` must next be called. (The channel asks `pollAtInPlace` after each service of its link session.)
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
