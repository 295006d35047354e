import Glibc

/// A file a capture (pcap, pppd record) is written to, with plain POSIX calls.
///
/// - It is opened without following a symbolic link at its path (`O_NOFOLLOW`: a link planted
///   where a capture goes cannot make us write through it) and created 0600, since captures
///   hold what crossed the line.
/// - A write that fails (a full disk, `EFBIG`, a reader that went away: `EPIPE`, SIGPIPE being
///   ignored by the program) stops the recording and says so once through `onStop`; it never
///   traps, and the link goes on. `EINTR` is retried and short writes are continued.
/// - The file stops growing at `limit` bytes: a record that would pass it is not written, the
///   recording stops and says so once.
public final class CaptureFile {
    /// 256 MiB: hours of a 115200 bit/s line both ways, far from filling a disk.
    public static let defaultLimit = 256 * 1024 * 1024

    public let path: String
    public let limit: Int
    public private(set) var bytesWritten = 0
    /// Why writing stopped (nil while it goes on).
    public private(set) var stopReason: String?
    /// Told once, with a line for a person, when writing stops early.
    public var onStop: ((String) -> Void)?
    private var descriptor: Int32

    /// What an existing file at the path must already hold to be replaced: a capture is
    /// written over only a capture of the same kind, so a path given by mistake (or by a
    /// configuration file) never truncates anything else.
    public enum Replaces: Sendable {
        /// A pcap or pcapng file (or an empty one).
        case pcap
        /// A pppd record file: its first byte a record type (RFC-less; pppd's 1–7), or empty.
        case pppdRecord
        /// Any regular file of ours (a status file's own temporary name).
        case anyOfOurs

        func recognizes(_ head: [UInt8]) -> Bool {
            if head.isEmpty { return true }
            switch self {
            case .pcap: return PcapReader.looksLikePcap(head)
            case .pppdRecord: return (1...7).contains(head[0])
            case .anyOfOurs: return true
            }
        }
    }

    /// Creates `path` for writing, or replaces it (truncated) when it already holds what
    /// `replaces` says, belongs to us, has no other name and is 0600.
    public init(path: String, limit: Int = CaptureFile.defaultLimit, replaces: Replaces) throws(CaptureError) {
        // Created only if new (O_EXCL); an existing file is opened without O_CREAT and checked
        // before anything is written to it.
        var fd = retryingOnInterrupt { open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600) }
        var created = fd >= 0
        if fd < 0 && errno == EEXIST {
            // Without waiting: a FIFO with no reader fails (ENXIO) instead of holding the loop.
            fd = retryingOnInterrupt { open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK) }
            if fd >= 0 { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) }
            created = false
        }
        guard fd >= 0 else {
            let e = errno
            if e == ELOOP { throw CaptureError("\(path) is a symbolic link, which is not written through") }
            throw CaptureError("\(path): \(String(cString: strerror(e)))")
        }
        // An existing regular file must be ours and have no other name: in a shared directory
        // another user could have planted it (and would then own what we write, passwords of a
        // capture included), or made it a hard link to a file of ours elsewhere. It keeps its
        // mode through O_CREAT, so it is made as private as a new one. Devices and FIFOs (a live
        // reader) are left as they are.
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            let e = errno
            _ = Glibc.close(fd)
            throw CaptureError("\(path): \(String(cString: strerror(e)))")
        }
        if st.st_mode & S_IFMT == S_IFREG && !created {
            guard st.st_uid == geteuid(), st.st_nlink == 1 else {
                _ = Glibc.close(fd)
                throw CaptureError("\(path) belongs to another user or has other names (hard links); not written")
            }
            guard st.st_mode & 0o077 == 0 else {
                _ = Glibc.close(fd)
                throw CaptureError("\(path) exists and is readable or writable by others (mode \(String(st.st_mode & 0o777, radix: 8))); not replaced")
            }
            guard let head = CaptureFile.head(of: path, sameAs: st), replaces.recognizes(head) else {
                _ = Glibc.close(fd)
                throw CaptureError("\(path) exists and is not a capture of this kind; not replaced (remove it, or name another file)")
            }
            guard ftruncate(fd, 0) == 0 else {
                let e = errno
                _ = Glibc.close(fd)
                throw CaptureError("\(path): \(String(cString: strerror(e)))")
            }
        }
        self.path = path
        self.limit = max(0, limit)
        descriptor = fd
    }

    /// Why a capture of kind `replaces` would not be written at `path` as it is now (a link,
    /// another user's file, a file readable by others, one that is not a capture of that kind),
    /// or nil when it would: for a configuration to be refused when it is read, not at every
    /// open. The open checks again on the descriptor.
    public static func refusal(toReplace path: String, _ replaces: Replaces) -> String? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        switch st.st_mode & S_IFMT {
        case S_IFLNK: return "\(path) is a symbolic link, which is not written through"
        case S_IFREG: break
        default: return nil
        }
        if st.st_uid != geteuid() || st.st_nlink != 1 { return "\(path) belongs to another user or has other names (hard links); not written" }
        if st.st_mode & 0o077 != 0 { return "\(path) exists and is readable or writable by others (mode \(String(st.st_mode & 0o777, radix: 8))); not replaced" }
        guard let head = head(of: path, sameAs: st), replaces.recognizes(head) else {
            return "\(path) exists and is not a capture of this kind; not replaced (remove it, or name another file)"
        }
        return nil
    }

    /// The first bytes of the regular file at `path`, if it is still the file `expected`
    /// describes (opened again for reading: the capture's own descriptor is write-only).
    private static func head(of path: String, sameAs expected: stat) -> [UInt8]? {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK) }
        guard fd >= 0 else { return nil }
        defer { _ = Glibc.close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_dev == expected.st_dev, st.st_ino == expected.st_ino else { return nil }
        var head = [UInt8](repeating: 0, count: 8)
        let n = head.withUnsafeMutableBytes { b in retryingOnInterrupt { pread(fd, b.baseAddress, b.count, 0) } }
        return n >= 0 ? Array(head[..<n]) : nil
    }

    public var isWriting: Bool { stopReason == nil && descriptor >= 0 }

    /// Appends `bytes` whole, or nothing once stopped. Returns false when they were not written.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        guard isWriting else { return false }
        guard bytes.count <= limit - bytesWritten else {
            stop("reached its size limit of \(limit) bytes")
            return false
        }
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { b in retryingOnInterrupt { Glibc.write(descriptor, b.baseAddress, b.count) } }
            if n < 0 {
                stop(String(cString: strerror(errno)))
                return false
            }
            if n == 0 {
                stop("the file takes no more bytes")
                return false
            }
            offset += n
            bytesWritten += n
        }
        return true
    }

    /// Closes the file. Idempotent.
    public func close() {
        guard descriptor >= 0 else { return }
        _ = Glibc.close(descriptor)
        descriptor = -1
    }

    private func stop(_ why: String) {
        stopReason = why
        close()
        onStop?("pppbridge: capture \(path) stopped: \(why)")
    }

    deinit { close() }
}

func retryingOnInterrupt<T: BinaryInteger>(_ call: () -> T) -> T {
    while true {
        let r = call()
        if r >= 0 || errno != EINTR { return r }
    }
}
