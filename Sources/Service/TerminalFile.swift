import Capture
import Channel
import RemoteSerial
import Foundation
import Glibc
import NetStack

/// One terminal's configuration file in `serve`'s directory (`NAME.conf`), in pppd's options-file
/// style: each line is one of `run`'s long options without its dashes and its values
/// (`device /dev/ttyACM0`, `bridge host:5000`), `#` starts a comment. Parsed with `run`'s own
/// parser, so the checks and their messages are the same; each message says the file and line.
public struct TerminalFile {
    /// Terminals per `serve` (each file is one; the directory is the administrator's, but a
    /// runaway script filling it must not exhaust the process's descriptors). 4,096: the
    /// kernel's default number of ptys, and a line, a listener and a few clients each fit the
    /// unit's descriptor limit (65,536).
    static let maximumTerminals = 4_096
    /// A configuration file is a few lines; one larger than this is refused unread.
    static let maximumSize = 65_536
    static let suffix = ".conf"
    /// Errors reported per file (a file of junk is not thousands of lines of log).
    static let maximumErrors = 20
    /// Options whose value is a file `serve` reads or writes: refused unless a regular file (or,
    /// for captures, a path not there yet), so a FIFO cannot hold the loop in open(2) or read(2).
    static let fileOptions = ["password-file", "peer-file", "socks-user-file", "pcap", "record"]

    let name: String
    let path: String
    /// The file's bytes, to tell a changed file from one only touched.
    let contents: [UInt8]
    let options: RunOptions
    /// pppd's `holdoff`: seconds from a link's end to the next open.
    let holdoff: Int
    /// pppd's `maxfail`: failed opens in a row before the terminal is left closed (0: never).
    let maxfail: Int

    var device: String { options.device ?? "" }

    /// Why a file was not taken, one message a line.
    struct FileErrors: Error {
        var messages: [String]
        init(messages: [String]) { self.messages = messages }
        init(_ message: String) { messages = [message] }
    }

    public struct Defaults {
        public var holdoff = 5
        public var maxfail = 10
        public init() {}
    }

    /// `run` options that have no place in `serve`, and why.
    static let refused: [String: String] = [
        "pty": "serve attaches to devices (give `device PATH`)",
        "link": "serve attaches to devices (give `device PATH`)",
        "tun": "serve runs every terminal on its own stack",
        "persist": "serve always reopens a link that went down (see holdoff and maxfail)",
        "status-json": "the control socket's `status` gives the same",
        "ping": "serve does not ping", "ping-count": "serve does not ping",
        "rearm": "serve adds the bridges each time the link opens",
        "help": "not an option", "h": "not an option",
    ]

