/// A journal that cannot grow without bound: the last `capacity` lines, each cut to
/// `lineLimit` characters, and a count of every line ever written, so a reader that remembers
/// how many it has seen can print only the new ones even after old ones were dropped. Every line
/// is written because of a peer's request, so a peer that keeps asking would otherwise fill the
/// memory.
public struct RecentLines: Sendable {
    public let capacity: Int
    public let lineLimit: Int
    /// Oldest first.
    public private(set) var lines: [String] = []
    /// Lines written so far, dropped ones included.
    public private(set) var total = 0

    public init(capacity: Int = 1000, lineLimit: Int = 512) {
        self.capacity = max(1, capacity)
        self.lineLimit = max(1, lineLimit)
    }

    /// Lines no longer held.
    public var dropped: Int { total - lines.count }

    public mutating func append(_ line: String) {
        total += 1
        lines.append(line.count > lineLimit ? String(line.prefix(lineLimit)) + "..." : line)
        if lines.count > capacity { lines.removeFirst(lines.count - capacity) }
    }

    /// The lines written after the first `seen` that are still held.
    public func after(_ seen: Int) -> ArraySlice<String> {
        lines.suffix(max(0, min(lines.count, total - seen)))
    }
}
