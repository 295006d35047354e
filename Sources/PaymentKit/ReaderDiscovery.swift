import Channel
import Crypto
import Glibc
import NetStack
import Payment
import Synchronization

/// The lines this machine offers, standing in for the radio: every character device matching a
/// pattern (`/dev/ttyUSB*`, `/tmp/pppbridge-readers/*`), with the advertisement a terminal wrote beside its line
/// (`LINE.advert`, SPEC §4.5's JSON record) or, without one, as a wired reader.
public enum ReaderLines {
    /// Where `pppbridge terminal` links its ptys by default: the user's runtime directory
    /// (`$XDG_RUNTIME_DIR/pppbridge-readers`), else a directory of this user's own in /tmp.
    public static let defaultDirectory: String = {
        if let runtime = getenv("XDG_RUNTIME_DIR").map({ String(cString: $0) }), !runtime.isEmpty { return runtime + "/pppbridge-readers" }
        return "/tmp/pppbridge-readers-\(getuid())"
    }()

    /// The default pattern: every line in the default directory.
    public static var defaultPattern: String { defaultDirectory + "/*" }

    /// Makes the default directory (mode 0700) when it is missing.
    public static func makeDefaultDirectory() {
        mkdir(defaultDirectory, 0o700)
    }

    /// What the lines matching `pattern` advertise now. Throws `bluetoothDisabled` when the
    /// pattern's directory does not exist (no "radio" to scan with).
    public static func scan(_ pattern: String) throws(PaymentError) -> [DiscoveredReader] {
        // A pattern without a directory scans the working one, which must pass the same checks.
        let parts = pattern.split(separator: "/", omittingEmptySubsequences: false).dropLast()
        let directory = parts.isEmpty ? "." : (parts.joined(separator: "/").isEmpty ? "/" : parts.joined(separator: "/"))
        if !directory.isEmpty && access(directory, F_OK) != 0 {
            throw PaymentError(.bluetoothDisabled, "no lines to scan: \(directory) does not exist")
        }
        // Lines and advertisements someone else could plant are not believed: the directory
        // must be ours (or root's, as /dev is: root can stand in for us anyway) and writable by
        // nobody else, group included. A sticky bit does not help: it stops others deleting our
        // entries, not adding their own (a line named like a reader, its advertisement).
        var st = stat()
        if !directory.isEmpty {
            // A directory that cannot be looked at (a pattern with wildcards in it) is not trusted.
            guard stat(directory, &st) == 0 else {
                throw PaymentError(.bluetoothDisabled, "\(directory) cannot be checked: give a pattern whose directory is a plain path")
            }
            let foreign = st.st_uid != getuid() && st.st_uid != 0
            let writableByOthers = st.st_mode & UInt32(S_IWOTH | S_IWGRP) != 0
            guard !foreign && !writableByOthers else {
                throw PaymentError(.bluetoothDisabled, "\(directory) is not this user's (or is writable by others): its lines are not trusted")
            }
        }
        var g = glob_t()
        defer { globfree(&g) }
        guard glob(pattern, 0, nil, &g) == 0 else { return [] }
        var out: [DiscoveredReader] = []
        for i in 0..<Int(g.gl_pathc) {
            guard let p = g.gl_pathv[i] else { continue }
            let path = String(cString: p)
            if path.hasSuffix(".advert") || path.hasSuffix(".tmp") { continue }
            // Only lines (character devices: serial ports, ptys, or links to them); a link whose
            // pty is gone (a terminal that is off) is not on the air.
            var st = stat()
            guard stat(path, &st) == 0, st.st_mode & S_IFMT == S_IFCHR, access(path, R_OK | W_OK) == 0 else { continue }
            out.append(advert(at: path) ?? .wired(path: path))
        }
        return out
    }

    /// The advertisement beside the line at `path`, if there is a readable one.
    public static func advert(at path: String) -> DiscoveredReader? {
        guard let bytes = readFile(path + ".advert"), let json = try? JSONParser.parse(bytes) else { return nil }
        return DiscoveredReader(advert: json, path: path)
    }

    /// Publishes `reader`'s advertisement beside its line (atomically: write, then rename).
    public static func publish(_ reader: DiscoveredReader) {
        let target = reader.path + ".advert", temporary = reader.path + ".advert.tmp"
        unlink(temporary)
        // Never through a link someone put there.
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        let bytes = reader.advert.serialized + [0x0A]
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        if written == bytes.count { rename(temporary, target) } else { unlink(temporary) }
    }

    public static func withdraw(path: String) { unlink(path + ".advert") }

    static func readFile(_ path: String, limit: Int = 65_536) -> [UInt8]? {
        guard let f = fopen(path, "rb") else { return nil }
        defer { fclose(f) }
        var out = [UInt8](repeating: 0, count: limit)
        let n = fread(&out, 1, limit, f)
        return n > 0 ? Array(out[0..<n]) : nil
    }
}

/// The host's bonds with paired readers: peripheral UUID → 16-byte link key, and the host's
/// own identity (a random ID the readers know it by). In memory, or also in a directory (one
/// 0600 file per reader, and `host-id`) so bonds outlive the process.
public final class BondStore: Sendable {
    public let directory: String?
    public let hostID: String
    private let keys = Mutex<[String: [UInt8]]>([:])

    public init(directory: String? = nil) {
        self.directory = directory
        if let directory {
            mkdir(directory, 0o700)
            if let bytes = ReaderLines.readFile(directory + "/host-id"), let id = Hex.decode(String(decoding: bytes.prefix(32), as: UTF8.self)), id.count == 16 {
                hostID = Hex.encode(id)
                return
            }
        }
        hostID = Hex.encode((try? SecureBytes.random(16)) ?? [])
        if let directory { BondStore.write(directory + "/host-id", hostID) }
    }

    public func key(for uuid: String) -> [UInt8]? {
        keys.withLock { keys in
            if let k = keys[uuid.uppercased()] { return k }
            guard let directory, let bytes = ReaderLines.readFile(directory + "/" + uuid.uppercased() + ".bond"),
                  let k = Hex.decode(String(decoding: bytes.prefix(32), as: UTF8.self)), k.count == 16 else { return nil }
            keys[uuid.uppercased()] = k
            return k
        }
    }

    public func store(_ key: [UInt8], for uuid: String) {
        keys.withLock { $0[uuid.uppercased()] = key }
        if let directory { BondStore.write(directory + "/" + uuid.uppercased() + ".bond", Hex.encode(key)) }
    }

    public func remove(_ uuid: String) {
        keys.withLock { $0[uuid.uppercased()] = nil }
        if let directory { unlink(directory + "/" + uuid.uppercased() + ".bond") }
    }

    private static func write(_ path: String, _ text: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
