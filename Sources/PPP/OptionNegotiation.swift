import Framing
import Wire

/// The states of the RFC 1661 §4.2 option negotiation automaton.
public enum NegotiationState: Int, Sendable, CustomStringConvertible {
    case initial, starting, closed, stopped, closing, stopping, requestSent, ackReceived, ackSent, opened

    public var description: String {
        ["Initial", "Starting", "Closed", "Stopped", "Closing", "Stopping", "Req-Sent", "Ack-Rcvd", "Ack-Sent", "Opened"][rawValue]
    }
}

/// Counters and timers of RFC 1661 §4.6.
public struct NegotiationConfiguration: Sendable, Equatable {
    public var restartInterval: Duration = .seconds(3)
    public var maxTerminate = 2
    public var maxConfigure = 10
    public var maxFailure = 5
    /// RFC 1661 §4.2 "passive": after Configure-Requests time out, wait in Stopped for the peer
    /// instead of finishing (pppd's `passive`).
    public var passive = false

    public init() {}
}

/// What an option-negotiating protocol (LCP, IPCP, ...) decides; the automaton does the rest.
public protocol NegotiationPolicy: Sendable {
    /// Codes beyond 1–7 this protocol handles itself (RXR events), e.g. LCP's Echo.
    func handlesExtendedCode(_ code: ControlCode) -> Bool
    /// Called before each new negotiation (irc after Open or Up): back to the configured wishes.
    mutating func resetNegotiation()
    /// The options of our next Configure-Request.
    func requestOptions() -> [ConfigurationOption]
    /// Judges the peer's Configure-Request; `mayNak` is false once Max-Failure Naks were sent
    /// without an Ack, and Naks must then become Rejects (RFC 1661 §4.6).
    mutating func judge(_ options: [ConfigurationOption], mayNak: Bool) -> RequestVerdict
    /// The peer acknowledged `options` (exactly what we sent).
    mutating func acknowledged(_ options: [ConfigurationOption])
    /// The peer Nak'd (`rejected` false) or Rejected options; returns false if the packet is
    /// invalid and must be ignored.
    mutating func peerRefused(_ options: [ConfigurationOption], rejected: Bool) -> Bool
}

/// The answer to a Configure-Request (RFC 1661 §5.2–5.4: Reject beats Nak beats Ack).
public enum RequestVerdict: Sendable, Equatable {
    case ack
    case nak([ConfigurationOption])
    case reject([ConfigurationOption])
}

/// What the automaton asks its owner to do (RFC 1661 §4.4 actions that leave the automaton).
public enum NegotiationOutput: Sendable, Equatable {
    case send(ControlPacket)
    /// tlu: the layer is up.
    case layerUp
    /// tld: the layer is leaving Opened.
    case layerDown
    /// tls: the layer needs the lower layer (LCP asks for the physical layer).
    case layerStarted
    /// tlf: the layer is finished with the lower layer.
    case layerFinished(FinishReason)
    /// A packet of a code `handlesExtendedCode` accepted, received in Opened (RXR).
    case extended(ControlPacket)
}

/// Why a layer finished.
public enum FinishReason: Sendable, Equatable {
    /// Close was asked for and the Terminate exchange ended (or timed out).
    case closed
    /// The peer sent Terminate-Request.
    case peerTerminated(String)
    /// Configure-Requests went unanswered Max-Configure times.
    case noResponse
    /// A Code-Reject or Protocol-Reject the layer cannot live with (RXJ-).
    case rejected(String)
    /// The lower layer went down in a state that finishes.
    case lowerLayerDown
}

/// One RFC 1661 automaton: all ten states and every event of the §4.1 state-transition table.
/// Time is an input: the owner calls `timerExpired(now:)` when `deadline` has passed.
public struct OptionNegotiator<Policy: NegotiationPolicy>: Sendable {
    public let protocolNumber: ProtocolNumber
    public var configuration: NegotiationConfiguration
    public var policy: Policy
    public private(set) var state: NegotiationState = .initial
    /// When the restart timer fires; nil while it is stopped.
    public private(set) var deadline: Instant?
    public private(set) var restartCounter = 0
    /// Configure-Naks sent since the last Configure-Ack we sent.
    public private(set) var failureCounter = 0
    private var identifier: UInt8 = 0
    private var sentRequest: (id: UInt8, options: [ConfigurationOption])?
    private var terminateReason: FinishReason = .closed
    private var outputs: [NegotiationOutput] = []

    /// The largest information field the peer takes (LCP's result; 1500 until then). Our
    /// answers are cut to fit it (RFC 1661 §5.3, §5.4, §5.6).
    public var peerMRU = 1500
    /// Packets not sent because an option in them did not fit its Length octet (only a
    /// configuration can cause it: every option the peer sent fits).
    public private(set) var unsendablePackets = 0

