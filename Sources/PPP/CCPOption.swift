import Wire

/// CCP options (RFC 1962 and the algorithm RFCs), read only so that a trace can say what was
/// offered. pppbridge does not compress; it rejects CCP (LCP Protocol-Reject), as pppd's `noccp`.
public enum CCPOption {
    /// pppd's rendering inside `<...>` (ccp_printpkt).
    public static func describe(_ o: ConfigurationOption) -> String {
        let v = o.value
        switch (o.type, v.count) {
        case (1, 0...): return "predictor 1"
        case (2, 0...): return "predictor 2"
        case (21, 1): // RFC 1977 BSD-Compress: version in the top 3 bits, code size below.
            return "bsd v\(v[0] >> 5) \(v[0] & 0x1F)"
        case (18, 4): // MPPE/MPPC (RFC 3078): supported bits.
            let bits = BigEndian.uint32(v, 0)
            func flag(_ mask: UInt32, _ letter: String) -> String { (bits & mask != 0 ? "+" : "-") + letter }
            return "mppe " + [flag(0x0100_0000, "H"), flag(0x80, "M"), flag(0x40, "S"), flag(0x20, "L"),
                              flag(0x10, "D"), flag(0x01, "C")].joined(separator: " ")
        case (24, 2), (26, 2): // RFC 1979 Deflate (26) and its draft number (24).
            let window = Int(v[0] >> 4) + 8
            let method = v[0] & 0x0F
            return (o.type == 24 ? "deflate(old#) " : "deflate ") + "\(window)" + (method != 8 ? " method \(method)" : "")
        default: return PppdHex.option(o)
        }
    }
}

/// IPV6CP options (RFC 5072), read only: pppbridge runs IPv4 and rejects IPV6CP.
public enum IPV6CPOption {
    public static func describe(_ o: ConfigurationOption) -> String {
        if o.type == 1 && o.value.count == 8 {
            // pppd prints the link-local address made from the interface identifier.
            let groups = stride(from: 0, to: 8, by: 2).map { String(BigEndian.uint16(o.value, $0), radix: 16) }
            return "addr fe80::" + groups.joined(separator: ":")
        }
        return PppdHex.option(o)
    }
}
