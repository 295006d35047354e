import Channel
import NetStack
import Payment
import PaymentKit

/// The terminal's reader-protocol listener on its own stack (inside PPP): one host connection
/// at a time, frames in and out, the terminal core behind it. While a host is connected, a
/// second connection is heard only for its first message: a Login presenting the session's
/// token (the host coming back) takes the session over; anything else is refused and the
/// connected host's session goes on.
final class ReaderService: StackApplication {
    let port: UInt16
    let core: TerminalCore
    /// Carries one gateway request through the host's SOCKS proxy; the answer bytes come back.
    let gatewayExchange: (_ payload: [UInt8], _ completion: @escaping ([UInt8]?) -> Void) -> Void
    let onShutdown: (_ reason: String, _ restartAfter: Duration?) -> Void
    private weak var host: StackAttachment?
    private var connection: ConnectionID?
    private var decoder = PaymentFrameDecoder()
    /// Framed bytes for the host that TCP has not taken yet.
    private var pending: [UInt8] = []
    /// Above this much waiting for the host, the host is not read: its requests stay in TCP's
    /// window until it takes its answers (each request's answer is bounded, so this bounds them).
    static let readLimit = 256 * 1024
    /// What the terminal says unasked (events) may still pile up behind a host that reads
    /// nothing: beyond this the connection is aborted.
    static let pendingCap = 4 * PaymentFrame.maximumLength
    /// Messages not sent: too large for a frame, or the host connection aborted for not reading.
    private(set) var droppedMessages = 0
    private var closeAfterFlush = false
    /// The host connection we closed: its last frames (a Shutdown event) may still be unacknowledged.
    private var closing: ConnectionID?
    private var gatewaySequence = 0
    /// Second connections waiting for their first message, each with its decoder and deadline.
    private var candidates: [ConnectionID: (decoder: PaymentFrameDecoder, deadline: Instant)] = [:]
    /// At most this many second connections wait at once; more are reset at once (counted).
    static let candidateLimit = 4
    /// A second connection that sends no whole message in this long is reset.
    static let candidateTimeout: Duration = .seconds(10)
    /// Second connections reset: beyond the limit, silent past the timeout, or sending garbage.
    private(set) var candidatesDropped = 0
    /// Every byte the reader connection carried, both ways (tests look for card data in it).
    var observer: ((_ fromHost: Bool, _ bytes: [UInt8]) -> Void)?

    init(port: UInt16, core: TerminalCore, gatewayExchange: @escaping (_ payload: [UInt8], _ completion: @escaping ([UInt8]?) -> Void) -> Void,
         onShutdown: @escaping (String, Duration?) -> Void) {
        self.port = port
        self.core = core
        self.gatewayExchange = gatewayExchange
        self.onShutdown = onShutdown
    }

    func start(_ host: StackAttachment, now: Instant) {
        self.host = host
        try? host.listen(port: port, for: self)
    }

    func stop() {
        if connection != nil { core.hostDidDisconnect(now: currentNow()) }
        connection = nil
        candidates = [:]
        host = nil
        pending = []
    }

    func acceptable(port: UInt16, now: Instant) {
        guard let host, host.stackIsUp else { return }
        let stack = host
        while let id = host.accept(port: port, for: self) {
            if connection != nil {
                guard candidates.count < ReaderService.candidateLimit else {
                    candidatesDropped += 1
                    stack.abort(id, now: now)
                    continue
                }
                candidates[id] = (PaymentFrameDecoder(), now + ReaderService.candidateTimeout)
                hearCandidate(id, now: now)
                continue
            }
            connection = id
            decoder = PaymentFrameDecoder()
            pending = []
            closeAfterFlush = false
            core.hostDidConnect(now: now)
        }
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        if candidates[id] != nil {
            if case .closed = event {
                candidates[id] = nil
                host?.abort(id, now: nil)
            } else {
                hearCandidate(id, now: now)
            }
            return
        }
        guard id == connection else {
            if case .closed = event { host?.abort(id, now: nil) }
            return
        }
        if case .closed = event {
            connection = nil
            pending = []
            host?.abort(id, now: nil)
            core.hostDidDisconnect(now: now)
            drain(now: now)
            return
        }
        step(now: now)
    }

    func step(now: Instant) {
        guard let id = connection, let stack = host, stack.stackIsUp else { return }
        while pending.count < ReaderService.readLimit {
            let chunk = stack.read(id, now: now)
            if chunk.isEmpty { break }
            observer?(true, chunk)
            do {
                for frame in try decoder.feed(chunk) { core.receive(hostPayload: frame, now: now) }
            } catch {
                // A zero or oversize length: nothing is answered, the connection is closed.
                stack.abort(id, now: now)
                connection = nil
                pending = []
                core.hostDidDisconnect(now: now)
                break
            }
        }
        drain(now: now)
        flush(now: now)
        if let id = connection, stack.atEndOfStream(id), pending.isEmpty {
            stack.close(id, now: now)
        }
    }

