import Crypto
import Payment
import Wire

/// The gateway queue: one request at a time, each with its deadline, sent directly (through
/// the host's proxy) or relayed by the host; answers and failures go to what asked.
extension TerminalCore {
    // MARK: Gateway exchanges

    func enqueueGateway(_ purpose: GatewayPurpose, _ request: JSONValue, hostRelay: Bool = false, timeout: Duration, now: Instant) {
        if case .authorise = purpose { lastSession = transaction?.origin ?? session }
        gatewayQueue.append(GatewayRequest(purpose: purpose, payload: request.serialized, hostRelay: hostRelay, timeout: timeout))
        if gatewayInFlight == nil { startNextGatewayRequest(now: now) }
    }

    func startNextGatewayRequest(now: Instant) {
        guard gatewayInFlight == nil, !gatewayQueue.isEmpty else { return }
        let next = gatewayQueue.removeFirst()
        gatewayInFlight = next
        gatewayDeadline = now + next.timeout
        if next.hostRelay {
            deviceRequest(.transmit, body: ["Message": .string(Base64.encode(next.payload)), "WaitResponseFlag": true,
                                            "MaximumTransmitTime": .integer(next.timeout.components.seconds),
                                            "DestinationAddress": .string(configuration.gatewayAddress)])
        } else {
            outputs.append(.gateway(next.payload))
        }
    }

    /// The gateway's answer to the request in flight.
    public func receive(gatewayPayload payload: [UInt8], now: Instant) {
        guard let inFlight = gatewayInFlight else { return }
        gatewayInFlight = nil
        gatewayDeadline = nil
        let answer = try? JSONParser.parse(payload)
        complete(inFlight.purpose, answer, now: now)
        startNextGatewayRequest(now: now)
    }

    /// The request in flight got no answer (connection refused or closed, or its time ran out).
    public func gatewayDidFail(now: Instant) {
        guard let inFlight = gatewayInFlight else { return }
        gatewayInFlight = nil
        gatewayDeadline = nil
        record("gateway unreachable")
        complete(inFlight.purpose, nil, now: now)
        startNextGatewayRequest(now: now)
    }

    func complete(_ purpose: GatewayPurpose, _ answer: JSONValue?, now: Instant) {
        switch purpose {
        case .authorise:
            if let answer { authoriseAnswered(answer, now: now) } else {
                finishPayment(status: .failure(.unreachableHost, [("code", "3003")]), now: now)
            }
        case .reverse: reverseAnswered(answer, now: now)
        case .updateCheck:
            if let answer, answer["Available"]?.bool == true, let offer = UpdateOffer(json: answer["Update"]),
               UpdateOffer.isNewer(offer.version, than: configuration.softwareVersion) {
                availableUpdate = offer
            } else if answer != nil {
                availableUpdate = nil
            }
            completeLogin(now: now)
        case .updateChunk: chunkAnswered(answer, now: now)
        case .ping(let h): answerDiagnosis(h, reachable: answer?["Type"]?.string == "Pong")
        }
    }
}
