import Foundation
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

// Under journald each line carries its priority (see `JournalStream`).
let environment = ProcessInfo.processInfo.environment
let outputToJournal = JournalStream.isJournal(STDOUT_FILENO, environment: environment)
let errorsToJournal = JournalStream.isJournal(STDERR_FILENO, environment: environment)

/// Writes what a command says to `descriptor`, each line with its priority when it is the journal.
func writer(_ descriptor: Int32, journal: Bool) -> (String) -> Void {
    { text in
        guard journal else { return writeLine(text, to: descriptor) }
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            writeLine(JournalStream.prefixed(String(line), standardError: descriptor == STDERR_FILENO), to: descriptor)
        }
    }
}

// Written line by line: a program reading our output through a pipe sees events as they happen.
let tool = CommandLineTool(standardOutput: writer(STDOUT_FILENO, journal: outputToJournal),
                           standardError: writer(STDERR_FILENO, journal: errorsToJournal))
exit(tool.run(Array(CommandLine.arguments.dropFirst())))
