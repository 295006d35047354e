/// Which way a frame went, seen from the side that sent or captured it.
public enum Direction: String, Sendable, Equatable {
    case sent
    case received = "rcvd"
}

/// A PPP frame as it leaves the framing layer: the protocol number and the information field,
/// with how its header was sent (RFC 1661 §6.5 ACFC and §6.6 PFC), so that the exact packet
/// can be rebuilt.
public struct PPPFrame: Sendable, Equatable {
    public var `protocol`: ProtocolNumber
    public var information: [UInt8]
    /// The frame carried the FF 03 address and control fields.
    public var addressControlPresent: Bool
    /// The protocol field was sent in one byte.
    public var protocolCompressed: Bool

    public init(protocol: ProtocolNumber, information: [UInt8], addressControlPresent: Bool = true, protocolCompressed: Bool = false) {
        self.protocol = `protocol`
        self.information = information
        self.addressControlPresent = addressControlPresent
        self.protocolCompressed = protocolCompressed
    }

    /// Parses a packet (frame without flags or FCS, de-escaped).
    public init?(packet: UnsafeRawBufferPointer) {
        guard let h = PPPHeader.parse(packet) else { return nil }
        self.init(protocol: h.protocol, information: Array(packet[h.length...]),
                  addressControlPresent: h.addressControlPresent, protocolCompressed: h.protocolCompressed)
    }

    public init?(packet: [UInt8]) {
        guard let f = packet.withUnsafeBytes({ PPPFrame(packet: $0) }) else { return nil }
        self = f
    }

    /// The packet exactly as it was framed: header as sent, then the information field.
    public var packet: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(information.count + 4)
        if addressControlPresent { out += [HDLC.allStationsAddress, HDLC.unnumberedInformation] }
        let number = self.protocol.rawValue
        if protocolCompressed && number < 0x100 {
            out.append(UInt8(number))
        } else {
            out += [UInt8(number >> 8), UInt8(number & 0xFF)]
        }
        out += information
        return out
    }

    /// The packet with a full header (FF 03 and a two-byte protocol), as pcap's DLT_PPP shows it.
    public var uncompressedPacket: [UInt8] {
        PPPFrame(protocol: self.protocol, information: information).packet
    }
}

/// The address, control and protocol fields at the start of a packet.
public struct PPPHeader: Sendable, Equatable {
    public var `protocol`: ProtocolNumber
    /// Bytes taken by the header.
    public var length: Int
    public var addressControlPresent: Bool
    public var protocolCompressed: Bool

    /// Reads the header. Both compressed forms are accepted whatever was negotiated, as RFC 1661
    /// §6.5/§6.6 ask of a receiver that may see LCP frames before negotiation ends.
    /// Returns nil for a header that no PPP sender produces: FF not followed by 03, a missing
    /// protocol, or a protocol whose last byte is even (RFC 1661 §2).
    public static func parse(_ p: UnsafeRawBufferPointer) -> PPPHeader? {
        var offset = 0
        var ac = false
        if p.count >= 1 && p[0] == HDLC.allStationsAddress {
            guard p.count >= 2, p[1] == HDLC.unnumberedInformation else { return nil }
            offset = 2
            ac = true
        }
        guard offset < p.count else { return nil }
        let first = p[offset]
        if first & 1 == 1 {
            return PPPHeader(protocol: ProtocolNumber(UInt16(first)), length: offset + 1, addressControlPresent: ac, protocolCompressed: true)
        }
        guard offset + 1 < p.count, p[offset + 1] & 1 == 1 else { return nil }
        return PPPHeader(protocol: ProtocolNumber(UInt16(first) << 8 | UInt16(p[offset + 1])), length: offset + 2,
                         addressControlPresent: ac, protocolCompressed: false)
    }
}
