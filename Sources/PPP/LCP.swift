import Framing
import Wire

/// The authentication protocols this project speaks.
public enum AuthenticationProtocol: String, Sendable, Equatable, Hashable, CaseIterable {
    case pap
    /// CHAP with MD5 (RFC 1994, algorithm 5).
    case chapMD5 = "chap-md5"

    /// Most preferred first: PAP sends the password in the clear (RFC 1334 §2), CHAP never
    /// sends the secret (RFC 1994 §2), so CHAP is asked for and suggested before PAP whenever
    /// both would do, as pppd does.
    public static let preference: [AuthenticationProtocol] = [.chapMD5, .pap]

    /// The most preferred of `candidates`.
    static func preferred(_ candidates: some Sequence<AuthenticationProtocol>) -> AuthenticationProtocol? {
        let offered = Set(candidates)
        return preference.first(where: offered.contains)
    }

    var option: LCPOption {
        switch self {
        case .pap: return .authenticationProtocol(ProtocolNumber.pap, data: [])
        case .chapMD5: return .authenticationProtocol(ProtocolNumber.chap, data: [5])
        }
    }

    init?(_ option: LCPOption) {
        switch option {
        case .authenticationProtocol(ProtocolNumber.pap, data: []): self = .pap
        case .authenticationProtocol(ProtocolNumber.chap, data: [5]): self = .chapMD5
        default: return nil
        }
    }
}

extension Set where Element == AuthenticationProtocol {
    /// One required protocol: `requireAuthentication = .pap`.
    public static var pap: Self { [.pap] }
    public static var chapMD5: Self { [.chapMD5] }
}

/// What we ask for and accept in LCP (pppd's option names in the comments).
public struct LCPConfiguration: Sendable, Equatable {
    /// The largest MRU we ask for or use, either way (pppd's MAXMRU). RFC 1661 §6.1 allows up
    /// to 65535, but a control packet that large could not be answered: a Configure-Nak can be
    /// half as long again as the request it answers and must still fit a 16-bit length. An
    /// IPv4 link on a serial line never needs more, and the receive buffer stays small. A peer
    /// that declares more is acknowledged (RFC 1661 §6.1 lets us send less) and sent at most
    /// this much.
    public static let maximumMRU: UInt16 = 16384
    /// The smallest MRU a Configure-Nak of ours can make us take (pppd's MINMRU).
    public static let minimumMRU: UInt16 = 128

    /// Our MRU (`mru`); asked for when not the default 1500, at most `maximumMRU`.
    public var mru: UInt16 = 1500
    /// The control characters we ask the peer to escape (`asyncmap`); nil leaves the map
    /// unnegotiated, so both sides keep escaping all of them (`default-asyncmap`).
    public var asyncMap: UInt32? = 0
    public var magicNumber = true
    /// Ask for and accept protocol field compression (`nopcomp` turns it off).
    public var protocolFieldCompression = true
    /// Ask for and accept address/control field compression (`noaccomp` turns it off).
    public var addressControlCompression = true
    /// The peer must authenticate with one of these (`require-pap`, `require-chap`). With both,
    /// CHAP is asked for first and PAP only if the peer refuses CHAP.
    public var requireAuthentication: Set<AuthenticationProtocol> = []
    /// Protocols we can authenticate ourselves with when the peer asks (we hold credentials);
    /// a peer asking for another is told CHAP, when we can do it.
    public var authenticateWith: [AuthenticationProtocol] = []
    /// The smallest MRU we let the peer declare; smaller ones are Nak'd up to it.
    public var minimumPeerMRU: UInt16 = 128
    /// Configure-Naks about our own magic number before the line counts as looped back
    /// (pppd's `lcp-max-loopback`... its default, 10).
    public var loopbackLimit = 10

    public init() {}
}

/// What LCP settled, in the direction each applies to.
public struct LCPResult: Sendable, Equatable {
    /// The largest information field we may send (the peer's MRU).
    public var transmitMRU = 1500
    /// Control characters we must escape when sending (the peer's ACCM).
    public var transmitACCM: UInt32 = 0xFFFF_FFFF
    public var transmitProtocolCompression = false
    public var transmitAddressControlCompression = false
    /// The largest information field the peer will send us (our MRU, once acknowledged).
    public var receiveMRU = 1500
    /// Control characters the peer escapes for us (our ACCM, once acknowledged).
    public var receiveACCM: UInt32 = 0xFFFF_FFFF
    /// The peer must authenticate itself with this protocol.
    public var peerAuthentication: AuthenticationProtocol?
    /// We must authenticate ourselves with this protocol.
    public var localAuthentication: AuthenticationProtocol?
    public var localMagic: UInt32 = 0
    public var peerMagic: UInt32 = 0

