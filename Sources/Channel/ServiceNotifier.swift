import CSystem
import Glibc

/// The service manager's notify protocol (sd_notify(3)): datagrams of `KEY=VALUE` lines to the
/// Unix socket named by `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace).
/// Written here rather than linking libsystemd: it is one sendto(2).
public final class ServiceNotifier {
    private let descriptor: Int32
    private var address: sockaddr_un
    private let addressLength: socklen_t
    /// Datagrams the socket did not take (the manager gone, its queue full).
    public private(set) var failures = 0

    /// nil without `NOTIFY_SOCKET` (not started by a service manager, or not Type=notify) or
    /// with a value that is not a socket address.
    public init?(environment: [String: String]) {
        guard let path = environment["NOTIFY_SOCKET"], !path.isEmpty else { return nil }
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        guard bytes.count <= UnixSocket.maximumPathLength, abstract || bytes.first == UInt8(ascii: "/"), !bytes.dropFirst().contains(0) else {
            return nil
        }
        var a = sockaddr_un()
        a.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &a.sun_path) { p in
            for (i, b) in bytes.enumerated() { p[i] = b }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return nil }
        descriptor = fd
        address = a
        // An abstract name is exactly its bytes (no terminating NUL counted); a path, with it.
        addressLength = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1))
    }

    deinit { Glibc.close(descriptor) }

    /// Sends `state` (lines such as `READY=1`, `STATUS=...`); false when it was not taken.
    @discardableResult
    public func notify(_ state: String) -> Bool {
        let bytes = Array(state.utf8)
        let n = bytes.withUnsafeBytes { b in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(descriptor, b.baseAddress, b.count, Int32(MSG_NOSIGNAL), $0, addressLength) }
            }
        }
        if n != bytes.count { failures += 1 }
        return n == bytes.count
    }

    /// How often the manager wants `WATCHDOG=1`: half of `WATCHDOG_USEC` (sd_watchdog_enabled(3)),
    /// when it is set for this process (`WATCHDOG_PID`, when present, is ours).
    public static func watchdogInterval(environment: [String: String]) -> Duration? {
        guard let text = environment["WATCHDOG_USEC"], let usec = UInt64(text), usec > 0 else { return nil }
        if let pid = environment["WATCHDOG_PID"], Int32(pid) != getpid() { return nil }
        // Half the timeout, as sd_watchdog_enabled(3) advises, but never under 100 ms: a tiny
        // WATCHDOG_USEC (1) would otherwise make the pings a busy loop.
        return .microseconds(max(Int64(clamping: usec / 2), 100_000))
    }
}
