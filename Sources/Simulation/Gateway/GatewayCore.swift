import Crypto
import Payment
import Wire

/// The acquirer side (specification §3, §4.10), sans-IO: one JSON request in, one JSON answer out
/// (or none). It holds the BDKs; for each Authorise it selects the BDK by the KSN's BDK ID,
/// derives the keys, rejects invalid and replayed counters, checks the CMAC in constant time
/// before decrypting, deciphers the PIN block, decides by deterministic rules and MACs its answer
/// so that nothing between it and the terminal can forge an approval.
public final class GatewayCore: @unchecked Sendable {
    /// A merchant the gateway knows: the credentials its Login takes and the identity every
    /// operation of its sessions is kept under.
    public struct Merchant: Sendable, Equatable {
        /// The licence its logins must name; nil: any test licence (`LIC-TEST-…`).
        public var licence: String?
        public var user: String
        public var password: String
        /// Nine digits (specification §4.10).
        public var merchantID: String
        public var terminalID: String

        public init(licence: String?, user: String, password: String, merchantID: String, terminalID: String = "001") {
            self.licence = licence
            self.user = user
            self.password = password
            self.merchantID = merchantID
            self.terminalID = terminalID
        }

        /// The merchant every gateway knows unless told otherwise: `merchant`/`secret`.
        public static let standard = Merchant(licence: nil, user: "merchant", password: "secret", merchantID: "999008881")
    }

    public struct Configuration: Sendable {
        /// AES BDKs by BDK ID (the KSN's first 4 bytes, hex).
        public var bdks: [String: [UInt8]]
        public var currencies = Currency.known.map(\.numeric)
        /// Who may log in, and under which merchant ID their operations are kept.
        public var merchants: [Merchant] = [.standard]
        /// The PIN of each test card; cards not listed have `defaultPIN`.
        public var pins: [String: String] = [:]
        public var defaultPIN = "1234"
        /// The update offered to terminals older than it, its image, and the key that signs it.
        public var update: (offer: UpdateOffer, image: [UInt8])?
        public var sessionLifetime: Int64 = 8 * 3600
        /// Operations kept for refunds, reversals, signatures and lookups; the oldest beyond
        /// this are forgotten (counted in `operationsForgotten`).
        public var operationLimit = 100_000

        public init(bdks: [String: [UInt8]]) { self.bdks = bdks }

        /// The ANSI X9.24-3 test BDK under its ID `12345678`.
        public static let testKeys = Configuration(bdks: ["12345678": Hex.decode("FEDCBA9876543210F1F1F1F1F1F1F1F1")!])
    }

    struct Operation {
        /// The merchant whose session asked for it: only that merchant's sessions may refund,
        /// reverse, sign or look it up.
        var merchantID: String
        var transactionID: String
        var amount: Int64
        var currency: String
        var approved: Bool
        var signatureRequired: Bool
        var signed = false
        var reversed = false
        var refunded: Int64 = 0
        var refund: Bool
        var approvalCode = ""
    }

    public var configuration: Configuration
    /// Initial keys derived so far, by initial key ID: only for requests whose MAC verified (an
    /// unauthenticated request with a made-up key ID must not take a place), and at most 1024.
    private(set) var initialKeys = RecentMap<String, [UInt8]>(capacity: 1024)
    private var lastCounter: [String: UInt32] = [:]
    /// Every operation, the oldest forgotten beyond `operationLimit`: each Authorise that
    /// verifies adds one, so even a terminal's own key cannot make the table grow for ever.
    private var operations: RecentMap<String, Operation>
    /// Operations forgotten to make room (a refund of one then finds nothing: 3008).
    public var operationsForgotten: Int { operations.evicted }
    /// Merchant sessions by token, kept per merchant: expired ones are pruned at each login, and
    /// each merchant has at most 1024 live (its oldest make room), so no merchant's logins can
    /// push out another's sessions.
    private(set) var sessionsByMerchant: [String: RecentMap<String, WallTime>] = [:]
    /// Which merchant each live token belongs to.
    private var tokenOwners: [String: String] = [:]

