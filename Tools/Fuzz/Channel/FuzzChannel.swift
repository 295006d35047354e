// libFuzzer target: the channel's sans-IO pieces that take a terminal's input over the link.
//
// The first byte chooses:
//   even: a SOCKS client. The rest is what it sends, fed to `SocksNegotiation` (bit 1 of the
//         first byte: a password is required) in pieces whose sizes the bytes themselves pick;
//         the outcome must not depend on the cut. A CONNECT request's destination goes before
//         the proxy's policy (`SocksPolicy`) as the proxy puts it there: an allow-list, private
//         destinations allowed or not, our addresses and the host's, and for a name the address
//         it "resolved" to, all chosen by the first byte's other bits and the request's own
//         bytes. The decision must keep the policy's promises (below), and its replies are built.
//   odd:  the DNS relay's book of queries. The rest is a series of operations, each a byte
//         and a 2-byte big-endian length with that many bytes: a client's query (admitted,
//         sent under a fresh id on a slot), an upstream datagram on a slot (answered only under
//         the id sent), time passing, a slot closed. The cap and the ids must hold throughout.
// Nothing may trap.
import Channel
import FuzzSupport
import NetStack
import Proxy

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzChannel(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    if input[0] & 1 == 0 {
        socksClient(input)
    } else {
        dnsRelay(input)
    }
    return 0
}

/// What `PeerText.escaped` promises of a log line's peer text: printable ASCII only.
func isPrintable(_ text: String) -> Bool { text.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) } }

func socksClient(_ input: [UInt8]) {
    let body = Array(input.dropFirst())
    let passwords: [String: String]? = input[0] & 2 != 0 ? ["user": "secret"] : nil
    let once = socksStepsWhateverTheCut(body, passwords: passwords)
    let ends = once.filter { if case .needMore = $0 { return false } else { return true } }
    precondition(body.count <= SocksNegotiation.maximumHandshakeBytes || ends.count >= 1, "an endless handshake was not refused")
    // A refusal's reason goes to the proxy's log as it is (`SocksProxy`: "refused: REASON").
    for case let .refuse(_, reason) in ends {
        precondition(isPrintable(reason), "a refusal's reason reached a log unescaped")
    }
    guard case let .request(request, _)? = once.last else { return }
    FuzzDepth.count("socks-requests")
    _ = request.host.description
    policyDecision(request, bits: input[0], body: body)
    for version in [SocksVersion.socks4, .socks5] {
        _ = SocksNegotiation.failureReply(for: version, .notAllowed)
    }
    _ = SocksNegotiation.successReply(for: request, bound: IPv4Address(192, 168, 53, 1), port: 1080)
}

