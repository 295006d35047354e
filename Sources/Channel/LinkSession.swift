import CSystem
import Capture
import Framing
import Glibc
import NetStack
import PPP

/// Runs one PPP link over a line on an event loop: reads and writes the line, keeps the
/// captures, feeds the PPP core the clock, and hands IP to the attachment. The PPP core stays
/// sans-IO.
public final class LinkSession: LoopClient {
    public let line: SerialLine
    public private(set) var link: PPPLink
    private let pcap: PcapWriter?
    private let record: PPPDRecordWriter?
    private let onEvent: (LinkEvent) -> Void
    /// Also told of every link event (after `onEvent`).
    public var onLinkEvent: ((LinkEvent) -> Void)?
    private var pending: [UInt8] = []
    private var pendingStart = 0
    private let started: Instant
    /// What carries IP once IPCP is up; without one, IP packets are counted and dropped.
    public let attachment: NetworkAttachment?
    /// Seeded frame loss on the line, both ways, for recovery tests against real peers.
    private var inboundLoss: FrameDropper?
    private var outboundLoss: FrameDropper?
    /// Close the link once the attachment says it is finished (e.g. a ping run).
    public var closeWhenAttachmentFinished = false
    /// Lines for a person (counters on SIGUSR1).
    public var report: (String) -> Void = { _ in }
    public private(set) var ipPacketsDropped = 0
    /// The line's output queue is not filled beyond this by IP packets: one that does not fit
    /// is dropped (TCP retransmits, as behind any full router queue) and the line is not read
    /// until the queue is back under half of it, so a peer that floods us with requests and
    /// never reads the answers backs up in its own line, not in our memory.
    public var lineQueueLimit = 256 * 1024
    /// Control frames (LCP, IPCP, echo replies) may go this far beyond the limit: they are few
    /// and keep the link alive; past it they are dropped too (their own timers resend them).
    public var lineQueueControlReserve = 16 * 1024
    /// What the output queue held and dropped (`queued` is kept current by `lineQueue`).
    private var queueCounters = LineQueueCounters()
    public var lineQueue: LineQueueCounters {
        var c = queueCounters
        c.queued = queuedBytes
        return c
    }
    /// Called once, on the loop, when the link is down and the session has let go of the loop.
    public var onDown: ((LinkDownReason) -> Void)?
    public private(set) var downReason: LinkDownReason?
    /// Bytes that crossed the line.
    public private(set) var lineBytesIn = 0
    public private(set) var lineBytesOut = 0

    private var loop: EventLoop?
    private var closeDeadline: Instant?
    private var watchingOutput = false
    private var watchingAttachment = true
    /// The line is not read while its output queue is full (see `lineQueueLimit`).
    private var readPaused = false
    /// An IP packet did not fit in the queue since the interest was last set.
    private var overflowed = false
    private var readBuffer = [UInt8](repeating: 0, count: 65536)

    public init(line: SerialLine, link: PPPLink, pcap: PcapWriter? = nil, record: PPPDRecordWriter? = nil,
                attachment: NetworkAttachment? = nil, frameLoss: Double = 0, seed: UInt64 = 1,
                onEvent: @escaping (LinkEvent) -> Void) {
        self.line = line
        self.link = link
        self.attachment = attachment
        if frameLoss > 0 {
            inboundLoss = FrameDropper(frameLoss: frameLoss, seed: seed)
            outboundLoss = FrameDropper(frameLoss: frameLoss, seed: seed &+ 1)
        }
        self.pcap = pcap
        self.record = record
        self.onEvent = onEvent
        started = monotonicNow()
    }

    /// How long we wait for the Terminate exchange after a close request before giving up on it
    /// (two Terminate-Requests and their restart intervals, plus a margin).
    public var closeGrace: Duration = .seconds(7)

