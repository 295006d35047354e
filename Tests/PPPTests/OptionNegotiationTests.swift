import NetStack
import PPP
import Testing

/// A policy for driving the automaton through its table: it acks everything unless told to
/// nak or reject, and requests one option.
struct ScriptedPolicy: NegotiationPolicy {
    var verdict: RequestVerdict = .ack
    var resets = 0
    func handlesExtendedCode(_ code: ControlCode) -> Bool { code == .echoRequest }
    mutating func resetNegotiation() { resets += 1 }
    func requestOptions() -> [ConfigurationOption] { [ConfigurationOption(type: 1, value: [0x05, 0xDC])] }
    mutating func judge(_ options: [ConfigurationOption], mayNak: Bool) -> RequestVerdict {
        if case let .nak(o) = verdict, !mayNak { return .reject(o) }
        return verdict
    }
    mutating func acknowledged(_ options: [ConfigurationOption]) {}
    mutating func peerRefused(_ options: [ConfigurationOption], rejected: Bool) -> Bool { true }
}

typealias Automaton = OptionNegotiator<ScriptedPolicy>

let t0 = Instant.zero
let peerRequest = ControlPacket(code: .configureRequest, identifier: 0x42, data: [1, 4, 0x05, 0xDC])

extension Automaton {
    static func make(_ configuration: NegotiationConfiguration = NegotiationConfiguration()) -> Automaton {
        Automaton(protocolNumber: .lcp, policy: ScriptedPolicy(), configuration: configuration)
    }

    /// Drives the automaton into `target` by a short sequence of real events.
    static func inState(_ target: NegotiationState, _ configuration: NegotiationConfiguration = NegotiationConfiguration()) -> Automaton {
        var a = make(configuration)
        switch target {
        case .initial: break
        case .starting: a.open(now: t0)
        case .closed: a.up(now: t0)
        case .stopped:
            a = inState(.requestSent, configuration)
            while a.state == .requestSent, let d = a.deadline { a.timerExpired(now: d) }
        case .closing:
            a = inState(.requestSent, configuration)
            a.close(now: t0)
        case .stopping:
            a = inState(.closing, configuration)
            a.open(now: t0)
        case .requestSent:
            a.open(now: t0)
            a.up(now: t0)
        case .ackReceived:
            a = inState(.requestSent, configuration)
            a.receive(a.ackOfLastRequest(), now: t0)
        case .ackSent:
            a = inState(.requestSent, configuration)
            a.receive(peerRequest, now: t0)
        case .opened:
            a = inState(.ackSent, configuration)
            a.receive(a.ackOfLastRequest(), now: t0)
        }
        precondition(a.state == target, "could not reach \(target), got \(a.state)")
        _ = a.takeOutputs()
        return a
    }

    /// A Configure-Ack of our latest Configure-Request.
    func ackOfLastRequest() -> ControlPacket {
        ControlPacket(code: .configureAck, identifier: requestIdentifier ?? 0, data: [1, 4, 0x05, 0xDC])
    }
}

/// The table's action names for what the automaton produced.
func actions(_ outputs: [NegotiationOutput]) -> [String] {
    outputs.map { o in
        switch o {
        case let .send(p):
            switch p.code {
            case .configureRequest: return "scr"
            case .configureAck: return "sca"
            case .configureNak, .configureReject: return "scn"
            case .terminateRequest: return "str"
            case .terminateAck: return "sta"
            case .codeReject: return "scj"
            default: return "send code \(p.code)"
            }
        case .layerUp: return "tlu"
        case .layerDown: return "tld"
        case .layerStarted: return "tls"
        case .layerFinished: return "tlf"
        case .extended: return "ser"
        }
    }
}

@Suite struct StateTableTests {
    /// RFC 1661 §4.1, row by row: (event, from state, actions, to state).
    struct Row: CustomStringConvertible, Sendable {
        var event: String
        var from: NegotiationState
        var actions: [String]
        var to: NegotiationState
        var description: String { "\(event) in \(from)" }
    }

