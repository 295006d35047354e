import Framing

/// pppd's `record` file: the raw bytes of an async line with directions and time stamps, the
/// format `pppdump` reads (pppd/main.c, pppdump/pppdump.c):
///   0x07 + 4-byte start time (Unix seconds, big-endian)
///   0x01 / 0x02 + 2-byte length + bytes: data sent / received
///   0x03 / 0x04: end of sent / received data
///   0x05 + 4 bytes, 0x06 + 1 byte: time step in tenths of a second
public struct PPPDRecord: Sendable {
    public enum Event: Sendable, Equatable {
        case data(Direction, [UInt8], tenths: Int64)
        case end(Direction)
    }

    public let startTime: Int64
    public let events: [Event]
    /// The file ended inside an entry (a partial trailing entry is reported, not decoded).
    public let truncatedAt: Int?

    public static func looksLikeRecord(_ bytes: [UInt8]) -> Bool {
        bytes.count >= 5 && bytes[0] == 0x07
    }

    /// - Parameter maximumEntries: more entries than this is an error, raised as it is passed.
    public init(bytes: [UInt8], maximumEntries: Int = .max) throws(CaptureError) {
        var i = 0
        var tenths: Int64 = 0
        var start: Int64 = 0
        var out: [Event] = []
        var truncated: Int?
        func need(_ n: Int) -> Bool { i + n <= bytes.count }
        // Steps are unsigned and a file can hold billions of them: the sum saturates.
        func advance(_ step: Int64) {
            let (sum, overflow) = tenths.addingReportingOverflow(step)
            tenths = overflow ? .max : sum
        }
        loop: while i < bytes.count {
            guard out.count < maximumEntries else { throw CaptureError("more than \(maximumEntries) entries") }
            let tag = bytes[i]
            switch tag {
            case 0x07:
                guard need(5) else { truncated = i; break loop }
                start = Int64(bytes[i + 1]) << 24 | Int64(bytes[i + 2]) << 16 | Int64(bytes[i + 3]) << 8 | Int64(bytes[i + 4])
                tenths = 0
                i += 5
            case 0x01, 0x02:
                guard need(3) else { truncated = i; break loop }
                let length = Int(bytes[i + 1]) << 8 | Int(bytes[i + 2])
                guard need(3 + length) else { truncated = i; break loop }
                out.append(.data(tag == 0x01 ? .sent : .received, Array(bytes[(i + 3)..<(i + 3 + length)]), tenths: tenths))
                i += 3 + length
            case 0x03, 0x04:
                out.append(.end(tag == 0x03 ? .sent : .received))
                i += 1
            case 0x05:
                guard need(5) else { truncated = i; break loop }
                advance(Int64(bytes[i + 1]) << 24 | Int64(bytes[i + 2]) << 16 | Int64(bytes[i + 3]) << 8 | Int64(bytes[i + 4]))
                i += 5
            case 0x06:
                guard need(2) else { truncated = i; break loop }
                advance(Int64(bytes[i + 1]))
                i += 2
            default:
                throw CaptureError("not a pppd record file: unknown entry type 0x\(String(tag, radix: 16)) at offset \(i)")
            }
        }
        startTime = start
        events = out
        truncatedAt = truncated
    }
}
