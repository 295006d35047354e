import Capture
import Framing
import NetStack
import PPP
import Wire

/// Bounds on one session's replay: the recording decides how long it is, these decide how
/// long it may take, whatever the recording says.
public struct ReplayBounds: Sendable, Equatable {
    /// How long (virtual) a peer frame waits for the answer of ours it responds to.
    public var answerWait: Duration = .seconds(5)
    /// How long (virtual) the replay runs on after the recording's last frame.
    public var drain: Duration = .seconds(10)
    /// Timer expiries and feeds, together.
    public var steps = 2_000_000
    /// Frames our stack may send per recorded frame (plus a fixed allowance).
    public var sentPerRecorded = 8
    /// TCP connections followed; a terminal's session has tens.
    public var connections = 4096
    /// Bytes of the recorded side's writes waiting for our stack's send buffer, per connection.
    public var pendingBytes = 4 << 20
    public init() {}
}

/// Plays one recorded session against our link and stack on virtual time (sans-IO: frames
/// and time in, a report out). The peer's frames are fed in recording order, each when what it
/// answers has come from our side and the recording's gap has passed; what the recorded side
/// did of its own accord (closing the link, TCP data and FINs, pings) our side's application
/// does at the same point.
final class ReplayEngine {
    let plan: ReplayPlan
    let bounds: ReplayBounds
    var link: PPPLink
    var stack: IPStack?
    var now = Instant.zero
    var report: ReplayReport
    /// Every frame on our line, both directions, with when it passed (for `--pcap`).
    var captured: [(Direction, PPPFrame, Instant)] = []
    private let peerEncoder = HDLCEncoder(fcs: .fcs16, escapes: .allControlCharacters)
    private var steps = 0
    private var seed: UInt64

    // Control protocols.
    struct RequestKey: Hashable {
        var proto: ProtocolNumber
        var code: ControlCode
    }
    /// Our latest request of each kind not yet answered by a fed frame.
    private var outstanding: [RequestKey: ControlPacket] = [:]
    private var lastRequest: [RequestKey: ControlPacket] = [:]
    private var sentProtocols: Set<ProtocolNumber> = []
    /// The recorded side's requests, in order, and how many of ours have been matched to them.
    private var recordedRequests: [RequestKey: [RecordedFrame]] = [:]
    private var requestCursor: [RequestKey: Int] = [:]
    /// The recorded side's answers to the peer frame at each index.
    private var recordedAnswers: [Int: [RecordedFrame]] = [:]
    /// Option values our Naks suggested where the recording's suggested others: the peer's next
    /// request takes ours, as a live peer would (RFC 1661 §5.3).
    private var nakValues: [ProtocolNumber: [UInt8: (recorded: [UInt8], ours: [UInt8])]] = [:]
    /// The options of our latest Configure-Request the peer acknowledged, per protocol.
    private var acknowledgedRequest: [ProtocolNumber: [UInt8]] = [:]
    /// The peer's latest Configure-Request per protocol as recorded, and whether ours acked it.
    private var lastPeerRequest: [ProtocolNumber: (packet: ControlPacket, acknowledged: Bool)] = [:]
    /// Frames the peer sends of its own accord in answer to ours (see `sent`), fed next.
    private var synthetic: [PPPFrame] = []

    // The network layer.
    private var local: IPv4Address = .any
    private var peer: IPv4Address = .any
    private var lcpOpened = false
    private var authenticatedName: String?
    private var ipcpResult: IPCPResult?
    private var downReason: LinkDownReason?
    /// Whether ours acknowledged a Terminate-Request of the peer's (RFC 1661 §5.5): the peer
    /// ended that negotiation even when our link went on to renegotiate.
    private var acknowledgedPeerTermination = false
    /// Since when (and the recorded frame then being played) our request of a kind has been
    /// sent again without an answer between: a peer gone silent.
    private var unansweredSince: [RequestKey: (time: Instant, frame: Int)] = [:]
    private var requestSentAt: [RequestKey: (time: Instant, frame: Int)] = [:]
    /// The recorded frame being played, for divergences our timers cause.
    private var currentFrame = 0
    /// The last Nak or Reject fed, per protocol ("#12 IPCP ConfNak ..."): why ours asked again.
    private var lastPeerAnswer: [ProtocolNumber: String] = [:]
    /// The control protocols our link sends requests of; an answer in any other can never be
    /// fed.
    private static let negotiatedByOurs: Set<ProtocolNumber> = [ProtocolNumber.lcp, ProtocolNumber.ipcp, ProtocolNumber.pap, ProtocolNumber.chap]

    struct FlowKey: Hashable {
        var ourPort: UInt16
        var peerPort: UInt16
    }
    struct Flow {
        var id: ConnectionID?
        var recordedOurISN: SequenceNumber?
        var recordedPeerISN: SequenceNumber?
        var ourISN: SequenceNumber?
        /// Sequence space we have sent, counted from our ISN (SYN and FIN included).
        var sentEnd = 0
        var lastTimestamp: UInt32?
        /// Peer bytes the recording had shown by the frame being processed.
        var recordedPeerBytes = 0
        /// Bytes of ours scheduled (from the recording), written, and waiting to be written.
        var scheduled = 0
        var written = 0
        /// A slice: written bytes leave from its front without moving the rest.
        var pending: ArraySlice<UInt8> = []
        var closeWanted = false
        var closeDone = false
        var read = 0
        var peerFinished = false
        var established = false
        var closed: TCPCloseReason?
        var resetByUs = false
    }
    private var flows: [FlowKey: Flow] = [:]
    /// Flows with a connection of our stack's that has not closed: what the application
    /// serves each turn.
    private var live: Set<FlowKey> = []
    private var flowByID: [ConnectionID: FlowKey] = [:]
    private var recordedResets: Set<FlowKey> = []
    private var boundUDP: Set<UInt16> = []