/// What the proxy does with a request (`SocksProxy.admit`, `connectIfAllowed`), with a policy
/// and addresses the input picks, and the promises the decision must keep:
/// - a destination an allow-list does not name is `notListed`, whatever else holds;
/// - the operator opened it (`connect(openedByOperator: true)`) only with private destinations
///   allowed or an entry naming this address and port;
/// - the rules let it through only to a global address that is neither ours nor the host's;
/// - otherwise, a destination that is not global, or ours, is never connected to;
/// - what a log line shows of the destination has no control character (`PeerText`).
func policyDecision(_ request: SocksRequest, bits: UInt8, body: [UInt8]) {
    // Addresses from the request's own bytes, so that mutations reach every range.
    func address(_ k: Int) -> IPv4Address {
        let b = { (i: Int) -> UInt8 in body.isEmpty ? 0 : body[(k &* 7 &+ i) % body.count] }
        return IPv4Address(b(0), b(1), b(2), b(3))
    }
    // As the proxy takes it (`SocksProxy.admit`): an IPv6 destination is refused before this.
    guard let requested = SocksDestination(request) else { return }
    var resolved = address(1)
    if case let .ipv4(a) = request.host { resolved = a }
    // What the proxy's log lines show of the destination (`SocksProxy.refuse`, `admit`), and
    // how a destination prints.
    for text in ["\(request.host):\(request.port)", requested.description] {
        precondition(isPrintable(text), "a destination's text reached a log unescaped")
    }
    let byAddress = SocksDestination(host: resolved.description, port: request.port)
    let allow: [SocksDestination]?
    switch (bits >> 2) & 3 {
    case 0: allow = nil
    case 1: allow = [requested]
    case 2: allow = [requested, byAddress]
    default: allow = [SocksDestination(host: address(2).description, port: request.port &+ 1)]
    }
    let own = [address(3), bits & 0x40 != 0 ? resolved : address(4)]
    let hostAddresses = bits & 0x80 != 0 ? [resolved, address(5)] : [address(5)]
    let policy = SocksPolicy(allow: allow, allowPrivate: bits & 0x10 != 0, ownAddresses: own)
    let decision = policy.decide(requested, address: resolved, hostAddresses: hostAddresses)
    let scope = IPv4AddressScope(resolved)
    FuzzDepth.count("socks-\(scope)")
    let listed = allow?.contains(requested) ?? true
    let namedByOperator = policy.allowPrivate || (allow?.contains(byAddress) ?? false)
    switch decision {
    case .notListed:
        FuzzDepth.count("socks-not-listed")
        precondition(!listed, "a listed destination was refused as not listed")
    case .connect(openedByOperator: true):
        FuzzDepth.count("socks-operator")
        precondition(listed && namedByOperator, "a destination was opened that no entry and no setting opens")
    case .connect(openedByOperator: false):
        FuzzDepth.count("socks-connect")
        precondition(listed && !namedByOperator && scope == .global && !own.contains(resolved) && !hostAddresses.contains(resolved),
                     "the rules let through \(resolved), \(scope)")
    case .ownAddress:
        FuzzDepth.count("socks-own-address")
        precondition(listed && !namedByOperator && own.contains(resolved), "refused as ours: \(resolved)")
    case .hostAddress:
        FuzzDepth.count("socks-host-address")
        precondition(listed && !namedByOperator && scope == .global && hostAddresses.contains(resolved), "refused as the host's: \(resolved)")
    case let .restricted(s):
        FuzzDepth.count("socks-restricted")
        precondition(listed && !namedByOperator && s == scope && scope != .global, "refused by range: \(resolved), \(scope)")
    }
    if !listed { precondition(decision == .notListed, "an unlisted destination was not refused as such") }
}

func dnsRelay(_ input: [UInt8]) {
    var book = DNSRelayQueries<Int>(capacity: 8, timeout: .seconds(5))
    var random = SplitMix64(seed: UInt64(input[0]))
    var sentIDs: [Int: UInt16] = [:]
    var now = Instant.zero
    var nextSlot = 0
    var i = 1
    while i + 3 <= input.count {
        let op = input[i]
        let n = min(Int(input[i + 1]) << 8 | Int(input[i + 2]), input.count - i - 3)
        let bytes = Array(input[(i + 3)..<(i + 3 + n)])
        i += 3 + n
        switch op % 4 {
        case 0:
            guard book.admits(bytes) else { break }
            let id = UInt16.random(in: .min ... .max, using: &random)
            guard let upstream = DNSRelayQueries<Int>.upstreamQuery(bytes, id: id) else { preconditionFailure("an admitted query had no header") }
            precondition(upstream.count == bytes.count && Array(upstream.dropFirst(2)) == Array(bytes.dropFirst(2)), "the relay changed more than the id")
            book.sent(bytes, from: TCPEndpoint(IPv4Address(192, 168, 53, 2), 5353), upstreamID: id, on: nextSlot, now: now)
            sentIDs[nextSlot] = id
            nextSlot += 1
        case 1:
            let slot = Int(op >> 2) % max(nextSlot, 1)
            if let (_, answer) = book.answer(bytes, on: slot) {
                FuzzDepth.count("dns-answers")
                precondition(bytes.count >= 12 && sentIDs[slot] == UInt16(bytes[0]) << 8 | UInt16(bytes[1]), "an answer under another id was taken")
                precondition(answer.count == bytes.count, "an answer changed length")
                sentIDs[slot] = nil
            }
        case 2:
            now = now + .milliseconds(Int64(n) * 50)
            for slot in book.expire(now: now) { sentIDs[slot] = nil }
        default:
            let slot = Int(op >> 2) % max(nextSlot, 1)
            book.remove(slot)
            sentIDs[slot] = nil
        }
        precondition(book.count <= book.capacity, "queries in flight over the cap")
        if let p = book.pollAt { precondition(p > now, "a query outlived its deadline") }
    }
}

#if FUZZING
@_cdecl("FuzzChannel_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzChannel)
}
#else
@main struct Replay {
    static func main() { replay(fuzzChannel) }
}
#endif
