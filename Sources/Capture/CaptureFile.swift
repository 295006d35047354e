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

    /// Creates (or truncates) `path` for writing.
    public init(path: String, limit: Int = CaptureFile.defaultLimit) throws(CaptureError) {
        // Not truncated at open: an existing file is checked first.
        let fd = retryingOnInterrupt { open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600) }
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
        if st.st_mode & S_IFMT == S_IFREG {
            guard st.st_uid == geteuid(), st.st_nlink == 1 else {
                _ = Glibc.close(fd)
                throw CaptureError("\(path) belongs to another user or has other names (hard links); not written")
            }
            guard ftruncate(fd, 0) == 0, st.st_mode & 0o077 == 0 || fchmod(fd, 0o600) == 0 else {
                let e = errno
                _ = Glibc.close(fd)
                throw CaptureError("\(path): \(String(cString: strerror(e)))")
            }
        }
        self.path = path
        self.limit = max(0, limit)
        descriptor = fd
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
