import Crypto
import NetStack
import Payment
import Testing

/// Discovery's rules and pairing's derivations, on virtual time.
@Suite struct DiscoveryTests {
    static let uuids = ["6A1F0C2E-5B7D-4E8A-9C3B-2D4F6E8A0B1C", "11111111-2222-3333-4444-555555555555", "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"]

    func reader(_ i: Int, rssi: Int?, battery: Double? = 0.8) -> DiscoveredReader {
        DiscoveredReader(path: "/lines/SIM-\(i)", peripheralUUID: Self.uuids[i], name: "SIM-\(i)", serialNumber: "SIM-\(i)",
                         rssi: rssi, batteryLevel: battery)
    }

    func ticks(_ core: inout DiscoveryCore, _ seen: [DiscoveredReader], from: Double, count: Int) -> [DiscoveryCore.Event] {
        (0..<count).flatMap { core.tick(seen, now: .seconds(from + Double($0) * 0.25)) }
    }

    @Test func scanReportsChangesSortedByStrengthAndTimesOut() {
        var core = DiscoveryCore(configuration: .init(method: .scan(timeout: 1)), now: .zero)
        let a = reader(0, rssi: -70), b = reader(1, rssi: -48)
        #expect(core.tick([], now: .zero).isEmpty, "nothing seen, nothing reported")
        #expect(core.tick([a], now: .seconds(0.25)) == [.update([a])])
        #expect(core.tick([a, b], now: .seconds(0.5)) == [.update([b, a])], "strongest first")
        #expect(core.tick([b, a], now: .seconds(0.75)).isEmpty, "no change, no update")
        #expect(core.tick([b, a], now: .seconds(1)) == [.failed(.discoveryTimedOut)])
        #expect(core.tick([a], now: .seconds(1.25)).isEmpty, "finished")
    }

    @Test func scanWithTimeoutZeroNeverEnds() {
        var core = DiscoveryCore(configuration: .init(method: .scan(timeout: 0)), now: .zero)
        let events = ticks(&core, [reader(0, rssi: -60)], from: 0, count: 4 * 3600)
        #expect(events == [.update([reader(0, rssi: -60)])], "an hour of ticks: one update, no timeout")
        #expect(!core.finished)
    }

    @Test func equalStrengthSortsBySerialAndWiredLinesRankFirst() {
        var core = DiscoveryCore(configuration: .init(method: .scan(timeout: 0)), now: .zero)
        let x = reader(1, rssi: -50), y = reader(0, rssi: -50), wired = DiscoveredReader.wired(path: "/dev/ttyUSB0")
        #expect(core.tick([x, y, wired], now: .zero) == [.update([wired, y, x])])
        #expect(wired == DiscoveredReader.wired(path: "/dev/ttyUSB0"), "a wired line's UUID is stable")
        #expect(DiscoveredReader.isUUID(wired.peripheralUUID) && wired.serialNumber == "ttyUSB0")
    }

    @Test func proximityReportsExactlyOneReaderTwice() {
        var core = DiscoveryCore(configuration: .init(method: .proximity), now: .zero)
        let near = reader(0, rssi: -40), close = reader(1, rssi: -45), far = reader(2, rssi: -70)
        let events = ticks(&core, [far, close, near], from: 0, count: 40)
        var first = near
        first.batteryLevel = nil
        #expect(events == [.update([first]), .update([near])], "serial only, then with battery; never a list")
    }

    @Test func proximityNeedsTwoTicksAndTheThreshold() {
        var core = DiscoveryCore(configuration: .init(method: .proximity), now: .zero)
        // Too far: never reported.
        #expect(ticks(&core, [reader(2, rssi: -70)], from: 0, count: 20).isEmpty)
        // Seen once only, then gone: not reported.
        #expect(core.tick([reader(0, rssi: -40)], now: .seconds(10)).isEmpty)
        #expect(core.tick([], now: .seconds(10.25)).isEmpty)
        // The battery arrives only with a later advertisement: the second report waits for it.
        let noBattery = reader(1, rssi: -42, battery: nil)
        #expect(core.tick([noBattery], now: .seconds(11)).isEmpty)
        #expect(core.tick([noBattery], now: .seconds(11.25)) == [.update([noBattery])])
        #expect(core.tick([noBattery], now: .seconds(11.5)).isEmpty)
        #expect(core.tick([reader(1, rssi: -42)], now: .seconds(11.75)) == [.update([reader(1, rssi: -42)])])
        #expect(ticks(&core, [reader(0, rssi: -30)], from: 12, count: 20).isEmpty, "one reader, once")
    }

    @Test func allowedPeripheralFilter() {
        let all = [reader(0, rssi: -40), reader(1, rssi: -45), reader(2, rssi: -70)]
        var any = DiscoveryCore(configuration: .init(method: .scan(timeout: 0), allowedPeripheralUUIDs: nil), now: .zero)
        #expect(any.tick(all, now: .zero) == [.update(all)])
        var none = DiscoveryCore(configuration: .init(method: .scan(timeout: 1), allowedPeripheralUUIDs: []), now: .zero)
        #expect(ticks(&none, all, from: 0, count: 4).isEmpty, "an empty list admits nobody")
        #expect(none.tick(all, now: .seconds(1)) == [.failed(.discoveryTimedOut)], "the timeout still applies")
        var one = DiscoveryCore(configuration: .init(method: .scan(timeout: 0), allowedPeripheralUUIDs: [Self.uuids[1].lowercased()]), now: .zero)
        #expect(one.tick(all, now: .zero) == [.update([all[1]])])
    }

