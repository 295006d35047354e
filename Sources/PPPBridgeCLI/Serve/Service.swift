import Channel
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
    /// Files beyond `TerminalFile.maximumTerminals`, left out.
    private(set) var filesOverLimit = 0
    private(set) var configurationErrors = 0
    private let watcher: DirectoryWatcher
    private var scanScheduled = false
    var say: (String) -> Void
    var complain: (String) -> Void
    var publish: (ServiceEvent) -> Void = { _ in }

    init(directory: String, defaults: TerminalFile.Defaults, environment: [String: String], loop: EventLoop,
         say: @escaping (String) -> Void, complain: @escaping (String) -> Void) throws(SystemError) {
        self.loop = loop
        self.directory = directory
        self.defaults = defaults
        self.environment = environment
        self.say = say
        self.complain = complain
        watcher = try DirectoryWatcher(loop: loop)
        watcher.onChange = { [weak self] directory, name in self?.changed(directory, name) }
        if let failure = watcher.watch(exactly: [directory])[directory] { throw SystemError("\(directory): \(failure)", errno: ENOENT) }
    }

    var openCount: Int { terminals.values.filter { $0.state == .open }.count }

    func terminal(_ name: String) -> ServedTerminal? { terminals[name] }

    /// Reads the directory and brings the terminals in line with it.
    func scan() {
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: directory).sorted() } catch {
            complain("pppbridge serve: \(directory): \(error.localizedDescription)")
            return
        }
        var seen = Set<String>()
        var seenPaths = Set<String>()
        var overLimit = 0
        for fileName in names {
            guard let name = TerminalFile.terminalName(fileName: fileName) else { continue }
            guard seen.count < TerminalFile.maximumTerminals else {
                overLimit += 1
                continue
            }
            seen.insert(name)
            seenPaths.insert(directory + "/" + fileName)
            load(name: name, path: directory + "/" + fileName)
        }
        if overLimit > 0 && overLimit != filesOverLimit {
            complain("pppbridge serve: \(overLimit) configuration files beyond \(TerminalFile.maximumTerminals) terminals left out")
        }
        filesOverLimit = overLimit
        for (name, t) in terminals where !seen.contains(name) {
            say("\(name): configuration removed")
            pending[name] = nil
            retire(t) { [weak self] in
                guard let self, self.terminals[name] === t else { return }
                self.terminals[name] = nil
                self.publish(.configuration(terminal: name, added: false))
                self.startPending(name)
            }
        }
        rejected = rejected.filter { seenPaths.contains($0.key) }
        rewatch()
    }

    private func load(name: String, path: String) {
        let contents: [UInt8]
        switch TerminalFile.read(path) {
        case let .success(c): contents = c
        case let .failure(e):
            report(path: path, contents: [], errors: e.messages)
            return
        }
        if let current = pending[name] ?? terminals[name]?.file, current.contents == contents { return }
        if rejected[path] == contents { return }
        switch TerminalFile.parse(contents, name: name, path: path, defaults: defaults, environment: environment) {
        case let .failure(errors):
            report(path: path, contents: contents, errors: errors.messages)
        case let .success(file):
            if let other = terminals.values.first(where: { $0.name != name && $0.file.device == file.device }) {
                report(path: path, contents: contents, errors: ["\(path): device \(file.device) is \(other.name)'s already"])
                return
            }
            rejected[path] = nil
            if let old = terminals[name] {
                say("\(name): configuration changed")
                pending[name] = file
                retire(old) { [weak self] in
                    guard let self, self.terminals[name] === old else { return }
                    self.terminals[name] = nil
                    self.startPending(name)
                }
            } else {
                pending[name] = file
                startPending(name)
            }
        }
    }

    private func report(path: String, contents: [UInt8], errors: [String]) {
        rejected[path] = contents
        configurationErrors += 1
        let kept = terminals.values.contains { $0.file.path == path } ? " (the terminal keeps its previous configuration)" : ""
        for e in errors { complain("pppbridge serve: \(e)" + kept) }
        publish(.configurationError(path: path, errors))
    }

    private func startPending(_ name: String) {
        guard terminals[name] == nil, let file = pending.removeValue(forKey: name) else { return }
        let t = ServedTerminal(file: file, loop: loop, publish: { [weak self] in self?.terminalEvent($0) },
                               say: { [weak self] in self?.say($0) })
        t.lineHolder = { [weak self, unowned t] line in
            self?.terminals.values.first { $0 !== t && $0.heldLine == line }?.name
        }
        terminals[name] = t
        say("\(name): on \(file.device)")
        publish(.configuration(terminal: name, added: true))
        t.start()
        rewatch()
    }

    private func retire(_ t: ServedTerminal, then: @escaping () -> Void) {
        t.retire(then: then)
    }

    private func terminalEvent(_ event: ServiceEvent) {
        switch event {
        case let .opened(name, a):
            say("\(name): open, \(a.ip) ↔ \(a.terminalIP)")
        case let .closed(name, reason):
            say("\(name): closed: \(reason)")
        case let .waiting(name, device):
            say("\(name): waiting for \(device)")
            rewatch()
        default:
            break
        }
        publish(event)
    }

    // MARK: Watching

    private func changed(_ changedDirectory: String, _ name: String) {
        if changedDirectory == directory {
            scheduleScan()
        }
        for t in Array(terminals.values) { t.changed(name, in: changedDirectory) }
        rewatch()
    }

    /// Scans once the directory has been quiet for a moment (an editor's save is several events).
    func scheduleScan() {
        guard !scanScheduled else { return }
        scanScheduled = true
        loop.schedule(at: loop.now + .milliseconds(100)) { [weak self] in
            self?.scanScheduled = false
            self?.scan()
        }
    }

    /// Watches the configuration directory and, for every terminal, the directory its device
    /// is in (or the nearest one above it that exists).
    private func rewatch() {
        var wanted: Set<String> = [directory]
        for t in terminals.values { wanted.insert(DirectoryWatcher.nearestExistingDirectory(of: t.file.device)) }
        for (path, failure) in watcher.watch(exactly: wanted) where path == directory {
            complain("pppbridge serve: \(path): \(failure)")
        }
    }

    /// Closes every link; `then` once all are down.
    func closeAll(then: @escaping () -> Void) {
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
