import CSystem
import Capture
import Framing
import Glibc
import NetStack
import PPP
import RemoteSerial

/// Runs one PPP link over a line on an event loop: reads and writes the line, keeps the
/// captures, feeds the PPP core the clock, and hands IP to the attachment. The PPP core stays
/// sans-IO.
public final class LinkSession: LoopClient {
    public let line: SerialLine
    #if DEBUG
    public private(set) var link: PPPLink
    #else
    // Unchecked in release builds (docs/PERFORMANCE.md): a sans-IO core with no callbacks or
    // references back, so an access could only nest through a closure in this file; none does.
    @exclusivity(unchecked) public private(set) var link: PPPLink
    #endif
    // So is the rest of the session's state marked so below: plain values, standard
    // collections and sans-IO structs, read and set on the loop thread and changed in place
    // only by their own methods, never across a call back into this session.
    private let pcap: PcapWriter?
    private let record: PPPDRecordWriter?
    private let onEvent: (LinkEvent) -> Void
    /// Also told of every link event (after `onEvent`).
    public var onLinkEvent: ((LinkEvent) -> Void)?
    /// The line's flow policy: what waits for it (control frames ahead of IP frames) and the
    /// queue's limit, the read pause, the read clock and their counters (`LineFlowControl`).
    #if DEBUG
    private var flow: LineFlowControl
    #else
    // Without the runtime's exclusivity check in release builds, as `link` (above).
    @exclusivity(unchecked) private var flow: LineFlowControl
    #endif
    /// When the link started on its loop's clock (the record file's times count from it).
    private var started = Instant(nanoseconds: 0)
    /// What carries IP once IPCP is up; without one, IP packets are counted and dropped.
    public let attachment: NetworkAttachment?
    /// `attachment` when it is our own stack, cast once: `service` marks it on every call.
    private let stackAttachment: StackAttachment?
    /// Seeded frame loss on the line, both ways, for recovery tests against real peers.
    #if DEBUG
    private var inboundLoss: FrameDropper?
    #else
    @exclusivity(unchecked) private var inboundLoss: FrameDropper?
    #endif
    /// Bit errors on what this session writes to its line (a simulated terminal's noisy
    /// line); nil on every real link.
    #if DEBUG
    public var lineNoise: LineNoise?
    #else
    @exclusivity(unchecked) public var lineNoise: LineNoise?
    #endif
    #if DEBUG
    private var outboundLoss: FrameDropper?
    #else
    @exclusivity(unchecked) private var outboundLoss: FrameDropper?
    #endif
    /// Whether the two above are set: a constant, asked on every read and every packet without
    /// the runtime's exclusivity check that looking at an optional property costs.
    private let dropsFrames: Bool
    /// Close the link once the attachment says it is finished (e.g. a ping run).
    #if DEBUG
    public var closeWhenAttachmentFinished = false
    #else
    @exclusivity(unchecked) public var closeWhenAttachmentFinished = false
    #endif
    /// Lines for a person (counters on SIGUSR1).
    public var report: (String) -> Void = { _ in }
    // Unchecked in release builds (docs/PERFORMANCE.md says why): plain values and standard
    // collections, never changed across a call back into this object.
    #if DEBUG
    public private(set) var ipPacketsDropped = 0
    #else
    @exclusivity(unchecked) public private(set) var ipPacketsDropped = 0
    #endif
    /// IP packets do not fill the line's output queue beyond this (`LineFlowControl.limit`).
    public var lineQueueLimit: Int {
        get { flow.limit }
        set { flow.limit = newValue }
    }
    /// What the output queue held and dropped, and how the line was read.
    public var lineQueue: LineQueueCounters { flow.counters }
    /// Called once, on the loop, when the link is down and the session has let go of the loop.
    public var onDown: ((LinkDownReason) -> Void)?
    // Unchecked in release builds, as above.
    #if DEBUG
    public private(set) var downReason: LinkDownReason?
    #else
    @exclusivity(unchecked) public private(set) var downReason: LinkDownReason?
    #endif
    // Unchecked in release builds, as above.
    /// Bytes that crossed the line.
    #if DEBUG
    public private(set) var lineBytesIn = 0
    public private(set) var lineBytesOut = 0
    #else
    @exclusivity(unchecked) public private(set) var lineBytesIn = 0
    @exclusivity(unchecked) public private(set) var lineBytesOut = 0
    #endif

