import Wire

/// One end of a TCP connection: address and port.
public struct TCPEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var address: IPv4Address
    public var port: UInt16
    public init(_ address: IPv4Address, _ port: UInt16) {
        self.address = address
        self.port = port
    }
    public var description: String { "\(address):\(port)" }
}
