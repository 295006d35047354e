import NetStack

/// The authentication protocols this project speaks.
public enum AuthenticationProtocol: String, Sendable, Equatable, CaseIterable {
    case pap
    /// CHAP with MD5 (RFC 1994, algorithm 5).
    case chapMD5 = "chap-md5"

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

/// What we ask for and accept in LCP (pppd's option names in the comments).
public struct LCPConfiguration: Sendable, Equatable {
    /// Our MRU (`mru`); asked for when not the default 1500.
    public var mru: UInt16 = 1500
    /// The control characters we ask the peer to escape (`asyncmap`); nil leaves the map
    /// unnegotiated, so both sides keep escaping all of them (`default-asyncmap`).
    public var asyncMap: UInt32? = 0
    public var magicNumber = true
    /// Ask for and accept protocol field compression (`nopcomp` turns it off).
    public var protocolFieldCompression = true
    /// Ask for and accept address/control field compression (`noaccomp` turns it off).
    public var addressControlCompression = true
    /// The peer must authenticate with this protocol (`require-pap`, `require-chap`).
    public var requireAuthentication: AuthenticationProtocol?
    /// Protocols we can authenticate ourselves with when the peer asks (we hold credentials).
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

/// Magic numbers and challenges from a seeded generator (NetStack's SplitMix64). The link
/// owner seeds it from the system's generator; tests seed it with a constant.
public struct LinkRandom: Sendable {
    private var generator: SplitMix64
    public init(seed: UInt64) { generator = SplitMix64(seed: seed) }
    public mutating func next() -> UInt64 { generator.next() }
    /// A non-zero 32-bit value (RFC 1661 §6.4: zero means no magic number).
    public mutating func magic() -> UInt32 {
        while true {
            let v = UInt32(truncatingIfNeeded: next())
            if v != 0 { return v }
        }
    }
    public mutating func bytes(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8(truncatingIfNeeded: next()) } }
}

/// LCP's option policy (RFC 1661 §6, RFC 1570) for the shared automaton.
public struct LCPPolicy: NegotiationPolicy {
    public var configuration: LCPConfiguration
    public private(set) var result = LCPResult()
    /// Set when the line looks looped back (our own magic number keeps coming back).
    public private(set) var loopbackDetected = false
    /// Why negotiation cannot succeed (e.g. the peer refuses to authenticate); the link closes.
    public private(set) var failure: String?
    var random: LinkRandom

    // Our current request.
    private var mru: UInt16?
    private var accm: UInt32?
    private var magic: UInt32?
    private var pfc = false
    private var acfc = false
    private var authentication: AuthenticationProtocol?
    private var loopbackNaks = 0

    public init(configuration: LCPConfiguration, random: LinkRandom) {
        self.configuration = configuration
        self.random = random
        resetNegotiation()
    }

    public func handlesExtendedCode(_ code: UInt8) -> Bool {
        (ControlCode.protocolReject...ControlCode.timeRemaining).contains(code)
    }

    public mutating func resetNegotiation() {
        let c = configuration
        mru = c.mru == 1500 ? nil : c.mru
        accm = c.asyncMap
        magic = c.magicNumber ? random.magic() : nil
        pfc = c.protocolFieldCompression
        acfc = c.addressControlCompression
        authentication = c.requireAuthentication
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
                    peer.transmitMRU = Int(m)
                }
            case let .asyncControlCharacterMap(map):
                peer.transmitACCM = map
            case .authenticationProtocol:
                if let wanted = AuthenticationProtocol(option), configuration.authenticateWith.contains(wanted) {
                    peer.localAuthentication = wanted
                } else if let offer = configuration.authenticateWith.first {
                    // RFC 1661 §6.2: Nak with a protocol we can do.
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
                    mru = min(max(m, 128), 16384) == 1500 ? nil : min(max(m, 128), 16384)
                }
            case let .asyncControlCharacterMap(map):
                if rejected { accm = nil } else { accm = (accm ?? 0) | map }
            case .authenticationProtocol:
                // We ask only because we require that protocol: anything else will not do.
                if let required = configuration.requireAuthentication {
                    failure = "peer refused to authenticate with \(required.rawValue)"
                } else {
                    authentication = nil
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