    /// Starts the link on `loop` (on the loop's thread).
    public func start(on loop: EventLoop) throws(SystemError) {
        self.loop = loop
        try loop.register(line.descriptor, events: EPOLLIN.rawValue) { [unowned self] events in
            self.lineEvent(events)
        }
        do {
            for fd in attachment?.descriptors ?? [] {
                try loop.register(fd, events: EPOLLIN.rawValue) { [unowned self] _ in
                    guard let a = self.attachment, self.downReason == nil else { return }
                    let now = loop.now
                    do {
                        try a.readable(fd, room: max(0, self.lineQueueLimit - self.queuedBytes), now: now)
                    } catch {
                        self.report("pppbridge: \(error)")
                    }
                }
            }
        } catch {
            unregisterAll()
            throw error
        }
        loop.add(self)
        link.open(now: loop.now)
        drain(now: loop.now)
    }

    /// Closes the link with LCP Terminate-Request; a second call stops waiting for the peer.
    public func close(now: Instant) {
        guard downReason == nil else { return }
        if closeDeadline == nil {
            link.close(now: now)
            closeDeadline = now + closeGrace
        } else {
            closeDeadline = now
        }
    }

    /// Takes the link down at once without a word to the peer (the line is the owner's to close).
    public func forceDown() {
        guard downReason == nil else { return }
        let now = loop?.now ?? monotonicNow()
        pending.removeAll()
        pendingStart = 0
        link.lineDown(now: now)
        drain(now: now)
        finish(link.downReason ?? .lineHangUp)
    }

    /// Prints the attachment's counters (SIGUSR1).
    public func printReport() {
        for text in attachment?.report() ?? [] { report(text) }
        report(lineQueue.description)
    }

    private var queuedBytes: Int { pending.count - pendingStart }

    public var pollAt: Instant? {
        guard downReason == nil else { return nil }
        return earliest(link.pollAt, closeDeadline, attachment?.pollAt)
    }

    public func service(now: Instant) {
        guard downReason == nil else { return }
        if let a = attachment, let p = a.pollAt, p <= now { a.poll(now: now) }
        if let a = attachment, a.finished, closeWhenAttachmentFinished, closeDeadline == nil {
            link.close(now: now)
            closeDeadline = now + closeGrace
        }
        link.poll(now: now)
        drain(now: now)
        if let c = closeDeadline, now >= c, link.downReason == nil {
            link.lineDown(now: now)
            drain(now: now)
        }
        if let reason = link.downReason {
            finish(reason)
            return
        }
        updateInterest()
    }

    private func updateInterest() {
        guard let loop else { return }
        let wantOutput = queuedBytes > 0
        // Full: a packet did not fit, or control frames took the queue to the limit. Reading
        // resumes only once half the limit has drained, so a flood is not let in again a frame
        // at a time (and a paused line always has output to wait for).
        let full = overflowed || queuedBytes >= lineQueueLimit
        overflowed = false
        let pause = queuedBytes > lineQueueLimit / 2 && (readPaused || full)
        if wantOutput != watchingOutput || pause != readPaused {
            if pause && !readPaused { queueCounters.readPauses += 1 }
            loop.setInterest(line.descriptor, (pause ? 0 : EPOLLIN.rawValue) | (wantOutput ? EPOLLOUT.rawValue : 0))
            watchingOutput = wantOutput
            readPaused = pause
        }
        // Back-pressure: a fast source (the kernel through TUN) waits while the line is behind.
        let wantAttachment = queuedBytes < lineQueueLimit
        if wantAttachment != watchingAttachment {
            for fd in attachment?.descriptors ?? [] { loop.setInterest(fd, wantAttachment ? EPOLLIN.rawValue : 0) }
            watchingAttachment = wantAttachment
        }
    }

    private func finish(_ reason: LinkDownReason) {
        guard downReason == nil else { return }
        let now = loop?.now ?? monotonicNow()
        // Best effort for the last frames (a Terminate-Ack), then the captures are complete.
        flushPending(now: now)
        // A write that found the line gone took the link down after the last drain: its
        // events (the attachment's link-down among them) are still to be delivered.
        drain(now: now)
        unregisterAll()
        pcap?.close()
        record?.close()
        downReason = reason
        onDown?(reason)
    }

