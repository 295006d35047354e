import NetStack

/// The DNS relay's book of queries in flight, sans-IO: which client asked under which id, the
/// id each query carries upstream, and when it is given up. The relay (in Channel) owns the
/// sockets; `Slot` names a query's own upstream socket.
///
/// A client's query and the upstream's answer are peer bytes: only the 12-byte header's id is
/// read (RFC 1035 §4.1.1) and rewritten, nothing else is parsed. An off-path attacker who wants
/// to slip a forged answer in must guess both the upstream id and the source port (RFC 5452 §4,
/// §9.2): the relay draws both from the CSPRNG, independently, and an answer carrying another id
/// is ignored and counted.
public struct DNSRelayQueries<Slot: Hashable & Sendable>: Sendable {
    public struct Query: Sendable, Equatable {
        public let client: TCPEndpoint
        public let clientID: UInt16
        public let upstreamID: UInt16
        public let deadline: Instant
    }

    public struct Counters: Sendable, Equatable {
        public var queries = 0
        public var answers = 0
        public var timeouts = 0
        /// Queries refused: too short for a DNS header, over the in-flight cap, or not sent.
        public var dropped = 0
        /// Datagrams from the upstream carrying another id, ignored.
        public var mismatched = 0
    }

    /// The DNS header: id, flags and four counts (RFC 1035 §4.1.1).
    public static var headerLength: Int { 12 }

    public let capacity: Int
    public let timeout: Duration
    public private(set) var counters = Counters()
    private var inFlight: [Slot: Query] = [:]

    public init(capacity: Int = 64, timeout: Duration = .seconds(5)) {
        self.capacity = max(capacity, 0)
        self.timeout = timeout
    }

    public var count: Int { inFlight.count }
    public var slots: [Slot] { Array(inFlight.keys) }
    public func isWaiting(on slot: Slot) -> Bool { inFlight[slot] != nil }

    /// Whether a client's datagram may become a query now: long enough to be DNS and with room
    /// in flight. A refusal is counted.
    public mutating func admits(_ query: [UInt8]) -> Bool {
        guard query.count >= Self.headerLength, inFlight.count < capacity else {
            counters.dropped += 1
            return false
        }
        return true
    }

    /// Counts a query that was admitted but could not be sent (no socket, a send error).
    public mutating func notSent() { counters.dropped += 1 }

    /// The query as it goes upstream: the client's bytes under our id.
    public static func upstreamQuery(_ query: [UInt8], id: UInt16) -> [UInt8]? {
        withID(query, id)
    }

    /// Records a query sent upstream on `slot`.
    public mutating func sent(_ query: [UInt8], from client: TCPEndpoint, upstreamID: UInt16, on slot: Slot, now: Instant) {
        guard query.count >= Self.headerLength else { return }
        inFlight[slot] = Query(client: client, clientID: BigEndian.uint16(query, 0), upstreamID: upstreamID, deadline: now + timeout)
        counters.queries += 1
    }

    /// An upstream datagram on `slot`: the answer for the client, under the client's own id, or
    /// nil (no such query, too short, another id: counted as mismatched, the query stays).
    /// A query is answered once and then forgotten.
    public mutating func answer(_ datagram: [UInt8], on slot: Slot) -> (client: TCPEndpoint, answer: [UInt8])? {
        guard let q = inFlight[slot] else { return nil }
        guard datagram.count >= Self.headerLength, BigEndian.uint16(datagram, 0) == q.upstreamID,
              let answer = Self.withID(datagram, q.clientID) else {
            counters.mismatched += 1
            return nil
        }
        inFlight[slot] = nil
        counters.answers += 1
        return (q.client, answer)
    }

    /// Forgets a query (its socket closed).
    public mutating func remove(_ slot: Slot) { inFlight[slot] = nil }

    public var pollAt: Instant? {
        // A loop, not `map(\.deadline)`: a key path here is built anew on every call, and this
        // is asked after each service of the link session.
        var earliest: Instant?
        for entry in inFlight.values where earliest.map({ entry.deadline < $0 }) ?? true { earliest = entry.deadline }
        return earliest
    }

    /// The slots of queries whose time ran out, forgotten and counted.
    public mutating func expire(now: Instant) -> [Slot] {
        let due = inFlight.filter { $0.value.deadline <= now }.map(\.key)
        for slot in due { inFlight[slot] = nil }
        counters.timeouts += due.count
        return due
    }

    private static func withID(_ message: [UInt8], _ id: UInt16) -> [UInt8]? {
        guard message.count >= headerLength else { return nil }
        var m = message
        m[0] = UInt8(truncatingIfNeeded: id >> 8)
        m[1] = UInt8(truncatingIfNeeded: id)
        return m
    }
}
