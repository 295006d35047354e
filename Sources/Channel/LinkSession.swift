import CSystem
import Capture
import Framing
import Glibc
import NetStack
import PPP

/// The self-pipe SIGINT and SIGTERM write to, so the event loop sees them as readable bytes.
nonisolated(unsafe) private var signalPipeWriter: Int32 = -1

/// Runs one PPP link over a line: the only place that touches the descriptor, the clock and
/// the signals. One epoll loop; the PPP core stays sans-IO.
public final class LinkSession {
    public let line: SerialLine
    public private(set) var link: PPPLink
    private let pcap: PcapWriter?
    private let record: PPPDRecordWriter?
    private let onEvent: (LinkEvent) -> Void
    private var pending: [UInt8] = []
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
    /// The line's output queue is not filled beyond this from the attachment's sources.
    public var lineQueueLimit = 256 * 1024

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

    /// How long we wait for the Terminate exchange after a signal before giving up on it
    /// (two Terminate-Requests and their restart intervals, plus a margin).
    public var closeGrace: Duration = .seconds(7)

    /// Runs until the link is down. SIGINT/SIGTERM close it with LCP Terminate; a second
    /// signal stops waiting. Returns why the link went down.
    public func run() throws(SystemError) -> LinkDownReason {
        var fds: [Int32] = [0, 0]
        guard pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0 else { throw SystemError("pipe2") }
        defer {
            signal(SIGINT, SIG_DFL)
            signal(SIGTERM, SIG_DFL)
            signal(SIGUSR1, SIG_DFL)
            signalPipeWriter = -1
            Glibc.close(fds[0])
            Glibc.close(fds[1])
        }
        signalPipeWriter = fds[1]
        // A parent may have started us with these blocked; we must see them.
        var unblock = sigset_t()
        sigemptyset(&unblock)
        sigaddset(&unblock, SIGINT)
        sigaddset(&unblock, SIGTERM)
        sigaddset(&unblock, SIGUSR1)
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        for s in [SIGINT, SIGTERM, SIGUSR1] {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { signo in
                var b = UInt8(truncatingIfNeeded: signo)
                _ = write(signalPipeWriter, &b, 1)
            }
            sigemptyset(&action.sa_mask)
            sigaction(s, &action, nil)
        }

        let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw SystemError("epoll_create1") }
        defer { Glibc.close(epoll) }
        var watchingOutput = false
        func watch(_ fd: Int32, _ events: UInt32, modify: Bool = false) throws(SystemError) {
            var e = epoll_event()
            e.events = events
            e.data.fd = fd
            guard epoll_ctl(epoll, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &e) == 0 else { throw SystemError("epoll_ctl") }
        }
        try watch(line.descriptor, EPOLLIN.rawValue)
        try watch(fds[0], EPOLLIN.rawValue)
        let attachmentDescriptors = attachment?.descriptors ?? []
        for fd in attachmentDescriptors { try watch(fd, EPOLLIN.rawValue) }
        var watchingAttachment = true

        var now = monotonicNow()
        link.open(now: now)
        try drain(now: now)
        var closeDeadline: Instant?
        var buffer = [UInt8](repeating: 0, count: 65536)
        var events = [epoll_event](repeating: epoll_event(), count: 8)

