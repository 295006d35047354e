import Glibc

/// Secrets from a file or the environment, so that they need not be on the command line, where
/// every local user can read them (/proc/PID/cmdline, ps).
public enum SecretSource {
    /// The password `--user` authenticates with, when neither --password nor --password-file is given.
    public static let passwordVariable = "PPPBRIDGE_PASSWORD"
    /// A secrets file is a few lines; anything larger is not one.
    public static let maximumFileSize = 64 * 1024

    /// What a secrets file holds, and a warning for a person when others may read it.
    public struct FileText: Equatable {
        public var text: String
        public var warning: String?
    }

    /// The UTF-8 text of `path` without its trailing newline ("\n" or "\r\n"). A pipe or FIFO is
    /// read too (`--password-file <(pass show terminal)`); a regular file readable by group or
    /// others is read with a warning, not refused.
    public static func read(_ path: String) -> Result<FileText, SecretError> {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { return .failure(SecretError("\(path): \(String(cString: strerror(errno)))")) }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return .failure(SecretError("\(path): \(String(cString: strerror(errno)))")) }
        guard st.st_mode & S_IFMT != S_IFDIR else { return .failure(SecretError("\(path): is a directory")) }
        var warning: String?
        if st.st_mode & S_IFMT == S_IFREG && st.st_mode & 0o044 != 0 {
            warning = "\(path) can be read by group or others (mode 0\(String(st.st_mode & 0o777, radix: 8))); chmod 600 keeps the secret yours"
        }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { return .failure(SecretError("\(path): \(String(cString: strerror(errno)))")) }
            if n == 0 { break }
            bytes += buffer[0..<n]
            guard bytes.count <= maximumFileSize else {
                return .failure(SecretError("\(path): larger than \(maximumFileSize) bytes, not a secrets file"))
            }
        }
        if bytes.last == 0x0A {
            bytes.removeLast()
            if bytes.last == 0x0D { bytes.removeLast() }
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            return .failure(SecretError("\(path): not UTF-8 text"))
        }
        return .success(FileText(text: text, warning: warning))
    }

    /// `NAME:SECRET` lines, as `--peer` and `--socks-user` take them one at a time; blank lines
    /// are skipped. The secret is everything after the first colon.
    public static func pairs(_ text: String, path: String) -> Result<[(name: String, secret: String)], SecretError> {
        var out: [(name: String, secret: String)] = []
        // "\r\n" is one Character in Swift, so both line ends are named.
        for (number, entry) in text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" }).enumerated() {
            if entry.isEmpty { continue }
            guard let colon = entry.firstIndex(of: ":") else {
                return .failure(SecretError("\(path): line \(number + 1) is not NAME:SECRET"))
            }
            out.append((String(entry[..<colon]), String(entry[entry.index(after: colon)...])))
        }
        return .success(out)
    }
}

public struct SecretError: Error, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