    static let rows: [Row] = {
        var r: [Row] = []
        func add(_ e: String, _ f: NegotiationState, _ a: [String], _ t: NegotiationState) { r.append(Row(event: e, from: f, actions: a, to: t)) }
        // Up
        add("Up", .initial, [], .closed); add("Up", .starting, ["scr"], .requestSent)
        // Down
        add("Down", .closed, [], .initial); add("Down", .stopped, ["tls"], .starting); add("Down", .closing, [], .initial)
        add("Down", .stopping, [], .starting); add("Down", .requestSent, [], .starting); add("Down", .ackReceived, [], .starting)
        add("Down", .ackSent, [], .starting); add("Down", .opened, ["tld"], .starting)
        // Open
        add("Open", .initial, ["tls"], .starting); add("Open", .starting, [], .starting); add("Open", .closed, ["scr"], .requestSent)
        add("Open", .stopped, [], .stopped); add("Open", .closing, [], .stopping); add("Open", .stopping, [], .stopping)
        add("Open", .requestSent, [], .requestSent); add("Open", .ackReceived, [], .ackReceived); add("Open", .ackSent, [], .ackSent)
        add("Open", .opened, [], .opened)
        // Close
        add("Close", .initial, [], .initial); add("Close", .starting, ["tlf"], .initial); add("Close", .closed, [], .closed)
        add("Close", .stopped, [], .closed); add("Close", .closing, [], .closing); add("Close", .stopping, [], .closing)
        add("Close", .requestSent, ["str"], .closing); add("Close", .ackReceived, ["str"], .closing)
        add("Close", .ackSent, ["str"], .closing); add("Close", .opened, ["tld", "str"], .closing)
        // TO+
        add("TO+", .closing, ["str"], .closing); add("TO+", .stopping, ["str"], .stopping); add("TO+", .requestSent, ["scr"], .requestSent)
        add("TO+", .ackReceived, ["scr"], .requestSent); add("TO+", .ackSent, ["scr"], .ackSent)
        // TO-
        add("TO-", .closing, ["tlf"], .closed); add("TO-", .stopping, ["tlf"], .stopped); add("TO-", .requestSent, ["tlf"], .stopped)
        add("TO-", .ackReceived, ["tlf"], .stopped); add("TO-", .ackSent, ["tlf"], .stopped)
        // RCR+
        add("RCR+", .closed, ["sta"], .closed); add("RCR+", .stopped, ["scr", "sca"], .ackSent); add("RCR+", .closing, [], .closing)
        add("RCR+", .stopping, [], .stopping); add("RCR+", .requestSent, ["sca"], .ackSent); add("RCR+", .ackReceived, ["sca", "tlu"], .opened)
        add("RCR+", .ackSent, ["sca"], .ackSent); add("RCR+", .opened, ["tld", "scr", "sca"], .ackSent)
        // RCR-
        add("RCR-", .closed, ["sta"], .closed); add("RCR-", .stopped, ["scr", "scn"], .requestSent); add("RCR-", .closing, [], .closing)
        add("RCR-", .stopping, [], .stopping); add("RCR-", .requestSent, ["scn"], .requestSent); add("RCR-", .ackReceived, ["scn"], .ackReceived)
        add("RCR-", .ackSent, ["scn"], .requestSent); add("RCR-", .opened, ["tld", "scr", "scn"], .requestSent)
        // RCA
        add("RCA", .closed, ["sta"], .closed); add("RCA", .stopped, ["sta"], .stopped); add("RCA", .closing, [], .closing)
        add("RCA", .stopping, [], .stopping); add("RCA", .requestSent, [], .ackReceived); add("RCA", .ackReceived, ["scr"], .requestSent)
        add("RCA", .ackSent, ["tlu"], .opened); add("RCA", .opened, ["tld", "scr"], .requestSent)
        // RCN
        add("RCN", .closed, ["sta"], .closed); add("RCN", .stopped, ["sta"], .stopped); add("RCN", .closing, [], .closing)
        add("RCN", .stopping, [], .stopping); add("RCN", .requestSent, ["scr"], .requestSent); add("RCN", .ackReceived, ["scr"], .requestSent)
        add("RCN", .ackSent, ["scr"], .ackSent); add("RCN", .opened, ["tld", "scr"], .requestSent)
        // RTR
        add("RTR", .closed, ["sta"], .closed); add("RTR", .stopped, ["sta"], .stopped); add("RTR", .closing, ["sta"], .closing)
        add("RTR", .stopping, ["sta"], .stopping); add("RTR", .requestSent, ["sta"], .requestSent); add("RTR", .ackReceived, ["sta"], .requestSent)
        add("RTR", .ackSent, ["sta"], .requestSent); add("RTR", .opened, ["tld", "sta"], .stopping)
        // RTA
        add("RTA", .closed, [], .closed); add("RTA", .stopped, [], .stopped); add("RTA", .closing, ["tlf"], .closed)
        add("RTA", .stopping, ["tlf"], .stopped); add("RTA", .requestSent, [], .requestSent); add("RTA", .ackReceived, [], .requestSent)
        add("RTA", .ackSent, [], .ackSent); add("RTA", .opened, ["tld", "scr"], .requestSent)
        // RUC
        for s in [NegotiationState.closed, .stopped, .closing, .stopping, .requestSent, .ackReceived, .ackSent, .opened] {
            add("RUC", s, ["scj"], s)
        }
        // RXJ+
        for (s, t) in [(NegotiationState.closed, NegotiationState.closed), (.stopped, .stopped), (.closing, .closing), (.stopping, .stopping),
                       (.requestSent, .requestSent), (.ackReceived, .requestSent), (.ackSent, .ackSent), (.opened, .opened)] {
            add("RXJ+", s, [], t)
        }
        // RXJ-
        add("RXJ-", .closed, ["tlf"], .closed); add("RXJ-", .stopped, ["tlf"], .stopped); add("RXJ-", .closing, ["tlf"], .closed)
        add("RXJ-", .stopping, ["tlf"], .stopped); add("RXJ-", .requestSent, ["tlf"], .stopped); add("RXJ-", .ackReceived, ["tlf"], .stopped)
        add("RXJ-", .ackSent, ["tlf"], .stopped); add("RXJ-", .opened, ["tld", "str"], .stopping)
        // RXR
        for s in [NegotiationState.closed, .stopped, .closing, .stopping, .requestSent, .ackReceived, .ackSent] { add("RXR", s, [], s) }
        add("RXR", .opened, ["ser"], .opened)
        return r
    }()

