/// Cuts a byte stream into newline-ended lines for line protocols (control sockets), holding at
/// most `limit` bytes: a line that goes on longer is reported once as `.tooLong` and the rest
/// of it dropped up to its newline, never buffered.
public struct LineAssembler: Sendable {
    public enum Piece: Equatable, Sendable {
        case line([UInt8])
        case tooLong
    }

    public let limit: Int
    /// Lines of nothing but spaces, tabs and CR are passed over without a piece each (a client
    /// writing blank lines as fast as it can costs a scan, not an allocation a line).
    public let skipsBlankLines: Bool
    private var buffer: [UInt8] = []
    private var skipping = false

    public init(limit: Int, skipsBlankLines: Bool = false) {
        self.limit = limit
        self.skipsBlankLines = skipsBlankLines
    }

    private static func isBlank(_ bytes: some Collection<UInt8>) -> Bool {
        bytes.allSatisfy { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }
    }

    /// The pieces `bytes` completes, in order (a line without its newline).
    public mutating func feed(_ bytes: [UInt8]) -> [Piece] {
        var pieces: [Piece] = []
        var rest = bytes[...]
        while !rest.isEmpty {
            let newline = rest.firstIndex(of: 0x0A)
            if skipping {
                guard let newline else { break }
                skipping = false
                rest = rest[(newline + 1)...]
                continue
            }
            guard let newline else {
                buffer += rest
                if buffer.count > limit {
                    buffer = []
                    skipping = true
                    pieces.append(.tooLong)
                }
                break
            }
            if skipsBlankLines && LineAssembler.isBlank(buffer) && LineAssembler.isBlank(rest[..<newline]) {
                buffer.removeAll(keepingCapacity: true)
                rest = rest[(newline + 1)...]
                continue
            }
            let line = buffer + rest[..<newline]
            buffer = []
            rest = rest[(newline + 1)...]
            pieces.append(line.count <= limit ? .line(line) : .tooLong)
        }
        return pieces
    }
}
