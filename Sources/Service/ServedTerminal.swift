import Channel
import Glibc
import NetStack
import RemoteSerial
import PPP

/// What the service reports: to the control socket's subscribers (as `json`), to
/// `TerminalService.events()`, and to the C API's event callback.
public enum ServiceEvent: Sendable {
    case opened(terminal: String, ChannelAddresses)
    case closed(terminal: String, ChannelCloseReason)
    case waiting(terminal: String, device: String)
    case gaveUp(terminal: String, failures: Int)
    case connection(terminal: String, ConnectionReport)
    case configuration(terminal: String, added: Bool)
    case configurationError(path: String, [String])
}

/// One terminal of `serve`: its channel, kept open by a `TerminalSupervisor` (pppd's `persist`,
/// `holdoff` and `maxfail`). This class is the supervisor's shell: it tells it what happened
/// (the channel's events, the directory watcher's changes, the control socket's requests) with
/// what the device path leads to now, and does what it answers: opens or closes the channel,
/// runs the holdoff's timer on the loop, says what happened.
final class ServedTerminal {
    let file: TerminalFile
    let channel: Channel
    var name: String { file.name }
    /// The device path as it may be printed (the file's bytes, control characters escaped).
    var devicePrintable: String { TerminalFile.printable(file.device) }
    private(set) var supervisor: TerminalSupervisor
    var state: TerminalSupervisor.State { supervisor.state }
    /// Let go for good, or on the way (its file changed or was removed, or the service stops).
    var retired: Bool {
        switch supervisor.state {
        case .retired, .closing(after: .retire): return true
        default: return false
        }
    }
    var failures: Int { supervisor.failures }
    /// Waiting for its device, or given up until it appears anew: what the directory watcher
    /// is for.
    var awaitsDevice: Bool {
        switch supervisor.state {
        case .waiting, .gaveUp: return true
        default: return false
        }
    }
    private var holdoffTimer: Int?
    /// The bridges added whenever the link opens: the file's, and those the control socket added.
    private(set) var bridges: [BridgeSpec]
    private(set) var lastCloseReason: ChannelCloseReason?

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
    /// Told when this terminal lets go of its line (another may be waiting for it).
    var onLineReleased: () -> Void = {}

    /// Set from a hang-up on a pty reached through a symbolic link, to the link as it was: a
    /// pty's program that died leaves its link behind, and the pty number it leads to is soon
    /// another program's. Until the link is made again, what it leads to is not opened. (Its
    /// inode number is reused at once too; the change time tells a new link.) A serial device
    /// that hangs up is opened again after the holdoff, as pppd does.
    var staleLink: LinkStamp?
    /// The link as it was when the line was opened: the one a hang-up makes stale. (Stamped at
    /// the hang-up instead, a link its program had already made again, at once and to the
    /// same pty number, would be taken for the stale one, and never opened.)
    private var openedLink: LinkStamp?

    /// This terminal's part of the process's descriptors (its bridges', proxy's and DNS
    /// relay's host sockets draw on it).
    let descriptors: DescriptorShare?

    init(file: TerminalFile, loop: EventLoop, descriptors: DescriptorShare? = nil, publish: @escaping (ServiceEvent) -> Void,
         say: @escaping (String) -> Void) {
        self.file = file
        self.publish = publish
        self.say = say
        self.descriptors = descriptors
        // A device server is never given up on: a failed connection (it is rebooting, or its
        // network is down) is tried again after each holdoff, however many there were; only
        // a local device that keeps failing to open is left closed after maxfail.
        let network = RemoteLineAddress.isNetworkName(file.device)
        supervisor = TerminalSupervisor(holdoff: .seconds(file.holdoff), maxfail: network ? 0 : file.maxfail)
        bridges = file.options.bridges
        var configuration = file.options.channelConfiguration
        configuration.descriptorShare = descriptors
        channel = Channel(configuration: configuration, loop: loop)
        channel.observe { [weak self] event in self?.handle(event) }
    }

    var loop: EventLoop { channel.loop }

    /// The device is there (following a symbolic link, as an open would), and is not a link a
    /// hung-up pty's program left behind.
    var deviceExists: Bool {
        // A line on the network is always there to try: a server that refuses or does not
        // answer is a failed open (holdoff, then maxfail), not a device to wait for.
        if isNetworkLine { return true }
        if let stale = staleLink {
            if LinkStamp(path: file.device) == stale { return false }
            staleLink = nil
        }
        return LineIdentity(path: file.device) != nil
    }

    var isNetworkLine: Bool { RemoteLineAddress.isNetworkName(file.device) }

    /// What the device path leads to now, as the supervisor weighs it.
    private var device: TerminalSupervisor.Device {
        guard deviceExists else { return .missing }
        // One line is never two terminals' (two paths to one device, or a link that now leads
        // to the line another terminal holds).
        if let line = LineIdentity(path: file.device), let holder = lineHolder(line) { return .heldBy(holder) }
        return .present
    }