    #if DEBUG
    private var loop: EventLoop?
    #else
    @exclusivity(unchecked) private var loop: EventLoop?
    #endif
    #if DEBUG
    private var closeDeadline: Instant?
    #else
    @exclusivity(unchecked) private var closeDeadline: Instant?
    #endif
    #if DEBUG
    private var watchingOutput = false
    #else
    @exclusivity(unchecked) private var watchingOutput = false
    #endif
    #if DEBUG
    private var watchingAttachment = true
    #else
    @exclusivity(unchecked) private var watchingAttachment = true
    #endif
    /// Whether the line is watched for arrivals (not while paused, nor while read on the clock).
    #if DEBUG
    private var watchingInput = true
    #else
    @exclusivity(unchecked) private var watchingInput = true
    #endif
    /// When a busy line is read on a clock (`LineReadModeration.Settings.standard` unless
    /// set; an interval of zero reads on every arrival). Set before `start`.
    public var readModeration: LineReadModeration.Settings {
        get { flow.moderation.settings }
        set { flow.moderation = LineReadModeration(settings: newValue) }
    }
    // Unchecked in release builds, as above.
    #if DEBUG
    private var readBuffer = [UInt8](repeating: 0, count: 65536)
    #else
    @exclusivity(unchecked) private var readBuffer = [UInt8](repeating: 0, count: 65536)
    #endif
    #if DEBUG
    private var packetsIn: [[UInt8]] = []
    #else
    @exclusivity(unchecked) private var packetsIn: [[UInt8]] = []
    #endif
    #if DEBUG
    private var packetsOut: [[UInt8]] = []
    #else
    @exclusivity(unchecked) private var packetsOut: [[UInt8]] = []
    #endif
    /// Telnet's side of an `rfc2217:` line: what the server sends is split from the line's
    /// bytes, and what we write is escaped (RFC 854, RFC 2217). nil on every other line.
    #if DEBUG
    private var comPort: ComPortClient?
    #else
    @exclusivity(unchecked) private var comPort: ComPortClient?
    #endif
    /// Telnet's bytes to write before more of the queue: answers, the port's settings, and
    /// the escaped part of the queue taken last (at most `telnetChunk` of it, so control frames
    /// still pass queued data).
    #if DEBUG
    private var telnetPending: [UInt8] = []
    #else
    @exclusivity(unchecked) private var telnetPending: [UInt8] = []
    #endif
    #if DEBUG
    private var telnetPendingStart = 0
    #else
    @exclusivity(unchecked) private var telnetPendingStart = 0
    #endif
    private static let telnetChunk = 4096
    /// The COM-PORT-OPTION settings the server answered with, for the status.
    public var comPortReport: ComPortReport? { comPort?.report }
    public var comPortCounters: ComPortClient.Counters? { comPort?.counters }

    public init(line: SerialLine, link: PPPLink, pcap: PcapWriter? = nil, record: PPPDRecordWriter? = nil,
                attachment: NetworkAttachment? = nil, frameLoss: Double = 0, seed: UInt64 = 1,
                onEvent: @escaping (LinkEvent) -> Void) {
        self.line = line
        self.link = link
        self.attachment = attachment
        self.stackAttachment = attachment as? StackAttachment
        flow = LineFlowControl(limit: LineFlowControl.defaultLimit(bitsPerSecond: line.bitsPerSecond))
        dropsFrames = frameLoss > 0
        if frameLoss > 0 {
            inboundLoss = FrameDropper(frameLoss: frameLoss, seed: seed)
            outboundLoss = FrameDropper(frameLoss: frameLoss, seed: seed &+ 1)
        }
        self.pcap = pcap
        self.record = record
        self.onEvent = onEvent
        if let settings = line.comPortSettings {
            var c = ComPortClient(settings: settings)
            c.start()
            c.takeOutput(into: &telnetPending)
            comPort = c
        }
    }

    /// How long we wait for the Terminate exchange after a close request before giving up on it
    /// (two Terminate-Requests and their restart intervals, plus a margin).
    public var closeGrace: Duration = .seconds(7)

