import Channel
import RemoteSerial
import CSystem
import Foundation
import Glibc
import NetStack

/// `serve`'s terminals: one per `NAME.conf` in the configuration directory, all on one event
/// loop. The directory is read again when it changes (inotify) or on `reload`; a file that
/// changed replaces its terminal, one removed closes it, a bad one is reported and changes
/// nothing. The directories the devices live in are watched so a terminal waiting for its
/// device opens when it appears.
final class Service {
    let loop: EventLoop
    let directory: String
    let defaults: TerminalFile.Defaults
    let environment: [String: String]
    private(set) var terminals: [String: ServedTerminal] = [:]
    /// Files parsed while their terminal's previous configuration still lets go of the line.
    private var pending: [String: TerminalFile] = [:]
    /// Bad files by path with their contents, so an unchanged bad file is reported once.
    private var rejected: [String: [UInt8]] = [:]
    /// Good files whose device another terminal has: tried again at every scan, reported once.
    private var conflicts: [String: [UInt8]] = [:]
    /// Files beyond `TerminalFile.maximumTerminals`, left out.
    private(set) var filesOverLimit = 0
    private(set) var configurationErrors = 0
    private(set) var stopping = false
    private let watcher: DirectoryWatcher
    private var scanScheduled = false
    /// The process's descriptors: the terminals' host connections draw on its pool, and its
    /// reserve keeps what the lines, captures, listeners and local clients need.
    let descriptors: DescriptorBudget
    /// Descriptors kept for the service's own sockets and clients, whatever the terminals.
    var baseReserve: Int
    /// The local clients' servers, for their counters in the metrics.
    weak var controlServer: ControlServer?
    weak var metricsServer: MetricsServer?
    var say: (String) -> Void
    var complain: (String) -> Void
    var publish: (ServiceEvent) -> Void = { _ in }

    init(directory: String, defaults: TerminalFile.Defaults, environment: [String: String], loop: EventLoop,
         descriptors: DescriptorBudget, baseReserve: Int,
         say: @escaping (String) -> Void, complain: @escaping (String) -> Void) throws(SystemError) {
        self.loop = loop
        self.descriptors = descriptors
        self.baseReserve = baseReserve
        self.directory = directory
        self.defaults = defaults
        self.environment = environment
        self.say = say
        self.complain = complain
        watcher = try DirectoryWatcher(loop: loop)
        watcher.onChange = { [weak self] change in self?.changed(change) }
        if let failure = watcher.watch(exactly: [directory: .contents])[directory] { throw failure }
    }

    var openCount: Int { terminals.values.filter { $0.state == .open }.count }

    func terminal(_ name: String) -> ServedTerminal? {
        guard let t = terminals[name], !t.retired else { return nil }
        return t
    }

    /// Reads the directory and brings the terminals in line with it.
    func scan() {
        guard !stopping else { return }
        let fileNames: [String]
        do { fileNames = try FileManager.default.contentsOfDirectory(atPath: directory) } catch {
            complain("pppbridge serve: \(directory): \(error.localizedDescription)")
            return
        }
        var files: [String: String] = [:]
        for fileName in fileNames {
            if let name = TerminalFile.terminalName(fileName: fileName) { files[name] = directory + "/" + fileName }
        }
        // Terminals whose file is gone first: a file renamed takes over its device at once.
        for (name, t) in terminals where files[name] == nil && !t.retired {
            say("\(name): configuration removed")
            pending[name] = nil
            retire(t, name: name, announce: true)
        }
        for name in Array(pending.keys) where files[name] == nil { pending[name] = nil }
        // Running terminals keep their places; new ones are taken while there is room.
        var overLimit = 0
        // Counted once and kept up as files are taken: a pass per file would make a scan of
        // thousands of files cost millions of steps.
        var serving = terminals.values.filter { !$0.retired }.count + pending.keys.filter { terminal($0) == nil }.count
        for name in files.keys.sorted(by: { (terminal($0) != nil ? 0 : 1, $0) < (terminal($1) != nil ? 0 : 1, $1) }) {
            let isNew = terminal(name) == nil && pending[name] == nil
            if isNew && serving >= TerminalFile.maximumTerminals {
                overLimit += 1
                continue
            }
            if let path = files[name] { load(name: name, path: path) }
            if isNew && (terminal(name) != nil || pending[name] != nil) { serving += 1 }
        }
        if overLimit > 0 && overLimit != filesOverLimit {
            complain("pppbridge serve: \(overLimit) configuration files beyond \(TerminalFile.maximumTerminals) terminals left out")
        }
        filesOverLimit = overLimit
        let paths = Set(files.values)
        rejected = rejected.filter { paths.contains($0.key) }
        conflicts = conflicts.filter { paths.contains($0.key) }
        rewatch()
    }

