import Crypto
import Wire

/// A reader as discovery sees it: its advertisement (SPEC §4.5) and the line it is on. Our
/// "radio" is the set of serial lines and ptys whose names match a pattern; a terminal that
/// advertises writes its record beside its line (`LINE.advert`). A line without one is a wired
/// reader: named after the line, no battery known, and as near as a reader gets (RSSI nil,
/// ranked as 0 dBm).
public struct DiscoveredReader: Sendable, Equatable, CustomStringConvertible {
    public var path: String
    public var peripheralUUID: String
    public var name: String
    public var serialNumber: String
    public var deviceType: String
    public var rssi: Int?
    public var requiresPairing: Bool
    public var batteryLevel: Double?
    public var softwareVersion: String?

    public init(path: String, peripheralUUID: String, name: String, serialNumber: String, deviceType: String = "simTelium",
                rssi: Int?, requiresPairing: Bool = false, batteryLevel: Double? = nil, softwareVersion: String? = nil) {
        self.path = path
        self.peripheralUUID = peripheralUUID
        self.name = name
        self.serialNumber = serialNumber
        self.deviceType = deviceType
        self.rssi = rssi
        self.requiresPairing = requiresPairing
        self.batteryLevel = batteryLevel
        self.softwareVersion = softwareVersion
    }

    /// The battery level in whole percent (a level outside 0...1 is clamped into it, NaN reads
    /// as 0).
    public var batteryPercent: Int? {
        batteryLevel.map { Int((($0.isNaN ? 0 : min(1, max(0, $0))) * 100).rounded()) }
    }

    /// Signal strength for ranking: a wired line counts as 0 dBm.
    public var strength: Int { rssi ?? 0 }

    /// A wired line's reader: its UUID is derived from the path, so it is stable across scans.
    public static func wired(path: String) -> DiscoveredReader {
        let name = String(path.split(separator: "/").last ?? Substring(path))
        let h = Digest.hash(.sha256, Array(("pppbridge-line|" + path).utf8)) ?? [UInt8](repeating: 0, count: 16)
        return DiscoveredReader(path: path, peripheralUUID: uuidText(Array(h.prefix(16))), name: name, serialNumber: name,
                                deviceType: "serial", rssi: nil)
    }

    /// Reads an advertisement record (SPEC §4.5's JSON) for the line at `path`.
    public init?(advert: JSONValue, path: String) {
        guard let uuid = advert["PeripheralUUID"]?.string, DiscoveredReader.isUUID(uuid),
              let serial = advert["SerialNumber"]?.string, !serial.isEmpty else { return nil }
        // A level outside 0...1 (or not finite) is no level: it would be printed as a percentage.
        let battery = PaymentRules.fraction(advert["BatteryLevel"])
        self.init(path: path, peripheralUUID: uuid.uppercased(), name: advert["Name"]?.string ?? serial, serialNumber: serial,
                  deviceType: advert["DeviceType"]?.string ?? "simTelium", rssi: advert["RSSI"]?.integer.map { Int($0) },
                  requiresPairing: advert["RequiresPairing"]?.bool ?? false, batteryLevel: battery,
                  softwareVersion: advert["SoftwareVersion"]?.string)
    }

    /// The record a terminal publishes.
    public var advert: JSONValue {
        var j: JSONValue = ["PeripheralUUID": .string(peripheralUUID), "Name": .string(name), "SerialNumber": .string(serialNumber),
                            "DeviceType": .string(deviceType), "Protocols": ["com.example.paybridge.ppp", "com.example.paybridge.transaction"],
                            "RequiresPairing": .bool(requiresPairing)]
        if let rssi { j = j.setting("RSSI", .integer(Int64(rssi))) }
        if let batteryLevel { j = j.setting("BatteryLevel", .number(PaymentRules.fraction(batteryLevel))) }
        if let softwareVersion { j = j.setting("SoftwareVersion", .string(softwareVersion)) }
        return j
    }