    private func unregisterAll() {
        guard let loop else { return }
        loop.unregister(line.descriptor)
        for fd in attachment?.descriptors ?? [] { loop.unregister(fd) }
        loop.remove(self)
    }

    /// Runs the link on a loop of its own on this thread until it is down, with SIGINT/SIGTERM
    /// closing it (a second signal stops waiting) and SIGUSR1 printing counters.
    public func run() throws(SystemError) -> LinkDownReason {
        let loop = try EventLoop()
        let signals = try SignalWatcher(signals: [SIGINT, SIGTERM, SIGUSR1], loop: loop) { [unowned self] signo in
            if signo == SIGUSR1 { self.printReport() } else { self.close(now: loop.now) }
        }
        defer { signals.cancel() }
        try start(on: loop)
        loop.run { self.downReason != nil }
        return downReason ?? .closedByUs
    }

    private func lineEvent(_ events: UInt32) {
        guard downReason == nil, let now = loop?.now else { return }
        if events & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { readLine(now: now) }
        if events & EPOLLOUT.rawValue != 0 { flushPending(now: now) }
    }

    /// Reads one buffer per turn: what it makes us send is queued, and counted against the
    /// limit, before more is read (the descriptor is level-triggered, so the rest waits).
    private func readLine(now: Instant) {
        let n: Int?
        do {
            n = try readAvailable(line.descriptor, into: &readBuffer)
        } catch {
            // EIO: the other side of a pty went away, or the device vanished.
            link.lineDown(now: now)
            return
        }
        guard let count = n else { return }
        if count == 0 {
            link.lineDown(now: now)
            return
        }
        line.peerAttached()
        lineBytesIn += count
        var chunk = Array(readBuffer[0..<count])
        record?.record(.received, chunk, elapsedTenths: tenths(now))
        if inboundLoss != nil { chunk = inboundLoss!.filter(chunk) }
        link.receive(chunk, now: now)
    }

    private func drain(now: Instant) {
        // Events first, so the attachment is up before the packets that follow IPCP.
        for e in link.takeEvents() {
            switch e {
            case let .ipcpOpened(result):
                do {
                    try attachment?.linkUp(result, mtu: link.transmitMRU, now: now)
                } catch {
                    report("pppbridge: \(error)")
                    link.close(now: now, reason: "Local network setup failed")
                }
            case .ipcpClosed, .down:
                attachment?.linkDown()
            default:
                break
            }
            onEvent(e)
            onLinkEvent?(e)
        }
        let packets = link.takeReceivedIPPackets()
        if let a = attachment {
            for p in packets { a.receive(packet: p, now: now) }
        } else {
            ipPacketsDropped += packets.count
        }
        // Control frames first, within the reserve; then IP packets while the queue has room.
        var out = link.takeTransmit()
        if queuedBytes + out.count > lineQueueLimit + lineQueueControlReserve {
            queueCounters.droppedControlBytes += out.count
            out.removeAll()
        }
        if let a = attachment {
            var room = lineQueueLimit - queuedBytes - out.count
            for p in a.takeOutgoing(now: now) {
                // Decided before the packet is framed (and VJ-compressed): a drop here is like a
                // frame lost on the line. Escapes can add a little beyond the limit.
                guard p.count <= room else {
                    queueCounters.droppedPackets += 1
                    overflowed = true
                    continue
                }
                guard link.send(ipPacket: p, now: now) else {
                    ipPacketsDropped += 1
                    continue
                }
                let frame = link.takeTransmit()
                room -= frame.count
                out += frame
            }
        }
        if !out.isEmpty {
            if outboundLoss != nil { out = outboundLoss!.filter(out) }
            record?.record(.sent, out, elapsedTenths: tenths(now))
            if pendingStart > 0 && pendingStart == pending.count {
                pending.removeAll(keepingCapacity: true)
                pendingStart = 0
            }
            pending += out
            queueCounters.peak = max(queueCounters.peak, queuedBytes)
            flushPending(now: now)
        }
        if let pcap {
            let wall = wallClock()
            for (direction, frame) in link.takeCapturedFrames() {
                // A capture that stopped (a write error, its size limit) said so once; the link goes on.
                try? pcap.write(packet: frame.uncompressedPacket, time: wall, direction: direction)
            }
        }
    }

