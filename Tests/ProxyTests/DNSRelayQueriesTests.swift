import Testing
import NetStack
@testable import Proxy

/// The DNS relay's book of queries, sans-IO: a terminal's queries and an upstream's datagrams
/// as a hostile peer would send them.
@Suite struct DNSRelayQueriesTests {
    let client = TCPEndpoint(IPv4Address(192, 168, 53, 2), 5353)
    let query: [UInt8] = [0xAB, 0xCD, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0] + Array("\u{7}example\u{4}test\0\0\u{1}\0\u{1}".utf8)

    @Test func anAnswerIsTakenOnlyUnderTheIdSentAndGoesBackUnderTheClients() throws {
        var book = DNSRelayQueries<Int>()
        let admitted = book.admits(query)
        #expect(admitted)
        let upstream = try #require(DNSRelayQueries<Int>.upstreamQuery(query, id: 0x1234))
        #expect(upstream[0] == 0x12 && upstream[1] == 0x34 && upstream.dropFirst(2) == query.dropFirst(2))
        book.sent(query, from: client, upstreamID: 0x1234, on: 7, now: .zero)
        var forged = upstream
        forged[1] ^= 1
        let wrongID = book.answer(forged, on: 7)
        #expect(wrongID == nil && book.counters.mismatched == 1 && book.isWaiting(on: 7))
        let short = book.answer([0x12], on: 7)
        #expect(short == nil && book.counters.mismatched == 2)
        let otherSocket = book.answer(upstream, on: 8)
        #expect(otherSocket == nil, "no query on that socket")
        let taken = book.answer(upstream, on: 7)
        let (to, answer) = try #require(taken)
        #expect(to == client && answer == query)
        let again = book.answer(upstream, on: 7)
        #expect(again == nil && !book.isWaiting(on: 7), "answered once")
        #expect(book.counters.queries == 1 && book.counters.answers == 1)
    }

    @Test func shortQueriesAndQueriesBeyondTheCapAreDroppedAndCounted() {
        var book = DNSRelayQueries<Int>(capacity: 2)
        let tooShort = book.admits([1, 2, 3])
        #expect(!tooShort)
        for slot in 0..<2 {
            let admitted = book.admits(query)
            #expect(admitted)
            book.sent(query, from: client, upstreamID: UInt16(slot), on: slot, now: .zero)
        }
        let overCap = book.admits(query)
        #expect(!overCap && book.counters.dropped == 2 && book.count == 2)
    }

    @Test func queriesAreForgottenAtTheirDeadline() {
        var book = DNSRelayQueries<Int>(timeout: .seconds(5))
        book.sent(query, from: client, upstreamID: 1, on: 1, now: .zero)
        book.sent(query, from: client, upstreamID: 2, on: 2, now: .seconds(3))
        #expect(book.pollAt == .seconds(5))
        let expired = book.expire(now: .seconds(5))
        #expect(expired == [1] && book.counters.timeouts == 1)
        #expect(book.pollAt == .seconds(8))
    }
}
