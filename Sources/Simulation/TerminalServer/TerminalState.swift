import Channel
import Glibc
import Payment
import PaymentKit

/// The terminal simulator's persistent state: its DUKPT initial key, key ID and the KSN counter,
/// in one JSON file of mode 0600. Each counter the gateway sees must be new (it refuses one not
/// above the last as a replay, and a repeated counter would repeat keys and ciphertexts), so the
/// counter is written before a request that used it leaves: a restart, or a crash, goes on
/// from there.
public struct TerminalStateFile {
    let path: String
    /// A state file is a few hundred bytes.
    static let maximumSize = 64 * 1024

    public struct StateError: Error, CustomStringConvertible {
        public var description: String
    }

    /// The security module saved at `path`, or nil when there is no file yet. A file that is
    /// not ours, open to others, or does not parse is an error: the simulator does not start on
    /// keys it cannot trust, nor overwrite them.
    func load() throws(StateError) -> TerminalSecurity? {
        // O_NONBLOCK: a FIFO planted at the path must not hang the start (it is refused below).
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw StateError(description: "\(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw StateError(description: "\(path): not a regular file") }
        guard st.st_uid == getuid() else { throw StateError(description: "\(path): belongs to another user") }
        guard st.st_mode & 0o077 == 0 else {
            throw StateError(description: "\(path): open to group or others (mode 0\(String(st.st_mode & 0o777, radix: 8))); chmod 600 it")
        }
        guard st.st_size <= TerminalStateFile.maximumSize else { throw StateError(description: "\(path): too large for a state file") }
        var bytes = [UInt8](repeating: 0, count: Int(st.st_size))
        var got = 0
        while got < bytes.count {
            let n = bytes[got...].withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            got += n
        }
        guard let json = try? JSONParser.parse(Array(bytes[0..<got])), let security = TerminalSecurity(state: json) else {
            throw StateError(description: "\(path): not a terminal state file")
        }
        return security
    }

    /// Writes `security`'s state: a new file (mode 0600) beside the old, synced, then renamed
    /// over it, so a crash leaves the old state or the new one, never half of one.
    func save(_ security: TerminalSecurity) throws(StateError) {
        let temporary = path + ".tmp"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw StateError(description: "\(temporary): \(String(cString: strerror(errno)))") }
        let bytes = security.state.serialized + [0x0A]
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                let e = String(cString: strerror(errno))
                close(fd)
                unlink(temporary)
                throw StateError(description: "\(temporary): \(e)")
            }
            written += n
        }
        let synced = fsync(fd) == 0
        let syncError = errno
        close(fd)
        guard synced, rename(temporary, path) == 0 else {
            let e = String(cString: strerror(synced ? errno : syncError))
            unlink(temporary)
            throw StateError(description: "\(path): \(e)")
        }
        // The rename itself is durable once the directory is synced.
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropLast()
        let directory = parts.isEmpty ? "." : (parts.joined(separator: "/").isEmpty ? "/" : parts.joined(separator: "/"))
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw StateError(description: "\(directory): \(String(cString: strerror(errno)))") }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw StateError(description: "\(directory): \(String(cString: strerror(errno)))") }
    }

    /// This user's directory for state that outlives a session and a reboot:
    /// `$XDG_STATE_HOME/pppbridge`, else `~/.local/state/pppbridge` (made 0700 when missing).
    public static func defaultDirectory() throws(StateError) -> String {
        let base: String
        // The XDG specification: a relative path there is to be ignored.
        if let x = getenv("XDG_STATE_HOME"), x.pointee == 0x2F {
            base = String(cString: x)
        } else if let h = getenv("HOME"), h.pointee != 0 {
            base = String(cString: h) + "/.local/state"
        } else {
            throw StateError(description: "neither XDG_STATE_HOME nor HOME is set: give --state FILE")
        }
        var path = ""
        for part in (base + "/pppbridge").split(separator: "/") {
            path += "/" + part
            if mkdir(path, 0o700) != 0 && errno != EEXIST { throw StateError(description: "\(path): \(String(cString: strerror(errno)))") }
        }
        var st = stat()
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFDIR, st.st_uid == getuid(), st.st_mode & 0o022 == 0 else {
            throw StateError(description: "\(path) is not a directory of this user's closed to others")
        }
        return path
    }
}
