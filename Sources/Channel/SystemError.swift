import Glibc
import NetStack

/// An errno value: the system's name for why a call failed, printed as `strerror` says it.
/// Any value is kept as it came.
public struct Errno: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// The calling thread's errno now.
    public static var current: Errno { Errno(Glibc.errno) }

    public static let interrupted = Errno(EINTR)
    public static let wouldBlock = Errno(EAGAIN)
    public static let notPermitted = Errno(EPERM)
    public static let invalidArgument = Errno(EINVAL)
    public static let addressInUse = Errno(EADDRINUSE)
    public static let connectionRefused = Errno(ECONNREFUSED)
    public static let connectionReset = Errno(ECONNRESET)
    public static let timedOut = Errno(ETIMEDOUT)
    public static let networkUnreachable = Errno(ENETUNREACH)
    public static let hostUnreachable = Errno(EHOSTUNREACH)

    public var description: String { String(cString: strerror(rawValue)) }
}

/// A failed system call with its errno, e.g. `open /dev/ttyS1: No such file or directory`.
public struct SystemError: Error, Equatable, Sendable, CustomStringConvertible {
    public var operation: String
    public var errno: Errno

    public init(_ operation: String, errno: Errno = .current) {
        self.operation = operation
        self.errno = errno
    }

    public var description: String { "\(operation): \(errno)" }
}

/// Retries a call interrupted by a signal (EINTR); returns the result otherwise.
@inline(__always)
func retryingOnInterrupt<T: BinaryInteger>(_ body: () -> T) -> T {
    while true {
        let r = body()
        if r == -1 && errno == EINTR { continue }
        return r
    }
}

/// Reads what is available from a non-blocking descriptor. nil when it would block;
/// an empty array at end of file.
func readAvailable(_ fd: FileDescriptor, into buffer: inout [UInt8]) throws(SystemError) -> Int? {
    let n = buffer.withUnsafeMutableBytes { b in retryingOnInterrupt { read(fd.rawValue, b.baseAddress, b.count) } }
    if n < 0 {
        if errno == EAGAIN || errno == EWOULDBLOCK { return nil }
        throw SystemError("read")
    }
    return n
}

/// Reads until `buffer` is full or a read brings nothing: a tty hands over at most what its
/// line discipline holds (4 KiB) per read, however much waits behind it. Returns the bytes
/// read. A read of 0 (the end of a stream, or a tty with VMIN 0 and nothing waiting) ends it
/// like EAGAIN, and so does an error after some bytes: the caller's next read finds either.
func fillAvailable(_ fd: FileDescriptor, into buffer: inout [UInt8]) throws(SystemError) -> Int {
    var count = 0
    while count < buffer.count {
        let n = buffer.withUnsafeMutableBytes { b in retryingOnInterrupt { read(fd.rawValue, b.baseAddress! + count, b.count - count) } }
        if n < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK || count > 0 { break }
            throw SystemError("read")
        }
        if n == 0 { break }
        count += n
    }
    return count
}

/// Writes as much as the descriptor takes now; returns the bytes written (0 when it would block).
func writeSome(_ fd: FileDescriptor, _ bytes: ArraySlice<UInt8>) throws(SystemError) -> Int {
    let n = bytes.withUnsafeBytes { b in retryingOnInterrupt { write(fd.rawValue, b.baseAddress, b.count) } }
    if n < 0 {
        if errno == EAGAIN || errno == EWOULDBLOCK { return 0 }
        throw SystemError("write")
    }
    return n
}

/// Reads the monotonic clock as the sans-IO cores' `Instant`.
public func monotonicNow() -> Instant {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Instant(nanoseconds: Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec))
}
