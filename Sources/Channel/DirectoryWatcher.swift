import CSystem
import Glibc

/// inotify(7) on an event loop: the directories it is given are watched, and every change of a
/// name in one of them (created, deleted, moved, written, its attributes changed) is reported.
/// For waiting on a device node or a configuration file without polling. A directory that
/// does not exist cannot be watched; the caller watches its nearest existing ancestor instead
/// (`nearestExistingDirectory`) and asks again after each change.
public final class DirectoryWatcher {
    public let loop: EventLoop
    private let descriptor: Int32
    private var watches: [String: Int32] = [:]
    private var directories: [Int32: String] = [:]
    /// A directory and a name in it that changed; an empty name: the directory itself (it was
    /// deleted or moved, or the kernel's queue overflowed and everything must be looked at).
    public var onChange: (_ directory: String, _ name: String) -> Void = { _, _ in }
    /// Times the kernel's event queue overflowed (each reported as a change of everything).
    public private(set) var overflows = 0

    static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)

    public init(loop: EventLoop) throws(SystemError) {
        self.loop = loop
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { throw SystemError("inotify_init1") }
        descriptor = fd
        do throws(SystemError) {
            try loop.register(fd, events: EPOLLIN.rawValue) { [weak self] _ in self?.readEvents() }
        } catch {
            Glibc.close(fd)
            throw error
        }
    }

    deinit {
        loop.unregister(descriptor)
        Glibc.close(descriptor)
    }

    public var watched: Set<String> { Set(watches.keys) }

    /// Watches exactly `wanted`: new directories are added, the others dropped. Returns those
    /// that could not be watched, with the system's words.
    @discardableResult
    public func watch(exactly wanted: Set<String>) -> [String: String] {
        for (path, wd) in watches where !wanted.contains(path) {
            inotify_rm_watch(descriptor, wd)
            watches[path] = nil
            directories[wd] = nil
        }
        var failures: [String: String] = [:]
        for path in wanted where watches[path] == nil {
            let wd = inotify_add_watch(descriptor, path, DirectoryWatcher.mask)
            guard wd >= 0 else {
                failures[path] = String(cString: strerror(errno))
                continue
            }
            watches[path] = wd
            directories[wd] = path
        }
        return failures
    }

    /// The directory to watch to learn when `path` appears: its parent when that exists, else
    /// the nearest ancestor that does ("/" at worst).
    public static func nearestExistingDirectory(of path: String) -> String {
        var directory = parent(of: path)
        var st = stat()
        while directory != "/" {
            if stat(directory, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR { return directory }
            directory = parent(of: directory)
        }
        return "/"
    }

    public static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let p = String(path[..<slash])
        return p.isEmpty ? "/" : p
    }

    private func readEvents() {
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let n = buffer.withUnsafeMutableBytes { b in retryingOnInterrupt { Glibc.read(descriptor, b.baseAddress, b.count) } }
            guard n > 0 else { return }
            var changes: [(String, String)] = []
            // struct inotify_event: wd, mask, cookie, len (4 bytes each), then len bytes of a
            // NUL-padded name. Read with bounds checks: the lengths come from the buffer.
            var offset = 0
            while offset + 16 <= n {
                func word(_ at: Int) -> UInt32 {
                    buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset + at, as: UInt32.self) }
                }
                let wd = Int32(bitPattern: word(0)), mask = word(4), length = Int(word(12))
                let end = offset + 16 + length
                guard end <= n else { break }
                let nameBytes = buffer[(offset + 16)..<end].prefix { $0 != 0 }
                let name = String(decoding: nameBytes, as: UTF8.self)
                if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                    overflows += 1
                    for d in watches.keys { changes.append((d, "")) }
                } else if let directory = directories[wd] {
                    if mask & UInt32(IN_IGNORED) != 0 {
                        // The directory is gone (or unwatched): forget the watch.
                        if watches[directory] == wd { watches[directory] = nil }
                        directories[wd] = nil
                        changes.append((directory, ""))
                    } else {
                        changes.append((directory, mask & UInt32(IN_DELETE_SELF | IN_MOVE_SELF) != 0 ? "" : name))
                    }
                }
                offset = end
            }
            for (d, name) in changes { onChange(d, name) }
        }
    }
}
