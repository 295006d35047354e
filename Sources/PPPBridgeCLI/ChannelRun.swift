import Capture
import Channel
import RemoteSerial
import Service
import Foundation
import Glibc
import NetStack
import PPP

/// `pppbridge run` on our own stack: the channel on a loop on this thread, its bridges added as
/// soon as the link is up, a status line on a terminal and a JSON status file on request.
final class ChannelRun {
    let configuration: ChannelConfiguration
    let bridges: [BridgeSpec]
    let persist: Bool
    let statusPath: String?
    let debug: Bool
    let output: (String) -> Void
    let error: (String) -> Void
    private var finished: ChannelCloseReason?
    private var stopping = false
    private var bridgeFailed = false
    private var statusLineShown = false
    private var statusFailureReported = false
    private let interactive = isatty(1) != 0

    init(configuration: ChannelConfiguration, bridges: [BridgeSpec], persist: Bool, statusPath: String?, debug: Bool,
         output: @escaping (String) -> Void, error: @escaping (String) -> Void) {
        self.configuration = configuration
        self.bridges = bridges
        self.persist = persist
        self.statusPath = statusPath
        self.debug = debug
        self.output = output
        self.error = error
    }

    func run() -> Int32 {
        if let statusPath, ChannelRun.isSymbolicLink(statusPath) {
            error("pppbridge: \(statusPath) is a symbolic link, which is not written through")
            return RunCommand.Status.openFailed
        }
        let loop: EventLoop
        do { loop = try EventLoop() } catch let e {
            error("pppbridge: \(e)")
            return RunCommand.Status.openFailed
        }
        let channel = Channel(configuration: configuration, loop: loop)
        channel.observe { [unowned self] event in self.handle(event, channel) }
        let signals: SignalWatcher
        do {
            signals = try SignalWatcher(signals: [SIGINT, SIGTERM, SIGUSR1, SIGUSR2], loop: loop) { [unowned self] signo in
                switch signo {
                case SIGUSR1: for line in channel.report() { self.say(line) }
                case SIGUSR2: self.writeStatus(channel)
                default:
                    self.stopping = true
                    // Between a close and a --persist reopen there is no link to close.
                    if channel.status.state == .closed { self.finished = self.finished ?? .closedByUs }
                    channel.requestClose()
                }
            }
        } catch let e {
            error("pppbridge: \(e)")
            return RunCommand.Status.openFailed
        }
        defer { signals.cancel() }
        do { try channel.start() } catch let e {
            // A line that could not be opened was reported by the channel's closed event; a
            // device server that refused is tried again with --persist (the closed event
            // scheduled it), from the first open on as after.
            if case let .closed(reason) = e, persist, !reasonIsFinal(reason) {
            } else {
                if case .closed(.lineFailed) = e {} else { error("pppbridge: \(e)") }
                return RunCommand.Status.openFailed
            }
        }
        var tick: (() -> Void)!
        tick = { [unowned self] in
            self.writeStatus(channel)
            self.showStatusLine(channel)
            loop.schedule(at: loop.now + .seconds(1), tick)
        }
        loop.schedule(at: loop.now + .seconds(1), tick)
        loop.run { self.finished != nil }
        writeStatus(channel)
        if statusLineShown { ChannelRun.writeTerminal("\n") }
        guard let reason = finished else { return CommandLineTool.Status.success }
        if bridgeFailed && reason == .closedByUs && !stopping { return RunCommand.Status.openFailed }
        return RunCommand.Status.of(reason)
    }

    private func say(_ text: String) {
        if statusLineShown {
            // Clear the status line first; it is redrawn on the next tick.
            ChannelRun.writeTerminal("\r\u{1B}[K")
            statusLineShown = false
        }
        output(text)
    }

    private func handle(_ event: ChannelEvent, _ channel: Channel) {
        switch event {
        case let .line(path):
            if let path { say("pppbridge: pty \(path)" + (configuration.lineLink.map { " (linked at \($0))" } ?? "")) }
            else if case let .device(d, _) = configuration.line { say("pppbridge: attached to \(d)") }
        case .opened:
            for spec in bridges where !channel.bridgeStatus.contains(where: { $0.kind == spec.kind && $0.port == spec.port }) {
                do {
                    try channel.addBridge(spec.kind, port: spec.port)
                } catch let e {
                    error("pppbridge: bridge \(spec): \(e) (\(e.rawValue))")
                    bridgeFailed = true
                }
            }
            if bridgeFailed && !persist { channel.requestClose() }
        case let .closed(reason):
            if case let .lineFailed(m) = reason {
                error("pppbridge: \(m)")  // the system's words, as for any open
            } else if reason != .closedByUs || !stopping {
                say("pppbridge: channel closed: \(reason)")
            }
            if persist && !stopping && !reasonIsFinal(reason) {
                say("pppbridge: reopening")
                channel.loop.schedule(at: channel.loop.now + .seconds(1)) { [unowned self] in
                    if !self.stopping { try? channel.start() }
                }
            } else {
                finished = reason
            }
        case let .link(e):
            for text in RunCommand.describe(e, debug: debug) { say(text) }
        case let .log(text):
            say(text)
        case .connection:
            break
        }
    }

