/// Walks the arguments, with a look at the next one for options whose value is optional.
public struct ArgumentCursor {
    private let arguments: [String]
    private var index = 0
    public init(_ arguments: [String]) { self.arguments = arguments }
    public mutating func next() -> String? {
        guard index < arguments.count else { return nil }
        defer { index += 1 }
        return arguments[index]
    }
    public func peek() -> String? { index < arguments.count ? arguments[index] : nil }
}

/// A number as a person writes one on a command line or in a configuration file: decimal
/// digits only (no sign, no spaces, no `0x`), within `T`'s range. `Int("+17002")` takes a
/// sign, and a port written `+17002` or a keep-alive of `60,x,10,5` is a mistake to report,
/// not a value to guess at.
public func decimal<T: FixedWidthInteger>(_ text: some StringProtocol, as type: T.Type = T.self) -> T? {
    guard !text.isEmpty, text.utf8.count <= 20, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
    return T(text, radix: 10)
}
