import Crypto
import Payment

/// The terminal's secure module (SRED/PED): it holds the DUKPT initial key, advances the KSN per
/// transaction, encrypts card data, enciphers the PIN, MACs the request and checks the gateway's
/// response MAC. Nothing outside it sees a key or a clear PAN; keys are wiped after use.
public struct TerminalSecurity: Sendable {
    public private(set) var initialKeyID: [UInt8]
    private var initialKey: [UInt8]
    public private(set) var counter: UInt32
    /// Whether the keys are the published ANSI test keys (such a terminal refuses production).
    public var testKeys: Bool
    /// Test hook: the format-4 random fill, so published vectors can be reproduced.
    public var fixedPINFill: [UInt8]?

    /// The default provisioning: the X9.24-3 test initial key for IKID `1234567890123456`, counter 0.
    public static func testDevice() -> TerminalSecurity {
        TerminalSecurity(initialKey: Hex.decode("1273671EA26AC29AFA4D1084127652A1")!, initialKeyID: Hex.decode("1234567890123456")!, counter: 0, testKeys: true)
    }

    public init(initialKey: [UInt8], initialKeyID: [UInt8], counter: UInt32 = 0, testKeys: Bool = false) {
        self.initialKey = initialKey
        self.initialKeyID = initialKeyID
        self.counter = counter
        self.testKeys = testKeys
    }

    /// What a restart needs to go on where this module stopped (the simulator's state file):
    /// the initial key and its ID, the counter last used, whether the keys are test keys.
    public var state: JSONValue {
        ["Version": 1, "InitialKeyID": .string(Hex.encode(initialKeyID)), "InitialKey": .string(Hex.encode(initialKey)),
         "Counter": .integer(Int64(counter)), "TestKeys": .bool(testKeys)]
    }

    /// The module `state` describes; nil unless every field has its form (an AES-128 key, an
    /// 8-byte key ID, a valid counter or 0).
    public init?(state: JSONValue) {
        guard state["Version"]?.integer == 1, let ikid = state["InitialKeyID"]?.string.flatMap(Hex.decode), ikid.count == 8,
              let key = state["InitialKey"]?.string.flatMap(Hex.decode), key.count == 16,
              let c = state["Counter"]?.integer, let counter = UInt32(exactly: c), counter == 0 || AESKSN.isValid(counter: counter),
              let testKeys = state["TestKeys"]?.bool else { return nil }
        self.init(initialKey: key, initialKeyID: ikid, counter: counter, testKeys: testKeys)
    }

    /// Provisioning from a TR-31 version-D block (usage B1, an `IK` optional block) under `kbpk`.
    public init(keyBlock: String, kbpk: [UInt8], testKeys: Bool = false) throws {
        let (header, key) = try TR31.unwrap(keyBlock, kbpk: kbpk)
        guard header.keyUsage == "B1", let ik = header.optionalBlock("IK"), let ikid = Hex.decode(ik), ikid.count == 8,
              key.count == 16 else { throw TR31Error.malformed("expected an AES-128 initial DUKPT key (B1) with an IK block") }
        self.init(initialKey: key, initialKeyID: ikid, counter: 0, testKeys: testKeys)
    }

    /// Valid counters left after the current one (2,448,023,842 for a fresh device).
    public var transactionsRemaining: Int64 { TerminalSecurity.rank(AESKSN.maximumCounter) - TerminalSecurity.rank(counter) }

    /// The number of valid counters (non-zero, at most 16 one-bits) not above `c`.
    static func rank(_ c: UInt32) -> Int64 {
        func choose(_ n: Int, _ k: Int) -> Int64 {
            if k < 0 || k > n { return 0 }
            var r: Int64 = 1
            for i in 0..<k { r = r * Int64(n - i) / Int64(i + 1) }
            return r
        }
        var count: Int64 = 0
        var ones = 0
        for bit in stride(from: 31, through: 0, by: -1) where c >> UInt32(bit) & 1 == 1 {
            // Same higher bits, this bit 0, any lower bits keeping at most 16 ones.
            if ones <= 16 { for k in 0...(16 - ones) { count += choose(bit, k) } }
            ones += 1
        }
        if ones <= 16 { count += 1 }   // c itself
        return count - 1               // zero is not a counter
    }

    /// Keys of one transaction.
    public struct TransactionKeys: Sendable {
        public let ksn: AESKSN
        var pin: [UInt8]
        var macRequest: [UInt8]
        var macResponse: [UInt8]
        var data: [UInt8]

        public mutating func wipe() {
            SecureBytes.wipe(&pin)
            SecureBytes.wipe(&macRequest)
            SecureBytes.wipe(&macResponse)
            SecureBytes.wipe(&data)
        }
    }

