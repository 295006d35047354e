import CSystem
import Glibc
import NetStack

/// TCP keep-alive for the host sockets the SOCKS proxy opens on the terminal's behalf (ICPPP's
/// `setKeepAliveDelay:Interval:andCount:`): after `idleSeconds` without traffic, probe every
/// `probeIntervalSeconds`, and give up after `probeCount` unanswered probes.
public struct KeepAliveSettings: Sendable, Equatable, CustomStringConvertible {
    public var idleSeconds: Int32
    public var probeIntervalSeconds: Int32
    public var probeCount: Int32

    public init(idleSeconds: Int32, probeIntervalSeconds: Int32, probeCount: Int32) {
        self.idleSeconds = idleSeconds
        self.probeIntervalSeconds = probeIntervalSeconds
        self.probeCount = probeCount
    }

    /// The kernel's limits (tcp(7)): idle and interval 1–32767 s, count 1–127.
    public var isValid: Bool {
        (1...32767).contains(idleSeconds) && (1...32767).contains(probeIntervalSeconds) && (1...127).contains(probeCount)
    }

    public var description: String { "idle \(idleSeconds) s, interval \(probeIntervalSeconds) s, count \(probeCount)" }
}

/// How long a listener rests after accept(2) ran out of descriptors (EMFILE, ENFILE): the
/// client stays in the kernel's queue, so the listener stays readable and watching it would
/// spin the loop until a descriptor is freed. 100 ms, doubling to 2 s; a client taken resets it.
struct AcceptBackoff: Sendable, Equatable {
    static let initial: Duration = .milliseconds(100)
    static let maximum: Duration = .seconds(2)
    private(set) var next = AcceptBackoff.initial
    /// Times the listener was rested.
    private(set) var count = 0

    /// Another failure: how long to stop watching the listener.
    mutating func failed() -> Duration {
        let pause = next
        next = min(next * 2, AcceptBackoff.maximum)
        count += 1
        return pause
    }

    mutating func succeeded() { next = AcceptBackoff.initial }
}

/// Thin typed wrappers over the socket calls the channel makes on the host side.
enum HostSocket {
    static func address(_ endpoint: TCPEndpoint) -> sockaddr_in {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = endpoint.port.bigEndian
        a.sin_addr.s_addr = endpoint.address.value.bigEndian
        return a
    }

    static func endpoint(_ a: sockaddr_in) -> TCPEndpoint {
        TCPEndpoint(IPv4Address(UInt32(bigEndian: a.sin_addr.s_addr)), UInt16(bigEndian: a.sin_port))
    }

