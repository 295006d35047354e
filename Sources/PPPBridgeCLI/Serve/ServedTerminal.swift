import Channel
import Glibc
import NetStack
import PPP

/// What `serve` reports to the control socket's subscribers.
enum ServiceEvent {
    case opened(terminal: String, ChannelAddresses)
    case closed(terminal: String, ChannelCloseReason)
    case waiting(terminal: String, device: String)
    case gaveUp(terminal: String, failures: Int)
    case connection(terminal: String, ConnectionCarrier, opened: Bool)
    case configuration(terminal: String, added: Bool)
    case configurationError(path: String, [String])
}

/// One terminal of `serve`: its channel, kept open with pppd's `persist` semantics. A device
/// that is not there is waited for (the service's directory watcher says when it may have come);
/// a link that ends is reopened after `holdoff` seconds; `maxfail` failed opens in a row (a link
/// that never reached IPCP) leave it closed until it is opened again, its file changes or its
/// device comes back.
final class ServedTerminal {
    enum State: String { case waiting, opening, open, closed }

    let file: TerminalFile
    let channel: Channel
    var name: String { file.name }
    private(set) var state = State.closed
    /// Opens wanted: false after `close` (the control socket) or once retired.
    private(set) var wanted = false
    /// Failed opens in a row (pppd's maxfail counts these).
    private(set) var failures = 0
    private(set) var gaveUp = false
    private var holdoffTimer: Int?
    private var reachedOpen = false
    /// The bridges added whenever the link opens: the file's, and those the control socket added.
    private(set) var bridges: [BridgeSpec]
    private(set) var lastCloseReason: ChannelCloseReason?
    private var retiring: (() -> Void)?

    // Counters over every link this terminal had (the channel's restart with each link).
    private(set) var opens = 0
    private(set) var closeReasons: [String: Int] = [:]
    private(set) var echoFailures = 0
    private var finishedLinks = (bytesIn: 0, bytesOut: 0, framesIn: 0, framesOut: 0, dropped: 0)
    private var linkCounted = true
    /// Bridges that could not be added when the link opened (the header's codes said why).
    private(set) var bridgeFailures = 0

    private let publish: (ServiceEvent) -> Void
    private let say: (String) -> Void
    /// The line this terminal holds while opening or open: the device its path led to then.
    private(set) var heldLine: LineIdentity?
    /// The name of another terminal that holds `line`, if one does (the service answers).
    var lineHolder: (LineIdentity) -> String? = { _ in nil }

    init(file: TerminalFile, loop: EventLoop, publish: @escaping (ServiceEvent) -> Void, say: @escaping (String) -> Void) {
        self.file = file
        self.publish = publish
        self.say = say
        bridges = file.options.bridges
        channel = Channel(configuration: file.options.channelConfiguration, loop: loop)
        channel.observe { [weak self] event in self?.handle(event) }
    }

    var loop: EventLoop { channel.loop }

    /// True from a hang-up on a pty reached through a symbolic link until that link changes: a
    /// pty's program that died leaves its link behind, and the pty number it leads to is soon
    /// another program's. (Only a change of the name says the link is new: its inode number and
    /// the pty's number are both reused at once.) A serial device that hangs up is opened again
    /// after the holdoff, as pppd does.
    private var linkHungUp = false

    /// The device is there (following a symbolic link, as an open would), and is not a link
    /// that led to a line that hung up.
    var deviceExists: Bool { !linkHungUp && LineIdentity(path: file.device) != nil }

    /// Starts keeping the link open (a new terminal, or `open` from the control socket).
    func start() {
        wanted = true
        failures = 0
        gaveUp = false
        if state == .closed { attempt() }
    }

    /// Closes the link and keeps it closed (`close` from the control socket).
    func stop() {
        wanted = false
        cancelHoldoff()
        switch state {
        case .opening, .open: channel.requestClose()
        case .waiting: state = .closed
        case .closed: break
        }
    }

    /// Stops for good and calls `then` once the line is let go (a file changed or removed).
    func retire(then: @escaping () -> Void) {
        stop()
        if state == .closed { return then() }
        retiring = then
    }

    /// `name` changed in `directory` (an empty name: anything in it may have).
    func changed(_ name: String, in directory: String) {
        if linkHungUp && directory == DirectoryWatcher.parent(of: file.device)
            && (name.isEmpty || name == String(file.device.split(separator: "/").last ?? "")) {
            linkHungUp = false
        }
        deviceDirectoryChanged()
    }

    /// Something changed in the directory the device lives in (or one above it).
    func deviceDirectoryChanged() {
        guard wanted, !gaveUp || deviceExists else { return }
        if state == .waiting && deviceExists {
            attempt()
        } else if gaveUp && deviceExists && state == .closed {
            // A device that comes back is a new line: maxfail counts again from zero.
            start()
        }
    }