    /// Live sessions, all merchants together.
    var sessionCount: Int { sessionsByMerchant.values.reduce(0) { $0 + $1.count } }
    /// Sessions a merchant's newer logins pushed out.
    var sessionsEvicted: Int { sessionsByMerchant.values.reduce(0) { $0 + $1.evicted } }
    /// Session tokens, operation IDs and approval codes are drawn from this (production: OpenSSL's
    /// CSPRNG). A failure is an error answer, never an empty or predictable value.
    private let random: @Sendable (Int) throws -> [UInt8]
    /// What happened, one line per request (no card data, no keys; peer text escaped): the most
    /// recent 1000 lines, and how many there were.
    public private(set) var journal = RecentLines()
    /// Answers that would not fit in a frame, replaced by an error.
    public private(set) var oversizeAnswers = 0

    public var log: [String] { journal.lines }

    public init(configuration: Configuration, random: @escaping @Sendable (Int) throws -> [UInt8] = { try SecureBytes.random($0) }) {
        self.configuration = configuration
        self.random = random
        operations = RecentMap(capacity: configuration.operationLimit)
    }

    /// Peer text as it may appear in a log line or an error reason: escaped and cut short.
    static func quoted(_ s: String) -> String { PeerText.escaped(s, limit: 64) }

    public func handle(_ payload: [UInt8], now: WallTime) -> [UInt8]? {
        guard let answer = answer(payload, now: now) else { return nil }
        let bytes = answer.serialized
        guard PaymentFrame.fits(bytes) else {
            oversizeAnswers += 1
            return error("2012", "answer too large for a frame", type: answer["Type"]?.string ?? "Error").serialized
        }
        return bytes
    }

    func answer(_ payload: [UInt8], now: WallTime) -> JSONValue? {
        guard let request = try? JSONParser.parse(payload), let type = request["Type"]?.string else {
            return error("2012", "not a gateway request")
        }
        let answer: JSONValue?
        switch type {
        case "Login": answer = login(request, now: now)
        case "Authorise": answer = authorise(request, now: now)
        case "Reverse": answer = reverse(request, now: now)
        case "Signature": answer = signature(request, now: now)
        case "Status": answer = status(request, now: now)
        case "Ping": answer = ["Type": "Pong"]
        case "UpdateCheck": answer = updateCheck(request)
        case "UpdateChunk": answer = updateChunk(request)
        default: answer = error("2012", "unknown request type \(GatewayCore.quoted(type))")
        }
        return answer
    }

    func error(_ code: String, _ reason: String, type: String = "Error") -> JSONValue {
        journal.append("\(type) error \(code): \(reason)")
        return ["Type": .string(type), "Result": "error", "Error": .string(code), "Reason": .string(reason)]
    }

    // MARK: Login

    func login(_ r: JSONValue, now: WallTime) -> JSONValue {
        let environment = r["Environment"]?.string ?? ""
        let licence = r["Licence"]?.string ?? ""
        guard ["des", "int", "ccal", "real"].contains(environment) else { return error("3006", "unknown environment", type: "LoginResult") }
        guard licence.hasPrefix("LIC-TEST-"), environment != "real" else {
            return error("3004", "licence not valid for \(environment)", type: "LoginResult")
        }
        let user = r["User"]?.string ?? "", password = r["Password"]?.string ?? ""
        // Every merchant's password is compared, in constant time, whoever the user is: neither
        // the answer nor its timing says which users exist or how much of a password matched.
        var found: Merchant?
        // Digests of equal length are compared, so not even a length says how close a guess was.
        func digest(_ s: String) -> [UInt8] { Digest.hash(.sha256, Array(s.utf8)) ?? [] }
        let userDigest = digest(user), passwordDigest = digest(password)
        for m in configuration.merchants {
            let userMatches = !userDigest.isEmpty && SecureBytes.equal(digest(m.user), userDigest)
            let passwordMatches = !passwordDigest.isEmpty && SecureBytes.equal(digest(m.password), passwordDigest)
            if userMatches && passwordMatches && (m.licence == nil || m.licence == licence) && found == nil { found = m }
        }
        guard let merchant = found else { return error("3005", "bad credentials", type: "LoginResult") }
        guard let tokenBytes = try? random(16), tokenBytes.count == 16 else {
            return error("5001", "no random bytes for a session token", type: "LoginResult")
        }
        let token = Hex.encode(tokenBytes)
        let expires = now.adding(configuration.sessionLifetime)
        var own = sessionsByMerchant[merchant.merchantID] ?? RecentMap(capacity: 1024)
        own.remove { $1 <= now }
        own.insert(token, expires)
        sessionsByMerchant[merchant.merchantID] = own
        // The owners of tokens no longer held (expired or pushed out) are forgotten with them.
        tokenOwners[token] = merchant.merchantID
        if tokenOwners.count > sessionCount { tokenOwners = tokenOwners.filter { sessionsByMerchant[$0.value]?.contains($0.key) == true } }
        journal.append("Login \(GatewayCore.quoted(user)) ok (merchant \(merchant.merchantID))")
        return ["Type": "LoginResult", "Result": "ok", "SessionToken": .string(token), "MerchantID": .string(merchant.merchantID),
                "TerminalID": .string(merchant.terminalID), "Currencies": .array(configuration.currencies.map { .string($0) }),
                "ExpiresAt": .string(expires.description)]
    }