    @Test(arguments: rows)
    func transition(_ row: Row) throws {
        // TO- rows start with the restart counter already spent (Max-Configure and
        // Max-Terminate of zero); every other row with the RFC's defaults.
        var exhausted = NegotiationConfiguration()
        exhausted.maxConfigure = 0
        exhausted.maxTerminate = 0
        var a = Automaton.inState(row.from, row.event == "TO-" ? exhausted : NegotiationConfiguration())
        switch row.event {
        case "Up": a.up(now: t0)
        case "Down": a.down(now: t0)
        case "Open": a.open(now: t0)
        case "Close": a.close(now: t0)
        case "TO+":
            #expect(a.restartCounter > 0)
            a.timerExpired(now: try #require(a.deadline))
        case "TO-":
            #expect(a.restartCounter <= 0)
            a.timerExpired(now: try #require(a.deadline))
        case "RCR+": a.receive(peerRequest, now: t0)
        case "RCR-":
            a.policy.verdict = .nak([ConfigurationOption(type: 1, value: [0x05, 0xDC])])
            a.receive(peerRequest, now: t0)
        case "RCA":
            a.receive(a.state == .closed || a.state == .stopped || a.state == .closing || a.state == .stopping
                      ? ControlPacket(code: .configureAck, identifier: 1, data: []) : a.ackOfLastRequest(), now: t0)
        case "RCN": a.receive(ControlPacket(code: .configureNak, identifier: a.requestIdentifier ?? 0, data: [1, 4, 0x05, 0xDC]), now: t0)
        case "RTR": a.receive(ControlPacket(code: .terminateRequest, identifier: 7), now: t0)
        case "RTA": a.receive(ControlPacket(code: .terminateAck, identifier: 7), now: t0)
        case "RUC": a.receive(ControlPacket(code: ControlCode(77), identifier: 7), now: t0)
        case "RXJ+": a.receive(ControlPacket(code: .codeReject, identifier: 7, data: [9, 1, 0, 4]), now: t0)
        case "RXJ-": a.receive(ControlPacket(code: .codeReject, identifier: 7, data: [1, 1, 0, 4]), now: t0)
        case "RXR": a.receive(ControlPacket(code: .echoRequest, identifier: 7, data: [0, 0, 0, 0]), now: t0)
        default: Issue.record("unknown event \(row.event)")
        }
        #expect(a.state == row.to, "\(row)")
        #expect(actions(a.takeOutputs()) == row.actions, "\(row)")
    }
}

@Suite struct ConvergenceTests {
    @Test func nakLoopsEndInRejectAfterMaxFailure() {
        // A peer that ignores our Naks and sends the same request again and again.
        var a = Automaton.inState(.requestSent)
        a.policy.verdict = .nak([ConfigurationOption(type: 1, value: [0x05, 0xDC])])
        var answers: [ControlCode] = []
        for id in UInt8(1)...8 {
            a.receive(ControlPacket(code: .configureRequest, identifier: id, data: [1, 4, 0x05, 0xDC]), now: t0)
            for case let .send(p) in a.takeOutputs() { answers.append(p.code) }
        }
        // Max-Failure (5) Naks, then Rejects.
        #expect(answers == [.configureNak, .configureNak, .configureNak, .configureNak, .configureNak,
                            .configureReject, .configureReject, .configureReject])
    }

    @Test func sendingAnAckResetsTheFailureCount() {
        var a = Automaton.inState(.requestSent)
        a.policy.verdict = .nak([ConfigurationOption(type: 1, value: [0x05, 0xDC])])
        for id in UInt8(1)...4 { a.receive(ControlPacket(code: .configureRequest, identifier: id, data: [1, 4, 0x05, 0xDC]), now: t0) }
        a.policy.verdict = .ack
        a.receive(ControlPacket(code: .configureRequest, identifier: 5, data: [1, 4, 0x05, 0xDC]), now: t0)
        #expect(a.failureCounter == 0)
    }

    @Test func lostRequestsAreRetransmittedEveryRestartInterval() {
        var a = Automaton.inState(.requestSent)
        var times: [Instant] = []
        while let d = a.deadline, a.state == .requestSent {
            a.timerExpired(now: d)
            if a.takeOutputs().contains(where: { if case let .send(p) = $0 { return p.code == .configureRequest }; return false }) { times.append(d) }
        }
        // Nine retransmissions 3 s apart after the first request, then Stopped at 30 s.
        #expect(times == (1...9).map { Instant.seconds(3.0 * Double($0)) })
        #expect(a.state == .stopped)
    }
}
