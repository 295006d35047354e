import Glibc
import PPPBridgeCLI

// A reader of our output that goes away (a closed pipe, a FIFO's reader, a pcap's live reader)
// must not end the process and every link in it: with SIGPIPE ignored, the write says EPIPE.
signal(SIGPIPE, SIG_IGN)

/// Writes `text` and a newline to `descriptor` with write(2), retrying on EINTR and finishing
/// short writes. An error (a closed or full output) drops the line: there is nowhere left to
/// report it, and the bridge goes on.
func writeLine(_ text: String, to descriptor: Int32) {
    let bytes = Array((text + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        if n > 0 {
            offset += n
        } else if n < 0 && errno == EINTR {
            continue
        } else {
            return
        }
    }
}

let tool = CommandLineTool(
    // Written line by line: a program reading our output through a pipe sees events as they happen.
    standardOutput: { writeLine($0, to: STDOUT_FILENO) },
    standardError: { writeLine($0, to: STDERR_FILENO) }
)
exit(tool.run(Array(CommandLine.arguments.dropFirst())))