    /// The merchant of the live session `r` names (its `SessionToken`), if any.
    func merchant(of r: JSONValue, now: WallTime) -> String? {
        guard let token = r["SessionToken"]?.string, let merchant = tokenOwners[token],
              let expires = sessionsByMerchant[merchant]?[token], now < expires else { return nil }
        return merchant
    }

    /// `count` random bytes, or nil when the random source failed (counted in the journal).
    private func randomBytes(_ count: Int) -> [UInt8]? {
        guard let b = try? random(count), b.count == count else {
            journal.append("random source failed")
            return nil
        }
        return b
    }

    /// A new operation ID: `OP-` and 16 random hex digits, unused so far.
    func newOperationID() -> String? {
        for _ in 0..<8 {
            guard let b = randomBytes(8) else { return nil }
            let id = "OP-" + Hex.encode(b)
            if !operations.contains(id) { return id }
        }
        return nil
    }

    /// A new approval code for `merchant`: six random digits none of its kept operations has.
    func newApprovalCode(for merchant: String) -> String? {
        for _ in 0..<64 {
            guard let b = randomBytes(4) else { return nil }
            let v = b.reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            // Rejection sampling: values in the top partial range would favour low codes.
            guard v < 4_294_000_000 else { continue }
            let code = sixDigits(Int(v % 1_000_000))
            if operations.first(where: { $1.merchantID == merchant && $1.approvalCode == code }) == nil { return code }
        }
        return nil
    }

    // MARK: Keys

    struct Keys {
        var ksn: AESKSN
        var initialKey: [UInt8]
        var macGeneration: [UInt8]
        var macVerification: [UInt8]
        var transaction: [UInt8]
    }

    enum KeyFailure: Error { case malformed, unknownKey, invalidCounter }