    public init() {}
}

/// The link's one source of unpredictable values: LCP magic numbers (RFC 1661 §6.4) and CHAP
/// challenges (RFC 1994 §2.3). The sans-IO core takes it as an input, as it takes time: in
/// production OpenSSL's CSPRNG (Crypto's `CSPRNG`), in tests a seeded generator
/// (`SplitMix64`). Every value is a draw of its own from it: a magic number seen on the wire
/// says nothing of a challenge.
public struct LinkRandom: Sendable {
    private var generator: any RandomNumberGenerator & Sendable

    public init(_ generator: some RandomNumberGenerator & Sendable) { self.generator = generator }

    public mutating func next() -> UInt64 { generator.next() }

    /// A non-zero 32-bit value (RFC 1661 §6.4: zero means no magic number).
    public mutating func magic() -> UInt32 {
        while true {
            let v = UInt32(truncatingIfNeeded: next())
            if v != 0 { return v }
        }
    }

    public mutating func bytes(_ n: Int) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(n)
        while out.count < n {
            let word = next()
            for shift in stride(from: 0, to: 64, by: 8) where out.count < n { out.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        return out
    }
}

/// LCP's option policy (RFC 1661 §6, RFC 1570) for the shared automaton.
public struct LCPPolicy: NegotiationPolicy {
    public var configuration: LCPConfiguration
    public private(set) var result = LCPResult()
    /// Set when the line looks looped back (our own magic number keeps coming back).
    public private(set) var loopbackDetected = false
    /// Why negotiation cannot succeed (e.g. the peer refuses to authenticate); the link closes.
    public private(set) var failure: String?
    /// The link's random source (magic numbers here, the CHAP challenge drawn by the link).
    var random: LinkRandom

    // Our current request.
    private var mru: UInt16?
    private var accm: UInt32?
    private var magic: UInt32?
    private var pfc = false
    private var acfc = false
    private var authentication: AuthenticationProtocol?
    /// Protocols we asked the peer to authenticate with and it refused, this negotiation.
    private var refusedAuthentication: Set<AuthenticationProtocol> = []
    private var loopbackNaks = 0

    public init(configuration: LCPConfiguration, random: LinkRandom) {
        self.configuration = configuration
        self.random = random
        resetNegotiation()
    }

    public func handlesExtendedCode(_ code: ControlCode) -> Bool {
        (ControlCode.protocolReject...ControlCode.timeRemaining).contains(code)
    }

    public mutating func resetNegotiation() {
        let c = configuration
        let wanted = min(c.mru, LCPConfiguration.maximumMRU)
        mru = wanted == 1500 ? nil : wanted
        accm = c.asyncMap
        magic = c.magicNumber ? random.magic() : nil
        pfc = c.protocolFieldCompression
        acfc = c.addressControlCompression
        authentication = AuthenticationProtocol.preferred(c.requireAuthentication)
        refusedAuthentication = []
        loopbackNaks = 0
        failure = nil
        result = LCPResult()
    }

    public func requestOptions() -> [ConfigurationOption] {
        var o: [LCPOption] = []
        if let mru { o.append(.maximumReceiveUnit(mru)) }
        if let accm { o.append(.asyncControlCharacterMap(accm)) }
        if let authentication { o.append(authentication.option) }
        if let magic { o.append(.magicNumber(magic)) }
        if pfc { o.append(.protocolFieldCompression) }
        if acfc { o.append(.addressControlFieldCompression) }
        return o.map(\.option)
    }

