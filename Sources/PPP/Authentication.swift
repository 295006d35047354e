import Framing
import Crypto
import Wire

/// A name and secret (pppd's `user` and `password`, or a line of pap-secrets/chap-secrets).
public struct Credentials: Sendable, Equatable {
    public var name: String
    public var secret: String
    public init(name: String, secret: String) {
        self.name = name
        self.secret = secret
    }
}

public struct AuthenticationConfiguration: Sendable, Equatable {
    /// What we authenticate ourselves with when the peer asks.
    public var local: Credentials?
    /// Whom we accept when we require the peer to authenticate.
    public var peers: [Credentials] = []
    /// Our name in CHAP Challenges (pppd's `name`).
    public var localName = "pppbridge"
    /// Retransmission of Authenticate-Requests and Challenges (pppd's pap/chap-restart).
    public var restartInterval: Duration = .seconds(3)
    public var maxTransmissions = 10
    /// How long we wait for the peer to authenticate (pppd's pap-timeout).
    public var peerTimeout: Duration = .seconds(30)

    public init() {}
}

/// PAP (RFC 1334) and CHAP-MD5 (RFC 1994) in both directions for the Authenticate phase.
public struct Authenticator: Sendable {
    public enum Outcome: Sendable, Equatable {
        case succeeded(peerName: String?)
        case failed(String)
    }

    public let configuration: AuthenticationConfiguration
    /// We authenticate ourselves with this protocol.
    public let local: AuthenticationProtocol?
    /// The peer authenticates with this protocol.
    public let peer: AuthenticationProtocol?
    public private(set) var outcome: Outcome?
    private var localDone = false
    private var peerName: String?
    private var peerDone = false
    /// The identifier, count and timer of one kind of request we repeat until answered.
    struct Retransmission: Sendable {
        var identifier: UInt8
        var transmissions = 0
        var at: Instant?

        /// Takes the next identifier for a (re)transmission at `now`.
        mutating func next(now: Instant, interval: Duration) -> UInt8 {
            identifier &+= 1
            transmissions += 1
            at = now + interval
            return identifier
        }

        /// True when the timer has fired (and clears it).
        mutating func due(_ now: Instant) -> Bool {
            guard let t = at, now >= t else { return false }
            at = nil
            return true
        }
    }

    // PAP requests and CHAP challenges each have their own identifiers and timers: we may be
    // authenticating ourselves with one while the peer answers the other.
    private var papRequests = Retransmission(identifier: 0)
    private var chapChallenges = Retransmission(identifier: 0x40)
    private var peerDeadline: Instant?
    private let challenge: [UInt8]
    private var outputs: [(ProtocolNumber, ControlPacket)] = []

    /// The length of our CHAP challenges: MD5's output size, as pppd uses.
    public static let challengeLength = 16

    /// - Parameter challenge: the value of our CHAP Challenge, fresh from the link's random
    ///   source (RFC 1994 §2.3: challenges must be unpredictable and never repeat).
    public init(configuration: AuthenticationConfiguration, local: AuthenticationProtocol?, peer: AuthenticationProtocol?,
                challenge: [UInt8]) {
        self.configuration = configuration
        self.local = local
        self.peer = peer
        self.challenge = challenge
        localDone = local == nil
        peerDone = peer == nil
    }

    public var deadline: Instant? { outcome == nil ? earliest(papRequests.at, chapChallenges.at, peerDeadline) : nil }

    public mutating func takeOutputs() -> [(ProtocolNumber, ControlPacket)] {
        defer { outputs = [] }
        return outputs
    }

    public mutating func start(now: Instant) {
        if peer != nil { peerDeadline = now + configuration.peerTimeout }
        if local == .pap { sendPAPRequest(now: now) }
        if peer == .chapMD5 { sendChallenge(now: now) }
        finishIfDone()
    }

    public mutating func timerExpired(now: Instant) {
        guard outcome == nil else { return }
        if let d = peerDeadline, now >= d {
            fail("peer did not authenticate within \(configuration.peerTimeout)")
            return
        }
        if papRequests.due(now) {
            guard papRequests.transmissions < configuration.maxTransmissions else { return fail("no answer to PAP Authenticate-Request") }
            sendPAPRequest(now: now)
        }
        if chapChallenges.due(now) {
            guard chapChallenges.transmissions < configuration.maxTransmissions else { return fail("no answer to CHAP Challenge") }
            sendChallenge(now: now)
        }
    }