    /// Starts keeping the link open (a new terminal, or `open` from the control socket).
    func start() { tell(.start) }

    /// Closes the link and keeps it closed (`close` from the control socket).
    func stop() { tell(.stop) }

    /// Stops for good and calls `then` once the line is let go (a file changed or removed).
    func retire(then: @escaping () -> Void) {
        retiring = then
        tell(.retire)
    }

    private var retiring: (() -> Void)?

    /// Something changed in a watched directory: acted on when it concerns the device's path
    /// (its name, or the name of the directory on the way to it; an empty name: anything).
    func changed(_ change: DirectoryWatcher.Change) {
        guard change.name.isEmpty || DirectoryWatcher.component(of: file.device, in: change.directory) == change.name else { return }
        tell(.deviceChanged(appeared: change.appeared))
    }

    /// Opens a terminal that waits for its device, if the device is there now.
    func recheck() {
        if supervisor.state == .waiting { tell(.deviceChanged(appeared: false)) }
    }

    /// Tells the supervisor, then does what it says and sets the timer it asks for.
    private func tell(_ event: TerminalSupervisor.Event) {
        let actions = supervisor.handle(event, device: device, now: loop.now)
        armTimer()
        for action in actions { perform(action) }
    }

    private func perform(_ action: TerminalSupervisor.Action) {
        switch action {
        case .openLink:
            heldLine = LineIdentity(path: file.device)
            openedLink = LinkStamp(path: file.device)
            linkCounted = false
            // A line that cannot be opened is reported by the closed event (handled below).
            try? channel.start()
        case .closeLink:
            channel.requestClose()
        case let .announceWaiting(holder):
            if let holder { say("\(name): \(devicePrintable) leads to the line \(holder) holds; waiting for it") }
            publish(.waiting(terminal: name, device: devicePrintable))
        case let .announceGaveUp(failures):
            say("\(name): \(failures) failed opens in a row (maxfail \(file.maxfail)): left closed until opened again or its device appears anew")
            publish(.gaveUp(terminal: name, failures: failures))
        case .retired:
            let then = retiring
            retiring = nil
            then?()
        }
    }

    /// The holdoff's timer, at the supervisor's `pollAt`.
    private func armTimer() {
        if let t = holdoffTimer { loop.cancelTimer(t) }
        holdoffTimer = nil
        guard let at = supervisor.pollAt else { return }
        holdoffTimer = loop.schedule(at: at) { [weak self] in
            self?.holdoffTimer = nil
            self?.tell(.tick)
        }
    }

    private func handle(_ event: ChannelEvent) {
        switch event {
        case let .opened(addresses):
            opens += 1
            tell(.linkOpened)
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
        case let .connection(report):
            publish(.connection(terminal: name, report))
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
            finishedLinks = totals
            linkCounted = true
        }
        publish(.closed(terminal: name, reason))
        if reason == .lineHangUp, heldLine?.isPseudoTerminal == true { staleLink = openedLink }
        let held = heldLine != nil
        heldLine = nil
        tell(.linkClosed)
        if held { onLineReleased() }
    }

    /// Descriptors this terminal keeps out of the pool for itself: its line, its captures and
    /// its bridges' listeners.
    var reservedDescriptors: Int {
        1 + (file.options.channelConfiguration.pcapPath == nil ? 0 : 1) + (file.options.channelConfiguration.recordPath == nil ? 0 : 1)
            + bridges.count
    }

    /// The counters over every link, the current one included.
    var totals: (bytesIn: Int, bytesOut: Int, framesIn: Int, framesOut: Int, dropped: Int) {
        guard !linkCounted else { return finishedLinks }
        let s = channel.status, f = finishedLinks
        return (f.bytesIn + s.lineBytesIn, f.bytesOut + s.lineBytesOut, f.framesIn + s.framesIn, f.framesOut + s.framesOut,
                f.dropped + s.framesDropped)
    }

    // MARK: Bridges at runtime

    /// Adds a bridge now (the link must be open) and whenever the link opens again.
    func addBridge(_ spec: BridgeSpec) throws(BridgeError) {
        guard !bridges.contains(where: { $0.port == spec.port && ($0.kind == .terminalToHost) == (spec.kind == .terminalToHost) }) else {
            throw .alreadyExists
        }
        guard bridges.count < maximumBridges else { throw .noMoreBridges }
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


}

/// A symbolic link as it is now: its inode and change time (a link made again at the same path
/// gets a new change time, even when its inode number is reused).
struct LinkStamp: Equatable {
    let inode: UInt64
    let seconds: Int
    let nanoseconds: Int

    /// nil when `path` is not a symbolic link.
    init?(path: String) {
        var st = stat()
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFLNK else { return nil }
        inode = UInt64(st.st_ino)
        seconds = st.st_ctim.tv_sec
        nanoseconds = st.st_ctim.tv_nsec
    }
}
