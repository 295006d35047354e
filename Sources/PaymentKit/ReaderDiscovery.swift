import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// The lines this machine offers, standing in for the radio: every character device matching a
/// pattern (`/dev/ttyUSB*`, `/tmp/pppbridge-readers/*`), with the advertisement a terminal wrote beside its line
/// (`LINE.advert`, SPEC §4.5's JSON record) or, without one, as a wired reader.
public enum ReaderLines {
    /// The default pattern: where `pppbridge terminal` links its ptys.
    public static let defaultPattern = "/tmp/pppbridge-readers/*"

    /// What the lines matching `pattern` advertise now. Throws `bluetoothDisabled` when the
    /// pattern's directory does not exist (no "radio" to scan with).
    public static func scan(_ pattern: String) throws(PaymentError) -> [DiscoveredReader] {
        let directory = pattern.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        if !directory.isEmpty && access(directory, F_OK) != 0 {
            throw PaymentError(.bluetoothDisabled, "no lines to scan: \(directory) does not exist")
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
        guard let f = fopen(temporary, "wb") else { return }
        let bytes = reader.advert.serialized + [0x0A]
        _ = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, f) }
        fclose(f)
        rename(temporary, target)
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

/// The host's bonds with paired readers: peripheral UUID → 16-byte link key. In memory, or
/// also in a directory (one file per reader, mode 0600) so bonds outlive the process.
public final class BondStore: @unchecked Sendable {
    public let directory: String?
    private var keys: [String: [UInt8]] = [:]
    private let lock = PThreadLock()

    public init(directory: String? = nil) {
        self.directory = directory
        if let directory { mkdir(directory, 0o700) }
    }

    public func key(for uuid: String) -> [UInt8]? {
        lock.locked {
            if let k = keys[uuid.uppercased()] { return k }
            guard let directory, let bytes = ReaderLines.readFile(directory + "/" + uuid.uppercased() + ".bond"),
                  let k = Hex.decode(String(decoding: bytes.prefix(32), as: UTF8.self)), k.count == 16 else { return nil }
            keys[uuid.uppercased()] = k
            return k
        }
    }

    public func store(_ key: [UInt8], for uuid: String) {
        lock.locked {
            keys[uuid.uppercased()] = key
            guard let directory else { return }
            let path = directory + "/" + uuid.uppercased() + ".bond"
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return }
            let text = Array((Hex.encode(key) + "\n").utf8)
            _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            close(fd)
        }
    }

    public func remove(_ uuid: String) {
        lock.locked {
            keys[uuid.uppercased()] = nil
            if let directory { unlink(directory + "/" + uuid.uppercased() + ".bond") }
        }
    }
}

/// A mutex without Foundation.
final class PThreadLock: @unchecked Sendable {
    private var m = pthread_mutex_t()
    init() { pthread_mutex_init(&m, nil) }
    deinit { pthread_mutex_destroy(&m) }
    func locked<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(&m)
        defer { pthread_mutex_unlock(&m) }
        return body()
    }
}