    /// A PAP or CHAP packet from the peer.
    public mutating func receive(protocol proto: ProtocolNumber, _ packet: ControlPacket, now: Instant) {
        switch proto {
        case ProtocolNumber.pap:
            guard let pap = try? PAPPacket(packet, lenient: true) else { return }
            receivePAP(pap)
        case ProtocolNumber.chap:
            guard let chap = try? CHAPPacket(packet) else { return }
            receiveCHAP(chap)
        default: return
        }
        finishIfDone()
    }

    private mutating func receivePAP(_ pap: PAPPacket) {
        switch pap {
        case let .authenticateRequest(id, peerID, password):
            guard peer == .pap else { return }
            // The name is compared as the bytes it is and only printed escaped.
            let name = PeerText.event(peerID)
            let ok = configuration.peers.contains {
                Array($0.name.utf8) == peerID && Digest.constantTimeEqual(Array($0.secret.utf8), password)
            }
            // RFC 1334 §2.2.1: a repeated request after success is acknowledged again.
            send(ok ? PAPPacket.authenticateAck(identifier: id, message: Array("Login ok".utf8))
                    : PAPPacket.authenticateNak(identifier: id, message: Array("Login incorrect".utf8)))
            if ok {
                peerDone = true
                peerName = name
                peerDeadline = nil
            } else if outcome == nil {
                fail("peer \"\(name)\" failed PAP authentication")
            }
        case let .authenticateAck(id, _):
            guard local == .pap, !localDone, id == papRequests.identifier else { return }
            localDone = true
            papRequests.at = nil
        case let .authenticateNak(id, message):
            guard local == .pap, !localDone, id == papRequests.identifier else { return }
            fail("PAP authentication refused by the peer" + (message.isEmpty ? "" : ": \"\(PeerText.event(message))\""))
        }
    }

    private mutating func receiveCHAP(_ chap: CHAPPacket) {
        switch chap {
        case let .challenge(id, value, _):
            guard local == .chapMD5, let credentials = configuration.local else { return }
            // RFC 1994 §4.1: MD5 over identifier, secret and challenge.
            let response = Digest.md5([id], Array(credentials.secret.utf8), value)
            send(CHAPPacket.response(identifier: id, value: response, name: Array(credentials.name.utf8)))
        case let .response(id, value, nameBytes):
            guard peer == .chapMD5, id == chapChallenges.identifier, !challenge.isEmpty else { return }
            let name = PeerText.event(nameBytes)
            let ok = configuration.peers.contains {
                Array($0.name.utf8) == nameBytes && Digest.constantTimeEqual(Digest.md5([id], Array($0.secret.utf8), challenge), value)
            }
            send(ok ? CHAPPacket.success(identifier: id, message: Array("Access granted".utf8))
                    : CHAPPacket.failure(identifier: id, message: Array("Access denied".utf8)))
            if ok {
                peerDone = true
                peerName = name
                chapChallenges.at = nil
                peerDeadline = nil
            } else if outcome == nil {
                fail("peer \"\(name)\" failed CHAP authentication")
            }
        case .success:
            guard local == .chapMD5 else { return }
            localDone = true
        case let .failure(_, message):
            guard local == .chapMD5, !localDone else { return }
            fail("CHAP authentication refused by the peer" + (message.isEmpty ? "" : ": \"\(PeerText.event(message))\""))
        }
    }

    private mutating func sendPAPRequest(now: Instant) {
        guard let credentials = configuration.local else {
            fail("the peer requires PAP and no credentials are configured")
            return
        }
        let id = papRequests.next(now: now, interval: configuration.restartInterval)
        send(PAPPacket.authenticateRequest(identifier: id, peerID: Array(credentials.name.utf8), password: Array(credentials.secret.utf8)))
    }

    private mutating func sendChallenge(now: Instant) {
        let id = chapChallenges.next(now: now, interval: configuration.restartInterval)
        send(CHAPPacket.challenge(identifier: id, value: challenge, name: Array(configuration.localName.utf8)))
    }

    /// Queues a packet; one that cannot be written (a configured name or secret past its
    /// one-byte length) ends authentication with the reason instead of trapping.
    private mutating func send(_ pap: PAPPacket) {
        do throws(WireError) {
            outputs.append((ProtocolNumber.pap, try pap.packet))
        } catch {
            fail("cannot send PAP: \(error)")
        }
    }

    private mutating func send(_ chap: CHAPPacket) {
        do throws(WireError) {
            outputs.append((ProtocolNumber.chap, try chap.packet))
        } catch {
            fail("cannot send CHAP: \(error)")
        }
    }

    private mutating func fail(_ reason: String) {
        guard outcome == nil else { return }
        outcome = .failed(reason)
    }

    private mutating func finishIfDone() {
        if outcome == nil && localDone && peerDone {
            outcome = .succeeded(peerName: peerName)
        }
    }
}