    private func load(name: String, path: String) {
        let contents: [UInt8]
        switch TerminalFile.read(path) {
        case let .success(c): contents = c
        case let .failure(e):
            if rejected[path] != [] { report(path: path, contents: [], errors: e.messages) }
            return
        }
        // What this name runs (or is about to): a terminal on its way out does not count.
        if let current = pending[name] ?? terminal(name)?.file, current.contents == contents { return }
        if rejected[path] == contents { return }
        switch TerminalFile.parse(contents, name: name, path: path, defaults: defaults, environment: environment) {
        case let .failure(errors):
            report(path: path, contents: contents, errors: errors.messages)
        case let .success(file):
            rejected[path] = nil
            if let other = deviceHolder(of: file, except: name) {
                if conflicts[path] != contents {
                    conflicts[path] = contents
                    configurationErrors += 1
                    let message = "\(path): device \(TerminalFile.printable(file.device)) is \(other)'s already (tried again when that changes)"
                    complain("pppbridge serve: " + message)
                    publish(.configurationError(path: path, [message]))
                }
                return
            }
            conflicts[path] = nil
            pending[name] = file
            if let old = terminals[name] {
                if !old.retired { say("\(name): configuration changed") }
                retire(old, name: name, announce: false)
            } else {
                startPending(name)
            }
        }
    }

    /// The terminal (running or about to) whose device is `file`'s: the same path, or a path
    /// to the same device.
    private func deviceHolder(of file: TerminalFile, except name: String) -> String? {
        let line = LineIdentity(path: file.device)
        // One device server port, however it is written (tcp: or rfc2217:, localhost or
        // 127.0.0.1): two terminals on it would interleave two links on one serial line.
        let remote = try? RemoteLineAddress.parse(file.device).get()
        func same(_ other: TerminalFile) -> Bool {
            if let remote, let o = try? RemoteLineAddress.parse(other.device).get() { return o.host == remote.host && o.port == remote.port }
            return other.device == file.device || (line != nil && LineIdentity(path: other.device) == line)
        }
        if let t = terminals.values.first(where: { $0.name != name && !$0.retired && same($0.file) }) { return t.name }
        return pending.first(where: { $0.key != name && same($0.value) })?.key
    }

    private func report(path: String, contents: [UInt8], errors: [String]) {
        rejected[path] = contents
        configurationErrors += 1
        let kept = terminals.values.contains { $0.file.path == path && !$0.retired } ? " (the terminal keeps its previous configuration)" : ""
        for e in errors { complain("pppbridge serve: \(e)" + kept) }
        publish(.configurationError(path: path, errors))
    }

    /// Lets `t` go; once its line is free, the file waiting for the name (if any) starts.
    private func retire(_ t: ServedTerminal, name: String, announce: Bool) {
        t.retire { [weak self, weak t] in
            guard let self, let t, self.terminals[name] === t else { return }
            self.terminals[name] = nil
            self.updateReserve()
            if announce { self.publish(.configuration(terminal: name, added: false)) }
            self.startPending(name, after: t)
            self.scheduleMemoryRelease()
            // A file refused for this terminal's device may take it now.
            if !self.conflicts.isEmpty { self.scheduleScan() }
        }
    }

    private var memoryReleaseScheduled = false

    /// A while after terminals went (or links closed), the heap's free pages go back to the
    /// kernel: what a burst of traffic or a thousand links took is not kept for good by the
    /// allocator. At most once every two seconds; a pass over the heap costs about a
    /// millisecond for a few hundred megabytes.
    func scheduleMemoryRelease() {
        guard !memoryReleaseScheduled else { return }
        memoryReleaseScheduled = true
        loop.schedule(at: loop.now + .seconds(2)) { [weak self] in
            self?.memoryReleaseScheduled = false
            _ = malloc_trim(0)
        }
    }

    private func startPending(_ name: String, after old: ServedTerminal? = nil) {
        guard !stopping, terminals[name] == nil, let file = pending.removeValue(forKey: name) else { return }
        let t = ServedTerminal(file: file, loop: loop, descriptors: descriptors.makeShare(),
                               publish: { [weak self] in self?.terminalEvent($0) }, say: { [weak self] in self?.say($0) })
        t.lineHolder = { [weak self, unowned t] line in
            self?.terminals.values.first { $0 !== t && $0.heldLine == line }?.name
        }
        t.onLineReleased = { [weak self] in self?.recheckWaiting() }
        // The same device: a pty link its predecessor saw hang up is still not to be trusted.
        if let old, old.file.device == file.device { t.staleLink = old.staleLink }
        terminals[name] = t
        updateReserve()
        say("\(name): on \(t.devicePrintable)")
        publish(.configuration(terminal: name, added: true))
        t.start()
        rewatch()
    }

