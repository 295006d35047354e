/// TCP on the stack: listening, connecting, the connection calls applications make, and
/// the demultiplexing of segments to connections and of their output to packets (RFC 9293).
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

    // The queries on one connection (`state`, `writableBytes`, …) are `mutating` only so that
    // they look at the connection where it lies: a non-mutating read copies it out of the
    // table first (see `ConnectionTable`), and the channel asks them for every relay on every
    // turn of the loop. They change nothing (`inspect`).

    public mutating func state(_ id: ConnectionID) -> TCPState? { connections.inspect(id) { $0.state } }
    public func connection(_ id: ConnectionID) -> TCPConnection? { connections.copy(id) }
    public var connectionIDs: [ConnectionID] { connections.keys.sorted() }

    /// Inlinable for the reason `TCPConnection.write` is.
    @discardableResult @inlinable
    public mutating func write<C: Collection<UInt8>>(_ id: ConnectionID, _ bytes: C, now: Instant) -> Int {
        if let n = bytes.withContiguousStorageIfAvailable({ write(id, UnsafeRawBufferPointer($0), now: now) }) { return n }
        return Array(bytes).withUnsafeBytes { write(id, $0, now: now) }
    }

    @discardableResult
    public mutating func write(_ id: ConnectionID, _ bytes: UnsafeRawBufferPointer, now: Instant) -> Int {
        connections.modify(id) { $0.write(bytes, now: now) } ?? 0
    }

    /// `write` with `fill` putting the bytes straight into the send buffer (see
    /// `TCPConnection.write(now:filling:)`); 0 for a connection that is gone.
    @discardableResult
    public mutating func write(_ id: ConnectionID, now: Instant, filling fill: (UnsafeMutableRawBufferPointer) -> Int) -> Int {
        connections.modify(id) { $0.write(now: now, filling: fill) } ?? 0
    }

    /// `read` with the bytes handed straight from the receive buffer to `body` (see
    /// `TCPConnection.read(maximum:now:taking:)`); 0 for a connection that is gone.
    @discardableResult
    public mutating func read(_ id: ConnectionID, maximum: Int = .max, now: Instant, taking body: (UnsafeRawBufferPointer) -> Int) -> Int {
        connections.modify(id) { $0.read(maximum: maximum, now: now, taking: body) } ?? 0
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

    public mutating func writableBytes(_ id: ConnectionID) -> Int { connections.inspect(id) { $0.writableBytes } ?? 0 }
    /// Bytes written to `id` that the peer has not acknowledged yet (sent or not).
    public mutating func unacknowledgedBytes(_ id: ConnectionID) -> Int { connections.inspect(id) { $0.unacknowledgedBytes } ?? 0 }
    public mutating func readableBytes(_ id: ConnectionID) -> Int { connections.inspect(id) { $0.readableBytes } ?? 0 }
    /// True once the peer's FIN is read past, or the connection is gone.
    public mutating func atEndOfStream(_ id: ConnectionID) -> Bool { connections.inspect(id) { $0.atEndOfStream || $0.state == .closed } ?? true }

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

    mutating func receiveTCP(_ ip: IPv4Header, _ segment: ArraySlice<UInt8>, now: Instant) {
        let pseudo = InternetChecksum.pseudoHeaderSum(source: ip.source, destination: ip.destination, protocol: IPProtocol.tcp, length: segment.count)
        guard InternetChecksum.finish(InternetChecksum.sum(segment, into: pseudo)) == 0 else {
            counterBase.tcpChecksumErrors += 1
            return
        }
        guard let h = try? segment.withUnsafeBytes({ b throws(WireError) in try TCPHeader(parsing: b) }) else {
            counterBase.tcpMalformed += 1
            return
        }
        let payload = segment[(segment.startIndex + h.headerLength)...]
        let remote = TCPEndpoint(ip.source, h.sourcePort)
        if h.flags.contains(.rst) { counterBase.tcpResetsReceived += 1 }
        if let id = demux[FourTuple(localPort: h.destinationPort, remote: remote)] {
            let hold = configuration.acknowledgeAtCollection
            let delivered = connections.modify(id) { c -> Bool in
                if hold { c.holdAcks(now: now) }
                c.receive(h, payload: payload, now: now)
                return true
            }
            if delivered == true { return }
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
        var reset = TCPHeader(sourcePort: h.destinationPort, destinationPort: h.sourcePort, sequenceNumber: SequenceNumber(0), flags: [.rst], window: 0)
        if h.flags.contains(.ack) {
            reset.sequenceNumber = h.acknowledgmentNumber
        } else {
            reset.flags.insert(.ack)
            let length = payloadLength + (h.flags.contains(.syn) ? 1 : 0) + (h.flags.contains(.fin) ? 1 : 0)
            reset.acknowledgmentNumber = h.sequenceNumber + length
        }
        counterBase.tcpResetsSent += 1
        send(protocol: IPProtocol.tcp, to: source, payload: reset.emit(source: configuration.address, destination: source, payload: []))
    }

    /// A closed connection is let go once the application released it, or never took it, or
    /// has read all it received.
    private mutating func isFinished(_ id: ConnectionID, at position: Int) -> Bool {
        released.contains(id) || pendingAccept[id] != nil || connections.inspect(position: position, { $0.readableBytes }) == 0
    }

    /// What a walk would find now: no connection with a segment or an event pending, and none
    /// closed and finished.
    private mutating func walkWouldFindNothing() -> Bool {
        for i in connections.positions {
            guard let id = connections.id(at: i),
                  let c = connections.inspect(position: i, { (pending: $0.hasPending, closed: $0.state == .closed) }) else { continue }
            if c.pending || (c.closed && isFinished(id, at: i)) { return false }
        }
        return true
    }

    /// Moves every connection's segments and events out, and forgets finished connections.
    /// `releasingAcks`: ACKs held while segments came in go now (the caller takes the output).
    mutating func collectSegments(releasingAcks: Bool = false) {
        // Nothing changed since the last walk: no connection has a segment or an event for us,
        // or a reason to be let go. (Held ACKs wait for a releasing walk, which always runs,
        // once a turn; so would a change the table missed, late but not lost.)
        guard releasingAcks || connections.changedSinceCollected else {
            // Checked in debug builds (the test suites): a walk skipped would have found nothing.
            assert(walkWouldFindNothing(), "a connection changed without the table knowing")
            return
        }
        defer { connections.markCollected() }
        var finished: [ConnectionID] = []
        // In place, without lookups (nothing here adds or removes a connection until the loop
        // is over). Asked through `modify`, not `read`: a non-mutating access may copy the
        // whole connection (see `ConnectionTable`), where an access in place does not.
        for i in connections.positions {
            guard let id = connections.id(at: i) else { continue }
            if releasingAcks { connections.modify(position: i) { $0.releaseHeldAck() } }
            guard let c = connections.modify(position: i, { (pending: $0.hasPending, closed: $0.state == .closed) }),
                  c.pending || c.closed else { continue }
            if c.pending {
                // Read in place, then emptied with their storage kept (`clearPending`): the
                // copies here end with this scope, so the arrays are no longer shared by then.
                let segments = connections.modify(position: i) { $0.pendingSegments } ?? []
                let connEvents = connections.modify(position: i) { $0.pendingEvents } ?? []
                if !segments.isEmpty, let (local, remote) = connections.modify(position: i, { ($0.local.address, $0.remote.address) }) {
                    for s in segments {
                        if s.header.flags.contains(.rst) { counterBase.tcpResetsSent += 1 }
                        sendTCP(s, connectionAt: i, from: local, to: remote)
                    }
                }
                // Looked up once per connection, not per event (a hash per lookup).
                let acceptPort = pendingAccept.isEmpty ? nil : pendingAccept[id]
                for e in connEvents {
                    if let port = acceptPort {
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
            if c.closed && isFinished(id, at: i) {
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