    @Test func advertRecordsRoundTrip() throws {
        let json = try JSONParser.parse(Array("""
        {"PeripheralUUID":"6A1F0C2E-5B7D-4E8A-9C3B-2D4F6E8A0B1C","Name":"SIM-00000001","SerialNumber":"SIM-00000001",
         "DeviceType":"simTelium","RSSI":-48,"Protocols":["com.example.paybridge.ppp","com.example.paybridge.transaction"],
         "RequiresPairing":true,"BatteryLevel":0.82,"SoftwareVersion":"1.0.0"}
        """.utf8))
        let r = try #require(DiscoveredReader(advert: json, path: "/x/SIM-00000001"))
        #expect(r.rssi == -48 && r.requiresPairing && r.batteryLevel == 0.82 && r.softwareVersion == "1.0.0")
        #expect(DiscoveredReader(advert: r.advert, path: r.path) == r)
        #expect(DiscoveredReader(advert: json.setting("PeripheralUUID", "not-a-uuid"), path: "/x") == nil)
    }

    /// RFC 7748 §6.1's Diffie-Hellman example, through OpenSSL.
    @Test func x25519MatchesRFC7748() throws {
        let alice = Hex.decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")!
        let bob = Hex.decode("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")!
        #expect(Hex.encode(try X25519.publicKey(privateKey: alice)) == "8520F0098930A754748B7DDCB43EF75A0DBF3A0D26381AF4EBA4A98EAA9B4E6A")
        #expect(Hex.encode(try X25519.publicKey(privateKey: bob)) == "DE9EDB7D7B7DC1B4D35B61C2ECE435373F8343C85B78674DADFC7E146F882B4F")
        let shared = try X25519.sharedSecret(privateKey: alice, peerPublicKey: try X25519.publicKey(privateKey: bob))
        #expect(Hex.encode(shared) == "4A5D9D5BA4CE2DE1728E3BF480350F25E07E21C947D19E3376F09B3C1E161742")
        #expect(throws: CryptoError.self) { try X25519.sharedSecret(privateKey: alice, peerPublicKey: [UInt8](repeating: 0, count: 32)) }
    }

    @Test func pairingDerivesTheSameOnBothSides() throws {
        let h = try SecureBytes.random(32), t = try SecureBytes.random(32)
        let hp = try X25519.publicKey(privateKey: h), tp = try X25519.publicKey(privateKey: t)
        let hn = try SecureBytes.random(16), tn = try SecureBytes.random(16)
        let k1 = try Pairing.linkKey(sharedSecret: try X25519.sharedSecret(privateKey: h, peerPublicKey: tp), hostPublicKey: hp, terminalPublicKey: tp,
                                     hostNonce: hn, terminalNonce: tn)
        let k2 = try Pairing.linkKey(sharedSecret: try X25519.sharedSecret(privateKey: t, peerPublicKey: hp), hostPublicKey: hp, terminalPublicKey: tp,
                                     hostNonce: hn, terminalNonce: tn)
        #expect(k1 == k2 && k1.count == 16)
        let passkey = try Pairing.passkey(hostPublicKey: hp, terminalPublicKey: tp, hostNonce: hn, terminalNonce: tn)
        #expect(passkey.count == 6 && passkey.allSatisfy(\.isNumber))
        // The host's nonce changes the passkey (fixed values: the same every run).
        let zero = [UInt8](repeating: 0, count: 16), one = [UInt8](repeating: 1, count: 16)
        #expect(try Pairing.passkey(hostPublicKey: hp, terminalPublicKey: tp, hostNonce: zero, terminalNonce: zero)
            != (try Pairing.passkey(hostPublicKey: hp, terminalPublicKey: tp, hostNonce: one, terminalNonce: zero)))
        let commitment = try Pairing.commitment(hostPublicKey: hp, hostNonce: hn)
        #expect(Pairing.matches(commitment, try Pairing.commitment(hostPublicKey: hp, hostNonce: hn)))
        #expect(!Pairing.matches(commitment, try Pairing.commitment(hostPublicKey: hp, hostNonce: tn)))
        #expect(!Pairing.matches("", ""), "an empty MAC never matches")
        let proof = try Pairing.proof(linkKey: k1, hostID: "H", poiID: "SIM-1", dateTime: "2026-01-01T00:00:00Z", nonce: "00")
        #expect(proof != (try Pairing.proof(linkKey: k1, hostID: "H", poiID: "SIM-1", dateTime: "2026-01-01T00:00:01Z", nonce: "00")))
        #expect(proof != (try Pairing.proof(linkKey: k1, hostID: "H", poiID: "SIM-1", dateTime: "2026-01-01T00:00:00Z", nonce: "01")))
        #expect(proof != (try Pairing.readerProof(linkKey: k1, hostID: "H", poiID: "SIM-1", nonce: "00")))
    }

    @Test func proximityReportsAWiredLineTwiceAtOnce() {
        var core = DiscoveryCore(configuration: .init(method: .proximity), now: .zero)
        let wired = DiscoveredReader.wired(path: "/dev/ttyUSB0")
        #expect(ticks(&core, [wired, reader(0, rssi: -40)], from: 0, count: 8) == [.update([wired]), .update([wired])])
    }
}
