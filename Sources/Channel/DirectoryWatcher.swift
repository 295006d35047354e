import CSystem
import Glibc

/// inotify(7) on an event loop: the directories it is given are watched, and every change of a
/// name in one of them (created, deleted, moved, written, its attributes changed) is reported.
/// For waiting on a device node or a configuration file without polling. A directory that
/// does not exist cannot be watched; the caller watches its nearest existing ancestor instead
/// (`nearestExistingDirectory`) and asks again after each change.
public final class DirectoryWatcher {
    /// What to be told of in a directory.
    public enum Interest: Sendable {
        /// Names created, deleted or moved (a device node or link appearing and going).
        case names
        /// Those, and files written or their attributes changed (a configuration directory).
        case contents

        var mask: UInt32 {
            let names = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
            return self == .names ? names : names | UInt32(IN_CLOSE_WRITE | IN_ATTRIB)
        }
    }

    /// A change: the directory, the name in it (empty: the directory itself was deleted or
    /// moved, or the kernel's queue overflowed and anything may have changed), and whether the
    /// name appeared (created or moved in).
    public struct Change: Sendable, Equatable {
        public var directory: String
        public var name: String
        public var appeared: Bool
    }

    public let loop: EventLoop
    private let descriptor: FileDescriptor
    private var watches: [String: Int32] = [:]
    private var interests: [String: Interest] = [:]
    /// Two paths to one directory (a link among its ancestors) share the kernel's watch.
    private var directories: [Int32: Set<String>] = [:]
    public var onChange: (Change) -> Void = { _ in }
    /// Times the kernel's event queue overflowed (each reported as a change of everything).
    public private(set) var overflows = 0
    /// Events read per wake-up before the loop serves the others (the rest stay queued).
    static let eventsPerTurn = 256

    public init(loop: EventLoop) throws(SystemError) {
        self.loop = loop
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { throw SystemError("inotify_init1") }
        descriptor = FileDescriptor(fd)
        do throws(SystemError) {
            try loop.register(descriptor, events: EPOLLIN.rawValue) { [weak self] _ in self?.readEvents() }
        } catch {
            Glibc.close(fd)
            throw error
        }
    }

    deinit {
        loop.unregister(descriptor)
        descriptor.close()
    }

    public var watched: Set<String> { Set(watches.keys) }

    /// Watches exactly `wanted`, each for its interest: new directories are added, the others
    /// dropped. Returns those that could not be watched, with the system's error.
    @discardableResult
    public func watch(exactly wanted: [String: Interest]) -> [String: SystemError] {
        for (path, wd) in watches where wanted[path] == nil {
            watches[path] = nil
            interests[path] = nil
            directories[wd]?.remove(path)
            if directories[wd]?.isEmpty == true {
                directories[wd] = nil
                inotify_rm_watch(descriptor.rawValue, wd)
            }
        }
        var failures: [String: SystemError] = [:]
        for (path, interest) in wanted {
            // Already watched for that: nothing to ask the kernel.
            if watches[path] != nil && interests[path] == interest { continue }
            // Added to the watch's mask, not in place of it: two spellings of one directory (a
            // link on the way) share the kernel's watch, and neither may take the other's events.
            let wd = inotify_add_watch(descriptor.rawValue, path, interest.mask | UInt32(IN_MASK_ADD))
            guard wd >= 0 else {
                failures[path] = SystemError("watch \(path)")
                interests[path] = nil
                if let old = watches.removeValue(forKey: path) { directories[old]?.remove(path) }
                continue
            }
            watches[path] = wd
            interests[path] = interest
            directories[wd, default: []].insert(path)
        }
        return failures
    }

    /// The directory to watch to learn when `path` appears: its parent when that exists, else
    /// the nearest ancestor that does ("/" at worst; `path` is absolute).
    public static func nearestExistingDirectory(of path: String) -> String {
        var directory = parent(of: path)
        var st = stat()
        while directory != "/" && directory != "." {
            if stat(directory, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR { return directory }
            directory = parent(of: directory)
        }
        return directory
    }

    public static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let p = String(path[..<slash])
        return p.isEmpty ? "/" : p
    }

    /// The name in `directory` that leads to `path` (its next component), if `path` is below it.
    public static func component(of path: String, in directory: String) -> String? {
        let prefix = directory == "/" ? "/" : directory + "/"
        guard path.hasPrefix(prefix) else { return nil }
        return path.dropFirst(prefix.count).split(separator: "/").first.map(String.init)
    }

    private func readEvents() {
        var buffer = [UInt8](repeating: 0, count: 16_384)
        var handled = 0
        while handled < DirectoryWatcher.eventsPerTurn {
            let n = buffer.withUnsafeMutableBytes { b in retryingOnInterrupt { Glibc.read(descriptor.rawValue, b.baseAddress, b.count) } }
            guard n > 0 else { return }
            var changes: [Change] = []
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
                let name = String(decoding: buffer[(offset + 16)..<end].prefix { $0 != 0 }, as: UTF8.self)
                handled += 1
                if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                    overflows += 1
                    for d in watches.keys { changes.append(Change(directory: d, name: "", appeared: false)) }
                } else if let paths = directories[wd] {
                    let selfChanged = mask & UInt32(IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED) != 0
                    if selfChanged {
                        // The directory is gone, moved away or unwatched: forget the watch, so
                        // the next `watch(exactly:)` asks for whatever is at the path now.
                        for d in paths where watches[d] == wd {
                            watches[d] = nil
                            interests[d] = nil
                        }
                        directories[wd] = nil
                        if mask & UInt32(IN_IGNORED) == 0 { inotify_rm_watch(descriptor.rawValue, wd) }
                    }
                    let appeared = mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0
                    for d in paths { changes.append(Change(directory: d, name: selfChanged ? "" : name, appeared: appeared)) }
                }
                offset = end
            }
            for c in changes { onChange(c) }
        }
        // More may be queued: the descriptor stays readable and the loop comes back for them
        // after serving the others.
    }
}