    init(plan: ReplayPlan, bounds: ReplayBounds, seed: UInt64) {
        self.plan = plan
        self.bounds = bounds
        self.seed = seed
        link = PPPLink(configuration: plan.link, random: SplitMix64(seed: seed))
        report = ReplayReport(label: plan.session.label, peerSide: plan.peerSide, ourSide: plan.ourSide, role: plan.role, notes: plan.notes)
        indexRecording()
    }

    // MARK: The recording's expectations

    private func requestCode(answering code: ControlCode, protocol proto: ProtocolNumber) -> ControlCode? {
        if proto == ProtocolNumber.pap { return code == PAPPacket.Code.ack || code == PAPPacket.Code.nak ? PAPPacket.Code.request : nil }
        switch code {
        case ControlCode.configureAck, ControlCode.configureNak, ControlCode.configureReject: return ControlCode.configureRequest
        case ControlCode.terminateAck: return ControlCode.terminateRequest
        case ControlCode.echoReply: return ControlCode.echoRequest
        default: return nil
        }
    }

    private func isRequest(_ code: ControlCode, protocol proto: ProtocolNumber) -> Bool {
        if proto == ProtocolNumber.pap { return code == PAPPacket.Code.request }
        return code == ControlCode.configureRequest || code == ControlCode.terminateRequest || code == ControlCode.echoRequest
    }

    private func indexRecording() {
        let frames = plan.session.frames
        var lastPeerRequest: [RequestKey: (index: Int, id: UInt8)] = [:]
        var lastPeerOfProtocol: [ProtocolNumber: Int] = [:]
        for (i, f) in frames.enumerated() {
            let fromUs = f.side == plan.ourSide
            if let ip = f.ip, fromUs, let s = TCPView(ip), s.flags.contains(.rst) {
                recordedResets.insert(FlowKey(ourPort: s.sourcePort, peerPort: s.destinationPort))
            }
            guard let p = controlPacket(f.frame) else {
                if !fromUs { lastPeerOfProtocol[f.frame.protocol] = i }
                continue
            }
            let proto = f.frame.protocol
            if !fromUs {
                lastPeerOfProtocol[proto] = i
                if isRequest(p.code, protocol: proto) { lastPeerRequest[RequestKey(proto: proto, code: p.code)] = (i, p.identifier) }
                continue
            }
            if isRequest(p.code, protocol: proto) {
                recordedRequests[RequestKey(proto: proto, code: p.code), default: []].append(f)
            } else if let request = requestCode(answering: p.code, protocol: proto),
                      let asked = lastPeerRequest[RequestKey(proto: proto, code: request)], asked.id == p.identifier {
                recordedAnswers[asked.index, default: []].append(f)
            } else if proto == ProtocolNumber.lcp && p.code == ControlCode.protocolReject && p.data.count >= 2 {
                let rejected = ProtocolNumber(UInt16(p.data[0]) << 8 | UInt16(p.data[1]))
                if let asked = lastPeerOfProtocol[rejected] { recordedAnswers[asked, default: []].append(f) }
            }
        }
    }

    // MARK: Running

    func run() -> ReplayReport {
        let frames = plan.session.frames
        link.open(now: now)
        pump()
        var previousTime = frames.first?.time ?? 0
        var previousVirtual = now
        let sentLimit = frames.count * bounds.sentPerRecorded + 1000
        for (i, f) in frames.enumerated() {
            if downReason != nil {
                let rest = frames[i...].filter { $0.side == plan.peerSide }.count
                if rest > 0 { report.notes.append("our link was down before \(rest) of the peer's frames (from #\(f.number)) could be fed") }
                if let reason = downReason, reason != .closedByUs, !{ if case .peerTerminated = reason { return true } else { return false } }() {
                    diverge(f.number, "our link went down (\(reason)) where the recorded side's went on")
                }
                break
            }
            currentFrame = f.number
            let gap = Duration.milliseconds(Int64(max(0, f.time - previousTime) * 1000))
            let earliest = previousVirtual + gap
            if f.side == plan.peerSide { feed(index: i, frame: f, earliest: earliest) } else { act(index: i, frame: f, earliest: earliest) }
            previousTime = f.time
            previousVirtual = now
            if steps >= bounds.steps {
                report.stopped = "\(bounds.steps) steps taken at #\(f.number)"
                break
            }
            if report.framesSent > sentLimit {
                report.stopped = "our stack sent more than \(sentLimit) frames by #\(f.number)"
                break
            }
        }
        if report.stopped == nil { advance(to: now + bounds.drain) }
        unansweredRequests()
        unmatchedRequests()
        report.divergences.sort { $0.frame < $1.frame }
        evaluate()
        report.virtualSeconds = Double(now.nanoseconds) / 1e9
        return report
    }

    private func log(_ line: String) {
        guard report.log.count < 20_000 else { return }
        report.log.append("\(ReplayReport.seconds(Double(now.nanoseconds) / 1e9)) \(ReplayEngine.shortened(line))")
    }

    /// How many divergences of each kind were said; after three, the rest are counted.
    private var divergenceKinds: [String: Int] = [:]