        while link.downReason == nil {
            let wantOutput = !pending.isEmpty
            if wantOutput != watchingOutput {
                try watch(line.descriptor, EPOLLIN.rawValue | (wantOutput ? EPOLLOUT.rawValue : 0), modify: true)
                watchingOutput = wantOutput
            }
            // Back-pressure: a fast source (the kernel through TUN) waits while the line is behind.
            let wantAttachment = pending.count < lineQueueLimit
            if wantAttachment != watchingAttachment {
                for fd in attachmentDescriptors { try watch(fd, wantAttachment ? EPOLLIN.rawValue : 0, modify: true) }
                watchingAttachment = wantAttachment
            }
            let deadline = earliest(link.pollAt, closeDeadline, attachment?.pollAt)
            var timeout: Int32 = -1
            if let d = deadline {
                let ms = (d.nanoseconds - monotonicNow().nanoseconds + 999_999) / 1_000_000
                timeout = Int32(clamping: max(0, ms))
            }
            let n = events.withUnsafeMutableBufferPointer { epoll_wait(epoll, $0.baseAddress, Int32($0.count), timeout) }
            if n < 0 && errno != EINTR { throw SystemError("epoll_wait") }
            now = monotonicNow()
            for i in 0..<max(0, Int(n)) {
                let fd = events[i].data.fd
                let flags = events[i].events
                if fd == fds[0] {
                    var b: UInt8 = 0
                    while read(fds[0], &b, 1) == 1 {
                        if Int32(b) == SIGUSR1 {
                            for text in attachment?.report() ?? [] { report(text) }
                            continue
                        }
                        if closeDeadline == nil {
                            link.close(now: now)
                            closeDeadline = now + closeGrace
                        } else {
                            // A second signal: do not wait for the peer any longer.
                            closeDeadline = now
                        }
                    }
                    continue
                }
                if flags & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 {
                    try readLine(into: &buffer, now: now)
                }
                if flags & EPOLLOUT.rawValue != 0 { try flushPending() }
                if attachmentDescriptors.contains(fd), let a = attachment {
                    try a.readable(fd, room: max(0, lineQueueLimit - pending.count), now: now)
                }
            }
            if let a = attachment, let p = a.pollAt, p <= now { a.poll(now: now) }
            if let a = attachment, a.finished, closeWhenAttachmentFinished, closeDeadline == nil {
                link.close(now: now)
                closeDeadline = now + closeGrace
            }
            link.poll(now: now)
            try drain(now: now)
            if let c = closeDeadline, now >= c, link.downReason == nil {
                link.lineDown(now: now)
                try drain(now: now)
            }
        }
        // Best effort for the last frames (a Terminate-Ack), then the captures are complete.
        try? flushPending()
        pcap?.close()
        record?.close()
        return link.downReason ?? .closedByUs
    }

    private func readLine(into buffer: inout [UInt8], now: Instant) throws(SystemError) {
        while true {
            let n: Int?
            do {
                n = try readAvailable(line.descriptor, into: &buffer)
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
            var chunk = Array(buffer[0..<count])
            record?.record(.received, chunk, elapsedTenths: tenths(now))
            if inboundLoss != nil { chunk = inboundLoss!.filter(chunk) }
            link.receive(chunk, now: now)
        }
    }

    private func drain(now: Instant) throws(SystemError) {
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
        }
        let packets = link.takeReceivedIPPackets()
        if let a = attachment {
            for p in packets { a.receive(packet: p, now: now) }
            for p in a.takeOutgoing(now: now) where !link.send(ipPacket: p, now: now) { ipPacketsDropped += 1 }
        } else {
            ipPacketsDropped += packets.count
        }
        var out = link.takeTransmit()
        if !out.isEmpty {
            if outboundLoss != nil { out = outboundLoss!.filter(out) }
            record?.record(.sent, out, elapsedTenths: tenths(now))
            pending += out
            try flushPending()
        }
        if let pcap {
            let wall = wallClock()
            for (direction, frame) in link.takeCapturedFrames() {
                try? pcap.write(packet: frame.uncompressedPacket, time: wall, direction: direction)
            }
            pcap.flush()
        }
    }

    private func flushPending() throws(SystemError) {
        guard !pending.isEmpty else { return }
        do {
            let n = try writeSome(line.descriptor, pending[...])
            pending.removeFirst(n)
        } catch {
            // The line is gone; what was pending cannot be delivered.
            pending.removeAll()
            if error.errno != EIO { throw error }
        }
    }

    private func tenths(_ now: Instant) -> Int64 { (now.nanoseconds - started.nanoseconds) / 100_000_000 }

    private func wallClock() -> CaptureTime {
        var tv = timeval()
        gettimeofday(&tv, nil)
        return CaptureTime(seconds: Int64(tv.tv_sec), microseconds: Int32(tv.tv_usec))
    }
}
