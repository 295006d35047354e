import Channel
import NetStack

/// Echo (RFC 862) that answers each read `delay` after it came, as an application on our
/// stack: a simulated terminal that answers slowly. What it holds per connection is bounded
/// (`holdLimit`); past it, it stops reading and the caller's window closes.
public final class DelayedEcho: StackApplication {
    public let port: UInt16
    public let delay: Duration
    public static let holdLimit = 64 * 1024
    private weak var host: StackAttachment?
    private var held: [ConnectionID: Held] = [:]

    struct Held {
        /// Chunks in the order they came, each with when it is to be answered.
        var chunks: [(due: Instant, bytes: [UInt8])] = []
        var bytes = 0
        var closed = false
    }

    public init(port: UInt16, delay: Duration) {
        self.port = port
        self.delay = max(.zero, delay)
    }

    public func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        try? host.listen(port: port, for: self)
    }

    public func stop() {
        held = [:]
        host = nil
    }

    public func acceptable(port: UInt16, now: Instant) {
        guard let host else { return }
        while let id = host.accept(port: port, for: self) { held[id] = Held() }
    }

    public func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        guard held[id] != nil else { return }
        if case .closed = event {
            held[id] = nil
            host?.stack?.abort(id, now: nil)
            return
        }
        serve(id, now: now)
    }

    public func step(now: Instant) {
        for id in Array(held.keys) { serve(id, now: now) }
    }

    public var pollAt: Instant? { held.values.lazy.compactMap { $0.chunks.first?.due }.min() }

    public func poll(now: Instant) { step(now: now) }

    /// Takes in what came (while under the limit), writes what is due, and closes once the
    /// caller finished and everything was answered.
    private func serve(_ id: ConnectionID, now: Instant) {
        guard let host, host.stackIsUp, var h = held[id] else { return }
        while h.bytes < Self.holdLimit {
            var chunk: [UInt8] = []
            guard host.stack!.read(id, maximum: Self.holdLimit - h.bytes, appendingTo: &chunk, now: now) > 0 else { break }
            h.bytes += chunk.count
            h.chunks.append((now + delay, chunk))
        }
        while let first = h.chunks.first, first.due <= now {
            let n = host.stack!.write(id, first.bytes, now: now)
            h.bytes -= n
            if n < first.bytes.count {
                h.chunks[0].bytes.removeFirst(n)
                break
            }
            h.chunks.removeFirst()
        }
        if h.chunks.isEmpty && !h.closed && host.atEndOfStream(id) {
            h.closed = true
            host.stack!.close(id, now: now)
        }
        held[id] = h
    }
}