    /// Starts the link on `loop` (on the loop's thread).
    public func start(on loop: EventLoop) throws(SystemError) {
        self.loop = loop
        started = loop.now
        if let stack = attachment as? StackAttachment {
            stack.loopClient = self
            stack.loop = loop
        }
        try loop.register(line.descriptor, events: EPOLLIN.rawValue, serving: self) { [unowned self] events in
            self.lineEvent(events)
        }
        do {
            for fd in attachment?.descriptors ?? [] {
                try loop.register(fd, events: EPOLLIN.rawValue, serving: self) { [unowned self] _ in
                    guard let a = self.attachment, self.downReason == nil else { return }
                    let now = loop.now
                    do {
                        try a.readable(fd, room: self.flow.room, now: now)
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
        // The Terminate-Request to send and the new deadline: serviced now, whoever called.
        if let loop { loop.wake(self) }
    }

    /// Takes the link down at once without a word to the peer (the line is the owner's to close).
    public func forceDown() {
        guard downReason == nil else { return }
        let now = loop?.now ?? monotonicNow()
        flow.queue.removeAll()
        // Not a word to the peer: telnet's answers and an escaped chunk waiting go too.
        telnetPending.removeAll()
        telnetPendingStart = 0
        link.lineDown(now: now)
        drain(now: now)
        finish(link.downReason ?? .lineHangUp)
    }

    /// Prints the attachment's counters (SIGUSR1).
    public func printReport() {
        for text in attachment?.report() ?? [] { report(text) }
        report(lineQueue.description)
    }

    /// Frames the line has brought, good or damaged: what the read clock weighs a read by.
    /// Frames a simulated loss (`--frame-loss`) took out before the decoder count too: they
    /// came over the line.
    private var framesReceived: Int {
        let c = link.decoder.counters
        return c.frames &+ c.droppedFrames &+ (inboundLoss?.framesDropped ?? 0)
    }

    public var pollAt: Instant? {
        guard downReason == nil else { return nil }
        return earliest(inPlace(&link) { $0.pollAt }, closeDeadline, attachment?.pollAt, flow.pollAt)
    }

    public func service(now: Instant) {
        guard downReason == nil else { return }
        // Work the stack is given while this runs is sent by this same service.
        let stack = stackAttachment
        stack?.insideSessionService = true
        defer { stack?.insideSessionService = false }
        if flow.clockReadDue(now: now) {
            let frames = framesReceived
            let bytes = readLine(now: now, all: true)
            // A full buffer: more was waiting, beyond any band the clock is for.
            flow.moderation.readOnClock(bytes: bytes == readBuffer.count ? .max : bytes, frames: framesReceived &- frames, now: now)
        }
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
        // A device server that suspended our output (RFC 2217's FLOWCONTROL-SUSPEND) is not
        // watched for room: the socket stays writable, and watching it would spin the loop.
        let wantOutput = telnetPendingStart < telnetPending.count || (flow.queued > 0 && comPort?.outputSuspended != true)
        // Not read while the queue is full, nor while read on the clock (`LineFlowControl`).
        let wantInput = flow.decideReading(now: loop.now)
        if wantOutput != watchingOutput || wantInput != watchingInput {
            loop.setInterest(line.descriptor, (wantInput ? EPOLLIN.rawValue : 0) | (wantOutput ? EPOLLOUT.rawValue : 0))
            watchingOutput = wantOutput
            watchingInput = wantInput
        }
        // Back-pressure: a fast source (the kernel through TUN) waits while the line is behind,
        // until a packet of the largest size the link carries fits again.
        let wantAttachment = flow.sourceMayRead(largestPacket: link.transmitMRU)
        if wantAttachment != watchingAttachment {
            for fd in attachment?.descriptors ?? [] { loop.setInterest(fd, wantAttachment ? EPOLLIN.rawValue : 0) }
            watchingAttachment = wantAttachment
        }
    }

    private func finish(_ reason: LinkDownReason) {
        guard downReason == nil else { return }
        let now = loop?.now ?? monotonicNow()
        // Over RFC 2217 the port is hung up too (DTR dropped), after the last frames; not
        // when the connection itself is what ended.
        if comPort != nil && reason != .lineHangUp {
            comPort!.hangUp()
            comPort!.takeOutput(into: &telnetPending)
        }
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
        if events & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 {
            let frames = framesReceived
            let bytes = readLine(now: now)
            flow.moderation.readOnArrival(bytes: bytes, frames: framesReceived &- frames, now: now)
        }
        if events & EPOLLOUT.rawValue != 0 { flushPending(now: now) }
    }

    /// Reads one buffer per turn: what it makes us send is queued, and counted against the
    /// limit, before more is read (the descriptor is level-triggered, so the rest waits). On an
    /// arrival one read; on the clock (`all`) reads until the buffer is full or the line has
    /// nothing more, since a tty gives at most 4 KiB a read. Returns the bytes read (0 when
    /// there were none, or the line is gone).
    @discardableResult
    private func readLine(now: Instant, all: Bool = false) -> Int {
        let count: Int
        do {
            if all {
                // Nothing read is not taken for the end of the line here: a tty left with VMIN
                // 0 reads 0 bytes when none are waiting. The clock then gives way to arrivals,
                // and a real end (a hang-up is reported whatever the interest, and end of
                // stream makes a descriptor readable) is found on arrival, as without the clock.
                let n = try fillAvailable(line.descriptor, into: &readBuffer)
                if n == 0 { return 0 }
                count = n
            } else {
                guard let n = try readAvailable(line.descriptor, into: &readBuffer) else { return 0 }
                if n == 0 {
                    if let remote = line.remote { report("pppbridge: \(remote): the server closed the connection") }
                    link.lineDown(now: now)
                    return 0
                }
                count = n
            }
        } catch {
            // EIO: the other side of a pty went away, or the device vanished. A network line's
            // error (refused, reset, timed out) says what happened to its connection.
            if let remote = line.remote { report("pppbridge: \(remote): \(error.errno.description)") }
            link.lineDown(now: now)
            return 0
        }
        line.peerAttached()
        lineBytesIn += count
        // Over RFC 2217, the line's bytes are what telnet leaves of the read.
        let data = comPort == nil ? count : telnetReceived(count, now: now)
        guard record != nil || dropsFrames else {
            // The common case: decoded straight from the read buffer.
            readBuffer.withUnsafeBytes { link.receive(UnsafeRawBufferPointer(rebasing: $0[0..<data]), now: now) }
            return count
        }
        var chunk = Array(readBuffer[0..<data])
        record?.record(.received, chunk, elapsedTenths: tenths(now))
        if dropsFrames { chunk = inboundLoss!.filter(chunk) }
        link.receive(chunk, now: now)
        return count
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
        // Through kept arrays (`packetsIn`, `packetsOut`): taken out while in use, so that a
        // call back into the session meanwhile finds an empty one rather than a shared one.
        var packets = packetsIn
        packetsIn = []
        link.takeReceivedIPPackets(into: &packets)
        if let a = attachment {
            for p in packets { a.receive(packet: p, now: now) }
        } else {
            ipPacketsDropped += packets.count
        }
        link.recycle(&packets)
        packetsIn = packets
        // Control frames (LCP, IPCP, PAP/CHAP), within the reserve: they go ahead of IP data.
        // Each batch the link hands over starts and ends with a flag, so batches can be
        // written in any order (RFC 1662 §4.1).
        var control = link.takeTransmit()
        if !flow.admitControl(bytes: control.count) { control.removeAll() }
        if dropsFrames { control = outboundLoss!.filter(control) }
        flow.queue.append(control: control)
        // Then IP packets while the queue has room.
        if let a = attachment {
            var room = flow.room
            var packets = packetsOut
            packetsOut = []
            a.takeOutgoing(now: now, into: &packets)
            for i in packets.indices {
                let size = packets[i].count
                // Decided before the packet is framed (and VJ-compressed); escapes can add a
                // little beyond the limit.
                guard flow.admitPacket(size: size, room: room) else { continue }
                let sent: Bool
                if !dropsFrames {
                    // Compressed in place and framed straight into the queue.
                    sent = flow.queue.appendDataFrame { link.send(ipPacket: &packets[i], now: now, framingInto: &$0) }
                } else if link.send(ipPacket: packets[i], now: now) {
                    flow.queue.append(dataFrame: outboundLoss!.filter(link.takeTransmit()))
                    sent = true
                } else {
                    sent = false
                }
                guard sent else {
                    ipPacketsDropped += 1
                    continue
                }
                // Counted unframed, as the sources count their room: escapes and the FCS may take
                // the queue a little beyond the limit, never a packet a source was told fits.
                room -= size
            }
            a.recycle(&packets)
            packetsOut = packets
        }
        if !flow.queue.isEmpty {
            flow.queuedMore()
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

    /// Writes while the line takes bytes. The record has what was written, in the line's order
    /// (control frames may pass IP frames queued before them).
    private func flushPending(now: Instant) {
        if comPort != nil {
            flushTelnet(now: now)
            return
        }
        while !flow.queue.isEmpty {
            let n: Int
            let offered: Int
            do {
                // The slice is let go before `written` changes the queue (no copy of it).
                let chunk = flow.queue.next
                offered = chunk.count
                if lineNoise == nil {
                    n = try writeLine(chunk)
                } else {
                    // A simulated noisy line: what the peer reads, not what we keep, is hit.
                    var noisy = Array(chunk)
                    lineNoise!.apply(&noisy)
                    n = try writeLine(noisy[...])
                }
                if n > 0 { record?.record(.sent, Array(chunk.prefix(n)), elapsedTenths: tenths(now)) }
            } catch {
                // The line is gone; what was pending cannot be delivered.
                if let remote = line.remote { report("pppbridge: \(remote): \(error.errno.description)") }
                flow.queue.removeAll()
                link.lineDown(now: now)
                return
            }
            lineBytesOut += n
            flow.queue.written(n)
            // The kernel took less than offered: the rest waits for EPOLLOUT.
            guard n == offered else { return }
        }
    }

    /// A write to the line; a socket's never raises SIGPIPE (a program linking us may not
    /// ignore it, and a device server that went away must end only this link).
    private func writeLine(_ bytes: ArraySlice<UInt8>) throws(SystemError) -> Int {
        line.remote == nil ? try writeSome(line.descriptor, bytes) : try HostSocket.send(line.descriptor, bytes)
    }

    // MARK: RFC 2217

    /// Takes telnet out of `readBuffer[0..<count]`; returns how many of the line's bytes are
    /// left at its front. Answers are written with the next flush; a carrier lost ends the link.
    private func telnetReceived(_ count: Int, now: Instant) -> Int {
        let data = comPort!.receive(&readBuffer, count: count)
        if comPort!.hasOutput {
            compactTelnetPending()
            comPort!.takeOutput(into: &telnetPending)
        }
        for e in comPort!.takeEvents() {
            let name = line.remote.map { "\($0)" } ?? "line"
            switch e {
            case .comPortAccepted:
                report("pppbridge: \(name): COM-PORT-OPTION taken; set \(comPort!.settings.description)")
            case .comPortRefused:
                report("pppbridge: \(name): the server refused COM-PORT-OPTION; the port runs as the server has it set")
            case .carrierLost:
                report("pppbridge: \(name): the server reports the carrier lost")
                link.lineDown(now: now)
            case .outputSuspended:
                break
            }
        }
        // After a hang-up nothing more is written, and what came with it is not PPP's.
        guard link.downReason == nil else { return 0 }
        flushTelnet(now: now)
        return data
    }

    /// The queue's bytes through telnet: pending telnet bytes first, then the queue a chunk at
    /// a time, escaped, while the connection takes them and the server has not suspended us.
    private func flushTelnet(now: Instant) {
        while true {
            if telnetPendingStart < telnetPending.count {
                let n: Int
                do {
                    n = try writeLine(telnetPending[telnetPendingStart...])
                } catch {
                    if let remote = line.remote { report("pppbridge: \(remote): \(error.errno.description)") }
                    flow.queue.removeAll()
                    telnetPending.removeAll()
                    telnetPendingStart = 0
                    link.lineDown(now: now)
                    return
                }
                lineBytesOut += n
                telnetPendingStart += n
                guard telnetPendingStart == telnetPending.count else { return }
                telnetPending.removeAll(keepingCapacity: true)
                telnetPendingStart = 0
            }
            guard !flow.queue.isEmpty, comPort?.outputSuspended != true else { return }
            // Copied out of the queue before `written` changes it (a slice kept alive across
            // that would have the queue's storage copied).
            var bytes = Array(flow.queue.next.prefix(Self.telnetChunk))
            let taken = bytes.count
            record?.record(.sent, bytes, elapsedTenths: tenths(now))
            if lineNoise != nil { lineNoise!.apply(&bytes) }
            comPort!.encode(bytes, into: &telnetPending)
            flow.queue.written(taken)
        }
    }

    private func compactTelnetPending() {
        guard telnetPendingStart > 0 else { return }
        telnetPending.removeFirst(telnetPendingStart)
        telnetPendingStart = 0
    }

    private func tenths(_ now: Instant) -> Int64 { (now.nanoseconds - started.nanoseconds) / 100_000_000 }

    private func wallClock() -> CaptureTime {
        var tv = timeval()
        gettimeofday(&tv, nil)
        return CaptureTime(seconds: Int64(tv.tv_sec), microseconds: Int32(tv.tv_usec))
    }
}
