/// The reader protocol's framing (nexo Sale-to-POI transport, also used towards the gateway):
/// a 4-byte big-endian length not counting itself, then that many bytes of UTF-8 JSON.
public enum PaymentFrame {
    public static let maximumLength = 1_048_576

    /// The frame carrying `payload`. A payload the receiver would have to close the connection
    /// for (empty, or above 1 MiB) is refused: a reply that copies a peer's text can outgrow its
    /// request (JSON escaping turns one byte into six), so the caller drops it, counts it and
    /// answers with an error instead.
    public static func encode(_ payload: [UInt8]) throws(FrameError) -> [UInt8] {
        guard !payload.isEmpty else { throw .emptyFrame }
        guard payload.count <= maximumLength else { throw .oversizeFrame(UInt32(clamping: payload.count)) }
        let n = UInt32(payload.count)
        return [UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)] + payload
    }

    public static func encode(_ value: JSONValue) throws(FrameError) -> [UInt8] { try encode(value.serialized) }

    /// Whether `payload` fits in one frame.
    public static func fits(_ payload: [UInt8]) -> Bool { (1...maximumLength).contains(payload.count) }
}

public enum FrameError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A length of zero: the connection must be closed.
    case emptyFrame
    /// A length above 1 MiB: the connection must be closed.
    case oversizeFrame(UInt32)

    public var description: String {
        switch self {
        case .emptyFrame: return "frame of length 0"
        case .oversizeFrame(let n): return "frame of \(n) bytes exceeds \(PaymentFrame.maximumLength)"
        }
    }
}

/// Reassembles frames from a byte stream cut anywhere. After an error it stays failed: the
/// protocol closes the connection.
public struct PaymentFrameDecoder: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0
    public private(set) var failure: FrameError?

    public init() {}

    /// Bytes held that do not yet make a whole frame.
    public var pendingCount: Int { buffer.count - start }

    /// Appends `bytes` and returns every frame payload now complete, in order.
    public mutating func feed(_ bytes: [UInt8]) throws -> [[UInt8]] {
        if let failure { throw failure }
        buffer += bytes
        var frames = [[UInt8]]()
        while buffer.count - start >= 4 {
            let n = UInt32(buffer[start]) << 24 | UInt32(buffer[start + 1]) << 16
                | UInt32(buffer[start + 2]) << 8 | UInt32(buffer[start + 3])
            if n == 0 { failure = .emptyFrame }
            if n > UInt32(PaymentFrame.maximumLength) { failure = .oversizeFrame(n) }
            if let failure {
                buffer = []
                start = 0
                if frames.isEmpty { throw failure }
                return frames
            }
            guard buffer.count - start >= 4 + Int(n) else { break }
            frames.append(Array(buffer[(start + 4)..<(start + 4 + Int(n))]))
            start += 4 + Int(n)
        }
        if start > 0 && (start >= 65_536 || start == buffer.count) {
            buffer.removeFirst(start)
            start = 0
        }
        return frames
    }
}