    private func terminalEvent(_ event: ServiceEvent) {
        switch event {
        case let .opened(name, a):
            say("\(name): open, \(a.ip) ↔ \(a.terminalIP)")
            // Its device directory need not be watched while the link is up.
            scheduleRewatch()
        case let .closed(name, reason):
            say("\(name): closed: \(reason)")
            scheduleMemoryRelease()
        case let .waiting(name, device):
            say("\(name): waiting for \(device)")
            rewatch()
        case .gaveUp:
            scheduleRewatch()
        default:
            break
        }
        publish(event)
    }

    /// The reserve: the service's own, and each terminal's line, captures and listeners.
    func updateReserve() {
        descriptors.reserve = baseReserve + terminals.values.reduce(0) { $0 + $1.reservedDescriptors }
    }

    /// Gives every waiting terminal a look at its device.
    private func recheckWaiting() {
        for t in Array(terminals.values) where t.state == .waiting { t.recheck() }
    }

    // MARK: Watching

    /// Which terminals each watched name concerns: directory → name in it → terminals whose
    /// device path goes through that name. A change costs a look-up here, not a pass over
    /// every terminal, so a busy device directory (thousands of names coming and going) costs
    /// only the terminals whose device it names.
    private var watchedNames: [String: [String: [String]]] = [:]
    private var rewatchScheduled = false
    /// Terminals shown a change in a device directory, and passes made over the watches: what
    /// hotplug costs (counted for the tests and the metrics).
    private(set) var deviceChecks = 0
    private(set) var rewatchPasses = 0

    private func changed(_ change: DirectoryWatcher.Change) {
        if change.directory == directory { scheduleScan() }
        guard let names = watchedNames[change.directory] else { return }
        if change.name.isEmpty {
            // The directory itself went, or the kernel's queue overflowed: anything may have.
            for name in names.values.joined() {
                deviceChecks += 1
                terminals[name]?.changed(change)
            }
            scheduleRewatch()
            return
        }
        guard let concerned = names[change.name] else { return }
        for name in concerned {
            guard let t = terminals[name] else { continue }
            deviceChecks += 1
            t.changed(change)
            // A directory on the way to the device appeared or went: watch the next one down
            // (or up), once for a burst of such changes.
            if DirectoryWatcher.parent(of: t.file.device) != change.directory { scheduleRewatch() }
        }
    }

    private func scheduleRewatch() {
        guard !rewatchScheduled else { return }
        rewatchScheduled = true
        loop.nextTurn { [weak self] in
            self?.rewatchScheduled = false
            self?.rewatch()
        }
    }

    /// Scans once the directory has been quiet for a moment (an editor's save is several events).
    func scheduleScan() {
        guard !scanScheduled, !stopping else { return }
        scanScheduled = true
        loop.schedule(at: loop.now + .milliseconds(100)) { [weak self] in
            self?.scanScheduled = false
            self?.scan()
        }
    }

    /// Watches the configuration directory and, for every terminal, the directory its device
    /// is in (or the nearest one above it that exists). A directory that appeared before its
    /// watch was in place may already hold the device: waiting terminals look again until the
    /// watches stop moving.
    private func rewatch() {
        for _ in 0..<8 {
            rewatchPasses += 1
            var wanted: [String: DirectoryWatcher.Interest] = [:]
            var names: [String: [String: [String]]] = [:]
            // Only the terminals that wait for their device to appear: a link that is up (or
            // opening, or in its holdoff) learns of its device going from the line itself, and
            // a busy device directory then costs nothing.
            for t in terminals.values where t.awaitsDevice {
                let d = DirectoryWatcher.nearestExistingDirectory(of: t.file.device)
                wanted[d] = .names
                if let component = DirectoryWatcher.component(of: t.file.device, in: d) { names[d, default: [:]][component, default: []].append(t.name) }
            }
            watchedNames = names
            wanted[directory] = .contents
            let before = watcher.watched
            for (path, failure) in watcher.watch(exactly: wanted) where path == directory {
                complain("pppbridge serve: \(failure)")
            }
            if watcher.watched == before { return }
            recheckWaiting()
        }
    }

    /// Closes every link; `then` once all are down. Nothing is opened or read again after.
    func closeAll(then: @escaping () -> Void) {
        stopping = true
        pending = [:]
        var left = terminals.count
        guard left > 0 else { return then() }
        for t in terminals.values {
            t.retire {
                left -= 1
                if left == 0 { then() }
            }
        }
    }
}