    private func diverge(_ frame: Int, _ text: String, kind: String? = nil, at time: Instant? = nil) {
        if let kind {
            divergenceKinds[kind, default: 0] += 1
            if divergenceKinds[kind, default: 0] > 3 {
                report.divergencesDropped += 1
                return
            }
        }
        guard report.divergences.count < ReplayReport.keptDivergences else {
            report.divergencesDropped += 1
            return
        }
        report.divergences.append(Divergence(frame: frame, time: Double((time ?? now).nanoseconds) / 1e9, text: ReplayEngine.shortened(text)))
    }

    /// A report line of at most 600 characters: a frame's options or data can be 64 KiB.
    static func shortened(_ line: String) -> String {
        line.count <= 600 ? line : String(line.prefix(600)) + " ..."
    }

    private func describe(_ frame: PPPFrame) -> String {
        PeerText.escaped(FramePrinter.describe(frame).text)
    }

    // MARK: Time

    private var nextDeadline: Instant? {
        [link.pollAt, stack?.pollAt].compactMap { $0 }.min()
    }

    /// Runs every timer due by `t`, in order, then sets the clock to `t`.
    private func advance(to t: Instant) {
        while steps < bounds.steps, let d = nextDeadline, d <= t {
            steps += 1
            now = max(now, d)
            link.poll(now: now)
            stack?.poll(now: now)
            pump()
        }
        now = max(now, t)
        pump()
    }

    /// Runs timers until `blocker` returns nil or `deadline` passes; returns the blocker left.
    private func wait(until deadline: Instant, _ blocker: () -> String?) -> String? {
        while let b = blocker() {
            guard steps < bounds.steps, let d = nextDeadline, d <= deadline else {
                advance(to: deadline)
                return blocker() == nil ? nil : b
            }
            steps += 1
            now = max(now, d)
            link.poll(now: now)
            stack?.poll(now: now)
            pump()
        }
        return nil
    }

    // MARK: Moving frames and packets

    private func pump() {
        for _ in 0..<10_000 {
            var moved = false
            _ = link.takeTransmit()
            for (direction, frame) in link.takeCapturedFrames() {
                moved = true
                captured.append((direction, frame, now))
                if direction == .sent { sent(frame) }
            }
            for event in link.takeEvents() {
                moved = true
                linkEvent(event)
            }
            if !synthetic.isEmpty {
                let frames = synthetic
                synthetic = []
                for frame in frames {
                    moved = true
                    var bytes: [UInt8] = []
                    peerEncoder.encode(protocol: frame.protocol, information: frame.information, into: &bytes)
                    log("peer  (again) " + describe(frame))
                    link.receive(bytes, now: now)
                }
            }
            if stack != nil {
                for packet in link.takeReceivedIPPackets() {
                    moved = true
                    stack?.receive(packet: packet, now: now)
                }
                for packet in stack?.takeOutgoing() ?? [] {
                    moved = true
                    sentIP(packet)
                    _ = link.send(ipPacket: packet, now: now)
                }
                for event in stack?.takeEvents() ?? [] {
                    moved = true
                    stackEvent(event)
                }
                if application() { moved = true }
            }
            if !moved { return }
        }
    }

    private func linkEvent(_ event: LinkEvent) {
        switch event {
        case .lcpOpened:
            lcpOpened = true
            log("ours  LCP opened")
        case let .authenticated(name):
            authenticatedName = name ?? plan.link.authentication.local?.name ?? ""
            log("ours  authenticated")
        case let .ipcpOpened(result):
            ipcpResult = result
            local = result.localAddress
            peer = result.peerAddress
            log("ours  IPCP opened, local \(local), peer \(peer)")
            startStack(result)
        case let .debug(line):
            // Frames are logged where they are fed and sent; the rest says what the link did.
            if !line.hasPrefix("sent [") && !line.hasPrefix("rcvd [") { log("link  " + PeerText.escaped(line)) }
        case let .down(reason):
            downReason = reason
            report.linkDown = reason.description
            log("ours  link down: \(reason)")
        default: break
        }
    }

    private func startStack(_ result: IPCPResult) {
        guard stack == nil else { return }
        var configuration = IPStackConfiguration(address: result.localAddress)
        configuration.mtu = link.transmitMRU
        var s = IPStack(configuration: configuration, seed: seed &+ 1)
        // The recorded side listened where the peer's SYNs went.
        var listening = Set<UInt16>()
        for f in plan.session.frames where f.side == plan.peerSide {
            guard let ip = f.ip, let v = TCPView(ip), v.flags.contains(.syn), !v.flags.contains(.ack) else { continue }
            guard listening.insert(v.destinationPort).inserted else { continue }
            try? s.listen(port: v.destinationPort, configuration: plan.tcpByPort[v.destinationPort])
        }
        stack = s
    }

    // MARK: What our side sends