    private func attempt() {
        cancelHoldoff()
        guard wanted, retiring == nil else { return }
        guard deviceExists else {
            if state != .waiting {
                state = .waiting
                publish(.waiting(terminal: name, device: file.device))
            }
            return
        }
        // A symbolic link left behind by a program that died (a pty's) may lead to a device
        // another terminal has opened since: one line is never two terminals'.
        if let line = LineIdentity(path: file.device), let holder = lineHolder(line) {
            if state != .waiting {
                state = .waiting
                say("\(name): \(file.device) leads to the line \(holder) holds; waiting for it to change")
                publish(.waiting(terminal: name, device: file.device))
            }
            return
        }
        heldLine = LineIdentity(path: file.device)
        state = .opening
        reachedOpen = false
        linkCounted = false
        // A line that cannot be opened is reported by the closed event (handled below).
        try? channel.start()
    }

    private func cancelHoldoff() {
        if let t = holdoffTimer { loop.cancelTimer(t) }
        holdoffTimer = nil
    }

    private func handle(_ event: ChannelEvent) {
        switch event {
        case let .opened(addresses):
            state = .open
            reachedOpen = true
            failures = 0
            opens += 1
            publish(.opened(terminal: name, addresses))
            for spec in bridges {
                do throws(BridgeError) { try channel.addBridge(spec.kind, port: spec.port) } catch {
                    bridgeFailures += 1
                    say("\(name): bridge \(spec): \(error) (\(error.rawValue))")
                }
            }
        case let .closed(reason):
            closed(reason)
        case let .link(e):
            if case .echoMissed = e { echoFailures += 1 }
        case let .connection(carrier, opened):
            publish(.connection(terminal: name, carrier, opened: opened))
        case let .log(text):
            say("\(name): \(text)")
        case .line:
            break
        }
    }

    private func closed(_ reason: ChannelCloseReason) {
        lastCloseReason = reason
        closeReasons[reason.name, default: 0] += 1
        if !linkCounted {
            let s = channel.status
            finishedLinks.bytesIn += s.lineBytesIn
            finishedLinks.bytesOut += s.lineBytesOut
            finishedLinks.framesIn += s.framesIn
            finishedLinks.framesOut += s.framesOut
            finishedLinks.dropped += s.framesDropped
            linkCounted = true
        }
        publish(.closed(terminal: name, reason))
        state = .closed
        if reason == .lineHangUp, heldLine?.isPseudoTerminal == true, LineIdentity.isSymbolicLink(file.device) { linkHungUp = true }
        heldLine = nil
        if let then = retiring {
            retiring = nil
            return then()
        }
        guard wanted else { return }
        if !reachedOpen { failures += 1 }
        if file.maxfail > 0 && failures >= file.maxfail {
            gaveUp = true
            say("\(name): \(failures) failed opens in a row (maxfail \(file.maxfail)): left closed until opened again or its device comes back")
            publish(.gaveUp(terminal: name, failures: failures))
            return
        }
        if !deviceExists {
            state = .waiting
            publish(.waiting(terminal: name, device: file.device))
            return
        }
        holdoffTimer = loop.schedule(at: loop.now + .seconds(file.holdoff)) { [weak self] in
            self?.holdoffTimer = nil
            self?.attempt()
        }
    }

    /// The counters over every link, the current one included.
    var totals: (bytesIn: Int, bytesOut: Int, framesIn: Int, framesOut: Int, dropped: Int) {
        var t = finishedLinks
        if !linkCounted {
            let s = channel.status
            t.bytesIn += s.lineBytesIn
            t.bytesOut += s.lineBytesOut
            t.framesIn += s.framesIn
            t.framesOut += s.framesOut
            t.dropped += s.framesDropped
        }
        return t
    }

    // MARK: Bridges at runtime

    /// Adds a bridge now (the link must be open) and whenever the link opens again.
    func addBridge(_ spec: BridgeSpec) throws(BridgeError) {
        guard !bridges.contains(where: { $0.port == spec.port && ($0.kind == .terminalToHost) == (spec.kind == .terminalToHost) }) else {
            throw .alreadyExists
        }
        guard bridges.count < 12 else { throw .noMoreBridges }
        try channel.addBridge(spec.kind, port: spec.port)
        bridges.append(spec)
    }

    /// Removes a bridge now and from the ones added when the link opens; false when there is none.
    func removeBridge(_ spec: BridgeSpec) -> Bool {
        guard let i = bridges.firstIndex(of: spec) else { return false }
        bridges.remove(at: i)
        _ = channel.removeBridge(spec.kind, port: spec.port)
        return true
    }
}

/// What a device path leads to: the device number of a character device (a tty, a pty), else
/// the file's device and inode.
struct LineIdentity: Equatable {
    let device: UInt64
    let inode: UInt64

    init?(path: String) {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        if st.st_mode & S_IFMT == S_IFCHR {
            device = UInt64(st.st_rdev)
            inode = 0
        } else {
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
        }
    }

    /// A Unix 98 pty's terminal side (majors 136–143, devices.txt): numbers that are handed out
    /// again as soon as they are free.
    var isPseudoTerminal: Bool {
        guard inode == 0 else { return false }
        let major = ((device >> 8) & 0xFFF) | ((device >> 32) & 0xFFFF_F000)
        return (136...143).contains(major)
    }

    static func isSymbolicLink(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0 && st.st_mode & S_IFMT == S_IFLNK
    }
}