    private func reasonIsFinal(_ r: ChannelCloseReason) -> Bool {
        switch r {
        case .authenticationFailed, .loopback: return true
        case let .lineFailed(message):
            // A device server that refuses (restarting, or its port held by another client) is
            // tried again, as a hang-up is; a local device that cannot be opened is not there,
            // and a capture that cannot be written will not be writable a second later.
            if message.hasPrefix("capture:") { return true }
            if case let .device(d, _) = configuration.line, RemoteLineAddress.isNetworkName(d) { return false }
            return true
        default: return false
        }
    }

    private func showStatusLine(_ channel: Channel) {
        guard interactive else { return }
        let s = channel.status
        var parts = ["link \(s.state.rawValue)"]
        if let a = s.addresses { parts.append("\(a.ip) ↔ \(a.terminalIP)") }
        let connections = s.bridges.reduce(0) { $0 + $1.traffic.active } + (s.proxy?.active ?? 0)
        let toTerminal = s.bridges.reduce(0) { $0 + $1.traffic.bytesToTerminal } + (s.proxy?.bytesToTerminal ?? 0)
        let toHost = s.bridges.reduce(0) { $0 + $1.traffic.bytesToHost } + (s.proxy?.bytesToHost ?? 0)
        let failures = s.bridges.reduce(0) { $0 + $1.traffic.failures } + (s.proxy?.failures ?? 0) + s.proxyRefusals
        parts.append("bridges \(s.bridges.count)")
        parts.append("connections \(connections)")
        parts.append("→terminal \(toTerminal) B ←terminal \(toHost) B")
        parts.append("line in \(s.lineBytesIn) out \(s.lineBytesOut)")
        parts.append("errors \(failures + s.framesDropped)")
        ChannelRun.writeTerminal("\r\u{1B}[K" + parts.joined(separator: " | "))
        statusLineShown = true
    }

    static func writeTerminal(_ text: String) {
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { Glibc.write(1, $0.baseAddress, $0.count) }
    }

    private func writeStatus(_ channel: Channel) {
        guard let statusPath else { return }
        do {
            try ChannelRun.writeStatusFile(ChannelRun.json(channel.status), to: statusPath)
        } catch let e {
            // Said once; the next tick tries again (a disk that filled may have room later).
            if !statusFailureReported { error("pppbridge: status file: \(e)") }
            statusFailureReported = true
        }
    }

    /// Replaces `path` with `text` through `path.tmp` (created 0600 without following a link)
    /// and a rename, so a reader never sees half a status. `path` itself may not be a link.
    static func writeStatusFile(_ text: String, to path: String) throws(CaptureError) {
        if isSymbolicLink(path) { throw CaptureError("\(path) is a symbolic link, which is not written through") }
        let temporary = path + ".tmp"
        let file = try CaptureFile(path: temporary, replaces: .anyOfOurs)
        let written = file.write(Array(text.utf8))
        file.close()
        guard written else { throw CaptureError("\(temporary): \(file.stopReason ?? "not written")") }
        guard rename(temporary, path) == 0 else { throw CaptureError("\(path): \(String(cString: strerror(errno)))") }
    }

    static func isSymbolicLink(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0 && st.st_mode & S_IFMT == S_IFLNK
    }

    /// The status as one JSON object. Peer text reaches it (a close reason carries what the
    /// terminal sent), so it goes through JSONSerialization, which escapes every string.
    static func json(_ s: ChannelStatus) -> String { encode(statusObject(s)) }

    static func statusObject(_ s: ChannelStatus) -> [String: Any] { StatusJSON.object(s) }
    static func encode(_ object: [String: Any]) -> String { StatusJSON.line(object) }
}

extension ChannelConfiguration {
    var lineLink: String? {
        if case let .pty(link, _) = line { return link }
        return nil
    }
}