    /// Advances the counter and derives the next transaction's keys.
    public mutating func nextTransaction() throws -> TransactionKeys {
        guard let next = AESKSN.next(after: counter) else { throw DUKPTError.exhausted }
        counter = next
        let ksn = AESKSN(initialKeyID: initialKeyID, counter: next)
        var txn = try AESDUKPT.transactionKey(initialKey: initialKey, ksn: ksn)
        defer { SecureBytes.wipe(&txn) }
        return TransactionKeys(
            ksn: ksn,
            pin: try AESDUKPT.workingKey(transactionKey: txn, usage: .pinEncryption, keyType: .aes128, ksn: ksn),
            macRequest: try AESDUKPT.workingKey(transactionKey: txn, usage: .macGeneration, keyType: .aes128, ksn: ksn),
            macResponse: try AESDUKPT.workingKey(transactionKey: txn, usage: .macVerification, keyType: .aes128, ksn: ksn),
            data: try AESDUKPT.workingKey(transactionKey: txn, usage: .dataEncryption, keyType: .aes128, ksn: ksn))
    }

    /// What the terminal authorises.
    public struct AuthoriseFields: Sendable {
        public var merchantID: String
        public var terminalID: String
        public var environment: String
        public var transactionID: String
        public var amountMinor: Int64
        public var currencyNumeric: String
        public var paymentType: String
        public var entryMode: String
        public var cvm: String
        public var originalOperationID: String?
        /// The merchant's gateway session (from the host's login): whose operation this is.
        public var sessionToken: String

        public init(merchantID: String, terminalID: String, environment: String, transactionID: String, amountMinor: Int64,
                    currencyNumeric: String, paymentType: String, entryMode: String, cvm: String, originalOperationID: String? = nil,
                    sessionToken: String = "") {
            self.sessionToken = sessionToken
            self.merchantID = merchantID
            self.terminalID = terminalID
            self.environment = environment
            self.transactionID = transactionID
            self.amountMinor = amountMinor
            self.currencyNumeric = currencyNumeric
            self.paymentType = paymentType
            self.entryMode = entryMode
            self.cvm = cvm
            self.originalOperationID = originalOperationID
        }
    }

    /// The gateway's Authorise for `fields`, with the card and PIN encrypted under `keys`.
    /// `pinFill`: the format-4 block's random fill (8 bytes; nil: drawn here).
    public func authorise(_ f: AuthoriseFields, card: CardData?, pin: String?, keys: TransactionKeys, pinFill: [UInt8]? = nil) throws -> JSONValue {
        var encCard = "", encPIN = ""
        if let card {
            var track = Array(card.track2.utf8)
            defer { SecureBytes.wipe(&track) }
            encCard = Hex.encode(try BlockCipher.aes.encrypt(key: keys.data, track, mode: .cbc, padding: true))
            if let pin, f.cvm == "OnlinePIN" {
                encPIN = Hex.encode(try PINBlock.encipherFormat4(pin: pin, pan: card.pan, key: keys.pin, random: fixedPINFill ?? pinFill))
            }
        }
        let message: JSONValue = [
            "Type": "Authorise", "Version": 1, "MerchantID": .string(f.merchantID), "TerminalID": .string(f.terminalID),
            "Environment": .string(f.environment), "TransactionID": .string(f.transactionID), "AmountMinor": .integer(f.amountMinor),
            "CurrencyNumeric": .string(f.currencyNumeric), "PaymentType": .string(f.paymentType), "EntryMode": .string(f.entryMode),
            "CVM": .string(f.cvm), "KSN": .string(keys.ksn.description), "EncCardData": .string(encCard), "EncPinBlock": .string(encPIN),
            "OriginalOperationID": f.originalOperationID.map { .string($0) } ?? .string(""), "SessionToken": .string(f.sessionToken),
        ]
        let mac = try MessageAuthentication.aesCMAC(key: keys.macRequest, GatewayCanonical.authorise(message))
        return message.setting("MAC", .string(Hex.encode(mac)))
    }

    /// The gateway's Reverse of `operationID` under fresh keys.
    public func reverse(operationID: String, reason: String, sessionToken: String = "", keys: TransactionKeys) throws -> JSONValue {
        let message: JSONValue = ["Type": "Reverse", "OperationID": .string(operationID), "Reason": .string(reason), "KSN": .string(keys.ksn.description),
                                  "SessionToken": .string(sessionToken)]
        let mac = try MessageAuthentication.aesCMAC(key: keys.macRequest, GatewayCanonical.reverse(message))
        return message.setting("MAC", .string(Hex.encode(mac)))
    }

    /// Whether a response carries a valid MAC under the transaction's response key (constant time),
    /// and answers the same KSN.
    public static func verifyResponse(_ r: JSONValue, canonical: [UInt8], keys: TransactionKeys) -> Bool {
        guard r["KSN"]?.string == keys.ksn.description, let mac = r["MAC"]?.string.flatMap(Hex.decode),
              let expected = try? MessageAuthentication.aesCMAC(key: keys.macResponse, canonical) else { return false }
        return SecureBytes.equal(mac, expected)
    }
}
