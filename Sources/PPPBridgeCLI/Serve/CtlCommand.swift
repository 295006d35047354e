import Channel
import Service
import Foundation
import Glibc
import Payment

/// `pppbridge ctl`: the command-line client of `serve`'s control socket. Prints each reply (and
/// with `events`, each event) as the JSON line the service sent.
struct CtlCommand {
    var output: (String) -> Void
    var error: (String) -> Void
    var environment: [String: String] = ProcessInfo.processInfo.environment

    static let usage = """
    usage: pppbridge ctl [--control PATH] [--timeout S] COMMAND

    Talks to a running `pppbridge serve` through its control socket (default
    $XDG_RUNTIME_DIR/pppbridge/control when it exists, else /run/pppbridge/control) and prints
    its JSON reply. It gives up after S seconds (default 5) without a reply (`events`: without
    its first), and talks only to a service that runs as this user, as root, or as the owner
    of the socket and of its directory.

      list                         every terminal: state, addresses, bridges
      status NAME                  one terminal with its counters
      add-bridge NAME SPEC         SPEC is host:PORT, local:PORT or terminal:PORT; the reply's
                                   code is ICPPP's (-1 no more bridges, -2 exists, -3 not open,
                                   -4 could not listen)
      remove-bridge NAME SPEC
      set-keepalive NAME I,V,C     the proxy's keep-alive: idle and interval seconds, probes
      open NAME | close NAME       keep the link up, or close it and keep it closed
      reload                       read the configuration directory again
      events                       print events as they happen (opened, closed, waiting,
                                   connection-opened/-closed, ...) until interrupted

    Exit status: 0 the reply said ok; 1 it did not, or the service could not be reached; 2 usage.
    """

    func run(_ arguments: [String]) -> Int32 {
        var args = arguments
        var path: String?
        if args.first == "-h" || args.first == "--help" {
            output(CtlCommand.usage)
            return CommandLineTool.Status.success
        }
        var timeout = Duration.seconds(5)
        while args.first == "--control" || args.first == "--timeout" {
            guard args.count >= 2 else {
                error("pppbridge ctl: \(args[0]) needs a value")
                return CommandLineTool.Status.usage
            }
            if args[0] == "--control" {
                path = args[1]
            } else {
                guard let s = Double(args[1]), s > 0, s <= 3_600 else {
                    error("pppbridge ctl: --timeout takes seconds, more than 0 and at most 3600")
                    return CommandLineTool.Status.usage
                }
                timeout = .milliseconds(Int64(s * 1_000))
            }
            args.removeFirst(2)
        }
        guard let request = CtlCommand.request(args) else {
            error("pppbridge ctl: expected list | status NAME | add-bridge NAME SPEC | remove-bridge NAME SPEC | set-keepalive NAME I,V,C | open NAME | close NAME | reload | events (see `pppbridge ctl --help`)")
            return CommandLineTool.Status.usage
        }
        let socketPath = path ?? CtlCommand.defaultControlPath(environment: environment)
        let fd: FileDescriptor
        do { fd = try UnixSocket.connectToService(socketPath, timeout: timeout) } catch let e {
            let hint = e.errno == .wouldBlock ? " (no answer within the timeout)" : e.errno == .notPermitted ? "" : " (is `pppbridge serve` running?)"
            error("pppbridge ctl: \(e)" + hint)
            return 1
        }
        defer { fd.close() }
        guard CtlCommand.write(fd, Array((request.line + "\n").utf8)) else {
            error("pppbridge ctl: \(socketPath): \(String(cString: strerror(errno)))")
            return 1
        }
        var reader = LineAssembler(limit: 16 << 20)
        let streaming = args.first == "events"
        var first = true
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd.rawValue, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                // A stream of events may be quiet for as long as it likes once it is answered.
                if !first && streaming { continue }
                error("pppbridge ctl: \(socketPath): no reply within \(timeout)")
                return 1
            }
            guard n > 0 else {
                if first { error("pppbridge ctl: the service closed the connection without a reply") }
                return first ? 1 : 0
            }
            for piece in reader.feed(Array(buffer[..<n])) {
                guard case let .line(line) = piece else { continue }
                output(String(decoding: line, as: UTF8.self))
                if first {
                    first = false
                    let ok = (try? JSONParser.parse(line))?["ok"]?.bool == true
                    if !streaming || !ok { return ok ? 0 : 1 }
                }
            }
        }
    }

    /// The user's own service's socket when there is one, else the system service's (which the
    /// caller reaches as a member of its group). Nothing is created or checked here: the
    /// socket's mode decides.
    static func defaultControlPath(environment: [String: String]) -> String {
        if let x = environment["XDG_RUNTIME_DIR"], !x.isEmpty {
            var st = stat()
            let own = x + "/pppbridge/control"
            if lstat(own, &st) == 0 { return own }
        }
        return "/run/pppbridge/control"
    }

    /// The request for the command line's words; nil when they are not a command (the
    /// service's own decoder decides, so ctl refuses exactly what the service would).
    static func request(_ words: [String]) -> ControlRequest? {
        var object: [String: Any]
        switch (words.first, words.count) {
        case ("list", 1), ("reload", 1): object = ["cmd": words[0]]
        case ("events", 1): object = ["cmd": "subscribe"]
        case ("status", 2), ("open", 2), ("close", 2): object = ["cmd": words[0], "terminal": words[1]]
        case ("add-bridge", 3), ("remove-bridge", 3): object = ["cmd": words[0], "terminal": words[1], "bridge": words[2]]
        case ("set-keepalive", 3):
            let parts = words[2].split(separator: ",", omittingEmptySubsequences: false)
            let n = parts.compactMap { decimal($0, as: Int.self) }
            guard parts.count == 3, n.count == 3 else { return nil }
            object = ["cmd": "set-keepalive", "terminal": words[1], "idle": n[0], "interval": n[1], "count": n[2]]
        default: return nil
        }
        guard let data = try? JSONSerialization.data(withJSONObject: object) else { return nil }
        return try? ControlRequest.decode(Array(data)).get()
    }

    static func write(_ fd: FileDescriptor, _ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(fd.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            sent += n
        }
        return true
    }
}
