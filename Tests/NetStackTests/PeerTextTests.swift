import NetStack
import Testing

@Suite struct PeerTextTests {
    @Test func printableASCIIStaysButBackslashAndQuoteAreEscaped() {
        #expect(PeerText.escaped("gateway.example:443 ~!{}") == "gateway.example:443 ~!{}")
        #expect(PeerText.escaped("a\\b\"c") == "a\\\\b\\\"c")
    }

    @Test func controlsDELAndEscapeBecomeHex() {
        // ESC [ 2 J would clear a terminal; CR and LF would forge a log line.
        #expect(PeerText.escaped([0x1B, 0x5B, 0x32, 0x4A]) == "\\x1B[2J")
        #expect(PeerText.escaped("ok\r\nforged: yes") == "ok\\x0D\\x0Aforged: yes")
        #expect(PeerText.escaped([0x00, 0x09, 0x1F, 0x7F]) == "\\x00\\x09\\x1F\\x7F")
        #expect(PeerText.escaped([0x20, 0x7E]) == " ~")
    }

    @Test func bytesFromTheUpperHalfAndInvalidUTF8BecomeHex() {
        #expect(PeerText.escaped("é") == "\\xC3\\xA9")
        // A lone continuation byte, an overlong NUL and a truncated sequence.
        #expect(PeerText.escaped([0x80, 0xC0, 0x80, 0xE2, 0x82]) == "\\x80\\xC0\\x80\\xE2\\x82")
        #expect(PeerText.escaped([0xFF]) == "\\xFF")
        // U+202E (right-to-left override) would reorder what a terminal shows.
        #expect(PeerText.escaped("a\u{202E}b") == "a\\xE2\\x80\\xAEb")
    }

    @Test func everyByteGivesPrintableASCIIOnly() {
        let all = PeerText.escaped((0...255).map { UInt8($0) })
        #expect(all.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) })
        #expect(all.count == 95 + 2 + (256 - 95) * 4)
    }

    @Test func aLimitCutsWithAMarkerSayingHowMuchIsLeft() {
        #expect(PeerText.escaped("abcdef", limit: 3) == "abc...(+3 bytes)")
        #expect(PeerText.escaped("abc", limit: 3) == "abc")
        #expect(PeerText.escaped([0x1B, 0x1B], limit: 1) == "\\x1B...(+1 bytes)")
        #expect(PeerText.escaped("ab", limit: -5) == "...(+2 bytes)")
        #expect(PeerText.escaped("", limit: 0) == "")
    }
}