    private func sent(_ frame: PPPFrame) {
        report.framesSent += 1
        sentProtocols.insert(frame.protocol)
        log("ours  " + describe(frame))
        if frame.protocol == ProtocolNumber.lcp, controlPacket(frame)?.code == ControlCode.terminateAck {
            acknowledgedPeerTermination = true
        }
        guard let p = controlPacket(frame), isRequest(p.code, protocol: frame.protocol) else { return }
        let key = RequestKey(proto: frame.protocol, code: p.code)
        let retransmission = lastRequest[key].map { $0.identifier == p.identifier && $0.data == p.data } ?? false
        if outstanding[key] == nil {
            requestSentAt[key] = (now, currentFrame)
        } else if unansweredSince[key] == nil {
            unansweredSince[key] = requestSentAt[key] ?? (now, currentFrame)
        }
        outstanding[key] = p
        lastRequest[key] = p
        // A Configure-Request the peer has acknowledged before, sent again (our restart timer
        // ran out before the peer's own request came, RFC 1661 §4.6 TO+ in Ack-Rcvd): a live
        // peer acknowledges it again, so the replay does, with the new identifier.
        // Magic numbers aside: a renegotiation draws a new one (RFC 1661 §6.4).
        if p.code == ControlCode.configureRequest, let acked = acknowledgedRequest[frame.protocol],
           let list = try? ConfigurationOption.parseList(acked),
           comparable(list, frame.protocol) == comparable(options(p), frame.protocol),
           let ack = try? ControlPacket(code: ControlCode.configureAck, identifier: p.identifier, data: p.data).emit() {
            outstanding[key] = nil
            synthetic.append(PPPFrame(protocol: frame.protocol, information: ack))
            return
        }
        guard !retransmission else { return }
        let cursor = requestCursor[key, default: 0]
        guard let recorded = recordedRequests[key], cursor < recorded.count else {
            if p.code == ControlCode.configureRequest {
                let after = lastPeerAnswer[frame.protocol].map { ", after the peer's \($0)" } ?? ""
                diverge(currentFrame, "we sent \(describe(frame)), more requests than the recorded side's \(recordedRequests[key]?.count ?? 0)\(after)",
                        kind: "more requests \(frame.protocol)")
            }
            return
        }
        requestCursor[key] = cursor + 1
        let theirs = recorded[cursor]
        guard p.code == ControlCode.configureRequest, let rp = controlPacket(theirs.frame) else { return }
        if comparable(options(p), frame.protocol) != comparable(options(rp), frame.protocol) {
            diverge(theirs.number, "our request differs: we sent \(describe(frame)), the recorded side \(describe(theirs.frame))")
        }
    }

    /// Options as they mean, not as they are written: in type order (RFC 1661 §6 sets no
    /// order), without options that say the default (an MRU of 1500, an ACCM of all ones), and
    /// with magic numbers compared by presence (drawn afresh each time, RFC 1661 §6.4).
    private func comparable(_ list: [ConfigurationOption], _ proto: ProtocolNumber) -> [ConfigurationOption] {
        guard proto == ProtocolNumber.lcp else { return list.sorted { $0.type < $1.type } }
        return list.compactMap { o -> ConfigurationOption? in
            switch LCPOption(o) {
            case .maximumReceiveUnit(1500), .asyncControlCharacterMap(0xFFFF_FFFF): return nil
            case .magicNumber: return ConfigurationOption(type: o.type)
            default: return o
            }
        }.sorted { $0.type < $1.type }
    }

    /// Requests the recorded side made in a protocol ours never spoke (CCP, IPv6CP, ...).
    /// Configure-Requests of ours still unanswered at the end, sent again and again: the peer
    /// went silent where the recorded side had its answers (RFC 1661 §4.6, the restart timer).
    private func unansweredRequests() {
        guard downReason == nil || link.phase != .dead else { return }
        let lastPeer = plan.session.frames.last { $0.side == plan.peerSide }
        for (key, since) in unansweredSince.sorted(by: { $0.value.time < $1.value.time }) where key.code == ControlCode.configureRequest {
            guard let p = outstanding[key] else { continue }
            let silence = lastPeer.map { " (the peer's last frame was #\($0.number))" } ?? ""
            diverge(since.frame, "our \(key.proto.name ?? "") ConfReq was sent again without an answer from \(ReplayReport.seconds(Double(since.time.nanoseconds) / 1e9)) on, up to id=0x\(String(p.identifier, radix: 16))\(silence)",
                    at: since.time)
        }
    }

    private func unmatchedRequests() {
        for (key, list) in recordedRequests.sorted(by: { ($0.key.proto, $0.key.code) < ($1.key.proto, $1.key.code) }) {
            guard key.code == ControlCode.configureRequest || key.proto == ProtocolNumber.pap, requestCursor[key, default: 0] == 0,
                  let first = list.first else { continue }
            diverge(first.number, "the recorded side sent \(describe(first.frame))\(list.count > 1 ? " (and \(list.count - 1) more)" : ""); ours never sent such a request")
        }
    }

    private func sentIP(_ packet: [UInt8]) {
        guard let s = TCPView(packet) else { return }
        let key = FlowKey(ourPort: s.sourcePort, peerPort: s.destinationPort)
        guard var flow = flows[key] else { return }
        if s.flags.contains(.syn) { flow.ourISN = s.header.sequenceNumber }
        if let isn = flow.ourISN {
            let end = s.header.sequenceNumber.offset(from: isn) + s.sequenceLength
            if end < 1 << 30 { flow.sentEnd = max(flow.sentEnd, end) }
        }
        if let ts = s.timestampValue { flow.lastTimestamp = ts }
        if s.flags.contains(.rst) && !flow.resetByUs {
            flow.resetByUs = true
            if !recordedResets.contains(key) {
                diverge(currentFrame, "we reset TCP port \(key.ourPort) ↔ \(key.peerPort); the recorded side never did")
            }
        }
        flows[key] = flow
    }

    private func stackEvent(_ event: StackEvent) {
        switch event {
        case let .acceptable(port):
            while let id = stack?.accept(port: port) {
                guard let c = stack?.connection(id) else { continue }
                let key = FlowKey(ourPort: c.local.port, peerPort: c.remote.port)
                guard flows[key] != nil else {
                    // A connection past the bound: ours answers it, the replay does not follow it.
                    continue
                }
                flows[key]?.id = id
                live.insert(key)
                flows[key]?.established = true
                flowByID[id] = key
                log("ours  TCP \(c.remote) → \(c.local) accepted")
            }
        case let .tcp(id, e):
            guard let key = flowByID[id] else { return }
            switch e {
            case .established:
                flows[key]?.established = true
            case .peerFinished:
                flows[key]?.peerFinished = true
            case let .closed(reason):
                flows[key]?.closed = reason
                live.remove(key)
                log("ours  TCP port \(key.ourPort) ↔ \(key.peerPort) \(reason.rawValue)")
            default: break
            }
        default: break
        }
    }