    /// The identifier of our latest Configure-Request: the one an answer must carry.
    public var requestIdentifier: UInt8? { sentRequest?.id }

    public init(protocolNumber: ProtocolNumber, policy: Policy, configuration: NegotiationConfiguration = NegotiationConfiguration()) {
        self.protocolNumber = protocolNumber
        self.policy = policy
        self.configuration = configuration
    }

    /// Takes what the automaton produced since the last call.
    public mutating func takeOutputs() -> [NegotiationOutput] {
        defer { outputs = [] }
        return outputs
    }

    // MARK: Events from the owner (RFC 1661 §4.3)

    /// Up: the lower layer is ready.
    public mutating func up(now: Instant) {
        switch state {
        case .initial: state = .closed
        case .starting:
            initializeRestartCount(configuration.maxConfigure)
            sendConfigureRequest(now: now)
            state = .requestSent
        default: break
        }
    }

    /// Down: the lower layer is gone.
    public mutating func down(now: Instant) {
        switch state {
        case .closed, .closing: state = .initial
        case .stopped:
            outputs.append(.layerStarted)
            state = .starting
        case .stopping, .requestSent, .ackReceived, .ackSent: state = .starting
        case .opened:
            outputs.append(.layerDown)
            state = .starting
        case .initial, .starting: break
        }
        if state == .initial || state == .starting { deadline = nil }
    }

    /// Open: the administrator allows the link.
    public mutating func open(now: Instant) {
        switch state {
        case .initial:
            outputs.append(.layerStarted)
            state = .starting
        case .closed:
            initializeRestartCount(configuration.maxConfigure)
            sendConfigureRequest(now: now)
            state = .requestSent
        case .closing: state = .stopping
        default: break // Starting, Stopped, Stopping, Req-Sent, Ack-Rcvd, Ack-Sent, Opened: no restart option
        }
    }

    /// Close: the administrator wants the link down.
    public mutating func close(now: Instant, reason: String = "") {
        terminateReason = .closed
        switch state {
        case .starting:
            outputs.append(.layerFinished(.closed))
            state = .initial
        case .stopped: state = .closed
        case .stopping: state = .closing
        case .requestSent, .ackReceived, .ackSent, .opened:
            if state == .opened { outputs.append(.layerDown) }
            initializeRestartCount(configuration.maxTerminate)
            sendTerminateRequest(now: now, message: reason)
            state = .closing
        case .initial, .closed, .closing: break
        }
    }

    /// The restart timer expired (TO+ while the counter lasts, TO- after).
    public mutating func timerExpired(now: Instant) {
        guard let d = deadline, now >= d else { return }
        deadline = nil
        if restartCounter > 0 {
            switch state {
            case .closing, .stopping: sendTerminateRequest(now: now, message: "")
            case .requestSent, .ackReceived:
                sendConfigureRequest(now: now)
                state = .requestSent
            case .ackSent: sendConfigureRequest(now: now)
            default: break
            }
        } else {
            switch state {
            case .closing:
                outputs.append(.layerFinished(terminateReason))
                state = .closed
            case .stopping:
                outputs.append(.layerFinished(terminateReason))
                state = .stopped
            case .requestSent, .ackReceived, .ackSent:
                state = .stopped
                if !configuration.passive { outputs.append(.layerFinished(.noResponse)) }
            default: break
            }
        }
    }

    /// RXJ- from outside the packet: LCP received a Protocol-Reject for this protocol.
    public mutating func protocolRejected(now: Instant) {
        rejectEvent(acceptable: false, reason: "Protocol-Reject", now: now)
    }

    // MARK: Receiving

    /// Handles a packet of this protocol. Malformed packets are dropped (returns false).
    @discardableResult
    public mutating func receive(_ packet: ControlPacket, now: Instant) -> Bool {
        switch packet.code {
        case ControlCode.configureRequest:
            guard let options = try? ConfigurationOption.parseList(packet.data) else { return false }
            receiveConfigureRequest(packet.identifier, options, now: now)
        case ControlCode.configureAck, ControlCode.configureNak, ControlCode.configureReject:
            switch state {
            case .initial, .starting, .closing, .stopping: return true
            case .closed, .stopped:
                // sta: a peer still negotiating is told this side is not.
                sendTerminateAck(packet.identifier)
                return true
            default: break
            }
            // Only an answer to our latest request counts; an Ack must repeat it exactly.
            guard let sent = sentRequest, packet.identifier == sent.id,
                  let options = try? ConfigurationOption.parseList(packet.data) else { return false }
            if packet.code == ControlCode.configureAck {
                guard options == sent.options else { return false }
                receiveConfigureAck(options, now: now)
            } else {
                guard policy.peerRefused(options, rejected: packet.code == ControlCode.configureReject) else { return false }
                receiveConfigureNakOrReject(now: now)
            }
        case ControlCode.terminateRequest:
            receiveTerminateRequest(packet, now: now)
        case ControlCode.terminateAck:
            receiveTerminateAck(now: now)
        case ControlCode.codeReject:
            // RFC 1661 §5.6: rejecting one of the codes the automaton needs is catastrophic.
            let rejectedCode = packet.data.first ?? 0
            let fatal = (1...7).contains(rejectedCode)
            rejectEvent(acceptable: !fatal, reason: "Code-Reject of code \(rejectedCode)", now: now)
        default:
            if policy.handlesExtendedCode(packet.code) {
                if state == .opened { outputs.append(.extended(packet)) }
            } else {
                receiveUnknownCode(packet)
            }
        }
        return true
    }

