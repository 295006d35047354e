import NetStack

/// A TCP connection from our stack to a port on the terminal, held inside the process: no host
/// socket, no listener, so no other local process can reach it or stand in for either end (a
/// host→terminal bridge takes any local client). The payment layer talks to the terminal's
/// reader port this way. The same shape as `StreamConnection`; every method runs on the loop's
/// thread, and the callbacks are called there.
public final class TerminalStream {
    public let port: UInt16
    fileprivate var id: ConnectionID?
    fileprivate weak var owner: TerminalStreams?
    fileprivate var outgoing: [UInt8] = []
    fileprivate var outgoingStart = 0
    fileprivate var established = false
    fileprivate var writeShutdownPending = false
    fileprivate var endOfStreamSeen = false
    fileprivate var closed = false
    /// The stream ended because the link went down (the channel's close reason says more).
    public fileprivate(set) var endedWithTheLink = false
    /// Bytes as they arrive.
    public var onData: (([UInt8]) -> Void)?
    /// The terminal finished sending (half-close); the stream may still send.
    public var onEndOfStream: (() -> Void)?
    /// Once, when the stream is gone: nil for an orderly close, else why (refused, reset, a
    /// timeout, the link going down).
    public var onClose: ((String?) -> Void)?
    /// Once, when the handshake is through.
    public var onConnected: (() -> Void)?

    fileprivate init(port: UInt16) { self.port = port }

    public var isOpen: Bool { !closed }

    /// Queues `bytes`; what the stack's send buffer cannot take yet waits here.
    public func send(_ bytes: [UInt8]) {
        guard !closed, !writeShutdownPending else { return }
        outgoing += bytes
        owner?.pump(self)
    }

    /// Half-closes once everything queued has been sent.
    public func shutdownWrite() {
        guard !closed else { return }
        writeShutdownPending = true
        owner?.pump(self)
    }

    /// Ends the stream now: an orderly close (FIN after what is queued in the stack), or a
    /// reset. What still waits here is dropped; `onClose` is not called.
    public func close(reset: Bool = false) {
        guard !closed else { return }
        closed = true
        owner?.forget(self, reset: reset)
    }
}

/// Why a terminal stream could not be opened.
public enum TerminalStreamError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The link is not up (no IPCP yet, or closed).
    case notOpen
    /// Our stack refused (too many connections, no port free).
    case stack(String)

    public var description: String {
        switch self {
        case .notOpen: return "the channel is not open"
        case let .stack(why): return "our stack cannot connect: \(why)"
        }
    }
}

/// The streams of one link, as an application of its stack.
final class TerminalStreams: StackApplication {
    private unowned let loop: EventLoop
    private weak var host: StackAttachment?
    private var streams: [ConnectionID: TerminalStream] = [:]
    private var dirty: Set<ConnectionID> = []

    init(loop: EventLoop) { self.loop = loop }

    var count: Int { streams.count }

    func start(_ host: StackAttachment, now: Instant) { self.host = host }

    func stop() {
        let gone = Array(streams.values)
        // What the terminal said last (a Shutdown event before it hung up) is handed over first.
        for s in gone { deliver(s) }
        streams = [:]
        dirty = []
        host = nil
        for s in gone where !s.closed {
            s.closed = true
            s.endedWithTheLink = true
            s.onClose?("the link went down")
        }
    }

    /// Connects to `port` on the terminal (the link's peer address).
    func open(port: UInt16, now: Instant) throws(TerminalStreamError) -> TerminalStream {
        guard let host, let peer = host.result?.peerAddress else { throw .notOpen }
        let stream = TerminalStream(port: port)
        let id: ConnectionID
        do { id = try host.connect(to: TCPEndpoint(peer, port), for: self, now: now) } catch {
            throw .stack("\(error)")
        }
        stream.id = id
        stream.owner = self
        streams[id] = stream
        return stream
    }


    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        guard let s = streams[id] else {
            // A stream closed by its owner: the stack may forget the connection once it ends.
            if case .closed = event { host?.abort(id, now: nil) }
            return
        }
        switch event {
        case .established:
            s.established = true
            s.onConnected?()
            pump(s)
        case .readable, .writable, .peerFinished:
            dirty.insert(id)
        case let .closed(reason):
            // What arrived before the end is handed over first.
            deliver(s)
            streams[id] = nil
            dirty.remove(id)
            host?.abort(id, now: nil)
            guard !s.closed else { return }
            s.closed = true
            s.onClose?(reason == .closed ? nil : reason.rawValue)
        }
    }

    func step(now: Instant) {
        guard !dirty.isEmpty else { return }
        let work = dirty
        dirty = []
        for id in work { if let s = streams[id] { pump(s) } }
    }

    fileprivate func pump(_ s: TerminalStream) {
        guard let host, let id = s.id, streams[id] != nil, s.established, host.stackIsUp else { return }
        defer { host.wakeSession() }
        let now = loop.now
        if s.outgoingStart < s.outgoing.count {
            let n = host.write(id, Array(s.outgoing[s.outgoingStart...]), now: now)
            s.outgoingStart += n
            if s.outgoingStart == s.outgoing.count {
                s.outgoing = []
                s.outgoingStart = 0
            } else {
                host.stack!.notifyWhenWritable(id)
            }
        }
        if s.writeShutdownPending && s.outgoing.isEmpty {
            s.writeShutdownPending = false
            host.shutdownWrite(id, now: now)
        }
        deliver(s)
    }

    /// Reads what the stack holds for `s` into its callback, and its end of stream once.
    private func deliver(_ s: TerminalStream) {
        guard let host, let id = s.id, host.stackIsUp else { return }
        while !s.closed {
            let chunk = host.read(id, maximum: 65536, now: loop.now)
            if chunk.isEmpty { break }
            s.onData?(chunk)
        }
        if !s.closed, !s.endOfStreamSeen, host.atEndOfStream(id), host.state(id) != nil {
            s.endOfStreamSeen = true
            s.onEndOfStream?()
        }
    }

    fileprivate func forget(_ s: TerminalStream, reset: Bool) {
        guard let id = s.id, streams.removeValue(forKey: id) != nil else { return }
        dirty.remove(id)
        guard let host, host.stackIsUp else { return }
        if reset {
            host.abort(id, now: loop.now)
        } else {
            host.close(id, now: loop.now)
        }
        host.serve(now: loop.now)
    }

    func report() -> [String] { streams.isEmpty ? [] : ["terminal streams: \(streams.count) open"] }
}