    public var description: String {
        // Name and serial number come from the advert beside the line: printed inert.
        "\(PeerText.escaped(serialNumber, limit: 64)) (\(PeerText.escaped(name, limit: 64)), \(peripheralUUID), \(rssi.map { "\($0) dBm" } ?? "wired")"
            + (batteryPercent.map { ", battery \($0)%" } ?? "") + (requiresPairing ? ", pairing" : "") + ") at \(path)"
    }

    /// 8-4-4-4-12 hex digits.
    public static func isUUID(_ s: String) -> Bool {
        let parts = s.split(separator: "-", omittingEmptySubsequences: false)
        return parts.map(\.count) == [8, 4, 4, 4, 12] && parts.allSatisfy { $0.utf8.allSatisfy { Hex.nibbleValue($0) != nil } }
    }

    public static func uuidText(_ b: [UInt8]) -> String {
        let h = Hex.encode(Array(b.prefix(16)))
        let c = Array(h)
        return [c[0..<8], c[8..<12], c[12..<16], c[16..<20], c[20..<32]].map { String($0) }.joined(separator: "-")
    }
}

/// How to discover: a scan that reports every reader the filter lets through (timeout in
/// seconds, 0 = never), or proximity, which reports the one reader held close.
public struct DiscoveryConfiguration: Sendable, Equatable {
    public enum Method: Sendable, Equatable {
        case scan(timeout: UInt)
        case proximity
    }

    public var method: Method
    /// nil: every reader; []: none; otherwise only these peripheral UUIDs.
    public var allowedPeripheralUUIDs: [String]?

    public init(method: Method, allowedPeripheralUUIDs: [String]? = nil) {
        self.method = method
        self.allowedPeripheralUUIDs = allowedPeripheralUUIDs
    }
}

/// Discovery's rules, sans-IO: fed what each scan tick saw and the time, it says what to report.
/// Scan: an update each time the filtered set changes (strongest first, then by serial), and
/// `discoveryTimedOut` at the timeout unless it is 0. Proximity: the strongest reader at
/// ≥ −50 dBm seen in two consecutive ticks is reported once with its serial only, then once
/// more with its battery level; never a list, never another reader.
public struct DiscoveryCore: Sendable {
    public enum Event: Sendable, Equatable {
        case update([DiscoveredReader])
        case failed(PaymentErrorCode)
    }

    /// The scan tick (SPEC §4.5).
    public static let tick: Duration = .milliseconds(250)
    /// Proximity's threshold.
    public static let proximityRSSI = -50

    public let configuration: DiscoveryConfiguration
    public let started: Instant
    public private(set) var finished = false
    private var lastReported: [DiscoveredReader]?
    private var proximityCandidate: String?
    private var proximityStage = 0

    public init(configuration: DiscoveryConfiguration, now: Instant) {
        self.configuration = configuration
        started = now
    }

    /// When the core next needs a tick.
    public func nextTick(after now: Instant) -> Instant { now + DiscoveryCore.tick }

    public func admits(_ r: DiscoveredReader) -> Bool {
        guard let allowed = configuration.allowedPeripheralUUIDs else { return true }
        return allowed.contains { $0.uppercased() == r.peripheralUUID.uppercased() }
    }

    /// One scan tick: what the lines advertised now.
    public mutating func tick(_ seen: [DiscoveredReader], now: Instant) -> [Event] {
        guard !finished else { return [] }
        var events: [Event] = []
        let filtered = seen.filter(admits).sorted {
            $0.strength != $1.strength ? $0.strength > $1.strength : $0.serialNumber < $1.serialNumber
        }
        switch configuration.method {
        case .scan(let timeout):
            if filtered != lastReported && !(lastReported == nil && filtered.isEmpty) {
                lastReported = filtered
                events.append(.update(filtered))
            }
            if timeout > 0 && now >= started + .seconds(Int64(timeout)) {
                finished = true
                events.append(.failed(.discoveryTimedOut))
            }
        case .proximity:
            let best = filtered.first { $0.strength >= DiscoveryCore.proximityRSSI }
            switch proximityStage {
            case 0:
                if let best, best.peripheralUUID == proximityCandidate {
                    var first = best
                    first.batteryLevel = nil
                    proximityStage = 1
                    events.append(.update([first]))
                } else {
                    proximityCandidate = best?.peripheralUUID
                }
            case 1:
                // The same reader again, now with what a closer look tells: its battery.
                // A wired line tells no battery: its second report is the same as its first.
                if let again = seen.first(where: { $0.peripheralUUID == proximityCandidate }), again.batteryLevel != nil || again.rssi == nil {
                    proximityStage = 2
                    events.append(.update([again]))
                }
            default:
                break
            }
        }
        return events
    }

}