    /// The terminal's name from a file name (`NAME.conf`); nil for other files, hidden ones and
    /// names that are not letters, digits, `-`, `_` and `.` (names reach JSON, metrics labels
    /// and log lines).
    static func terminalName(fileName: String) -> String? {
        guard fileName.hasSuffix(suffix), !fileName.hasPrefix(".") else { return nil }
        let name = String(fileName.dropLast(suffix.count))
        guard (1...64).contains(name.utf8.count),
              name.utf8.allSatisfy({ $0 < 0x80 && (isalnum(Int32($0)) != 0 || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".")) })
        else { return nil }
        return name
    }

    /// Parses `text` (the file at `path`); the errors, each `PATH:LINE: message`, when it does
    /// not describe a terminal.
    static func parse(_ contents: [UInt8], name: String, path: String, defaults: Defaults,
                      environment: [String: String]) -> Result<TerminalFile, FileErrors> {
        var options = RunOptions()
        var holdoff = defaults.holdoff, maxfail = defaults.maxfail
        var errors: [String] = []
        let text = String(decoding: contents, as: UTF8.self)
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let origin = "\(path):\(index + 1)"
            let line = rawLine.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" }).map(String.init)
            guard let option = words.first else { continue }
            let complain: (String) -> Void = { errors.append("\(origin): " + TerminalFile.printable($0)) }
            if let why = refused[option] {
                complain("\(option): not for serve: \(why)")
                continue
            }
            var values = ArgumentCursor(Array(words.dropFirst()))
            if fileOptions.contains(option), let file = words.dropFirst().first {
                var st = stat()
                let exists = stat(file, &st) == 0
                if exists && st.st_mode & S_IFMT != S_IFREG {
                    complain("\(option): \(file) is not a regular file")
                    continue
                }
                // A capture that would not be written is the file's error, said once, not a
                // line that fails at every open.
                if let refusal = option == "pcap" ? CaptureFile.refusal(toReplace: file, .pcap)
                    : option == "record" ? CaptureFile.refusal(toReplace: file, .pppdRecord) : nil {
                    complain("\(option): \(refusal)")
                    continue
                }
            }
            switch option {
            case "holdoff", "maxfail":
                guard let v = values.next(), let n = decimal(v, as: Int.self), (0...86_400).contains(n) else {
                    complain("\(option) takes a number of \(option == "holdoff" ? "seconds" : "attempts"), 0–86400")
                    continue
                }
                if option == "holdoff" { holdoff = n } else { maxfail = n }
            default:
                guard options.take("--" + option, from: &values, complain: complain) else { continue }
            }
            if let extra = values.next() { complain("\(option): unexpected '\(extra)' after its value") }
        }
        if errors.count > maximumErrors {
            let more = errors.count - maximumErrors
            errors = Array(errors.prefix(maximumErrors)) + ["\(path): \(more) more errors"]
        }
        if errors.isEmpty {
            if options.device == nil {
                errors.append("\(path): no `device PATH` line")
            } else if options.device?.hasPrefix("/") != true && !RemoteLineAddress.isNetworkName(options.device ?? "") {
                errors.append("\(path): the device must be an absolute path, tcp:HOST:PORT or rfc2217:HOST:PORT, not '\(printable(options.device ?? ""))'")
            } else if !options.validate(environment: environment, complain: { errors.append("\(path): " + TerminalFile.printable($0)) }) {
                // said
            }
        }
        guard errors.isEmpty else { return .failure(FileErrors(messages: errors)) }
        return .success(TerminalFile(name: name, path: path, contents: contents, options: options, holdoff: holdoff, maxfail: maxfail))
    }

    /// `text` with control characters written as \xNN (a file's bytes reach the log and the
    /// control socket's clients; what the options say is kept as it is otherwise).
    static func printable(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F || (0x80..<0xA0).contains(scalar.value) {
                out += "\\x" + String(scalar.value, radix: 16, uppercase: true).leftPadded(to: 2)
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// Reads the file at `path` (not through a symbolic link to elsewhere than a regular file,
    /// and at most `maximumSize` bytes).
    static func read(_ path: String) -> Result<[UInt8], FileErrors> {
        // Not followed: a link could lead to any file the service may read, and the errors
        // about a file's lines quote its words.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard fd >= 0 else {
            if errno == ELOOP { return .failure(FileErrors("\(path): a symbolic link, refused (a configuration file must be a regular file)")) }
            return .failure(FileErrors("\(path): \(String(cString: strerror(errno)))"))
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { return .failure(FileErrors("\(path): not a regular file, refused")) }
        // What a file says runs with the service's rights: only its own user or root may say it.
        guard st.st_uid == geteuid() || st.st_uid == 0 else {
            return .failure(FileErrors("\(path): owned by user \(st.st_uid), not by the service's user (\(geteuid())) or root, refused"))
        }
        // Nor anyone else: the control socket's group may drive the service, not say what it runs.
        guard st.st_mode & 0o022 == 0 else { return .failure(FileErrors("\(path): writable by group or others, refused")) }
        guard st.st_size <= maximumSize else { return .failure(FileErrors("\(path): larger than \(maximumSize) bytes")) }
        var bytes = [UInt8](repeating: 0, count: maximumSize + 1)
        var total = 0
        while total < bytes.count {
            let n = bytes[total...].withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { return .failure(FileErrors("\(path): \(String(cString: strerror(errno)))")) }
            if n == 0 { break }
            total += n
        }
        guard total <= maximumSize else { return .failure(FileErrors("\(path): larger than \(maximumSize) bytes")) }
        return .success(Array(bytes[..<total]))
    }
}

private extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
