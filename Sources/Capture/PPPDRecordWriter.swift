import Foundation
import Framing

/// Writes pppd's `record` format (see `PPPDRecord`): the raw line bytes both ways with time
/// steps, so `pppdump`, tshark and `pppbridge decode` can read a live session back.
public final class PPPDRecordWriter {
    private let handle: FileHandle
    private var tenthsWritten: Int64 = 0
    private var closed = false

    /// - Parameter startTime: Unix seconds of the start of the recording.
    public init(path: String, startTime: Int64) throws(CaptureError) {
        guard FileManager.default.createFile(atPath: path, contents: nil), let h = FileHandle(forWritingAtPath: path) else {
            throw CaptureError("\(path): cannot create the record file")
        }
        handle = h
        let t = UInt32(truncatingIfNeeded: startTime)
        write([0x07, UInt8(t >> 24), UInt8((t >> 16) & 0xFF), UInt8((t >> 8) & 0xFF), UInt8(t & 0xFF)])
    }

    /// Records `bytes` that went `direction`, `elapsedTenths` tenths of a second after the start.
    public func record(_ direction: Direction, _ bytes: [UInt8], elapsedTenths: Int64) {
        guard !closed, !bytes.isEmpty else { return }
        let step = elapsedTenths - tenthsWritten
        if step > 0 {
            if step < 256 {
                write([0x06, UInt8(step)])
            } else {
                let s = UInt32(truncatingIfNeeded: step)
                write([0x05, UInt8(s >> 24), UInt8((s >> 16) & 0xFF), UInt8((s >> 8) & 0xFF), UInt8(s & 0xFF)])
            }
            tenthsWritten = elapsedTenths
        }
        var offset = 0
        while offset < bytes.count {
            let n = min(0xFFFF, bytes.count - offset)
            write([direction == .sent ? 0x01 : 0x02, UInt8(n >> 8), UInt8(n & 0xFF)] + bytes[offset..<(offset + n)])
            offset += n
        }
    }

    /// Ends both directions (entries 3 and 4) and closes the file. Idempotent.
    public func close() {
        guard !closed else { return }
        write([0x03, 0x04])
        closed = true
        try? handle.close()
    }

    private func write(_ bytes: [UInt8]) { handle.write(Data(bytes)) }

    deinit { close() }
}
