import NetStack
import Testing
@testable import RemoteSerial

private let IAC: UInt8 = 255, SB: UInt8 = 250, SE: UInt8 = 240
private let WILL: UInt8 = 251, WONT: UInt8 = 252, DO: UInt8 = 253, DONT: UInt8 = 254

/// What ser2net 4.3 sends on an RFC 2217 port when a client connects (read off a real one):
/// WILL SGA, DO SGA, WILL ECHO, DONT ECHO, DO BINARY, WILL BINARY, DO COM-PORT-OPTION.
private let ser2netGreeting: [UInt8] = [IAC, WILL, 3, IAC, DO, 3, IAC, WILL, 1, IAC, DONT, 1, IAC, DO, 0, IAC, WILL, 0, IAC, DO, 44]

private func subnegotiation(_ code: UInt8, _ value: [UInt8]) -> [UInt8] {
    var out: [UInt8] = [IAC, SB, 44, code]
    for b in value { out.append(b); if b == IAC { out.append(IAC) } }
    return out + [IAC, SE]
}

private func started(_ settings: ComPortSettings = ComPortSettings()) -> (ComPortClient, [UInt8]) {
    var c = ComPortClient(settings: settings)
    c.start()
    var out: [UInt8] = []
    c.takeOutput(into: &out)
    return (c, out)
}

/// Feeds `bytes` in one read; returns the line's bytes and what the client wrote.
private func feed(_ c: inout ComPortClient, _ bytes: [UInt8]) -> (data: [UInt8], written: [UInt8]) {
    var buffer = bytes
    let n = c.receive(&buffer, count: buffer.count)
    var out: [UInt8] = []
    c.takeOutput(into: &out)
    return (Array(buffer[0..<n]), out)
}

/// The commands in `bytes` (IAC cmd opt), leaving subnegotiations out.
private func commands(_ bytes: [UInt8]) -> [[UInt8]] {
    var out: [[UInt8]] = []
    var i = 0
    while i + 2 < bytes.count {
        if bytes[i] == IAC && (WILL...DONT).contains(bytes[i + 1]) {
            out.append(Array(bytes[i...i + 2]))
            i += 3
        } else {
            i += 1
        }
    }
    return out
}

@Suite struct ComPortClientTests {
    @Test func theOpeningAsksForBinarySuppressGoAheadAndComPort() {
        let (_, out) = started()
        #expect(commands(out) == [[IAC, WILL, 0], [IAC, WILL, 3], [IAC, WILL, 44], [IAC, DO, 0], [IAC, DO, 3]])
    }

    @Test func ser2netsGreetingIsAnsweredOnceAndTheSettingsFollow() {
        var settings = ComPortSettings()
        settings.baudRate = 9600
        settings.flowControl = .hardware
        var (c, _) = started(settings)
        let (data, written) = feed(&c, ser2netGreeting)
        #expect(data.isEmpty)
        // Only the ECHO it offers is refused; the rest crossed our own requests.
        #expect(commands(written) == [[IAC, DONT, 1]])
        #expect(c.takeEvents() == [.comPortAccepted])
        #expect(c.sendsBinary && c.receivesBinary)
        // SET-BAUDRATE 9600, 8 data bits, no parity, one stop bit, RTS/CTS, DTR on, the mask.
        var expected = subnegotiation(1, [0, 0, 0x25, 0x80]) + subnegotiation(2, [8]) + subnegotiation(3, [1])
        expected += subnegotiation(4, [1]) + subnegotiation(5, [3]) + subnegotiation(5, [8]) + subnegotiation(11, [0x88])
        #expect(Array(written.dropFirst(3)) == expected)
        // The greeting again changes nothing: only ECHO is refused again (RFC 1143: a WILL of
        // an option that is off is answered each time), and the settings are not sent again.
        #expect(feed(&c, ser2netGreeting).written == [IAC, DONT, 1])
        #expect(c.takeEvents().isEmpty)
    }