    static func stream() throws(SystemError) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket") }
        return fd
    }

    /// A listening socket on `address:port` (0.0.0.0 for every interface, 127.0.0.1 for loopback only).
    static func listen(on endpoint: TCPEndpoint, backlog: Int32 = 128) throws(SystemError) -> FileDescriptor {
        let fd = try stream()
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var a = address(endpoint)
        let bound = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else {
            let e = SystemError("bind \(endpoint)")
            Glibc.close(fd)
            throw e
        }
        guard Glibc.listen(fd, backlog) == 0 else {
            let e = SystemError("listen \(endpoint)")
            Glibc.close(fd)
            throw e
        }
        return FileDescriptor(fd)
    }

    enum Accepted {
        case client(FileDescriptor, TCPEndpoint)
        /// No client now (or one that went away before we took it: the next turn tries again).
        case none
        /// The process or system is out of descriptors or memory; the client stays queued.
        case outOfResources
    }

    /// The next pending client, non-blocking.
    static func accept(_ listener: FileDescriptor) -> Accepted {
        var a = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let fd = withUnsafeMutablePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p in
                retryingOnInterrupt { accept4(listener.rawValue, p, &length, Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)) }
            }
        }
        return accepted(fd, endpoint(a))
    }

    /// What accept4 returning `fd` means (errno when it failed).
    static func accepted(_ fd: Int32, _ peer: TCPEndpoint) -> Accepted {
        guard fd >= 0 else {
            switch errno {
            case EMFILE, ENFILE, ENOBUFS, ENOMEM: return .outOfResources
            default: return .none
            }
        }
        return .client(FileDescriptor(fd), peer)
    }

    /// Starts a non-blocking connect; the socket reports writable when it finished (check `pendingError`).
    static func connect(to endpoint: TCPEndpoint, keepAlive: KeepAliveSettings? = nil, from source: IPv4Address? = nil) throws(SystemError) -> FileDescriptor {
        let fd = try stream()
        if let keepAlive { setKeepAlive(FileDescriptor(fd), keepAlive) }
        if let source {
            // Any free port on that address; the address must be this host's (EADDRNOTAVAIL).
            // The port is chosen at connect, per destination (IP_BIND_ADDRESS_NO_PORT): bound
            // here, one port per connection whatever its destination would run out at ~28k.
            var on: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_IP), 24 /* IP_BIND_ADDRESS_NO_PORT */, &on, socklen_t(MemoryLayout<Int32>.size))
            var local = address(TCPEndpoint(source, 0))
            let r = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if r != 0 {
                let e = SystemError("bind \(source)")
                Glibc.close(fd)
                throw e
            }
        }
        var a = address(endpoint)
        let r = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if r != 0 && errno != EINPROGRESS && errno != EINTR {
            let e = SystemError("connect \(endpoint)")
            Glibc.close(fd)
            throw e
        }
        return FileDescriptor(fd)
    }

    static func pendingError(_ descriptor: FileDescriptor) -> Int32 {
        let fd = descriptor.rawValue
        var e: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &length)
        return e
    }

    static func localEndpoint(_ descriptor: FileDescriptor) -> TCPEndpoint? {
        let fd = descriptor.rawValue
        var a = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let r = withUnsafeMutablePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return r == 0 ? endpoint(a) : nil
    }

    /// No Nagle on a relay's host socket: what our stack hands it was coalesced by the
    /// terminal's own TCP already, and a reply written in two parts must not wait for the host
    /// application's delayed ACK (RFC 1122 §4.2.3.4 is the sender's choice to make, and the
    /// sender is the terminal).
    static func setNoDelay(_ descriptor: FileDescriptor) {
        let fd = descriptor.rawValue
        var on: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
    }

    static func setKeepAlive(_ descriptor: FileDescriptor, _ k: KeepAliveSettings) {
        let fd = descriptor.rawValue
        var on: Int32 = 1
        var idle = k.idleSeconds, interval = k.probeIntervalSeconds, count = k.probeCount
        let size = socklen_t(MemoryLayout<Int32>.size)
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, size)
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, size)
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, size)
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, &count, size)
    }

    /// What the kernel holds for `fd` (nil when keep-alive is off).
    static func keepAlive(of descriptor: FileDescriptor) -> KeepAliveSettings? {
        let fd = descriptor.rawValue
        func get(_ level: Int32, _ name: Int32) -> Int32 {
            var v: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, level, name, &v, &length)
            return v
        }
        guard get(SOL_SOCKET, SO_KEEPALIVE) != 0 else { return nil }
        return KeepAliveSettings(idleSeconds: get(Int32(IPPROTO_TCP), TCP_KEEPIDLE),
                                 probeIntervalSeconds: get(Int32(IPPROTO_TCP), TCP_KEEPINTVL),
                                 probeCount: get(Int32(IPPROTO_TCP), TCP_KEEPCNT))
    }

    /// Sends what the socket takes now, never raising SIGPIPE; 0 when it would block.
    static func send(_ descriptor: FileDescriptor, _ bytes: ArraySlice<UInt8>) throws(SystemError) -> Int {
        let result = bytes.withUnsafeBytes { b in Result { () throws(SystemError) in try send(descriptor, b) } }
        return try result.get()
    }

    /// `send` of bytes where they lie (a stack's receive buffer).
    static func send(_ descriptor: FileDescriptor, _ b: UnsafeRawBufferPointer) throws(SystemError) -> Int {
        let fd = descriptor.rawValue
        let n = retryingOnInterrupt { Glibc.send(fd, b.baseAddress, b.count, Int32(MSG_NOSIGNAL)) }
        if n < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK { return 0 }
            throw SystemError("send")
        }
        return n
    }

    /// Closes with a reset (SO_LINGER 0), so the host peer learns the connection failed.
    static func closeWithReset(_ descriptor: FileDescriptor) {
        let fd = descriptor.rawValue
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        Glibc.close(fd)
    }

    /// A UDP socket from `localPort` (on every interface) connected to `endpoint`.
    static func datagram(from localPort: UInt16, connectedTo endpoint: TCPEndpoint) throws(SystemError) -> FileDescriptor {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket") }
        var local = address(TCPEndpoint(.any, localPort))
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else {
            let e = SystemError("bind port \(localPort)")
            Glibc.close(fd)
            throw e
        }
        var a = address(endpoint)
        let r = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard r == 0 else {
            let e = SystemError("connect \(endpoint)")
            Glibc.close(fd)
            throw e
        }
        return FileDescriptor(fd)
    }
}
