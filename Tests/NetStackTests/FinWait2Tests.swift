import Testing
@testable import NetStack

/// A peer that acknowledges our FIN and never sends its own once held the connection, and its
/// place under the listener's and the stack's limits, for good.
@Suite struct FinWait2Tests {
    @Test func aClosedConnectionGivesUpWaitingForThePeersFin() {
        var s = TCPScript()
        s.conn.close(now: s.now)
        let fin = s.take()
        #expect(fin.count == 1 && fin[0].header.flags.contains(.fin))
        s.deliver([.ack], ack: s.iss + 2)
        #expect(s.conn.state == .finWait2)
        s.advance(to: .seconds(59))
        #expect(s.conn.state == .finWait2)
        // Acknowledgments alone do not hold it longer.
        s.deliver([.ack], ack: s.iss + 2)
        s.advance(to: .seconds(60))
        #expect(s.conn.state == .closed)
        #expect(s.takeEvents().last == .closed(.finWait2Timeout))
        #expect(s.take().first?.header.flags.contains(.rst) == true)
    }

    /// A half-close still reads: the peer may send for as long as it likes.
    @Test func aHalfClosedConnectionWaitsForThePeer() {
        var s = TCPScript()
        s.conn.shutdownWrite(now: s.now)
        _ = s.take()
        s.deliver([.ack], ack: s.iss + 2)
        s.advance(to: .seconds(3600))
        #expect(s.conn.state == .finWait2)
        s.deliver([.ack, .psh], ack: s.iss + 2, payload: bytes(10))
        #expect(s.conn.readableBytes == 10)
    }
}