    func keys(for ksnText: String) throws(KeyFailure) -> Keys {
        guard ksnText.count == 24, let ksn = AESKSN(hex: ksnText) else { throw .malformed }
        let bdkID = Hex.encode(ksn.bdkID)
        guard let bdk = configuration.bdks[bdkID] else { throw .unknownKey }
        guard AESKSN.isValid(counter: ksn.counter) else { throw .invalidCounter }
        let ikid = Hex.encode(ksn.initialKeyID)
        do {
            let ik = try initialKeys[ikid] ?? AESDUKPT.initialKey(bdk: bdk, initialKeyID: ksn.initialKeyID)
            let txn = try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn)
            return Keys(ksn: ksn, initialKey: ik,
                        macGeneration: try AESDUKPT.workingKey(transactionKey: txn, usage: .macGeneration, keyType: .aes128, ksn: ksn),
                        macVerification: try AESDUKPT.workingKey(transactionKey: txn, usage: .macVerification, keyType: .aes128, ksn: ksn),
                        transaction: txn)
        } catch {
            throw .invalidCounter
        }
    }

    /// The checks every MACed request passes, in order: KSN form, known BDK, valid and fresh
    /// counter, MAC (constant time). Only then is the counter recorded.
    func verify(_ r: JSONValue, canonical: [UInt8], type: String) -> Result<Keys, Refusal> {
        let keys: Keys
        do { keys = try self.keys(for: r["KSN"]?.string ?? "") } catch {
            switch error {
            case .malformed: return .failure(Refusal(code: "2012", reason: "malformed KSN"))
            case .unknownKey: return .failure(Refusal(code: "4003", reason: "unknown BDK ID"))
            case .invalidCounter: return .failure(Refusal(code: "4004", reason: "invalid transaction counter"))
            }
        }
        let ikid = Hex.encode(keys.ksn.initialKeyID)
        if let last = lastCounter[ikid], keys.ksn.counter <= last {
            return .failure(Refusal(code: "4002", reason: "counter \(keys.ksn.counter) not above \(last) (replay)"))
        }
        guard let mac = r["MAC"]?.string.flatMap(Hex.decode), mac.count == 16,
              let expected = try? MessageAuthentication.aesCMAC(key: keys.macGeneration, canonical),
              SecureBytes.equal(mac, expected) else {
            return .failure(Refusal(code: "4001", reason: "\(type) MAC does not verify"))
        }
        lastCounter[ikid] = keys.ksn.counter
        initialKeys.insert(ikid, keys.initialKey)
        return .success(keys)
    }

    struct Refusal: Error { var code: String; var reason: String }

    func mac(_ message: JSONValue, _ canonical: [UInt8], key: [UInt8]) -> JSONValue {
        let tag = (try? MessageAuthentication.aesCMAC(key: key, canonical)) ?? []
        return message.setting("MAC", .string(Hex.encode(tag)))
    }

    // MARK: Authorise

    func authorise(_ r: JSONValue, now: WallTime) -> JSONValue? {
        let canonical = GatewayCanonical.authorise(r)
        let keys: Keys
        switch verify(r, canonical: canonical, type: "Authorise") {
        case .failure(let refusal): return error(refusal.code, refusal.reason, type: "AuthoriseResult")
        case .success(let k): keys = k
        }
        func field(_ n: String) -> String { GatewayCanonical.field(r, n) }
        // The terminal's key says which terminal asks; the merchant session it carries says for
        // whom. Operations are kept under that merchant and no other may touch them.
        guard let merchant = merchant(of: r, now: now) else { return error("3005", "no valid merchant session", type: "AuthoriseResult") }
        guard field("MerchantID") == merchant else {
            return error("3005", "merchant \(GatewayCore.quoted(field("MerchantID"))) is not the session's", type: "AuthoriseResult")
        }
        guard let amount = r["AmountMinor"]?.integer, amount > 0 else { return error("2005", "amount", type: "AuthoriseResult") }
        let currency = field("CurrencyNumeric")
        let paymentType = field("PaymentType")
        let cvm = field("CVM")
        var result = "approved", responseCode = "00"
        var byPIN = false
        let signatureRequired = cvm == "Signature"

        // Card data (absent only for a referenced refund).
        var card: CardData?
        if !field("EncCardData").isEmpty {
            guard let cipher = Hex.decode(field("EncCardData")), cipher.count % 16 == 0, !cipher.isEmpty else {
                return error("4005", "card data is not whole AES blocks", type: "AuthoriseResult")
            }
            do {
                var dataKey = try AESDUKPT.workingKey(transactionKey: keys.transaction, usage: .dataEncryption, keyType: .aes128, ksn: keys.ksn)
                defer { SecureBytes.wipe(&dataKey) }
                var clear = try BlockCipher.aes.decrypt(key: dataKey, cipher, mode: .cbc, padding: true)
                defer { SecureBytes.wipe(&clear) }
                guard let parsed = CardData(track2: String(decoding: clear, as: UTF8.self)) else {
                    return error("4005", "card data does not parse", type: "AuthoriseResult")
                }
                card = parsed
            } catch {
                return self.error("4005", "card data does not decrypt", type: "AuthoriseResult")
            }
        }
        if cvm == "OnlinePIN" {
            guard let card, let block = Hex.decode(field("EncPinBlock")), block.count == 16 else {
                return error("2012", "OnlinePIN without card or PIN block", type: "AuthoriseResult")
            }
            let pinKey = try? AESDUKPT.workingKey(transactionKey: keys.transaction, usage: .pinEncryption, keyType: .aes128, ksn: keys.ksn)
            let pin = pinKey.flatMap { try? PINBlock.decipherFormat4(block, pan: card.pan, key: $0) }
            byPIN = pin != nil && pin == (configuration.pins[card.pan] ?? configuration.defaultPIN)
            if !byPIN { result = "declined"; responseCode = "55" }
        }
        if let card, card.expiry < now.yymm { result = "declined"; responseCode = "54" }
        if !configuration.currencies.contains(currency) { result = "declined"; responseCode = "57" }

        var original: String?
        if paymentType == "Refund", !field("OriginalOperationID").isEmpty {
            // The original by its operation ID, or by the authorisation (approval) code the
            // merchant has on the receipt: unique per merchant.
            var id = field("OriginalOperationID")
            if PaymentRules.isDigits(id, 6...6),
               let byCode = operations.first(where: { $1.approvalCode == id && $1.merchantID == merchant && !$1.refund }) {
                id = byCode.key
            }
            // Another merchant's operation is not found: the answer does not say it exists.
            guard let op = operations[id], op.merchantID == merchant, op.approved, !op.refund else {
                return error("3008", "original operation \(GatewayCore.quoted(id)) not found", type: "AuthoriseResult")
            }
            guard op.currency == currency, amount <= op.amount - op.refunded, !op.reversed else {
                return error("3007", "refund exceeds what remains of \(GatewayCore.quoted(id))", type: "AuthoriseResult")
            }
            original = id
        } else if card == nil {
            return error("2012", "a payment needs card data", type: "AuthoriseResult")
        }
        switch amount % 100 {
        case 5 where paymentType == "Normal": result = "declined"; responseCode = "05"
        case 51 where paymentType == "Normal": result = "declined"; responseCode = "51"
        case 91:
            journal.append("Authorise \(GatewayCore.quoted(field("TransactionID"))) withheld (rule: amount % 100 == 91)")
            return nil
        default: break
        }

        // Random, so that one receipt says nothing about the next (specification §4.10 numbers them
        // in sequence; see docs/PAYMENTS.md).
        guard let operationID = newOperationID() else { return error("5001", "no random bytes for an operation ID", type: "AuthoriseResult") }
        var approval = ""
        if result == "approved" {
            guard let code = newApprovalCode(for: merchant) else { return error("5001", "no approval code free", type: "AuthoriseResult") }
            approval = code
            if let original, var o = operations[original] {
                o.refunded += amount
                operations.insert(original, o)
            }
        }
        operations.insert(operationID, Operation(merchantID: merchant, transactionID: field("TransactionID"), amount: amount,
                                            currency: currency, approved: result == "approved",
                                            signatureRequired: signatureRequired && result == "approved", refund: paymentType == "Refund",
                                            approvalCode: approval))
        journal.append("Authorise \(GatewayCore.quoted(field("TransactionID"))) \(GatewayCore.quoted(paymentType)) \(amount) \(GatewayCore.quoted(currency)) → \(result) \(responseCode) \(operationID)")
        let answer: JSONValue = [
            "Type": "AuthoriseResult", "OperationID": .string(operationID), "Result": .string(result),
            "ResponseCode": .string(responseCode), "ApprovalCode": .string(approval), "AuthenticatedByPin": .bool(byPIN),
            "SignatureRequired": .bool(signatureRequired && result == "approved"), "AmountMinor": .integer(amount),
            "CurrencyNumeric": .string(currency), "KSN": .string(field("KSN")), "TransactionID": .string(field("TransactionID")),
        ]
        return mac(answer, GatewayCanonical.authoriseResult(answer), key: keys.macVerification)
    }

    func sixDigits(_ n: Int) -> String { let s = String(n); return String(repeating: "0", count: max(0, 6 - s.count)) + s }

    // MARK: Reverse, signature

    func reverse(_ r: JSONValue, now: WallTime) -> JSONValue {
        let keys: Keys
        switch verify(r, canonical: GatewayCanonical.reverse(r), type: "Reverse") {
        case .failure(let refusal): return error(refusal.code, refusal.reason, type: "ReverseResult")
        case .success(let k): keys = k
        }
        let id = r["OperationID"]?.string ?? ""
        var answer: JSONValue = ["Type": "ReverseResult", "OperationID": .string(id), "KSN": r["KSN"] ?? ""]
        guard let merchant = merchant(of: r, now: now) else {
            journal.append("Reverse \(GatewayCore.quoted(id)) refused: no valid merchant session")
            answer = answer.setting("Result", "error").setting("Error", "3005")
            return mac(answer, GatewayCanonical.reverseResult(answer), key: keys.macVerification)
        }
        if var op = operations[id], op.merchantID == merchant, op.approved, !op.reversed, op.refunded == 0 {
            op.reversed = true
            operations.insert(id, op)
            answer = answer.setting("Result", "ok").setting("ReversedAmountMinor", .integer(op.amount))
            journal.append("Reverse \(GatewayCore.quoted(id)) ok")
        } else {
            answer = answer.setting("Result", "error").setting("Error", operations[id]?.merchantID == merchant ? "3007" : "3008")
            journal.append("Reverse \(GatewayCore.quoted(id)) refused")
        }
        return mac(answer, GatewayCanonical.reverseResult(answer), key: keys.macVerification)
    }

    func signature(_ r: JSONValue, now: WallTime) -> JSONValue {
        guard let merchant = merchant(of: r, now: now) else {
            return error("3005", "no valid session", type: "SignatureResult")
        }
        let id = r["OperationID"]?.string ?? ""
        guard var op = operations[id], op.merchantID == merchant, op.approved, op.signatureRequired, !op.signed, !op.reversed else {
            return error("3008", "operation \(GatewayCore.quoted(id)) takes no signature", type: "SignatureResult")
        }
        guard let format = r["ImageFormat"]?.integer, let image = r["Image"]?.string.flatMap(Base64.decode),
              SignatureImage.isValid(image, format: Int(format)),
              let digest = Digest.hash(.sha256, image), Hex.encode(digest) == (r["SHA256"]?.string ?? "").uppercased() else {
            return error("2008", "signature image invalid", type: "SignatureResult")
        }
        op.signed = true
        operations.insert(id, op)
        journal.append("Signature \(GatewayCore.quoted(id)) ok (\(image.count) bytes, format \(format))")
        return ["Type": "SignatureResult", "Result": "ok", "OperationID": .string(id)]
    }

    /// An operation as its merchant sees it; another merchant's is not found (3008).
    func status(_ r: JSONValue, now: WallTime) -> JSONValue {
        guard let merchant = merchant(of: r, now: now) else { return error("3005", "no valid session", type: "StatusResult") }
        let id = r["OperationID"]?.string ?? ""
        guard let op = operations[id], op.merchantID == merchant else {
            return error("3008", "operation \(GatewayCore.quoted(id)) not found", type: "StatusResult")
        }
        journal.append("Status \(GatewayCore.quoted(id)) ok")
        return ["Type": "StatusResult", "Result": "ok", "OperationID": .string(id), "TransactionID": .string(op.transactionID),
                "Approved": .bool(op.approved), "Refund": .bool(op.refund), "ApprovalCode": .string(op.approvalCode),
                "AmountMinor": .integer(op.amount), "CurrencyNumeric": .string(op.currency), "RefundedMinor": .integer(op.refunded),
                "Reversed": .bool(op.reversed), "Signed": .bool(op.signed)]
    }

    // MARK: Updates

    func updateCheck(_ r: JSONValue) -> JSONValue {
        guard let update = configuration.update, let current = r["Version"]?.string,
              UpdateOffer.isNewer(update.offer.version, than: current) else {
            return ["Type": "UpdateOffer", "Available": false]
        }
        return ["Type": "UpdateOffer", "Available": true, "Update": update.offer.json]
    }

    func updateChunk(_ r: JSONValue) -> JSONValue {
        guard let update = configuration.update, r["Version"]?.string == update.offer.version,
              let offset = r["Offset"]?.integer, let length = r["Length"]?.integer,
              offset >= 0, length > 0, length <= 65_536, offset <= Int64(update.image.count) else {
            return error("2012", "bad update chunk request", type: "UpdateChunkResult")
        }
        let end = min(update.image.count, Int(offset + length))
        return ["Type": "UpdateChunkResult", "Offset": .integer(offset), "Data": .string(Base64.encode(Array(update.image[Int(offset)..<end])))]
    }
}

extension UpdateOffer {
    /// Dotted numeric versions compared part by part ("1.10.0" > "1.9.2").
    public static func isNewer(_ a: String, than b: String) -> Bool {
        let x = a.split(separator: ".").map { Int($0) ?? 0 }, y = b.split(separator: ".").map { Int($0) ?? 0 }
        for i in 0..<max(x.count, y.count) {
            let p = i < x.count ? x[i] : 0, q = i < y.count ? y[i] : 0
            if p != q { return p > q }
        }
        return false
    }
}
