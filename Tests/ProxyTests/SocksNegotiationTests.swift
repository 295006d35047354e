import NetStack
@testable import Proxy
import Testing

@Suite struct SocksNegotiationTests {
    typealias Step = SocksNegotiation.Step

    static let passwords = ["alice": "s3cret"]

    func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    /// All steps but `.needMore`, feeding `input` in one piece or one byte at a time.
    func outcome(_ input: [UInt8], passwords: [String: String]? = nil, bytewise: Bool = false) -> (steps: [Step], leftover: [UInt8]) {
        var negotiation = SocksNegotiation(passwords: passwords)
        var steps: [Step] = []
        let chunks = bytewise ? input.map({ [$0] }) : [input]
        for chunk in chunks {
            steps += negotiation.feed(chunk).filter { $0 != .needMore }
        }
        return (steps, negotiation.leftover)
    }

    func refusal(_ steps: [Step]) -> [UInt8]? {
        guard case .refuse(let reply, _)? = steps.last else { return nil }
        return reply
    }

    func request(_ steps: [Step]) -> SocksRequest? {
        guard case .request(let request, let reply)? = steps.last, reply.isEmpty else { return nil }
        return request
    }

    @Test func socks4Connect() {
        var negotiation = SocksNegotiation()
        #expect(negotiation.feed([4, 1, 0, 80, 10, 0, 0]) == [.needMore])
        let steps = negotiation.feed([1] + bytes("fred") + [0])
        let expected = SocksRequest(version: .socks4, host: .ipv4(IPv4Address(10, 0, 0, 1)), port: 80, user: "fred")
        #expect(steps == [.request(expected, reply: [])])
        #expect(negotiation.feed([1, 2, 3]) == [])
        #expect(negotiation.leftover == [1, 2, 3])
    }

    @Test func socks4aCarriesHostName() {
        let input: [UInt8] = [4, 1, 0x01, 0xBB, 0, 0, 0, 9, 0] + bytes("example.com") + [0]
        let steps = outcome(input).steps
        #expect(request(steps) == SocksRequest(version: .socks4a, host: .name("example.com"), port: 443, user: nil))
        #expect(request(steps)?.host.description == "example.com")
    }

    @Test func socks4BindAndPasswordsAndGarbageRefused() {
        let rejected: [UInt8] = [0x00, 0x5B, 0, 0, 0, 0, 0, 0]
        #expect(refusal(outcome([4, 2, 0, 21, 10, 0, 0, 1, 0]).steps) == rejected)
        // SOCKS4 cannot carry a password.
        #expect(refusal(outcome([4, 1, 0, 80, 10, 0, 0, 1, 0], passwords: Self.passwords).steps) == rejected)
        // A user id without NUL within 255 bytes.
        #expect(refusal(outcome([4, 1, 0, 80, 10, 0, 0, 1] + [UInt8](repeating: 0x41, count: 256)).steps) == rejected)
        #expect(refusal(outcome(bytes("GET / HTTP/1.1\r\n")).steps) == [])
    }

    @Test func socks5NoAuthenticationIPv4() {
        var negotiation = SocksNegotiation()
        #expect(negotiation.feed([5, 2, 2, 0]) == [.reply([5, 0]), .needMore])
        let steps = negotiation.feed([5, 1, 0, 1, 192, 168, 1, 2, 0x1F, 0x90])
        let expected = SocksRequest(version: .socks5, host: .ipv4(IPv4Address(192, 168, 1, 2)), port: 8080)
        #expect(steps == [.request(expected, reply: [])])
        #expect(expected.host.description == "192.168.1.2")
    }

    @Test func socks5DomainName() {
        let input: [UInt8] = [5, 1, 0] + [5, 1, 0, 3, 11] + bytes("example.org") + [0, 80]
        let steps = outcome(input).steps
        #expect(steps.first == .reply([5, 0]))
        #expect(request(steps) == SocksRequest(version: .socks5, host: .name("example.org"), port: 80))
        // RFC 1928 §5: a name has at least one byte.
        #expect(refusal(outcome([5, 1, 0, 5, 1, 0, 3, 0, 0, 80]).steps) == [5, 1, 0, 1, 0, 0, 0, 0, 0, 0])
    }