/// Pairing (SPEC §4.5) as numeric comparison over X25519, with commitments as in Bluetooth LE
/// Secure Connections: the host sends its public key and a commitment to a nonce; the terminal
/// answers with its public key and its nonce; only then does the host reveal its nonce. Both
/// show a 6-digit passkey derived from both keys and both nonces, the person confirms they
/// match, and both keep a 16-byte link key. A man in the middle has to fix its own values
/// before it learns the host's nonce, so it cannot search for keys that give equal passkeys on
/// both sides (one chance in a million). Later logins prove the bond both ways with HMACs
/// under the link key.
public enum Pairing {
    static func digest(_ parts: [[UInt8]]) throws -> [UInt8] {
        guard let d = Digest.hash(.sha256, parts.flatMap { $0 }) else { throw CryptoError("SHA-256") }
        return d
    }

    static func mac(_ key: [UInt8], _ text: String) throws -> String {
        Hex.encode(Array(try MessageAuthentication.hmac(key: key, Array(text.utf8)).prefix(16)))
    }

    /// The host's commitment to its nonce, sent with its public key.
    public static func commitment(hostPublicKey: [UInt8], hostNonce: [UInt8]) throws -> String {
        Hex.encode(try digest([Array("v1|COMMIT|".utf8), hostPublicKey, hostNonce]))
    }

    public static func passkey(hostPublicKey: [UInt8], terminalPublicKey: [UInt8], hostNonce: [UInt8], terminalNonce: [UInt8]) throws -> String {
        let h = try digest([Array("v1|PASSKEY|".utf8), hostPublicKey, terminalPublicKey, hostNonce, terminalNonce])
        let v = (UInt32(h[0]) << 24 | UInt32(h[1]) << 16 | UInt32(h[2]) << 8 | UInt32(h[3])) % 1_000_000
        let s = String(v)
        return String(repeating: "0", count: 6 - s.count) + s
    }

    public static func linkKey(sharedSecret: [UInt8], hostPublicKey: [UInt8], terminalPublicKey: [UInt8], hostNonce: [UInt8],
                               terminalNonce: [UInt8]) throws -> [UInt8] {
        Array(try MessageAuthentication.hmac(key: sharedSecret, Array("v1|LINKKEY|".utf8) + hostPublicKey + terminalPublicKey + hostNonce + terminalNonce).prefix(16))
    }

    /// The host's proof of a bond in a login: who, when and a fresh nonce (the terminal refuses
    /// a stale time or a nonce it has recently seen).
    public static func proof(linkKey: [UInt8], hostID: String, poiID: String, dateTime: String, nonce: String) throws -> String {
        try mac(linkKey, "v1|BOND|\(hostID)|\(poiID)|\(dateTime)|\(nonce)")
    }

    /// The reader's answer to that proof: it holds the same link key (a reader that cannot is
    /// not the one the host paired with).
    public static func readerProof(linkKey: [UInt8], hostID: String, poiID: String, nonce: String) throws -> String {
        try mac(linkKey, "v1|BONDR|\(hostID)|\(poiID)|\(nonce)")
    }

    /// The host's proof that the person confirmed the passkey (commits the terminal's bond).
    public static func confirmation(linkKey: [UInt8], passkey: String) throws -> String {
        try mac(linkKey, "v1|CONFIRM|\(passkey)")
    }

    /// Constant-time comparison of two hex MACs (case-insensitive); false for empty ones.
    public static func matches(_ a: String, _ b: String) -> Bool {
        guard !a.isEmpty, let x = Hex.decode(a), let y = Hex.decode(b) else { return false }
        return SecureBytes.equal(x, y)
    }
}
