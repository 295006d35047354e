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

    public init(path: String) throws(CaptureError) {
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
                let captured = Int(h.pointee.caplen)
                list.append(PcapRecord(time: CaptureTime(seconds: Int64(h.pointee.ts.tv_sec), microseconds: Int32(h.pointee.ts.tv_usec)),
                                       data: Array(UnsafeBufferPointer(start: d, count: captured)),
                                       originalLength: Int(h.pointee.len)))
            } else if r == PCAP_ERROR_BREAK {
                break
            } else {
                throw CaptureError("\(path): \(String(cString: pcap_geterr(handle)))")
            }
        }
        records = list
    }
}

/// Writes pcap files through libpcap, one record per PPP frame.
public final class PcapWriter {
    public let linkType: LinkType
    private var handle: OpaquePointer?
    private var dumper: OpaquePointer?

    /// Link type `.ppp` (9) writes `FF 03` and a two-byte protocol before each packet, the form
    /// tshark and tcpdump decode everywhere but which has no direction; `.pppWithDirection`
    /// (204) adds a byte that keeps it.
    public init(path: String, linkType: LinkType = .ppp) throws(CaptureError) {
        guard linkType == .ppp || linkType == .pppWithDirection else {
            throw CaptureError("pcap output supports link types 9 (PPP) and 204 (PPP_WITH_DIR)")
        }
        self.linkType = linkType
        guard let h = pcap_open_dead(linkType.rawValue, 65535) else { throw CaptureError("libpcap could not open a dead handle") }
        handle = h
        guard let d = pcap_dump_open(h, path) else {
            let message = String(cString: pcap_geterr(h))
            pcap_close(h)
            handle = nil
            throw CaptureError("\(path): \(message)")
        }
        dumper = d
    }

    /// Writes one packet. `packet` is the PPP packet (header and information, no FCS).
    public func write(packet: [UInt8], time: CaptureTime, direction: Direction?) throws(CaptureError) {
        guard let dumper else { throw CaptureError("pcap writer is closed") }
        var bytes = packet
        if linkType == .pppWithDirection { bytes.insert(direction == .sent ? 1 : 0, at: 0) }
        var header = pcap_pkthdr()
        header.ts.tv_sec = Int(time.seconds)
        header.ts.tv_usec = Int(time.microseconds)
        header.caplen = bpf_u_int32(bytes.count)
        header.len = bpf_u_int32(bytes.count)
        bytes.withUnsafeBufferPointer { b in
            pcap_dump(UnsafeMutableRawPointer(dumper).assumingMemoryBound(to: u_char.self), &header, b.baseAddress)
        }
    }

    public func flush() { if let dumper { pcap_dump_flush(dumper) } }

    /// Closes the file. Idempotent; also done on deinit.
    public func close() {
        if let d = dumper { pcap_dump_close(d) }
        if let h = handle { pcap_close(h) }
        dumper = nil
        handle = nil
    }

    deinit { close() }
}
