import Glibc

/// An open file descriptor of this process: a line, a socket, a pty, an epoll or inotify
/// instance. Typed so that a descriptor is never taken for a count, a port or an errno; the
/// system calls take its `rawValue`.
public struct FileDescriptor: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// Closes it (EINTR is not retried: on Linux the descriptor is gone whatever close says).
    public func close() { _ = Glibc.close(rawValue) }

    public var description: String { "fd \(rawValue)" }
}
