import CSystem
import Glibc
import NetStack
import RemoteSerial

/// A serial line on the network: a device server (ser2net, a Moxa NPort, a Lantronix) that puts
/// a terminal's RS-232 port on TCP, raw (`tcp:HOST:PORT`) or as RFC 2217 (`rfc2217:HOST:PORT`).
///
/// The connection is started without waiting: the line is handed to its link at once, what
/// the link writes waits in its queue until the connection is up (a write would block until
/// then), and a refused or failed connection reads as the line hanging up. The connection's
/// end (the server closed it, restarted, or its port was taken over) is a hang-up too, and so
/// is, over RFC 2217, a carrier the server saw and then lost.
extension SerialLine {
    /// SYNs sent before a connection that gets no answer fails: 1 + 2 + 4 + 8 s, about 15 s
    /// (Linux's default, 6, waits over two minutes for a device server that is not there).
    static let networkSynRetries: Int32 = 3
    /// Unacknowledged data aborts the connection after this (RFC 5482; Linux's
    /// TCP_USER_TIMEOUT): a device server that went away without a word is noticed in the
    /// time LCP's echoes would notice it, even while the line is busy.
    static let networkUserTimeoutMilliseconds: Int32 = 20_000

    /// Connects to `address` (non-blocking; see the type's notes).
    convenience init(network address: RemoteLineAddress, options: Options) throws(SystemError) {
        let family: Int32
        switch address.host {
        case let .ipv4(a) where a.count == 4: family = AF_INET
        case let .ipv6(a) where a.count == 16: family = AF_INET6
        default: throw SystemError("\(address): not an address", errno: Errno(EINVAL))
        }
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket for \(address)") }
        let size = socklen_t(MemoryLayout<Int32>.size)
        var on: Int32 = 1
        // Frames are written whole as PPP hands them over; Nagle would hold an LCP echo
        // behind an unacknowledged frame.
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, size)
        var syn = SerialLine.networkSynRetries
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_SYNCNT, &syn, size)
        var user = SerialLine.networkUserTimeoutMilliseconds
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT, &user, size)
        // The kernel's send buffer is a queue of its own, ahead of ours: kept to about a
        // quarter second of the serial side's time (at least 4 KiB), so control frames that
        // our queue puts ahead of data are not stuck behind seconds of it in the kernel.
        var buffer = Int32(clamping: max(4096, options.speed / 8 / 4))
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, size)
        let r: Int32
        switch address.host {
        case let .ipv4(a):
            var sa = sockaddr_in()
            sa.sin_family = sa_family_t(AF_INET)
            sa.sin_port = address.port.bigEndian
            sa.sin_addr.s_addr = (UInt32(a[0]) << 24 | UInt32(a[1]) << 16 | UInt32(a[2]) << 8 | UInt32(a[3])).bigEndian
            r = withUnsafePointer(to: &sa) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        case let .ipv6(a):
            var sa = sockaddr_in6()
            sa.sin6_family = sa_family_t(AF_INET6)
            sa.sin6_port = address.port.bigEndian
            withUnsafeMutableBytes(of: &sa.sin6_addr) { bytes in
                for i in 0..<16 { bytes[i] = a[i] }
            }
            r = withUnsafePointer(to: &sa) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
            }
        }
        if r != 0 && errno != EINPROGRESS && errno != EINTR {
            let e = SystemError("connect \(address)")
            Glibc.close(fd)
            throw e
        }
        var settings: ComPortSettings?
        if address.kind == .rfc2217 {
            var s = ComPortSettings()
            s.baudRate = UInt32(clamping: options.speed)
            s.flowControl = options.hardwareFlowControl ? .hardware : .none
            settings = s
        }
        self.init(connected: FileDescriptor(fd), remote: address, comPort: settings, bitsPerSecond: options.speed)
    }
}
