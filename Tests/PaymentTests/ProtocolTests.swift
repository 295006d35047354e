import Crypto
import Payment
import Testing

@Suite struct FramingTests {
    func sample(_ id: String) -> PaymentMessage {
        PaymentMessage(direction: .request,
                       header: .init(messageClass: .service, category: .payment, type: .request, identifier: id, saleID: "HOST-1", poiID: "SIM-00000001"),
                       body: ["PaymentTransaction": ["AmountsReq": ["Currency": "EUR", "CurrencyNumeric": "978", "RequestedAmountMinor": 1050]]])
    }

    @Test func splitAtEveryByteAndSeveralPerRead() throws {
        let frames = try (1...3).map { try PaymentFrame.encode(sample(String($0)).encoded) }
        let stream = frames.flatMap { $0 }
        // One byte at a time.
        var d = PaymentFrameDecoder()
        var got = [[UInt8]]()
        for b in stream { got += try d.feed([b]) }
        #expect(got.count == 3)
        #expect(try got.map { try PaymentMessage.decode($0) } == (1...3).map { sample(String($0)) })
        // Every split point of the whole stream into two reads.
        for cut in 0...stream.count {
            var d = PaymentFrameDecoder()
            let out = try d.feed(Array(stream[..<cut])) + d.feed(Array(stream[cut...]))
            #expect(out.count == 3 && d.pendingCount == 0)
        }
    }

    @Test func zeroAndOversizeLengthsFail() throws {
        var d = PaymentFrameDecoder()
        #expect(throws: FrameError.emptyFrame) { try d.feed([0, 0, 0, 0, 1]) }
        #expect(throws: FrameError.emptyFrame) { try d.feed([0, 0, 0, 1, 0x31]) }
        var e = PaymentFrameDecoder()
        #expect(throws: FrameError.oversizeFrame(1_048_577)) { try e.feed([0, 0x10, 0, 1]) }
        // A frame of exactly the maximum is accepted; a good frame before a bad one is delivered.
        var f = PaymentFrameDecoder()
        let big = [UInt8](repeating: 0x20, count: PaymentFrame.maximumLength)
        #expect(try f.feed(PaymentFrame.encode(big)).first?.count == PaymentFrame.maximumLength)
        var g = PaymentFrameDecoder()
        #expect(try g.feed(PaymentFrame.encode([0x7B, 0x7D]) + [0, 0, 0, 0]).count == 1)
        #expect(throws: FrameError.emptyFrame) { try g.feed([]) }
    }

    @Test func messagesRoundTripAndInvalidOnesAreNamed() throws {
        let m = sample("12")
        #expect(try PaymentMessage.decode(m.encoded) == m)
        #expect(m.json.text.hasPrefix("{\"SaleToPOIRequest\":{\"MessageHeader\":{\"ProtocolVersion\":\"3.1\",\"MessageClass\":\"Service\""))
        func failure(_ text: String) -> MessageFormatError? {
            do { _ = try PaymentMessage.decode(Array(text.utf8)); return nil } catch let e as MessageFormatError { return e } catch { return nil }
        }
        #expect(failure("{\"a\":1}") != nil)
        #expect(failure("[1,2") != nil)
        #expect(failure("{\"SaleToPOIRequest\":{}}") != nil)
        // A recoverable ServiceID is reported so the terminal can answer Failure/MessageFormat.
        let bad = failure("{\"SaleToPOIRequest\":{\"MessageHeader\":{\"MessageClass\":\"Service\",\"MessageCategory\":\"Payment\",\"MessageType\":\"Request\",\"ServiceID\":\"7\",\"SaleID\":\"H\",\"POIID\":\"P\"}}}")
        #expect(bad?.serviceID == "7")
        #expect(failure("{\"SaleToPOIRequest\":{\"MessageHeader\":{\"MessageClass\":\"Service\",\"MessageCategory\":\"Payment\",\"MessageType\":\"Request\",\"ServiceID\":\"12345678901\",\"SaleID\":\"H\",\"POIID\":\"P\"},\"PaymentRequest\":{}}}")?.serviceID == nil)
        // Duplicate keys, invalid UTF-8, floats kept as text.
        #expect(throws: JSONError.self) { try JSONParser.parse(Array("{\"a\":1,\"a\":2}".utf8)) }
        #expect(throws: JSONError.self) { try JSONParser.parse([0x22, 0xC0, 0xAF, 0x22]) }
        #expect(throws: JSONError.self) { try JSONParser.parse(Array("{} x".utf8)) }
        #expect(try JSONParser.parse(Array("10.50".utf8)) == .number("10.50"))
        #expect(try JSONParser.parse(Array("999999999999".utf8)) == .integer(999_999_999_999))
        #expect(try JSONParser.parse(Array("\"\\u00e9\\ud83d\\ude00\\n\"".utf8)) == .string("é😀\n"))
        let nested = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        #expect(throws: JSONError.self) { try JSONParser.parse(Array(nested.utf8)) }
        let s: JSONValue = ["k": "a\"b\\c\u{1}"]
        #expect(try JSONParser.parse(s.serialized) == s)
    }

    @Test func responseStatusCarriesAdditionalResponse() {
        let status = PaymentResponseStatus.failure(.inProgress, [("message", "Uncompleted transaction")])
        #expect(status.json.text == "{\"Result\":\"Failure\",\"ErrorCondition\":\"InProgress\",\"AdditionalResponse\":\"message=Uncompleted%20transaction\"}")
        #expect(PaymentResponseStatus(json: status.json) == status)
    }
}
