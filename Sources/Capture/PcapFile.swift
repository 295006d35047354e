import CPcap
import Framing
import Glibc

/// Link-layer header types (tcpdump.org "LINKTYPE_" values) that carry PPP.
public enum LinkType: Int32, Sendable, CaseIterable {
    case ethernet = 1
    /// PPP frame without flags or FCS; FF 03 present or compressed away.
    case ppp = 9
    /// PPP in HDLC-like framing (RFC 1662 without escapes), or Cisco HDLC.
    case pppHDLC = 50
    /// A direction byte (0 received, 1 sent by the capturing host), then the PPP frame.
    case pppWithDirection = 204

    public var name: String {
        switch self {
        case .ethernet: return "Ethernet"
        case .ppp: return "PPP"
        case .pppHDLC: return "PPP_HDLC"
        case .pppWithDirection: return "PPP_WITH_DIR"
        }
    }
}

/// One record of a pcap file.
public struct PcapRecord: Sendable {
    public var time: CaptureTime
    /// Bytes captured (may be fewer than were on the wire).
    public var data: [UInt8]
    public var originalLength: Int
    /// The file's microseconds were out of range (see `CaptureTime.normalised`).
    public var timeAdjusted = false
}

/// Reads pcap files through libpcap.
public struct PcapReader: Sendable {
    public let linkType: Int32
    public let records: [PcapRecord]

    /// True when `bytes` begin with one of the pcap magic numbers (either byte order,
    /// microsecond or nanosecond) or pcapng's, which libpcap also reads.
    public static func looksLikePcap(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= 4 else { return false }
        let magic = UInt32(bytes[0]) << 24 | UInt32(bytes[1]) << 16 | UInt32(bytes[2]) << 8 | UInt32(bytes[3])
        return [0xA1B2_C3D4, 0xD4C3_B2A1, 0xA1B2_3C4D, 0x4D3C_B2A1, 0x0A0D_0D0A].contains(magic)
    }

    /// - Parameter maximumRecords: more records than this is an error, raised before they are
    ///   all held (a file of a million tiny records is input like any other).
    public init(path: String, maximumRecords: Int = .max) throws(CaptureError) {
        var errorBuffer = [CChar](repeating: 0, count: Int(PCAP_ERRBUF_SIZE) + 1)
        guard let handle = pcap_open_offline(path, &errorBuffer) else {
            throw CaptureError("\(path): " + String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        defer { pcap_close(handle) }
        linkType = pcap_datalink(handle)
        var list: [PcapRecord] = []
        var header: UnsafeMutablePointer<pcap_pkthdr>?
        var data: UnsafePointer<u_char>?
        while true {
            let r = pcap_next_ex(handle, &header, &data)
            if r == 1, let h = header, let d = data {
                guard list.count < maximumRecords else {
                    throw CaptureError("\(path): more than \(maximumRecords) records")
                }
                // The time stamp is whatever the file says: a ts_usec of 0x80000000 or a pcapng
                // time near 2^63 reaches us as it is, so it is normalised and counted, not trusted.
                let (time, adjusted) = CaptureTime.normalised(seconds: Int64(h.pointee.ts.tv_sec), microseconds: Int(h.pointee.ts.tv_usec))
                list.append(PcapRecord(time: time,
                                       data: Array(UnsafeBufferPointer(start: d, count: Int(h.pointee.caplen))),
                                       originalLength: Int(h.pointee.len), timeAdjusted: adjusted))
            } else if r == PCAP_ERROR_BREAK {
                break
            } else {
                throw CaptureError("\(path): \(String(cString: pcap_geterr(handle)))")
            }
        }
        records = list
    }
}

/// Writes pcap files (the classic format, microsecond time stamps), one record per PPP frame,
/// through a `CaptureFile`: no links followed, mode 0600, write errors and the size limit stop
/// the capture without stopping anything else.
public final class PcapWriter {
    public let linkType: LinkType
    /// Records longer than this are cut to it, as a capture with this snapshot length would be.
    public static let snapshotLength = 262_144
    private let file: CaptureFile
    private var masker: SecretMasker?

    /// Link type `.ppp` (9) writes `FF 03` and a two-byte protocol before each packet, the form
    /// tshark and tcpdump decode everywhere but which has no direction; `.pppWithDirection`
    /// (204) adds a byte that keeps it.
    /// - Parameters:
    ///   - masking: what hides the passwords in the frames written; nil writes them as they were.
    ///   - onStop: told once if writing stops early (an error, or `limit` bytes reached).
    public init(path: String, linkType: LinkType = .ppp, masking: SecretMasker? = SecretMasker(),
                limit: Int = CaptureFile.defaultLimit, onStop: ((String) -> Void)? = nil) throws(CaptureError) {
        guard linkType == .ppp || linkType == .pppWithDirection else {
            throw CaptureError("pcap output supports link types 9 (PPP) and 204 (PPP_WITH_DIR)")
        }
        self.linkType = linkType
        masker = masking
        file = try CaptureFile(path: path, limit: limit, replaces: .pcap)
        file.onStop = onStop
        // The global header, little-endian: magic, version 2.4, zone 0, sigfigs 0, snaplen, link type.
        var header: [UInt8] = [0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        header += PcapWriter.littleEndian(UInt32(PcapWriter.snapshotLength))
        header += PcapWriter.littleEndian(UInt32(bitPattern: linkType.rawValue))
        file.write(header)
    }

    /// Why writing stopped, if it did.
    public var stopReason: String? { file.stopReason }

    /// Writes one packet. `packet` is the PPP packet (header and information, no FCS). Throws
    /// when the capture has stopped (the reason was also given to `onStop`, once).
    public func write(packet: [UInt8], time: CaptureTime, direction: Direction?) throws(CaptureError) {
        var bytes = maskedCopy(packet, direction: direction)
        if linkType == .pppWithDirection { bytes.insert(direction == .sent ? 1 : 0, at: 0) }
        let captured = min(bytes.count, PcapWriter.snapshotLength)
        // ts_sec is 32 bits in this format; times outside it (a decoded capture's) are clamped.
        let normal = CaptureTime.normalised(seconds: time.seconds, microseconds: Int(time.microseconds)).time
        var record = PcapWriter.littleEndian(UInt32(clamping: normal.seconds))
        record += PcapWriter.littleEndian(UInt32(clamping: normal.microseconds))
        record += PcapWriter.littleEndian(UInt32(captured))
        record += PcapWriter.littleEndian(UInt32(clamping: bytes.count))
        record += bytes.prefix(captured)
        guard file.write(record) else { throw CaptureError("\(file.path): \(file.stopReason ?? "closed")") }
    }

    /// Closes the file. Idempotent; also done on deinit.
    public func close() { file.close() }

    private func maskedCopy(_ packet: [UInt8], direction: Direction?) -> [UInt8] {
        guard masker != nil, let h = packet.withUnsafeBytes({ PPPHeader.parse($0) }),
              let info = masker?.masked(protocol: h.protocol, information: Array(packet[h.length...]), direction: direction)
        else { return packet }
        return Array(packet[..<h.length]) + info
    }

    static func littleEndian(_ v: UInt32) -> [UInt8] {
        [UInt8(v & 0xFF), UInt8((v >> 8) & 0xFF), UInt8((v >> 16) & 0xFF), UInt8(v >> 24)]
    }
}
