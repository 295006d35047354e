import Glibc

/// journald's stream protocol: a service whose output goes to the journal (`JOURNAL_STREAM`
/// names that stream's device and inode) may begin each line with `<N>`, its syslog priority,
/// so errors are told from information in `journalctl -p`. Checked per descriptor: output
/// redirected elsewhere (a file, a pipe) keeps its lines as they are.
public enum JournalStream {
    public static let info = 6
    public static let warning = 4
    public static let error = 3

    /// True when `descriptor` is the stream `JOURNAL_STREAM` names ("DEVICE:INODE").
    public static func isJournal(_ descriptor: Int32, environment: [String: String]) -> Bool {
        guard let value = environment["JOURNAL_STREAM"] else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(descriptor, &st) == 0 else { return false }
        return UInt64(st.st_dev) == device && UInt64(st.st_ino) == inode
    }

    /// `line` with its priority prefix: errors unless the line says it is a warning.
    public static func prefixed(_ line: String, standardError: Bool) -> String {
        let priority = !standardError ? info : (line.contains("warning:") ? warning : error)
        return "<\(priority)>" + line
    }
}
