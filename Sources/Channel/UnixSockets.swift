import CSystem
import Glibc
import NetStack

/// Unix-domain stream sockets for control interfaces: reachable only through the file system,
/// so who may connect is the socket file's mode and its directory's, not every local process
/// (as with a TCP port on 127.0.0.1).
public enum UnixSocket {
    /// sun_path holds 108 bytes with the terminating NUL.
    static let maximumPathLength = 107

    /// The directory for this user's sockets: `$XDG_RUNTIME_DIR/pppbridge`, else
    /// `/tmp/pppbridge-UID`; made with mode 0700 when missing. A directory that exists must be
    /// ours, a real directory (not a link), and closed to group and others, or it is refused:
    /// anyone who can write there could replace our socket with theirs.
    public static func runtimeDirectory() throws(SystemError) -> String {
        let base: String
        if let x = getenv("XDG_RUNTIME_DIR"), x.pointee != 0 {
            base = String(cString: x) + "/pppbridge"
        } else {
            base = "/tmp/pppbridge-\(getuid())"
        }
        if mkdir(base, 0o700) != 0 && errno != EEXIST { throw SystemError("mkdir \(base)") }
        try checkPrivate(directory: base)
        return base
    }

    /// Throws unless `directory` is a directory owned by this user that group and others cannot
    /// enter or write.
    public static func checkPrivate(directory: String) throws(SystemError) {
        var st = stat()
        guard lstat(directory, &st) == 0 else { throw SystemError("stat \(directory)") }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw SystemError("\(directory) is not a directory", errno: Errno(ENOTDIR)) }
        guard st.st_uid == getuid() else { throw SystemError("\(directory) belongs to another user", errno: Errno(EPERM)) }
        guard st.st_mode & 0o077 == 0 else {
            throw SystemError("\(directory) is open to group or others (mode 0\(String(st.st_mode & 0o777, radix: 8)))", errno: .notPermitted)
        }
    }

    static func address(_ path: String) throws(SystemError) -> sockaddr_un {
        let bytes = Array(path.utf8)
        guard !bytes.isEmpty, bytes.count <= maximumPathLength, !bytes.contains(0) else {
            throw SystemError("socket path \(path)", errno: Errno(ENAMETOOLONG))
        }
        var a = sockaddr_un()
        a.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &a.sun_path) { p in
            for (i, b) in bytes.enumerated() { p[i] = b }
            p[bytes.count] = 0
        }
        return a
    }

    static func socket(nonBlocking: Bool) throws(SystemError) -> Int32 {
        let flags = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | (nonBlocking ? Int32(SOCK_NONBLOCK.rawValue) : 0)
        let fd = Glibc.socket(AF_UNIX, flags, 0)
        guard fd >= 0 else { throw SystemError("socket") }
        return fd
    }

    /// A listening socket at `path` with `mode` (0600: this user only). A socket file left there
    /// by a process that is gone is replaced; one that answers is not (two programs would not
    /// both be reachable), nor is anything that is not a socket.
    public static func listen(at path: String, mode: mode_t, backlog: Int32 = 128) throws(SystemError) -> FileDescriptor {
        var a = try address(path)
        var st = stat()
        if lstat(path, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFSOCK else { throw SystemError("\(path) exists and is not a socket", errno: Errno(EEXIST)) }
            // Without blocking: a listener there with a full backlog also means it is taken.
            var probeAddress = try address(path)
            let probe = try socket(nonBlocking: true)
            let r = withUnsafePointer(to: &probeAddress) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            let e = errno
            Glibc.close(probe)
            if r == 0 || e == EAGAIN || e == EINPROGRESS {
                throw SystemError("\(path): another program answers there", errno: Errno(EADDRINUSE))
            }
            unlink(path)
        }
        let fd = try socket(nonBlocking: true)
        let bound = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else {
            let e = SystemError("bind \(path)")
            Glibc.close(fd)
            throw e
        }
        // bind(2) made the file with the process's umask. Its mode is set on the very file
        // bind made, not on whatever the path names by now: opened without following a link,
        // checked to be a socket, and changed through that descriptor. Nobody can connect
        // meanwhile (the socket does not listen yet), and the umask, which every thread of a
        // program that links us shares, is left alone.
        do throws(SystemError) { try setMode(mode, ofSocketAt: path) } catch {
            Glibc.close(fd)
            unlink(path)
            throw error
        }
        guard Glibc.listen(fd, backlog) == 0 else {
            let e = SystemError("listen \(path)")
            Glibc.close(fd)
            unlink(path)
            throw e
        }
        return FileDescriptor(fd)
    }

    /// A blocking connection to the socket at `path` (for command-line clients), refused unless
    /// the program listening there runs as this user or root: a socket someone else planted at
    /// that path must not be handed our commands (cards, PINs).
    public static func connectToOwn(_ path: String) throws(SystemError) -> FileDescriptor {
        let fd = try connect(to: path)
        guard peerUser(fd).map({ $0 == getuid() || $0 == 0 }) == true else {
            fd.close()
            throw SystemError("\(path): the program listening there is another user's", errno: Errno(EPERM))
        }
        return fd
    }

    /// chmod of the socket file at `path` itself: opened with O_PATH and O_NOFOLLOW, checked
    /// to be a socket, changed through /proc/self/fd (which names that inode, not the path).
    private static func setMode(_ mode: mode_t, ofSocketAt path: String) throws(SystemError) {
        let p = open(path, Int32(PPPBRIDGE_O_PATH) | O_NOFOLLOW | O_CLOEXEC)
        guard p >= 0 else { throw SystemError("open \(path)") }
        defer { Glibc.close(p) }
        var st = stat()
        guard fstat(p, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK else {
            throw SystemError("\(path) is no longer the socket bound there", errno: Errno(EEXIST))
        }
        guard chmod("/proc/self/fd/\(p)", mode) == 0 else { throw SystemError("chmod \(path)") }
    }

    /// A blocking connection to a service's socket at `path`, refused unless the program
    /// listening there runs as this user, as root, or as the user who owns the directory the
    /// socket is in (the service's runtime directory, writable by no one else) and the socket
    /// itself. Every call on it (the connect included) gives up after `timeout`.
    public static func connectToService(_ path: String, timeout: Duration) throws(SystemError) -> FileDescriptor {
        let fd = try connect(to: path, timeout: timeout)
        guard let peer = peerUser(fd) else {
            fd.close()
            throw SystemError("\(path): the listening program's user cannot be told", errno: Errno(EPERM))
        }
        if peer == getuid() || peer == 0 { return fd }
        var socketStat = stat(), directoryStat = stat()
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) }.map { $0.isEmpty ? "/" : $0 } ?? "."
        let owned = lstat(path, &socketStat) == 0 && socketStat.st_uid == peer
            && stat(directory, &directoryStat) == 0 && directoryStat.st_uid == peer && directoryStat.st_mode & 0o022 == 0
        guard owned else {
            fd.close()
            throw SystemError("\(path): the program listening there (user \(peer)) does not own the socket and its directory", errno: .notPermitted)
        }
        return fd
    }

    /// A blocking connection to the socket at `path` (for command-line clients); with a
    /// `timeout`, the connect and every later send and receive give up after it (EAGAIN).
    public static func connect(to path: String, timeout: Duration? = nil) throws(SystemError) -> FileDescriptor {
        var a = try address(path)
        let fd = try socket(nonBlocking: false)
        if let timeout {
            let ns = max(timeout.nanoseconds, 1_000_000)
            var tv = timeval(tv_sec: Int(ns / 1_000_000_000), tv_usec: Int((ns % 1_000_000_000) / 1_000))
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        }
        let r = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0 else {
            let e = SystemError("connect \(path)")
            Glibc.close(fd)
            throw e
        }
        return FileDescriptor(fd)
    }

    /// The next pending client, non-blocking (as `HostSocket.accept`, without an address).
    static func accept(_ listener: FileDescriptor) -> HostSocket.Accepted {
        let fd = retryingOnInterrupt { accept4(listener.rawValue, nil, nil, Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)) }
        return HostSocket.accepted(fd, TCPEndpoint(IPv4Address(0, 0, 0, 0), 0))
    }

    /// The connecting process's user ID (SO_PEERCRED).
    public static func peerUser(_ fd: FileDescriptor) -> uid_t? {
        var uid: UInt32 = 0
        guard pppbridge_peer_uid(fd.rawValue, &uid) == 0 else { return nil }
        return uid
    }
}