    private func flushPending(now: Instant) {
        guard queuedBytes > 0 else { return }
        do {
            let n = try writeSome(line.descriptor, pending[pendingStart...])
            lineBytesOut += n
            pendingStart += n
            if pendingStart == pending.count {
                pending.removeAll(keepingCapacity: true)
                pendingStart = 0
            } else if pendingStart > 65536 {
                pending.removeFirst(pendingStart)
                pendingStart = 0
            }
        } catch {
            // The line is gone; what was pending cannot be delivered.
            pending.removeAll()
            pendingStart = 0
            link.lineDown(now: now)
        }
    }

    private func tenths(_ now: Instant) -> Int64 { (now.nanoseconds - started.nanoseconds) / 100_000_000 }

    private func wallClock() -> CaptureTime {
        var tv = timeval()
        gettimeofday(&tv, nil)
        return CaptureTime(seconds: Int64(tv.tv_sec), microseconds: Int32(tv.tv_usec))
    }
}

/// The line's output queue: what it holds now, the most it held, and what it dropped.
public struct LineQueueCounters: Sendable, Equatable, CustomStringConvertible {
    public var queued = 0
    public var peak = 0
    /// IP packets dropped because the queue was over its limit.
    public var droppedPackets = 0
    /// Bytes of control frames dropped because the queue was over its limit and reserve.
    public var droppedControlBytes = 0
    /// Times reading the line was paused until the queue drained.
    public var readPauses = 0
    public init() {}

    public var description: String {
        "line queue \(queued) B (peak \(peak) B), dropped \(droppedPackets) packets and \(droppedControlBytes) control bytes, reading paused \(readPauses) times"
    }
}

/// The self-pipe the watched signals write to, so the loop sees them as readable bytes.
nonisolated(unsafe) private var signalPipeWriter: Int32 = -1

/// Turns signals into calls on the loop (one watcher per process at a time): the handler only
/// writes the signal's number to a pipe.
public final class SignalWatcher {
    private let reader: Int32
    private let writer: Int32
    private let signals: [Int32]
    private unowned let loop: EventLoop
    private var cancelled = false

    public init(signals: [Int32], loop: EventLoop, handler: @escaping (Int32) -> Void) throws(SystemError) {
        var fds: [Int32] = [0, 0]
        guard pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0 else { throw SystemError("pipe2") }
        reader = fds[0]
        writer = fds[1]
        self.signals = signals
        self.loop = loop
        do {
            try loop.register(reader, events: EPOLLIN.rawValue) { [reader] _ in
                var b: UInt8 = 0
                while read(reader, &b, 1) == 1 { handler(Int32(b)) }
            }
        } catch {
            Glibc.close(fds[0])
            Glibc.close(fds[1])
            throw error
        }
        signalPipeWriter = writer
        // A parent may have started us with these blocked; we must see them.
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for s in signals { sigaddset(&unblock, s) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        for s in signals {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { signo in
                var b = UInt8(truncatingIfNeeded: signo)
                _ = write(signalPipeWriter, &b, 1)
            }
            sigemptyset(&action.sa_mask)
            action.sa_flags = Int32(SA_RESTART)
            sigaction(s, &action, nil)
        }
    }

    /// Restores the default dispositions and closes the pipe.
    public func cancel() {
        guard !cancelled else { return }
        cancelled = true
        for s in signals { signal(s, SIG_DFL) }
        signalPipeWriter = -1
        loop.unregister(reader)
        Glibc.close(reader)
        Glibc.close(writer)
    }

    deinit { cancel() }
}