    public mutating func judge(_ options: [ConfigurationOption], mayNak: Bool) -> RequestVerdict {
        var naks: [ConfigurationOption] = []
        var rejects: [ConfigurationOption] = []
        var peer = result
        peer.transmitMRU = 1500
        peer.transmitACCM = 0xFFFF_FFFF
        peer.transmitProtocolCompression = false
        peer.transmitAddressControlCompression = false
        peer.localAuthentication = nil
        peer.peerMagic = 0
        func nak(_ o: LCPOption, else original: ConfigurationOption) {
            if mayNak { naks.append(o.option) } else { rejects.append(original) }
        }
        for raw in options {
            let option = LCPOption(raw)
            switch option {
            case let .maximumReceiveUnit(m):
                if m < configuration.minimumPeerMRU {
                    nak(.maximumReceiveUnit(configuration.minimumPeerMRU), else: raw)
                } else {
                    // RFC 1661 §6.1: the peer's MRU bounds what we send; we may send less.
                    peer.transmitMRU = Int(min(m, LCPConfiguration.maximumMRU))
                }
            case let .asyncControlCharacterMap(map):
                peer.transmitACCM = map
            case .authenticationProtocol:
                if let wanted = AuthenticationProtocol(option), configuration.authenticateWith.contains(wanted) {
                    peer.localAuthentication = wanted
                } else if let offer = AuthenticationProtocol.preferred(configuration.authenticateWith) {
                    // RFC 1661 §6.2: Nak with a protocol we can do, CHAP when we can.
                    nak(offer.option, else: raw)
                } else {
                    rejects.append(raw)
                }
            case let .magicNumber(m):
                if m == 0 {
                    // RFC 1661 §6.4: zero is not a magic number.
                    nak(.magicNumber(random.magic()), else: raw)
                } else if let ours = magic, m == ours {
                    // RFC 1661 §6.4: our own number came back; Nak with a fresh one and count it.
                    loopbackNaks += 1
                    if loopbackNaks >= configuration.loopbackLimit { loopbackDetected = true }
                    nak(.magicNumber(random.magic()), else: raw)
                } else {
                    peer.peerMagic = m
                }
            case .protocolFieldCompression:
                if configuration.protocolFieldCompression { peer.transmitProtocolCompression = true } else { rejects.append(raw) }
            case .addressControlFieldCompression:
                if configuration.addressControlCompression { peer.transmitAddressControlCompression = true } else { rejects.append(raw) }
            default:
                // Quality protocols, callback, multilink, FCS alternatives and anything unknown.
                rejects.append(raw)
            }
        }
        if !rejects.isEmpty { return .reject(rejects) }
        if !naks.isEmpty { return .nak(naks) }
        result.transmitMRU = peer.transmitMRU
        result.transmitACCM = peer.transmitACCM
        result.transmitProtocolCompression = peer.transmitProtocolCompression
        result.transmitAddressControlCompression = peer.transmitAddressControlCompression
        result.localAuthentication = peer.localAuthentication
        result.peerMagic = peer.peerMagic
        return .ack
    }

    public mutating func acknowledged(_ options: [ConfigurationOption]) {
        result.receiveMRU = Int(mru ?? 1500)
        result.receiveACCM = accm ?? 0xFFFF_FFFF
        result.peerAuthentication = authentication
        result.localMagic = magic ?? 0
    }

    public mutating func peerRefused(_ options: [ConfigurationOption], rejected: Bool) -> Bool {
        // RFC 1661 §5.4: a Reject names only options we sent, unchanged; anything else makes
        // the whole packet invalid, before any of it is applied.
        let requested = requestOptions()
        if rejected && !options.allSatisfy(requested.contains) { return false }
        for raw in options {
            let option = LCPOption(raw)
            switch option {
            case let .maximumReceiveUnit(m):
                if rejected { mru = nil } else {
                    // Take a larger or smaller MRU within what our buffers allow.
                    let offered = min(max(m, LCPConfiguration.minimumMRU), LCPConfiguration.maximumMRU)
                    mru = offered == 1500 ? nil : offered
                }
            case let .asyncControlCharacterMap(map):
                if rejected { accm = nil } else { accm = (accm ?? 0) | map }
            case .authenticationProtocol:
                // We ask only because we require authentication: the peer refused the protocol
                // we asked for. Another we accept (the one its Nak suggests first, RFC 1661
                // §6.2) is asked for next; with none left the link cannot open.
                guard let asked = authentication else { break }
                refusedAuthentication.insert(asked)
                let remaining = configuration.requireAuthentication.subtracting(refusedAuthentication)
                if !rejected, let suggested = AuthenticationProtocol(option), remaining.contains(suggested) {
                    authentication = suggested
                } else if let next = AuthenticationProtocol.preferred(remaining) {
                    authentication = next
                } else {
                    let tried = AuthenticationProtocol.preference.filter(refusedAuthentication.contains).map(\.rawValue)
                    failure = "peer refused to authenticate with \(tried.joined(separator: " or "))"
                }
            case .magicNumber:
                if rejected { magic = nil } else {
                    // RFC 1661 §6.4: a Nak of our magic number may mean a looped-back line.
                    loopbackNaks += 1
                    if loopbackNaks >= configuration.loopbackLimit { loopbackDetected = true }
                    magic = random.magic()
                }
            case .protocolFieldCompression: pfc = false
            case .addressControlFieldCompression: acfc = false
            default:
                // A Nak may suggest options we did not ask for; we do not take any up.
                break
            }
        }
        return true
    }
}