    /// The application above our stack: reads whatever arrives, writes what the recorded side
    /// wrote once the recording's preceding peer bytes have been read, closes when it closed.
    private func application() -> Bool {
        var moved = false
        for key in live {
            guard let id = flows[key]?.id else { continue }
            let data = stack?.read(id, now: now) ?? []
            if !data.isEmpty {
                flows[key]?.read += data.count
                moved = true
            }
            if flows[key]?.pending.isEmpty == false {
                // In place: the flow's bytes are not copied out of the table to be written.
                let n = flows[key]?.pending.withUnsafeBytes { stack?.write(id, $0, now: now) ?? 0 } ?? 0
                if n > 0 {
                    let count = flows[key]?.pending.count ?? 0
                    flows[key]?.pending.removeFirst(min(n, count))
                    flows[key]?.written += n
                    moved = true
                }
            }
            if let flow = flows[key], flow.closeWanted && flow.pending.isEmpty && !flow.closeDone {
                // A FIN says only that the recorded side would write no more (RFC 9293
                // §3.6): it may still read, as the recordings' half-closes do, so ours shuts
                // its sending side down and keeps reading.
                flows[key]?.closeDone = true
                stack?.shutdownWrite(id, now: now)
                moved = true
            }
        }
        return moved
    }

    /// Drops what is known of a flow (its port pair is used again).
    private func forget(_ key: FlowKey) {
        if let id = flows[key]?.id { flowByID[id] = nil }
        flows[key] = nil
        live.remove(key)
    }

    /// Whether one more connection may be followed (`ReplayBounds.connections`); the first
    /// past the bound is said once, the rest counted.
    private func admitsFlow(_ key: FlowKey, frame: Int) -> Bool {
        if flows[key] != nil || flows.count < bounds.connections { return true }
        diverge(frame, "more than \(bounds.connections) TCP connections: the rest are left out", kind: "connections")
        return false
    }

    // MARK: The peer's frames

    private func phaseAllows(_ proto: ProtocolNumber) -> Bool {
        if proto == ProtocolNumber.lcp { return true }
        if proto == ProtocolNumber.pap || proto == ProtocolNumber.chap {
            return [.authenticate, .network, .open].contains(link.phase)
        }
        if proto.isControl { return [.network, .open].contains(link.phase) }
        return link.phase == .open && stack != nil
    }

    private func feed(index i: Int, frame f: RecordedFrame, earliest: Instant) {
        advance(to: earliest)
        let deadline = now + bounds.answerWait
        if let p = controlPacket(f.frame) {
            feedControl(index: i, frame: f, packet: p, deadline: deadline)
        } else if let ip = f.ip {
            feedIP(frame: f, packet: ip, deadline: deadline)
        } else {
            // Protocols we do not run: fed as they are (our answer is a Protocol-Reject).
            let before = captured.count
            deliver(f.frame, number: f.number)
            compareAnswers(index: i, frame: f, since: before)
        }
    }

    private func deliver(_ frame: PPPFrame, number: Int) {
        var bytes: [UInt8] = []
        var encoder = peerEncoder
        encoder.compressAddressControl = !frame.addressControlPresent
        encoder.compressProtocol = frame.protocolCompressed
        encoder.encode(protocol: frame.protocol, information: frame.information, into: &bytes)
        report.framesFed += 1
        log("peer  #\(number) " + describe(frame))
        link.receive(bytes, now: now)
        pump()
    }

