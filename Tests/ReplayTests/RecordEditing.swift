import Capture
import Foundation
import Framing
import PPP
import Replay

/// Builds pppd `record` files (the format `PPPDRecord` reads): a recorded session edited frame
/// by frame, or bytes no recorder would write.
struct RecordBuilder {
    private(set) var bytes: [UInt8] = [0x07, 0x5F, 0x00, 0x00, 0x00]
    private var tenths: Int64 = 0

    /// Time steps (0x06 for up to 255 tenths, 0x05 beyond), then the data entry (0x01 sent,
    /// 0x02 received), split at 65535 bytes.
    mutating func add(_ direction: Direction, _ data: [UInt8], at seconds: Double) {
        let target = Int64((seconds * 10).rounded())
        var step = max(0, target - tenths)
        tenths += step
        while step > 0 {
            if step <= 255 {
                bytes += [0x06, UInt8(step)]
                step = 0
            } else {
                let s = min(step, Int64(UInt32.max))
                bytes += [0x05, UInt8(s >> 24 & 0xFF), UInt8(s >> 16 & 0xFF), UInt8(s >> 8 & 0xFF), UInt8(s & 0xFF)]
                step -= s
            }
        }
        var rest = data[...]
        while !rest.isEmpty {
            let chunk = rest.prefix(65535)
            bytes += [direction == .sent ? 0x01 : 0x02, UInt8(chunk.count >> 8), UInt8(chunk.count & 0xFF)] + chunk
            rest = rest.dropFirst(chunk.count)
        }
    }

    /// One PPP frame, HDLC-framed as on the line (RFC 1662 §4, every control character escaped).
    mutating func add(_ direction: Direction, frame: PPPFrame, at seconds: Double) {
        add(direction, HDLCEncoder().encode(protocol: frame.protocol, information: frame.information), at: seconds)
    }

    func write(to path: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }
}

/// A recorded session's frames, in order, to edit.
struct EditableSession {
    var frames: [(direction: Direction, frame: PPPFrame, seconds: Double)]

    init(path: String) throws {
        let trace = try Trace(path: path)
        let origin = trace.frames.first?.time ?? trace.origin
        frames = trace.frames.compactMap { f in
            f.direction.map { ($0, f.frame, f.time.interval(since: origin)) }
        }
    }

    var record: RecordBuilder {
        var b = RecordBuilder()
        for f in frames { b.add(f.direction, frame: f.frame, at: f.seconds) }
        return b
    }

    /// The control packet of frame `i` when it is `proto`'s with `code`.
    func control(_ i: Int, _ proto: ProtocolNumber, _ code: ControlCode) -> ControlPacket? {
        guard frames[i].frame.protocol == proto, let p = try? ControlPacket(parsing: frames[i].frame.information), p.code == code else { return nil }
        return p
    }

    /// pppd-record_default.pppd with the terminal (pppd, the recording's sent side) answering
    /// every IPCP Configure-Request of the host's with a Nak of its address: its Ack turned into
    /// a Nak suggesting its own address, 10.0.2.15, then 40 more Naks half a second apart, none of its IP traffic
    /// (it never gets that far), and the Terminate-Request it ended with, after them.
    static func nakForever(from path: String) throws -> EditableSession {
        var s = try EditableSession(path: path)
        guard let ackIndex = s.frames.indices.first(where: { s.frames[$0].direction == .sent && s.control($0, ProtocolNumber.ipcp, ControlCode.configureAck) != nil }),
              let ack = s.control(ackIndex, ProtocolNumber.ipcp, ControlCode.configureAck),
              let termIndex = s.frames.indices.last(where: { s.frames[$0].direction == .sent && s.control($0, ProtocolNumber.lcp, ControlCode.terminateRequest) != nil })
        else { throw ReplayError("pppd-record_default.pppd no longer has the terminal's IPCP Ack and Terminate-Request") }
        let suggestion = try ConfigurationOption.emitList([ConfigurationOption(type: 3, value: [10, 0, 2, 15])])
        func nak(_ id: UInt8) throws -> PPPFrame {
            PPPFrame(protocol: ProtocolNumber.ipcp, information: try ControlPacket(code: ControlCode.configureNak, identifier: id, data: suggestion).emit())
        }
        let start = s.frames[ackIndex].seconds
        let terminate = s.frames[termIndex]
        var out: [(direction: Direction, frame: PPPFrame, seconds: Double)] = []
        for (i, f) in s.frames.enumerated() {
            if i == ackIndex {
                out.append((.sent, try nak(ack.identifier), f.seconds))
                for k in 1...40 { out.append((.sent, try nak(ack.identifier &+ UInt8(k)), start + 0.5 * Double(k))) }
                continue
            }
            // The terminal's IP traffic and its own ending go; the host's frames stay as recorded.
            if f.direction == .sent && (i > ackIndex && !f.frame.protocol.isControl || i == termIndex) { continue }
            out.append(f)
        }
        out.append((.sent, terminate.frame, start + 21))
        s.frames = out.sorted { $0.seconds < $1.seconds }
        return s
    }
}