    @Test func theServersAnswersAreReported() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        _ = c.takeEvents()
        // The values ser2net answered with on a real pty, split across reads at every byte.
        let answers = subnegotiation(107, [0]) + subnegotiation(101, [0, 0, 0x25, 0x80]) + subnegotiation(102, [8])
            + subnegotiation(103, [1]) + subnegotiation(104, [1]) + subnegotiation(105, [1])
        for b in answers { #expect(feed(&c, [b]).data.isEmpty) }
        #expect(c.report.baudRate == 9600)
        #expect(c.report.dataBits == 8 && c.report.parity == 1 && c.report.stopBits == 1 && c.report.control == 1)
        #expect(c.report.modemState == 0)
        #expect(c.takeEvents().isEmpty, "a carrier never seen is not lost")
    }

    @Test func dataWithIACIsEscapedAndUnescapedWhereverReadsSplitIt() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        let payload: [UInt8] = [0x7E, 0xFF, 0x03, 0xFF, 0xFF, 0x0D, 0x00, 0x0D, 0x0A, 0x7E]
        var encoded: [UInt8] = []
        c.encode(payload, into: &encoded)
        #expect(encoded == [0x7E, 0xFF, 0xFF, 0x03, 0xFF, 0xFF, 0xFF, 0xFF, 0x0D, 0x00, 0x0D, 0x0A, 0x7E], "binary: CR as it is")
        // What the server sends back in binary mode, a byte a read and all at once.
        var oneByOne: [UInt8] = []
        for b in encoded { oneByOne += feed(&c, [b]).data }
        #expect(oneByOne == payload)
        #expect(feed(&c, encoded).data == payload)
    }

    @Test func withoutBinaryCarriageReturnsFollowTheNVTRule() {
        var (c, _) = started()
        // A server that refuses binary both ways.
        _ = feed(&c, [IAC, DONT, 0, IAC, WONT, 0, IAC, DO, 44])
        #expect(!c.sendsBinary && !c.receivesBinary)
        var encoded: [UInt8] = []
        c.encode([0x41, 0x0D, 0x42], into: &encoded)
        #expect(encoded == [0x41, 0x0D, 0x00, 0x42])
        #expect(feed(&c, [0x41, 0x0D, 0x00, 0x42, 0x0D, 0x0A]).data == [0x41, 0x0D, 0x42, 0x0D, 0x0A])
        // The NUL after a CR split across reads.
        #expect(feed(&c, [0x0D]).data == [0x0D])
        #expect(feed(&c, [0x00, 0x43]).data == [0x43])
    }

    @Test func aCarrierSeenAndThenLostIsAHangUp() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        _ = c.takeEvents()
        _ = feed(&c, subnegotiation(107, [0x80]))
        #expect(c.takeEvents().isEmpty)
        _ = feed(&c, subnegotiation(107, [0x80 | 0x30]))
        #expect(c.takeEvents().isEmpty)
        _ = feed(&c, subnegotiation(107, [0x08]))
        #expect(c.takeEvents() == [.carrierLost])
    }

    @Test func flowControlSuspendAndResume() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        _ = c.takeEvents()
        _ = feed(&c, subnegotiation(108, []))
        #expect(c.outputSuspended)
        _ = feed(&c, subnegotiation(109, []))
        #expect(!c.outputSuspended)
        #expect(c.takeEvents() == [.outputSuspended(true), .outputSuspended(false)])
    }

    @Test func aSuspendEndsWithTheOptionAndTheReportKeepsFlowControlApartFromDTRAndRTS() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        _ = c.takeEvents()
        // Answers to flow control none (1), DTR on (8), RTS on (11): the report keeps the first.
        _ = feed(&c, subnegotiation(105, [1]) + subnegotiation(105, [8]) + subnegotiation(105, [11]))
        #expect(c.report.control == 1)
        _ = feed(&c, subnegotiation(108, []))
        #expect(c.outputSuspended)
        // The server turns COM-PORT-OPTION off: nothing could resume us, so the suspend ends.
        _ = feed(&c, [IAC, DONT, 44])
        #expect(!c.outputSuspended)
        #expect(c.takeEvents() == [.outputSuspended(true), .outputSuspended(false)])
    }

    @Test func hangingUpDropsDTROnceAndOnlyWithTheOption() {
        var (refused, _) = started()
        _ = feed(&refused, [IAC, DONT, 44])
        refused.hangUp()
        var none: [UInt8] = []
        refused.takeOutput(into: &none)
        #expect(none.isEmpty, "no COM-PORT-OPTION, no SET-CONTROL")
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        c.hangUp()
        c.hangUp()
        var out: [UInt8] = []
        c.takeOutput(into: &out)
        #expect(out == subnegotiation(5, [9]))
    }

    @Test func aRefusedComPortIsSaid() {
        var (c, _) = started()
        _ = feed(&c, [IAC, DONT, 44])
        #expect(c.takeEvents() == [.comPortRefused])
        _ = feed(&c, [IAC, DONT, 44])
        #expect(c.takeEvents().isEmpty)
    }

    @Test func endlessOptionRequestsGetABoundedNumberOfAnswers() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        var hostile: [UInt8] = []
        for _ in 0..<10_000 {
            hostile += [IAC, WILL, 1]  // ECHO, refused
            hostile += [IAC, WONT, 0, IAC, WILL, 0]  // BINARY off and on
            hostile += [IAC, DO, 99]  // an option nobody has
        }
        let (data, written) = feed(&c, hostile)
        #expect(data.isEmpty)
        #expect(written.count <= 3 * 8 * 3, "\(written.count) bytes of answers")
        #expect(c.counters.optionsIgnored > 0)
        #expect(c.counters.optionsRefused <= 16)
    }

    @Test func anEndlessSubnegotiationIsDroppedAndTheStreamGoesOn() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        var hostile: [UInt8] = [IAC, SB, 44, 101]
        hostile += [UInt8](repeating: 0x41, count: 1 << 20)
        hostile += [IAC, SE, 0x7E, 0x01, 0x7E]
        let (data, _) = feed(&c, hostile)
        #expect(data == [0x7E, 0x01, 0x7E])
        #expect(c.counters.subnegotiationsTooLong == 1)
        #expect(c.report.baudRate == nil)
    }

    @Test func strayCommandsAndBadSubnegotiationEndsAreNotData() {
        var (c, _) = started()
        _ = feed(&c, ser2netGreeting)
        // NOP, Go-Ahead, Are-You-There, a stray SE, an unknown command byte, then data; a
        // subnegotiation broken by IAC WILL (not IAC SE) ends unread and the WILL is taken.
        let (data, written) = feed(&c, [IAC, 241, IAC, 249, IAC, 246, IAC, SE, IAC, 17, 0x55, IAC, SB, 44, 101, IAC, WILL, 1, 0x66])
        #expect(data == [0x55, 0x66])
        #expect(commands(written) == [[IAC, DONT, 1]])
        #expect(c.counters.commandsIgnored == 5)
        #expect(c.counters.subnegotiationsIgnored == 1)
    }

    @Test func randomInputNeverTrapsAndDataNeverGrows() {
        var random = SplitMix64(seed: 2217)
        func next() -> UInt64 { random.next() }
        var (c, _) = started()
        var written = 0
        for _ in 0..<2_000 {
            let count = Int(next() % 300)
            // Biased to telnet's bytes so commands and options are reached.
            var bytes = (0..<count).map { _ -> UInt8 in
                let r = next()
                return r % 3 == 0 ? [IAC, SB, SE, WILL, WONT, DO, DONT, 44, 0, 13][Int(r >> 8 % 10)] : UInt8(truncatingIfNeeded: r >> 16)
            }
            let n = c.receive(&bytes, count: bytes.count)
            #expect(n <= count)
            var out: [UInt8] = []
            c.takeOutput(into: &out)
            written += out.count
        }
        // Answers are bounded by the per-option budget, however long this runs.
        #expect(written <= 256 * 8 * 3 + 200)
    }

    @Test func settingsAreWrittenAsSttyWouldSayThem() {
        var s = ComPortSettings()
        #expect(s.description == "115200 8N1")
        s.baudRate = 9600
        s.parity = .even
        s.stopBits = .two
        s.flowControl = .hardware
        #expect(s.description == "9600 8E2 RTS/CTS")
    }
}