    private func feedControl(index i: Int, frame f: RecordedFrame, packet recorded: ControlPacket, deadline: Instant) {
        let proto = f.frame.protocol
        let request = requestCode(answering: recorded.code, protocol: proto)
        if proto == ProtocolNumber.lcp && recorded.code == ControlCode.protocolReject && recorded.data.count >= 2 {
            // Rejects a protocol of the recorded side's; ours never sent it (a divergence said
            // where our requests are compared), so no live peer would reject it.
            let rejected = ProtocolNumber(UInt16(recorded.data[0]) << 8 | UInt16(recorded.data[1]))
            if !sentProtocols.contains(rejected) {
                report.framesDropped += 1
                log("peer  #\(f.number) \(describe(f.frame)) left out: we sent nothing of that protocol")
                return
            }
        }
        if request != nil && !Self.negotiatedByOurs.contains(proto) {
            // Answers a request of a protocol our link never negotiates (CCP, IPv6CP, ...):
            // waiting for it would only hold back the frames behind this one. The recorded
            // side's request was reported where requests are compared.
            report.framesDropped += 1
            log("peer  #\(f.number) \(describe(f.frame)) left out: ours never requests \(proto.name ?? "that protocol")")
            return
        }
        let left = wait(until: deadline) {
            if !phaseAllows(proto) { return "our \(proto.name ?? "protocol") to start" }
            if let request, outstanding[RequestKey(proto: proto, code: request)] == nil {
                return "our \(proto.name ?? "") request it answers"
            }
            return nil
        }
        if let left {
            // An answer to a request we never made would be a frame no live peer sends: left
            // out and said.
            if request != nil {
                report.framesDropped += 1
                diverge(f.number, "the peer's \(describe(f.frame)) waited \(bounds.answerWait) for \(left) and was left out")
                return
            }
            diverge(f.number, "the peer's \(describe(f.frame)) fed before \(left)")
        }
        if recorded.code == ControlCode.configureRequest, let previous = lastPeerRequest[proto],
           previous.packet == recorded, previous.acknowledged {
            // The peer sent it again because the recorded side did not answer; ours did, with
            // an Ack, and a live peer would not repeat itself.
            report.framesDropped += 1
            log("peer  #\(f.number) \(describe(f.frame)) left out: a request of the peer's we acknowledged, repeated")
            return
        }
        var packet = recorded
        if let request, let ours = outstanding[RequestKey(proto: proto, code: request)] {
            packet.identifier = ours.identifier
            switch recorded.code {
            case ControlCode.configureAck:
                // The peer acknowledges what we asked (RFC 1661 §5.2): our options, byte for byte.
                packet.data = ours.data
                acknowledgedRequest[proto] = ours.data
            case ControlCode.configureReject:
                let types = Set(options(recorded).map(\.type))
                let kept = options(ours).filter { types.contains($0.type) }
                guard !kept.isEmpty, let data = try? ConfigurationOption.emitList(kept) else {
                    report.framesDropped += 1
                    diverge(f.number, "the peer's \(describe(f.frame)) rejects options we did not ask for; left out")
                    return
                }
                packet.data = data
            default: break
            }
            outstanding[RequestKey(proto: proto, code: request)] = nil
            unansweredSince[RequestKey(proto: proto, code: request)] = nil
        } else if recorded.code == ControlCode.configureRequest, let substitutions = nakValues[proto] {
            let adapted = options(recorded).map { o -> ConfigurationOption in
                if let s = substitutions[o.type], s.recorded == o.value { return ConfigurationOption(type: o.type, value: s.ours) }
                return o
            }
            if let data = try? ConfigurationOption.emitList(adapted) { packet.data = data }
        }
        guard let information = try? packet.emit() else { return }
        var frame = f.frame
        frame.information = information
        let before = captured.count
        if packet.code == ControlCode.configureNak || packet.code == ControlCode.configureReject {
            lastPeerAnswer[proto] = "#\(f.number) \(describe(frame))"
        }
        deliver(frame, number: f.number)
        compareAnswers(index: i, frame: f, since: before)
        if recorded.code == ControlCode.configureRequest {
            let acked = captured[before...].contains { entry in
                entry.0 == .sent && entry.1.protocol == proto && controlPacket(entry.1).map { $0.code == ControlCode.configureAck && $0.identifier == recorded.identifier } == true
            }
            lastPeerRequest[proto] = (recorded, acked)
        }
    }

    /// Our answers to the fed frame against the recorded side's (RFC 1661 §5).
    private func compareAnswers(index i: Int, frame f: RecordedFrame, since before: Int) {
        let q = controlPacket(f.frame)
        let ours = captured[before...].filter { entry in
            guard entry.0 == .sent, let p = controlPacket(entry.1) else { return false }
            if entry.1.protocol == ProtocolNumber.lcp && p.code == ControlCode.protocolReject && p.data.count >= 2 {
                return ProtocolNumber(UInt16(p.data[0]) << 8 | UInt16(p.data[1])) == f.frame.protocol
            }
            guard let q, entry.1.protocol == f.frame.protocol, p.identifier == q.identifier,
                  requestCode(answering: p.code, protocol: entry.1.protocol) == q.code else { return false }
            return true
        }.map(\.1)
        let theirs = recordedAnswers[i] ?? []
        switch (ours.first, theirs.first) {
        case (nil, nil):
            return
        case let (nil, recorded?):
            diverge(f.number, "no answer from us to the peer's \(describe(f.frame)); the recorded side answered \(describe(recorded.frame)) (#\(recorded.number))")
        case let (mine?, nil):
            diverge(f.number, "we answered the peer's \(describe(f.frame)) with \(describe(mine)); the recorded side did not answer it",
                    kind: "unanswered \(f.frame.protocol) \(controlPacket(mine)?.code.rawValue ?? 0)")
        case let (mine?, recorded?):
            guard let a = controlPacket(mine), let b = controlPacket(recorded.frame) else { return }
            if mine.protocol != recorded.frame.protocol || a.code != b.code {
                diverge(f.number, "we answered the peer's \(describe(f.frame)) with \(describe(mine)); the recorded side with \(describe(recorded.frame)) (#\(recorded.number))")
                return
            }
            if a.code.carriesOptions && mine.protocol != ProtocolNumber.pap
                && comparable(options(a), mine.protocol) != comparable(options(b), mine.protocol) {
                diverge(f.number, "our \(describe(mine)) differs from the recorded \(describe(recorded.frame)) (#\(recorded.number))")
            }
            if a.code == ControlCode.configureNak && mine.protocol != ProtocolNumber.pap {
                for o in options(a) {
                    if let r = options(b).first(where: { $0.type == o.type }), r.value != o.value {
                        nakValues[mine.protocol, default: [:]][o.type] = (r.value, o.value)
                    }
                }
            }
        }
    }

