import Channel
import Service
import Foundation
import Glibc
import NetStack

/// `pppbridge serve`: many terminals in one process on one event loop, configured by a
/// directory of files, driven through a control socket, watched by metrics and the service
/// manager.
struct ServeCommand {
    var output: (String) -> Void
    var error: (String) -> Void
    var environment: [String: String] = ProcessInfo.processInfo.environment

    static let usage = """
    usage: pppbridge serve --config DIR [--control PATH] [--metrics ADDR:PORT] [--holdoff S] [--maxfail N]

    Keeps a PPP link up on every terminal DIR describes, all in one process. DIR holds one
    NAME.conf per terminal: each line one of `run`'s long options without its dashes, with its
    values (`device /dev/serial/by-id/usb-Ingenico...`, `bridge host:5000`, `keepalive 60,10,5`,
    `lcp-echo-interval 5`); `#` starts a comment. `device` is required; pty, link, tun,
    persist, status-json and ping are `run`'s alone. `holdoff S` and `maxfail N` in a file
    override the defaults below for that terminal. Files added, changed or removed take effect
    at once (inotify; SIGHUP or `ctl reload` read DIR again); a bad file is reported and leaves
    the other terminals, and its own running one, alone. NAME is letters, digits, - _ and .
    (at most 64), and at most 4,096 terminals are served.

    A device that is not there is waited for (inotify on its directory, no polling). A link
    that ends is opened again after the holdoff; when its device went away (a USB unplug, a
    pty whose program ended) the terminal waits for it to come back.

      --config DIR           the terminals' configuration files
      --control PATH         the control socket (JSON lines; mode 0660, so its group may drive
                             the service); default $XDG_RUNTIME_DIR/pppbridge/control, else
                             /run/pppbridge/control. `pppbridge ctl` is its client.
      --metrics ADDR:PORT    Prometheus metrics at http://ADDR:PORT/metrics (e.g. 127.0.0.1:9464)
      --holdoff S            pppd's holdoff: seconds between a link ending and the next open
                             (default 5)
      --maxfail N            pppd's maxfail: after N failed opens in a row (links that never
                             reached IPCP) the terminal is left closed until `ctl open`, a change
                             of its file or its device coming back (default 10; 0: never;
                             a device server's line is never left closed)

    Under a service manager (NOTIFY_SOCKET set) it says READY=1 once the control socket
    listens and the configuration is read, STATUS= with the terminals up, WATCHDOG=1 at half
    of WATCHDOG_USEC, STOPPING=1 when it stops. SIGINT and SIGTERM close every link (LCP
    Terminate-Request) and end the process.
    """

    func run(_ arguments: [String]) -> Int32 {
        var configDirectory: String?
        var controlPath: String?
        var metrics: TCPEndpoint?
        var defaults = TerminalFile.Defaults()
        var it = ArgumentCursor(arguments)
        let usageStatus = CommandLineTool.Status.usage
        func value(_ flag: String) -> String? {
            let v = it.next()
            if v == nil { error("pppbridge serve: \(flag) needs a value (see `pppbridge serve --help`)") }
            return v
        }
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(ServeCommand.usage)
                return CommandLineTool.Status.success
            case "--config": guard let v = value(a) else { return usageStatus }; configDirectory = v
            case "--control": guard let v = value(a) else { return usageStatus }; controlPath = v
            case "--metrics":
                guard let v = value(a) else { return usageStatus }
                let parts = v.split(separator: ":")
                guard parts.count == 2, let address = IPv4Address(String(parts[0])), let port = decimal(parts[1], as: UInt16.self) else {
                    error("pppbridge serve: --metrics takes ADDR:PORT, not '\(v)'")
                    return usageStatus
                }
                metrics = TCPEndpoint(address, port)
            case "--holdoff", "--maxfail":
                guard let v = value(a) else { return usageStatus }
                guard let n = decimal(v, as: Int.self), (0...86_400).contains(n) else {
                    error("pppbridge serve: \(a) takes a number, 0–86400")
                    return usageStatus
                }
                if a == "--holdoff" { defaults.holdoff = n } else { defaults.maxfail = n }
            default:
                error("pppbridge serve: unknown option \(a) (see `pppbridge serve --help`)")
                return usageStatus
            }
        }
        guard let configDirectory else {
            error("pppbridge serve: --config DIR is required")
            return usageStatus
        }
        let path: String
        do { path = try controlPath ?? ServeCommand.defaultControlPath(environment: environment) } catch let e {
            error("pppbridge serve: \(e)")
            return RunCommand.Status.openFailed
        }
        return ServiceRunner(directory: configDirectory, controlPath: path, metrics: metrics, defaults: defaults,
                             environment: environment, output: output, error: error).run()
    }

    /// `$XDG_RUNTIME_DIR/pppbridge/control` (a directory of this user's alone), else
    /// `/run/pppbridge/control` (made 0750 when missing, as systemd's RuntimeDirectory= would).
    static func defaultControlPath(environment: [String: String]) throws(SystemError) -> String {
        if let x = environment["XDG_RUNTIME_DIR"], !x.isEmpty { return try UnixSocket.runtimeDirectory() + "/control" }
        let directory = "/run/pppbridge"
        if mkdir(directory, 0o750) != 0 && errno != EEXIST { throw SystemError("mkdir \(directory)") }
        var st = stat()
        guard lstat(directory, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else { throw SystemError("\(directory) is not a directory", errno: Errno(ENOTDIR)) }
        guard st.st_uid == getuid(), st.st_mode & 0o022 == 0 else {
            throw SystemError("\(directory) must be ours and not writable by group or others", errno: Errno(EPERM))
        }
        return directory + "/control"
    }
}