    private mutating func receiveConfigureRequest(_ id: UInt8, _ options: [ConfigurationOption], now: Instant) {
        switch state {
        case .initial, .starting: return
        case .closed:
            sendTerminateAck(id)
            return
        case .closing, .stopping: return
        default: break
        }
        switch state {
        case .stopped:
            // irc, scr first: a new negotiation starts from the configured wishes, and the
            // peer's request is then judged into the fresh state.
            initializeRestartCount(configuration.maxConfigure)
            sendConfigureRequest(now: now)
            let verdict = judge(options)
            answer(id, options, verdict)
            state = verdict == .ack ? .ackSent : .requestSent
        case .requestSent, .ackSent:
            let verdict = judge(options)
            answer(id, options, verdict)
            state = verdict == .ack ? .ackSent : .requestSent
        case .ackReceived:
            let verdict = judge(options)
            answer(id, options, verdict)
            if verdict == .ack {
                outputs.append(.layerUp)
                state = .opened
            }
        case .opened:
            outputs.append(.layerDown)
            sendConfigureRequest(now: now)
            let verdict = judge(options)
            answer(id, options, verdict)
            state = verdict == .ack ? .ackSent : .requestSent
        default: break
        }
    }

    private mutating func judge(_ options: [ConfigurationOption]) -> RequestVerdict {
        let room = max(0, peerMRU - ControlPacket.headerLength)
        let before = policy
        let verdict = policy.judge(options, mayNak: failureCounter < configuration.maxFailure)
        switch verdict {
        case .ack:
            return verdict
        case let .nak(naked):
            guard ConfigurationOption.prefix(naked, fitting: room).count < naked.count else { return verdict }
            // A Nak may be longer than the request it answers (IPCP answers a 4-byte
            // compression option with 6). One that would not fit the peer's MRU is not sent:
            // the options are rejected instead, as after Max-Failure (RFC 1661 §5.3, §4.6), and
            // the judgement is made afresh so that nothing the Nak decided sticks.
            policy = before
            return fitted(policy.judge(options, mayNak: false), room: room)
        case .reject:
            return fitted(verdict, room: room)
        }
    }

    /// A Reject cut to the options that fit the peer's MRU (RFC 1661 §5.4: the peer asks again
    /// and the rest is rejected then); its first option stays whatever its size, since a packet
    /// that large came from the peer.
    private func fitted(_ verdict: RequestVerdict, room: Int) -> RequestVerdict {
        guard case let .reject(rejected) = verdict else { return verdict }
        let kept = ConfigurationOption.prefix(rejected, fitting: room)
        return .reject(kept.isEmpty ? Array(rejected.prefix(1)) : kept)
    }

    private mutating func receiveConfigureAck(_ options: [ConfigurationOption], now: Instant) {
        switch state {
        case .requestSent:
            policy.acknowledged(options)
            initializeRestartCount(configuration.maxConfigure)
            state = .ackReceived
        case .ackReceived:
            // Crossed connection (x): start over.
            sendConfigureRequest(now: now)
            state = .requestSent
        case .ackSent:
            policy.acknowledged(options)
            initializeRestartCount(configuration.maxConfigure)
            outputs.append(.layerUp)
            state = .opened
        case .opened:
            outputs.append(.layerDown)
            sendConfigureRequest(now: now)
            state = .requestSent
        default: break
        }
    }

    private mutating func receiveConfigureNakOrReject(now: Instant) {
        switch state {
        case .requestSent:
            initializeRestartCount(configuration.maxConfigure)
            sendConfigureRequest(now: now)
        case .ackReceived:
            sendConfigureRequest(now: now)
            state = .requestSent
        case .ackSent:
            initializeRestartCount(configuration.maxConfigure)
            sendConfigureRequest(now: now)
        case .opened:
            outputs.append(.layerDown)
            sendConfigureRequest(now: now)
            state = .requestSent
        default: break
        }
    }