    private func feedIP(frame f: RecordedFrame, packet: [UInt8], deadline: Instant) {
        var tcp = TCPView(packet)
        var key: FlowKey?
        if let s = tcp {
            let k = FlowKey(ourPort: s.destinationPort, peerPort: s.sourcePort)
            key = k
            if s.flags.contains(.syn) && !s.flags.contains(.ack) {
                // A new connection (or the port pair used again).
                if flows[k]?.closed != nil || flows[k]?.recordedPeerISN.map({ $0 != s.header.sequenceNumber }) ?? false {
                    forget(k)
                }
                if admitsFlow(k, frame: f.number) { flows[k, default: Flow()].recordedPeerISN = s.header.sequenceNumber }
            }
            if !s.payload.isEmpty, let isn = flows[k]?.recordedPeerISN {
                let end = s.header.sequenceNumber.offset(from: isn + 1) + s.payload.count
                let seen = flows[k]?.recordedPeerBytes ?? 0
                if end < 1 << 30 { flows[k]?.recordedPeerBytes = max(seen, end) }
            }
        }
        var acknowledged: Int?
        if let s = tcp, let k = key, s.flags.contains(.ack), let isn = flows[k]?.recordedOurISN {
            let offset = s.header.acknowledgmentNumber.offset(from: isn)
            if offset < 1 << 30 { acknowledged = offset }
        }
        let left = wait(until: deadline) {
            guard phaseAllows(f.frame.protocol) else { return "our IPCP to open" }
            guard let k = key, let s = tcp else { return nil }
            if s.flags.contains(.ack) {
                guard flows[k]?.ourISN != nil else { return "our SYN" }
                if let n = acknowledged, (flows[k]?.sentEnd ?? 0) < n { return "our bytes up to \(n)" }
            }
            return nil
        }
        if let left {
            if stack == nil {
                report.framesDropped += 1
                // A connection whose SYN was left out never exists on our side.
                if let k = key, tcp?.flags.contains(.syn) == true, flows[k]?.id == nil { forget(k) }
                diverge(f.number, "the peer's \(describe(f.frame)) waited for \(left); left out")
                return
            }
            if tcp?.flags.contains(.ack) == true && key.flatMap({ flows[$0]?.ourISN }) == nil {
                report.framesDropped += 1
                diverge(f.number, "the peer's \(describe(f.frame)) answers a SYN of ours that never came; left out")
                return
            }
            diverge(f.number, "the peer's \(describe(f.frame)) waited \(bounds.answerWait) for \(left); fed acknowledging what we sent")
        }
        let bytes: [UInt8]?
        if var s = tcp, let k = key, let flow = flows[k] {
            // Our sequence numbers, not the recorded side's (RFC 9293 §3.4): the offsets the
            // peer acknowledged, from our ISN; SACK edges likewise; the timestamp echo is ours.
            if s.flags.contains(.ack), let ours = flow.ourISN, let theirs = flow.recordedOurISN {
                let offset = min(s.header.acknowledgmentNumber.offset(from: theirs), flow.sentEnd)
                s.header.acknowledgmentNumber = ours + max(offset, 0)
                s.header.options = s.header.options.map { o in
                    switch o {
                    case let .sack(blocks):
                        return .sack(blocks.map { (ours + $0.0.offset(from: theirs), ours + $0.1.offset(from: theirs)) })
                    case let .timestamps(value, _):
                        return .timestamps(value: value, echoReply: flow.lastTimestamp ?? 0)
                    default: return o
                    }
                }
            }
            tcp = s
            bytes = s.emit(source: peer, destination: local)
        } else {
            bytes = readdressed(packet, source: peer, destination: local)
        }
        guard let bytes else {
            report.framesDropped += 1
            diverge(f.number, "the peer's \(describe(f.frame)) is not an IPv4 packet we can readdress; left out")
            return
        }
        deliver(PPPFrame(protocol: ProtocolNumber.ipv4, information: bytes, addressControlPresent: f.frame.addressControlPresent,
                         protocolCompressed: f.frame.protocolCompressed), number: f.number)
    }

    // MARK: What the recorded side did of its own accord

    private func act(index i: Int, frame f: RecordedFrame, earliest: Instant) {
        advance(to: earliest)
        if let p = controlPacket(f.frame) {
            if f.frame.protocol == ProtocolNumber.lcp && p.code == ControlCode.terminateRequest && downReason == nil && link.phase != .terminate {
                let reason = String(decoding: p.data, as: UTF8.self)
                log("app   close the link (as the recorded side did at #\(f.number))")
                link.close(now: now, reason: reason.isEmpty ? "User request" : reason)
                pump()
            }
            return
        }
        guard let ip = f.ip else { return }
        if let s = TCPView(ip) {
            actTCP(s, frame: f)
        } else {
            actOther(ip, frame: f)
        }
    }

