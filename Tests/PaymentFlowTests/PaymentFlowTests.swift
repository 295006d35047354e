import Channel
import ChannelTestSupport
import Crypto
import Glibc
import NetStack
import Payment
import PaymentKit
import Testing

/// End to end over the real stack: terminal simulator ↔ PPP on a pty ↔ channel ↔ host SDK, the
/// terminal reaching the gateway through the channel's SOCKS proxy.
@Suite(.serialized, .timeLimit(.minutes(2))) struct PaymentFlowTests {
    @Test func approvedPaymentCarriesNoClearCardDataAnywhere() async throws {
        let world = try PaymentWorld()
        try await world.connect()
        #expect(world.reader.info?.serialNumber == "SIM-00000001")
        #expect(world.reader.info?.locationID == "tml_test_1")
        try world.presentCard()
        let outcome = try await world.reader.startPayment(amount: "10.50", currency: .eur, transactionID: "0001ABC")
        #expect(outcome.result == .approved)
        #expect(outcome.approvalCode == "000001")
        #expect(outcome.operationID == "OP-000001")
        #expect(outcome.amountMinor == 1050 && outcome.authenticatedByPin)
        #expect(outcome.maskedPAN == "411111******1111")
        #expect(world.reader.state == .finished)
        #expect(world.gateway.log.contains { $0.contains("0001ABC Normal 1050 978 → approved 00 OP-000001") })
        await world.shutdown()

        // Nothing that crossed carries the PAN or the PIN block's clear form.
        let pan = Array("4111111111111111".utf8)
        func contains(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
            guard hay.count >= needle.count else { return false }
            return (0...(hay.count - needle.count)).contains { Array(hay[$0..<($0 + needle.count)]) == needle }
        }
        let sdk = world.reader.recorded, reader = world.terminal.readerBytes, gw = world.gateway.recorded
        #expect(sdk.count > 500 && reader.count > 500 && gw.count > 200)
        #expect(contains(reader, Array("411111******1111".utf8)), "the masked PAN is what the host sees")
        for (name, bytes) in [("sdk", sdk), ("reader", reader), ("gateway", gw)] {
            #expect(!contains(bytes, pan), "clear PAN in \(name) bytes")
        }
    }
}