    @Test func socks5IPv6IsParsed() {
        let address: [UInt8] = [0x20, 0x01, 0x0D, 0xB8] + [UInt8](repeating: 0, count: 11) + [1]
        let steps = outcome([5, 1, 0, 5, 1, 0, 4] + address + [0x01, 0xBB]).steps
        #expect(request(steps) == SocksRequest(version: .socks5, host: .ipv6(address), port: 443))
        #expect(SocksDestinationHost.ipv6(address).description == "[2001:db8::1]")
        #expect(SocksDestinationHost.ipv6([UInt8](repeating: 0, count: 16)).description == "[::]")
        let noRun: [UInt8] = [0, 1, 0, 0, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7]
        #expect(SocksDestinationHost.ipv6(noRun).description == "[1:0:2:3:4:5:6:7]")
    }

    @Test func socks5UsernamePasswordAccepted() {
        var negotiation = SocksNegotiation(passwords: Self.passwords)
        #expect(negotiation.feed([5, 2, 0, 2]) == [.reply([5, 2]), .needMore])
        #expect(negotiation.feed([1, 5] + bytes("alice") + [6] + bytes("s3cret")) == [.reply([1, 0]), .needMore])
        let steps = negotiation.feed([5, 1, 0, 1, 10, 0, 0, 1, 0, 22])
        #expect(request(steps) == SocksRequest(version: .socks5, host: .ipv4(IPv4Address(10, 0, 0, 1)), port: 22, user: "alice"))
    }

    @Test func socks5WrongPasswordOrUserRefused() {
        for (user, password) in [("alice", "s3creT"), ("alice", "s3cre"), ("alice", ""), ("bob", "s3cret")] {
            var negotiation = SocksNegotiation(passwords: Self.passwords)
            _ = negotiation.feed([5, 1, 2])
            let steps = negotiation.feed([1, UInt8(user.utf8.count)] + bytes(user) + [UInt8(password.utf8.count)] + bytes(password))
            #expect(refusal(steps) == [1, 1])
            #expect(negotiation.feed([5, 1, 0, 1, 10, 0, 0, 1, 0, 22]) == [])
        }
    }

    @Test func socks5NoAcceptableMethod() {
        // RFC 1928 §3: X'FF' when none of the offered methods is acceptable.
        #expect(outcome([5, 1, 2]).steps == [.refuse([5, 0xFF], reason: "no acceptable SOCKS5 authentication method offered")])
        #expect(refusal(outcome([5, 1, 0], passwords: Self.passwords).steps) == [5, 0xFF])
        #expect(refusal(outcome([5, 0]).steps) == [5, 0xFF])
    }

    @Test func socks5BindAndUDPAssociateRefused() {
        for command: UInt8 in [2, 3, 9] {
            let steps = outcome([5, 1, 0, 5, command, 0, 1, 10, 0, 0, 1, 0, 53]).steps
            #expect(steps.first == .reply([5, 0]))
            #expect(refusal(steps) == [5, 0x07, 0, 1, 0, 0, 0, 0, 0, 0])
        }
    }

    @Test func socks5UnknownAddressTypeRefused() {
        let steps = outcome([5, 1, 0, 5, 1, 0, 2, 1, 2, 3, 4, 0, 80]).steps
        #expect(refusal(steps) == [5, 0x08, 0, 1, 0, 0, 0, 0, 0, 0])
    }