    /// Reads a second connection's first message: the session's own token takes over, anything
    /// else is answered with a refusal and the connection closed.
    private func hearCandidate(_ id: ConnectionID, now: Instant) {
        guard let stack = host, stack.stackIsUp, var candidate = candidates[id] else { return }
        let chunk = stack.read(id, maximum: PaymentFrame.maximumLength + 4, now: now)
        let frames: [[UInt8]]
        do { frames = try candidate.decoder.feed(chunk) } catch {
            candidates[id] = nil
            candidatesDropped += 1
            stack.abort(id, now: now)
            return
        }
        guard let first = frames.first else {
            candidates[id] = candidate
            if stack.atEndOfStream(id) {
                candidates[id] = nil
                stack.close(id, now: now)
            }
            return
        }
        candidates[id] = nil
        // The host left while this one waited: the session is free, and it is the host now.
        if connection == nil || core.mayTakeOver(with: first) {
            observer?(true, chunk)
            if let old = connection {
                stack.abort(old, now: now)
                core.hostDidDisconnect(now: now)
            }
            connection = id
            decoder = candidate.decoder
            pending = []
            closeAfterFlush = false
            core.hostDidConnect(now: now)
            core.receive(hostPayload: first, now: now)
            for frame in frames.dropFirst() { core.receive(hostPayload: frame, now: now) }
            drain(now: now)
            return
        }
        if let answer = core.refusalOfSecondHost(first), let frame = try? PaymentFrame.encode(answer) {
            stack.write(id, frame, now: now)
        }
        stack.close(id, now: now)
    }

    /// Keeps the security module's state before anything it produced leaves (the simulator's
    /// state file); false when it could not, and then nothing leaves.
    var persist: () -> Bool = { true }
    /// Messages held back because the state could not be kept first.
    private(set) var heldBack = 0

    /// Acts on what the core asked for.
    func drain(now: Instant) {
        // Acting on an output can make more (a failed exchange ends what waited for it).
        var outputs = core.takeOutputs()
        while !outputs.isEmpty {
            // A request under a new KSN counter (to the gateway, or to the host to relay) leaves
            // only once the counter is on disk.
            let kept = persist()
            for output in outputs { act(output, kept: kept, now: now) }
            outputs = core.takeOutputs()
        }
        flush(now: now)
    }

    private func act(_ output: TerminalCore.Output, kept: Bool, now: Instant) {
        switch output {
        case .host(let payload):
            guard let id = connection else { return }
            // Only a request to relay (Transmit) carries what the new counter made; answers and
            // events go out whatever the state file did.
            if !kept, let m = try? PaymentMessage.decode(payload), m.header.messageClass == .device, m.header.category == .transmit {
                heldBack += 1
                return core.gatewayDidFail(now: now)
            }
            guard let frame = try? PaymentFrame.encode(payload) else {
                droppedMessages += 1
                return
            }
            guard pending.count + frame.count <= ReaderService.pendingCap else {
                droppedMessages += 1
                host?.abort(id, now: now)
                connection = nil
                pending = []
                core.hostDidDisconnect(now: now)
                return
            }
            observer?(false, frame)
            pending += frame
        case .closeHost:
            closeAfterFlush = true
        case .gateway(let payload):
            guard kept else {
                heldBack += 1
                return core.gatewayDidFail(now: now)
            }
            guard let frame = try? PaymentFrame.encode(payload) else {
                droppedMessages += 1
                return core.gatewayDidFail(now: now)
            }
            gatewaySequence += 1
            let sequence = gatewaySequence
            gatewayExchange(frame) { [weak self] answer in
                self?.gatewayAnswered(answer, sequence: sequence)
            }
        case .shutdown(let reason, let after):
            onShutdown(reason, after)
        }
    }

    private var lastAnswered = 0

    func gatewayAnswered(_ bytes: [UInt8]?, sequence: Int) {
        // Late answers (the core gave up and asked again since) are dropped.
        guard sequence == gatewaySequence, sequence > lastAnswered else { return }
        lastAnswered = sequence
        let now = currentNow()
        var decoder = PaymentFrameDecoder()
        if let bytes, let frame = (try? decoder.feed(bytes))?.first {
            core.receive(gatewayPayload: frame, now: now)
        } else {
            core.gatewayDidFail(now: now)
        }
        drain(now: now)
    }

    /// The time source: the loop's clock, handed in by the simulator.
    var currentNow: () -> Instant = { .zero }

    func flush(now: Instant) {
        guard let id = connection, let stack = host, stack.stackIsUp else { return }
        if !pending.isEmpty {
            let n = stack.write(id, pending, now: now)
            pending.removeFirst(n)
        }
        if pending.isEmpty && closeAfterFlush {
            closeAfterFlush = false
            stack.close(id, now: now)
            connection = nil
            closing = id
        }
    }

    /// Everything for the host has been sent and acknowledged (or there is no host).
    /// A connection closed after its last frames counts until they are acknowledged: the
    /// terminal's last words before it powers off must not be cut off by the link going down.
    var isFlushed: Bool {
        guard let stack = host, stack.stackIsUp else { return true }
        if let c = closing, stack.unacknowledgedBytes(c) > 0 { return false }
        guard let id = connection else { return true }
        return pending.isEmpty && stack.unacknowledgedBytes(id) == 0
    }

    var pollAt: Instant? {
        let waiting = candidates.values.map(\.deadline).min()
        guard let next = core.pollAt else { return waiting }
        return waiting.map { min($0, next) } ?? next
    }

    func poll(now: Instant) {
        for (id, c) in candidates where c.deadline <= now {
            candidates[id] = nil
            candidatesDropped += 1
            host?.abort(id, now: now)
        }
        core.poll(now: now)
        drain(now: now)
    }

    /// Runs `body` against the core and acts on its outputs (control commands).
    func withCore<T>(now: Instant, _ body: (TerminalCore) -> T) -> T {
        let r = body(core)
        drain(now: now)
        return r
    }

    func report() -> [String] {
        ["reader: port \(port), host \(connection.map { "connected \($0)" } ?? "not connected"), \(droppedMessages) messages dropped, "
            + "second connections refused \(core.refusedSecondHosts), reset \(candidatesDropped), held back for an unwritten state \(heldBack)"]
    }
}
