import Framing
import Wire
import PPP

/// Replaces the passwords a link carries with `*` in the copy of a frame written to a capture;
/// the bytes on the line are never touched. Lengths stay as they were, so tshark decodes the
/// masked frames as it decodes the originals.
///
/// Masked:
/// - PAP Authenticate-Request (RFC 1334 §2.2.1): the Password field, both directions.
/// - SOCKS5 username/password sub-negotiation (RFC 1929 §2): the PASSWD field, when the request
///   travels whole in one TCP segment to one of `socksPorts` (VER 1, ULEN, UNAME, PLEN, PASSWD,
///   and nothing else in the segment). The segment may be plain IPv4 (0x0021), VJ uncompressed
///   (0x002F) or VJ compressed (0x002D, RFC 1144 §3.2.3) whose connection's ports were seen in
///   an earlier VJ uncompressed frame. The TCP checksum is updated to match (RFC 1624 eqn. 3),
///   so a checksum that was right stays right and a wrong one stays wrong.
/// Not masked: a sub-negotiation split over several segments, IP fragments, VJ compressed
/// frames of a connection whose uncompressed frame was not seen, CHAP (which sends no
/// password, only a digest).
public struct SecretMasker: Sendable {
    public static let mask = UInt8(ascii: "*")

    public var socksPorts: Set<UInt16>
    /// RFC 1144 §3.2.2: a VJ connection (slot) is named in its uncompressed frames; its
    /// compressed frames carry the slot (or reuse the last one). Per direction, 256 slots at most.
    private var vjDestinationPorts: [Direction: [UInt16?]] = [:]
    private var vjLastSlot: [Direction: UInt8] = [:]

    public init(socksPorts: Set<UInt16> = []) {
        self.socksPorts = socksPorts
    }

    /// The information field to capture for a frame of `proto`: `information` with its secrets
    /// masked, or nil when there was nothing to mask. `direction` keeps VJ state apart (nil for
    /// captures without one).
    public mutating func masked(protocol proto: ProtocolNumber, information: [UInt8], direction: Direction?) -> [UInt8]? {
        switch proto {
        case ProtocolNumber.pap: return SecretMasker.maskPAP(information)
        case ProtocolNumber.ipv4: return maskIPv4(information, vjSlot: nil, direction: direction)
        case ProtocolNumber.vjUncompressedTCP:
            guard information.count >= 20 else { return nil }
            return maskIPv4(information, vjSlot: information[9], direction: direction)
        case ProtocolNumber.vjCompressedTCP: return maskVJCompressed(information, direction: direction)
        default: return nil
        }
    }

    /// RFC 1334 §2.2.1: Code 1, Identifier, Length, Peer-ID Length, Peer-ID, Passwd-Length,
    /// Password. Masks the password bytes present, even when the lengths overrun the packet.
    static func maskPAP(_ info: [UInt8]) -> [UInt8]? {
        guard info.count > 4, info[0] == PAPPacket.Code.request.rawValue else { return nil }
        let passwordLengthAt = 5 + Int(info[4])
        guard passwordLengthAt < info.count else { return nil }
        let start = passwordLengthAt + 1
        let end = min(info.count, start + Int(info[passwordLengthAt]))
        guard start < end else { return nil }
        var out = info
        for i in start..<end { out[i] = mask }
        return out
    }

    /// An IPv4 packet, or a VJ uncompressed one (`vjSlot`: its protocol field holds the slot).
    private mutating func maskIPv4(_ info: [UInt8], vjSlot: UInt8?, direction: Direction?) -> [UInt8]? {
        var bytes = info
        if vjSlot != nil { bytes[9] = IPProtocol.tcp.rawValue }
        guard let ip = bytes.withUnsafeBytes({ try? IPv4Header(parsing: $0) }), ip.protocol == IPProtocol.tcp, !ip.isFragment else {
            return nil
        }
        let tcp = ip.headerLength
        guard ip.totalLength - tcp >= 20 else { return nil }
        let dataOffset = Int(bytes[tcp + 12] >> 4) * 4
        guard dataOffset >= 20, tcp + dataOffset <= ip.totalLength else { return nil }
        let destinationPort = BigEndian.uint16(bytes, tcp + 2)
        if let slot = vjSlot {
            let d = direction ?? .sent
            var ports = vjDestinationPorts[d] ?? [UInt16?](repeating: nil, count: 256)
            ports[Int(slot)] = destinationPort
            vjDestinationPorts[d] = ports
            vjLastSlot[d] = slot
        }
        guard socksPorts.contains(destinationPort),
              let masked = SecretMasker.maskSocksPassword(bytes, payload: (tcp + dataOffset)..<ip.totalLength, checksumAt: tcp + 16)
        else { return nil }
        var out = masked
        if let slot = vjSlot { out[9] = slot }
        return out
    }

    /// RFC 1144 §3.2.3: change mask, connection number if C is set, the TCP checksum, deltas,
    /// then the segment's data.
    private mutating func maskVJCompressed(_ info: [UInt8], direction: Direction?) -> [UInt8]? {
        guard let h = info.withUnsafeBytes({ try? VJCompressedHeader(parsing: $0) }) else { return nil }
        let d = direction ?? .sent
        if let c = h.connection { vjLastSlot[d] = c }
        guard let slot = h.connection ?? vjLastSlot[d], let port = vjDestinationPorts[d]?[Int(slot)], socksPorts.contains(port) else {
            return nil
        }
        return SecretMasker.maskSocksPassword(info, payload: h.headerLength..<info.count, checksumAt: h.connection == nil ? 1 : 2)
    }

    /// RFC 1929 §2: VER (1), ULEN, UNAME, PLEN, PASSWD, exactly filling `payload`. The TCP
    /// checksum at `checksumAt` is updated for the change; the payload starts at an even offset
    /// of the segment (a TCP header is a multiple of 4 bytes), so its sums line up.
    static func maskSocksPassword(_ bytes: [UInt8], payload: Range<Int>, checksumAt: Int) -> [UInt8]? {
        guard payload.count >= 5, payload.upperBound <= bytes.count, checksumAt + 2 <= payload.lowerBound else { return nil }
        let p = payload.lowerBound
        guard bytes[p] == 0x01 else { return nil }
        let userLength = Int(bytes[p + 1])
        guard userLength >= 1, p + 2 + userLength < payload.upperBound else { return nil }
        let passwordLength = Int(bytes[p + 2 + userLength])
        let start = p + 3 + userLength
        guard passwordLength >= 1, start + passwordLength == payload.upperBound else { return nil }
        var out = bytes
        for i in start..<payload.upperBound { out[i] = mask }
        // RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), over the payload's words.
        let old = InternetChecksum.sum(bytes[payload])
        let new = InternetChecksum.sum(out[payload])
        let checksum = BigEndian.uint16(bytes, checksumAt)
        let updated = InternetChecksum.finish(UInt64(~checksum) + UInt64(InternetChecksum.finish(old)) + UInt64(~InternetChecksum.finish(new)))
        BigEndian.put(updated, into: &out, at: checksumAt)
        return out
    }
}