    @Test func byteAtATimeMatchesOneFeed() {
        let auth: [UInt8] = [1, 5] + bytes("alice") + [6] + bytes("s3cret")
        let cases: [([UInt8], [String: String]?)] = [
            ([4, 1, 0, 80, 10, 0, 0, 1] + bytes("fred") + [0] + bytes("early"), nil),
            ([4, 1, 0, 80, 0, 0, 0, 1, 0] + bytes("host.example") + [0], nil),
            ([5, 1, 0, 5, 1, 0, 3, 4] + bytes("a.bc") + [0, 80, 42], nil),
            ([5, 1, 2] + auth + [5, 1, 0, 1, 10, 0, 0, 1, 0, 22], Self.passwords),
            ([5, 1, 2, 1, 1, 0x78, 1, 0x79], Self.passwords),
            ([5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0], nil),
            ([4, 2, 0, 21, 10, 0, 0, 1, 0], nil),
            ([0x16, 3, 1], nil),
        ]
        for (input, passwords) in cases {
            let whole = outcome(input, passwords: passwords)
            let bytewise = outcome(input, passwords: passwords, bytewise: true)
            #expect(whole.steps == bytewise.steps)
            #expect(whole.leftover == bytewise.leftover)
            #expect(!whole.steps.isEmpty)
        }
    }

    @Test func earlyClientDataKeptInLeftover() {
        var negotiation = SocksNegotiation()
        let data = bytes("GET / HTTP/1.0\r\n\r\n")
        let steps = negotiation.feed([5, 1, 0] + [5, 1, 0, 1, 10, 0, 0, 1, 0, 80] + data)
        #expect(steps.count == 2 && request(steps) != nil)
        #expect(negotiation.leftover == data)
        #expect(negotiation.feed([7]) == [])
        #expect(negotiation.leftover == data + [7])
    }

    @Test func oversizeHandshakeRefused() {
        // 255 methods (257 bytes) + 255-byte user and password (513) + a request naming N bytes (N + 7).
        let user = String(repeating: "u", count: 255), password = String(repeating: "p", count: 255)
        let passwords = [user: password]
        func handshake(nameLength: Int) -> [UInt8] {
            var input: [UInt8] = [5, 255]
            input += 0...254
            input += [1, 255] + bytes(user)
            input += [255] + bytes(password)
            input += [5, 1, 0, 3, UInt8(nameLength)]
            input += [UInt8](repeating: 0x61, count: nameLength)
            input += [0, 80]
            return input
        }
        // Exactly maximumHandshakeBytes completes.
        let fits = handshake(nameLength: 247)
        #expect(fits.count == SocksNegotiation.maximumHandshakeBytes)
        #expect(request(outcome(fits, passwords: passwords).steps)?.user == user)
        // One byte more is refused, however it arrives.
        for bytewise in [false, true] {
            let steps = outcome(handshake(nameLength: 248), passwords: passwords, bytewise: bytewise).steps
            #expect(Array(steps.prefix(2)) == [.reply([5, 2]), .reply([1, 0])])
            #expect(refusal(steps) == [5, 1, 0, 1, 0, 0, 0, 0, 0, 0])
        }
    }

    @Test func replyBytesAreExact() {
        let bound = IPv4Address(10, 0, 0, 2)
        let v4 = SocksRequest(version: .socks4, host: .ipv4(bound), port: 80, user: nil)
        let v4a = SocksRequest(version: .socks4a, host: .name("x"), port: 80, user: nil)
        let v5 = SocksRequest(version: .socks5, host: .name("x"), port: 80, user: nil)
        #expect(SocksNegotiation.successReply(for: v4, bound: bound, port: 0x1234) == [0x00, 0x5A, 0x12, 0x34, 10, 0, 0, 2])
        #expect(SocksNegotiation.successReply(for: v4a, bound: bound, port: 0x1234) == [0x00, 0x5A, 0x12, 0x34, 10, 0, 0, 2])
        #expect(SocksNegotiation.successReply(for: v5, bound: bound, port: 0x1234) == [5, 0, 0, 1, 10, 0, 0, 2, 0x12, 0x34])
        #expect(SocksNegotiation.failureReply(for: .socks4, .connectionRefused) == [0x00, 0x5B, 0, 0, 0, 0, 0, 0])
        let failures: [SocksFailure] = [
            .generalFailure, .notAllowed, .networkUnreachable, .hostUnreachable, .connectionRefused, .ttlExpired,
            .commandNotSupported, .addressTypeNotSupported,
        ]
        for (index, failure) in failures.enumerated() {
            #expect(SocksNegotiation.failureReply(for: .socks5, failure) == [5, UInt8(index + 1), 0, 1, 0, 0, 0, 0, 0, 0])
        }
    }
}