    private mutating func receiveTerminateRequest(_ packet: ControlPacket, now: Instant) {
        let message = PeerText.event(packet.data)
        switch state {
        case .initial, .starting: return
        case .closed, .stopped, .closing, .stopping:
            sendTerminateAck(packet.identifier)
        case .requestSent, .ackReceived, .ackSent:
            sendTerminateAck(packet.identifier)
            state = .requestSent
        case .opened:
            outputs.append(.layerDown)
            // zrc: wait one restart interval before finishing, so the Ack can get out.
            restartCounter = 0
            deadline = now + configuration.restartInterval
            terminateReason = .peerTerminated(message)
            sendTerminateAck(packet.identifier)
            state = .stopping
        }
    }

    private mutating func receiveTerminateAck(now: Instant) {
        switch state {
        case .closing:
            deadline = nil
            outputs.append(.layerFinished(terminateReason))
            state = .closed
        case .stopping:
            deadline = nil
            outputs.append(.layerFinished(terminateReason))
            state = .stopped
        case .ackReceived: state = .requestSent
        case .opened:
            outputs.append(.layerDown)
            sendConfigureRequest(now: now)
            state = .requestSent
        default: break
        }
    }

    private mutating func receiveUnknownCode(_ packet: ControlPacket) {
        guard state != .initial && state != .starting else { return }
        // scj: the rejected packet, cut to fit the peer's MRU (RFC 1661 §5.6). A parsed packet
        // always fits its own Length field, so it can always be written back.
        guard let original = try? packet.emit() else { return }
        let rejected = Array(original.prefix(max(0, peerMRU - ControlPacket.headerLength)))
        identifier &+= 1
        outputs.append(.send(ControlPacket(code: ControlCode.codeReject, identifier: identifier, data: rejected)))
    }

    private mutating func rejectEvent(acceptable: Bool, reason: String, now: Instant) {
        if acceptable {
            if state == .ackReceived { state = .requestSent }
            return
        }
        switch state {
        case .closed, .closing:
            deadline = nil
            outputs.append(.layerFinished(.rejected(reason)))
            state = .closed
        case .stopped, .stopping, .requestSent, .ackReceived, .ackSent:
            deadline = nil
            outputs.append(.layerFinished(.rejected(reason)))
            state = .stopped
        case .opened:
            outputs.append(.layerDown)
            initializeRestartCount(configuration.maxTerminate)
            terminateReason = .rejected(reason)
            sendTerminateRequest(now: now, message: "")
            state = .stopping
        case .initial, .starting: break
        }
    }

    // MARK: Actions (RFC 1661 §4.4)

    private mutating func initializeRestartCount(_ value: Int) {
        restartCounter = value
    }

    /// scr
    private mutating func sendConfigureRequest(now: Instant) {
        // Outside Req-Sent, Ack-Rcvd and Ack-Sent this starts a new negotiation: back to the
        // configured wishes (a retransmission or an answer to a Nak keeps what was learnt).
        if sentRequest == nil || ![.requestSent, .ackReceived, .ackSent].contains(state) {
            policy.resetNegotiation()
            failureCounter = 0
        }
        identifier &+= 1
        let options = policy.requestOptions()
        sentRequest = (identifier, options)
        send(ControlCode.configureRequest, identifier, options)
        restartCounter -= 1
        deadline = now + configuration.restartInterval
    }

    /// sca / scn (a Reject too).
    private mutating func answer(_ id: UInt8, _ options: [ConfigurationOption], _ verdict: RequestVerdict) {
        switch verdict {
        case .ack:
            failureCounter = 0
            send(ControlCode.configureAck, id, options)
        case let .nak(naked):
            failureCounter += 1
            send(ControlCode.configureNak, id, naked)
        case let .reject(rejected):
            send(ControlCode.configureReject, id, rejected)
        }
    }

    private mutating func send(_ code: ControlCode, _ id: UInt8, _ options: [ConfigurationOption]) {
        guard let data = try? ConfigurationOption.emitList(options) else {
            unsendablePackets += 1
            return
        }
        outputs.append(.send(ControlPacket(code: code, identifier: id, data: data)))
    }

    /// str
    private mutating func sendTerminateRequest(now: Instant, message: String) {
        identifier &+= 1
        let data = Array(message.utf8.prefix(max(0, peerMRU - ControlPacket.headerLength)))
        outputs.append(.send(ControlPacket(code: ControlCode.terminateRequest, identifier: identifier, data: data)))
        restartCounter -= 1
        deadline = now + configuration.restartInterval
    }

    /// sta
    private mutating func sendTerminateAck(_ id: UInt8) {
        outputs.append(.send(ControlPacket(code: ControlCode.terminateAck, identifier: id)))
    }
}
