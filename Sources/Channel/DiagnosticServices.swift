import Glibc
import NetStack

/// The diagnostic services on our PPP address (RFC 862 echo, 863 discard, 864 chargen, 867
/// daytime), as an application on our stack. The port of each can be moved (a simulated
/// terminal serves echo on its payment port, for instance).
public final class DiagnosticServices: StackApplication {
    public let services: [(service: DiagnosticService, port: UInt16)]
    private let output: (String) -> Void
    // Unchecked in release builds (docs/PERFORMANCE.md): standard collections read and
    // changed on the loop thread by this object's own methods, and the stack it calls while
    // one is held is sans-IO and never calls back into it (its events come through the
    // attachment on a later call).
    #if DEBUG
    private weak var host: StackAttachment?
    private var sessions: [ConnectionID: Session] = [:]
    private var dirty: Set<ConnectionID> = []
    /// `dirty` as `step` walks it, swapped with it so that neither set is allocated anew for
    /// every batch of input.
    private var working: Set<ConnectionID> = []
    /// What discard, daytime and chargen read only to throw away, kept from read to read.
    private var discarded: [UInt8] = []
    #else
    @exclusivity(unchecked) private weak var host: StackAttachment?
    @exclusivity(unchecked) private var sessions: [ConnectionID: Session] = [:]
    @exclusivity(unchecked) private var dirty: Set<ConnectionID> = []
    @exclusivity(unchecked) private var working: Set<ConnectionID> = []
    @exclusivity(unchecked) private var discarded: [UInt8] = []
    #endif

    struct Session {
        var service: DiagnosticService
        /// Echo: bytes read but not yet taken by our send buffer; reading stops while any
        /// wait, so a peer that does not read its echo closes its own window. Chargen: the
        /// rest of the current line.
        var pending: [UInt8] = []
        var chargenOffset = 0
        /// Daytime: the time was sent and our direction closed.
        var greeted = false
        /// Echo, discard, daytime: the caller's FIN was seen and our close sent.
        var peerDone = false
    }

    public init(_ services: [DiagnosticService], output: @escaping (String) -> Void = { _ in }) {
        self.services = services.map { ($0, $0.port) }
        self.output = output
    }

    public init(ports: [(DiagnosticService, UInt16)], output: @escaping (String) -> Void = { _ in }) {
        self.services = ports.map { ($0.0, $0.1) }
        self.output = output
    }

    public func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        for (_, port) in services { try? host.listen(port: port, for: self) }
        if let address = host.stack?.address {
            output("stack: \(address) answers " + services.map { "\($0.service.rawValue) (\($0.port))" }.joined(separator: ", "))
        }
    }

    public func stop() {
        sessions = [:]
        dirty = []
        working = []
        discarded = []
        host = nil
    }

    public func acceptable(port: UInt16, now: Instant) {
        guard let host, let service = services.first(where: { $0.port == port })?.service else { return }
        while let id = host.accept(port: port, for: self) {
            sessions[id] = Session(service: service)
            dirty.insert(id)
        }
    }

    public func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        if case .closed = event {
            sessions[id] = nil
            dirty.remove(id)
            // Let the stack forget it even if unread bytes remain (a reset mid-stream).
            host?.stack?.abort(id, now: nil)
        } else if sessions.index(forKey: id) != nil {
            dirty.insert(id)
        }
    }

    public func step(now: Instant) {
        guard host?.stackIsUp == true, !dirty.isEmpty else { return }
        swap(&dirty, &working)
        for id in working { step(id, now: now) }
        working.removeAll(keepingCapacity: true)
    }

    private func step(_ id: ConnectionID, now: Instant) {
        guard let host, let i = sessions.index(forKey: id) else { return }
        // In place: a copy would share `pending` with the table, and its first change would
        // copy the array. Nothing below reaches back into this object (the stack is sans-IO).
        Self.serve(&sessions.values[i], id, host: host, discarding: &discarded, now: now)
    }

    private static func serve(_ s: inout Session, _ id: ConnectionID, host: StackAttachment, discarding scratch: inout [UInt8], now: Instant) {
        /// Reads everything that waits, in one read (one window update), and throws it away.
        /// The scratch array grows to a receive buffer at most (256 KiB by default), once for
        /// every session of this object.
        func drain() {
            host.stack!.read(id, appendingTo: &scratch, now: now)
            scratch.removeAll(keepingCapacity: true)
        }
        switch s.service {
        case .echo:
            while true {
                if !s.pending.isEmpty {
                    let n = host.stack!.write(id, s.pending, now: now)
                    s.pending.removeFirst(n)
                    if !s.pending.isEmpty { break }
                }
                // Asked first, on its own: the read below holds the stack for its whole call.
                let room = host.writableBytes(id)
                if host.stack!.read(id, maximum: max(room, 1), appendingTo: &s.pending, now: now) == 0 { break }
            }
            // Emptied, the pending array keeps its room for the next message, up to 16 KiB: a
            // session idle after one large read does not hold on to it.
            if s.pending.isEmpty && s.pending.capacity > 16384 { s.pending = [] }
            if s.pending.isEmpty && host.atEndOfStream(id) && !s.peerDone {
                s.peerDone = true
                host.stack!.close(id, now: now)
            }
        case .daytime:
            if !s.greeted {
                s.greeted = true
                host.stack!.write(id, Array(Self.daytime().utf8), now: now)
                host.stack!.shutdownWrite(id, now: now)
            }
            fallthrough
        case .discard:
            drain()
            if host.atEndOfStream(id) && !s.peerDone {
                s.peerDone = true
                host.stack!.close(id, now: now)
            }
        case .chargen:
            // RFC 864: the data goes on until the caller closes. Its FIN only says it sends
            // nothing more (`nc HOST 19 < /dev/null` half-closes at once), so we go on; the
            // reset its kernel answers after a close, or the user timeout of a caller that
            // stops reading, ends the session (the `.closed` event).
            drain()
            // The rest of a line the send buffer could not take waits in `pending`, so the
            // pattern stays exact however the writes are cut.
            while true {
                if s.pending.isEmpty {
                    s.pending = Self.chargenLine(s.chargenOffset)
                    s.chargenOffset += 1
                }
                let n = host.stack!.write(id, s.pending, now: now)
                s.pending.removeFirst(n)
                if !s.pending.isEmpty { break }
            }
        }
    }

    /// RFC 867 leaves the format open; this is the one its example suggests, in UTC.
    static func daytime() -> String {
        var t = time(nil)
        var parts = tm()
        gmtime_r(&t, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let n = strftime(&buffer, buffer.count, "%A, %B %d, %Y %H:%M:%S-UTC\r\n", &parts)
        return String(decoding: buffer.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// RFC 864: line i is 72 printable characters starting at character i of the 95-character
    /// ASCII ring (0x20...0x7E), then CR LF.
    static func chargenLine(_ index: Int) -> [UInt8] {
        (0..<72).map { UInt8(0x20 + (index + $0) % 95) } + [13, 10]
    }
}
