/// Text a peer chose (a SOCKS host or user name, an LCP Terminate-Request's data, a PAP or CHAP
/// name) made inert before it reaches a terminal, a log line or JSON: printable ASCII stays as it
/// is, except `\` and `"`, which are escaped with a backslash; every other byte (controls such as
/// ESC that would steer a terminal, DEL, any byte of 0x80 and above, so every non-ASCII or
/// malformed UTF-8 sequence) becomes `\xNN`. The result is printable ASCII only, and reading it
/// back is unambiguous.
public enum PeerText {
    /// `bytes` escaped; with `limit`, only the first `limit` bytes, then a marker saying how many
    /// more there were (`...(+N bytes)`).
    public static func escaped(_ bytes: some Sequence<UInt8>, limit: Int? = nil) -> String {
        let cap = max(0, limit ?? .max)
        var out = ""
        var taken = 0
        var beyond = 0
        for b in bytes {
            guard taken < cap else {
                beyond += 1
                continue
            }
            taken += 1
            switch b {
            case UInt8(ascii: "\\"): out += "\\\\"
            case UInt8(ascii: "\""): out += "\\\""
            case 0x20...0x7E: out.unicodeScalars.append(Unicode.Scalar(b))
            default: out += "\\x" + hex(b >> 4) + hex(b & 0x0F)
            }
        }
        if beyond > 0 { out += "...(+\(beyond) bytes)" }
        return out
    }

    /// `s`'s UTF-8 bytes escaped (see `escaped(_:limit:)` for bytes).
    public static func escaped(_ s: String, limit: Int? = nil) -> String {
        escaped(s.utf8, limit: limit)
    }

    private static func hex(_ nibble: UInt8) -> String {
        String(Unicode.Scalar(nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "A") + nibble - 10))
    }
}