    private func actTCP(_ s: TCPView, frame f: RecordedFrame) {
        let key = FlowKey(ourPort: s.sourcePort, peerPort: s.destinationPort)
        if s.flags.contains(.syn) {
            if !s.flags.contains(.ack) {
                // We open this one: a new flow, connected when our stack can.
                forget(key)
                guard admitsFlow(key, frame: f.number) else { return }
                flows[key] = Flow(recordedOurISN: s.header.sequenceNumber)
                let left = wait(until: now + bounds.answerWait) { stack == nil ? "our IPCP to open" : nil }
                guard left == nil else {
                    diverge(f.number, "could not open \(s.ip.source):\(s.sourcePort) → \(s.ip.destination):\(s.destinationPort): \(left ?? "")")
                    return
                }
                do {
                    let id = try stack?.connect(to: TCPEndpoint(peer, s.destinationPort), localPort: s.sourcePort,
                                                configuration: plan.tcpByPort[s.sourcePort], now: now)
                    if let id {
                        flows[key]?.id = id
                        flowByID[id] = key
                        live.insert(key)
                    }
                } catch {
                    diverge(f.number, "could not open TCP port \(s.sourcePort) → \(s.destinationPort): \(error)")
                }
                pump()
            } else {
                // The recorded side's SYN-ACK: of a connection the peer's SYN opened on our
                // side, or of none if that SYN never reached our stack.
                guard flows[key]?.recordedPeerISN != nil else {
                    diverge(f.number, "the recorded side's \(describe(f.frame)) is on a connection ours never had", kind: "no connection")
                    return
                }
                flows[key]?.recordedOurISN = s.header.sequenceNumber
            }
            if s.payload.isEmpty && !s.flags.contains(.fin) { return }
        }
        guard let isn = flows[key]?.recordedOurISN else { return }
        let start = s.header.sequenceNumber.offset(from: isn + 1)
        guard start < 1 << 30 else { return }
        let end = start + s.payload.count
        let needsData = end > (flows[key]?.scheduled ?? 0)
        let needsClose = s.flags.contains(.fin) && flows[key]?.closeWanted == false
        let needsReset = s.flags.contains(.rst)
        guard needsData || needsClose || needsReset else { return }
        // What the recorded side had read when it sent this: the peer's bytes before it.
        let wanted = flows[key]?.recordedPeerBytes ?? 0
        // A connection the peer's SYN never reached our stack for (it was left out) will not
        // come: nothing to wait for.
        guard flows[key] != nil else {
            diverge(f.number, "the recorded side's \(describe(f.frame)) is on a connection ours never had", kind: "no connection")
            return
        }
        let left = wait(until: now + bounds.answerWait) {
            guard let flow = flows[key], flow.id != nil else { return "the connection" }
            return flow.read >= wanted ? nil : "the peer's first \(wanted) bytes to arrive (\(flow.read) so far)"
        }
        if let left {
            diverge(f.number, "the recorded side's \(describe(f.frame)) waited \(bounds.answerWait) for \(left)")
            if flows[key]?.id == nil { return }
        }
        guard let id = flows[key]?.id else { return }
        if needsReset {
            stack?.abort(id, now: now)
            pump()
            return
        }
        if needsData, let flow = flows[key] {
            let skip = max(0, flow.scheduled - start)
            if skip < s.payload.count {
                if flow.pending.count + s.payload.count - skip > bounds.pendingBytes {
                    diverge(f.number, "the recorded side wrote more than \(bounds.pendingBytes) bytes ours could not send yet on port \(key.ourPort) ↔ \(key.peerPort); the rest is left out", kind: "pending \(key.ourPort) \(key.peerPort)")
                } else {
                    flows[key]?.pending += s.payload[skip...]
                }
            }
            flows[key]?.scheduled = end
        }
        if needsClose { flows[key]?.closeWanted = true }
        pump()
    }

    private func actOther(_ ip: [UInt8], frame f: RecordedFrame) {
        guard stack != nil, let h = ip.withUnsafeBytes({ try? IPv4Header(parsing: $0) }), !h.isFragment else { return }
        let body = Array(ip[h.headerLength..<h.totalLength])
        if h.protocol == IPProtocol.icmp, body.count >= 8, body[0] == 8 {
            // An echo request of the recorded side's (RFC 792): ours asks the same.
            stack?.ping(peer, identifier: BigEndian.uint16(body, 4), sequence: BigEndian.uint16(body, 6), payload: Array(body[8...]), now: now)
            pump()
        } else if h.protocol == IPProtocol.udp, body.count >= 8 {
            let source = BigEndian.uint16(body, 0)
            let destination = BigEndian.uint16(body, 2)
            if !boundUDP.contains(source) {
                try? stack?.bindUDP(port: source)
                boundUDP.insert(source)
            }
            stack?.sendDatagram(from: source, to: TCPEndpoint(peer, destination), payload: Array(body[8...]), now: now)
            pump()
        }
    }

    // MARK: The verdict

    private func evaluate() {
        for state in plan.states {
            var reached = false
            var detail = ""
            switch state {
            case .lcpOpened:
                reached = lcpOpened
                if !reached { detail = "ours never opened" }
            case let .authenticated(name):
                reached = authenticatedName != nil && (plan.role == .terminal || authenticatedName == name || name.isEmpty)
                if !reached { detail = authenticatedName.map { "ours authenticated \"\(PeerText.escaped($0))\"" } ?? "ours did not authenticate" }
            case let .ipcpOpened(l, r):
                if let result = ipcpResult {
                    reached = result.localAddress == l && result.peerAddress == r
                    if !reached { detail = "ours: local \(result.localAddress), peer \(result.peerAddress)" }
                } else {
                    detail = "ours never opened"
                }
            case let .tcp(c):
                let key = FlowKey(ourPort: c.ourPort, peerPort: c.peerPort)
                guard let flow = flows[key] else {
                    detail = "ours never saw it"
                    break
                }
                let acknowledgedOut = max(0, min(flow.written, flow.sentEnd - 1))
                var ok = flow.established && flow.read >= c.bytesFromPeer && flow.written >= c.bytesToPeer && acknowledgedOut >= c.bytesToPeer
                if c.closed && !c.reset { ok = ok && (flow.closed != nil || flow.peerFinished && flow.closeDone) }
                if c.reset { ok = ok && (flow.closed != nil || flow.resetByUs) }
                reached = ok
                if !reached {
                    detail = "ours: " + (flow.established ? "established" : "not established") + ", \(flow.read) B in, \(flow.written) B out"
                        + (flow.closed.map { ", \($0.rawValue)" } ?? "")
                }
            case let .terminated(byUs):
                switch downReason {
                case .peerTerminated?: reached = !byUs
                case .closedByUs?: reached = byUs || acknowledgedPeerTermination
                default: reached = !byUs && acknowledgedPeerTermination
                }
                if !reached { detail = downReason.map { "ours: \($0)" } ?? "ours is still up" }
            }
            report.outcomes.append(StateOutcome(state: state, reached: reached, detail: detail))
        }
    }
}
