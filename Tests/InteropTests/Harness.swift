import Foundation
import Synchronization
import Testing
import TestSupport

/// The package root (…/Tests/InteropTests/Harness.swift → …).
let packageRoot: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }
    return url.path
}()

/// A child process started with posix_spawn, its stdout and stderr appended to a file, reaped
/// with waitpid. (Foundation's Process can miss the exit of a script that leaves a daemon
/// behind, as Tools/vmpeer/run.sh leaves QEMU.)
final class ChildProcess {
    let pid: pid_t
    private(set) var status: Int32?

    /// `environment` is added to the test's own.
    init(_ path: String, _ arguments: [String], output: String, environment: [String: String] = [:]) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        let merged = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let envp: [UnsafeMutablePointer<CChar>?] = merged.map { strdup("\($0)=\($1)") } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        // The child starts with no signal blocked and default dispositions, whatever the
        // test runner's threads have set.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), all = sigset_t()
        sigemptyset(&none)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var child: pid_t = 0
        let r = posix_spawn(&child, path, &actions, &attributes, argv, envp)
        guard r == 0 else { throw InteropError("posix_spawn \(path): \(String(cString: strerror(r)))") }
        pid = child
    }

    /// The exit status once the child has exited (128 + signal when killed), else nil.
    func poll() -> Int32? {
        if let status { return status }
        var s: Int32 = 0
        guard waitpid(pid, &s, WNOHANG) == pid else { return nil }
        let signal = s & 0x7F
        status = signal == 0 ? (s >> 8) & 0xFF : 128 + signal
        return status
    }

    var isRunning: Bool { poll() == nil }

    /// Waits for the exit without holding a thread: the task sleeps between polls.
    func wait(_ timeout: TimeInterval) async -> Int32? {
        _ = await eventually(timeout) { poll() != nil }
        return poll()
    }

    /// The same on the caller's thread, for cleanup in a `defer` (a killed child exits at once).
    func waitBlocking(_ timeout: TimeInterval) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline, poll() == nil { usleep(10_000) }
        return poll()
    }

    func signal(_ sig: Int32) { if isRunning { kill(pid, sig) } }

    /// Kills and reaps the child if it is still there.
    func reap() {
        guard isRunning else { return }
        kill(pid, SIGKILL)
        _ = waitBlocking(10)
    }
}

/// Runs a command to completion with a time limit; stdout and stderr together.
/// The task sleeps while the command runs; no test-runner thread is held.
func runCommand(_ path: String, _ arguments: [String], timeout: TimeInterval) async throws -> (status: Int32, output: String) {
    let log = NSTemporaryDirectory() + "pppbridge-cmd-" + UUID().uuidString
    defer { try? FileManager.default.removeItem(atPath: log) }
    let child = try ChildProcess(path, arguments, output: log)
    guard let status = await child.wait(timeout) else {
        child.reap()
        throw InteropError("\(path) \(arguments.joined(separator: " ")) did not finish within \(Int(timeout)) s")
    }
    return (status, String(decoding: FileManager.default.contents(atPath: log) ?? Data(), as: UTF8.self))
}

/// `runCommand` for cleanup in a `defer`, which cannot wait asynchronously: the thread waits
/// (for commands that return in a moment, like `ip netns del`).
@discardableResult
func runCommandBlocking(_ path: String, _ arguments: [String], timeout: TimeInterval) -> Int32? {
    guard let child = try? ChildProcess(path, arguments, output: "/dev/null") else { return nil }
    let status = child.waitBlocking(timeout)
    if status == nil { child.reap() }
    return status
}

struct InteropError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held. The task
/// sleeps between polls (a thread of the test runner's pool is never held).
func eventually(_ timeout: TimeInterval, _ condition: () -> Bool) async -> Bool {
    await TestSupport.eventually(within: .milliseconds(Int64(timeout * 1000)), every: .milliseconds(50), condition)
}


/// Debian's pppd in a QEMU VM on a pty (Tools/vmpeer). Killed and cleaned up on `stop()`.
final class VMPeer {
    let runDirectory: String
    let pty: String
    let console: String
    let control: String
    let bootSeconds: String

    /// Why the VM cannot run here at all, or nil. Building the guest needs Debian's packages;
    /// a failure there is a test failure, not a skip.
    static let unavailable: String? = {
        if ProcessInfo.processInfo.environment["PPPBRIDGE_SKIP_VM"] != nil { return "PPPBRIDGE_SKIP_VM is set" }
        guard FileManager.default.fileExists(atPath: "/dev/ptmx") else { return "no pseudo-terminals on this machine" }
        return nil
    }()

    /// Builds the guest once per test run (build.sh returns at once when its cache is current).
    /// The VM suites run beside each other, each one test at a time: the first caller starts
    /// the one build and every caller awaits that same build. (Two builds at once on a fresh
    /// machine had the second fail on the first one's apt lock.)
    private static let build = Mutex<Task<Result<Void, InteropError>, Never>?>(nil)

    static func built() async -> Result<Void, InteropError> {
        let task = build.withLock { running in
            if let running { return running }
            let started = Task { await buildGuest() }
            running = started
            return started
        }
        return await task.value
    }

    private static func buildGuest() async -> Result<Void, InteropError> {
        do {
            let r = try await runCommand("/bin/bash", [packageRoot + "/Tools/vmpeer/build.sh"], timeout: 900)
            return r.status == 0 ? .success(()) : .failure(InteropError("Tools/vmpeer/build.sh failed:\n\(r.output.suffix(2000))"))
        } catch let e as InteropError {
            return .failure(e)
        } catch {
            return .failure(InteropError("\(error)"))
        }
    }

    init(_ options: [String]) async throws {
        try await VMPeer.built().get()
        let r = try await runCommand("/bin/bash", [packageRoot + "/Tools/vmpeer/run.sh", "-W", "120"] + options, timeout: 180)
        var values: [String: String] = [:]
        for line in r.output.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "="), line.prefix(while: { $0.isUppercase || $0 == "_" }).count == line.distance(from: line.startIndex, to: eq) else { continue }
            values[String(line[..<eq])] = String(line[line.index(after: eq)...])
        }
        guard r.status == 0, let dir = values["RUNDIR"], let pty = values["PTY"], let console = values["CONSOLE"], let ctl = values["CTL"] else {
            throw InteropError("Tools/vmpeer/run.sh failed (status \(r.status)):\n\(r.output.suffix(2000))")
        }
        runDirectory = dir
        self.pty = pty
        self.console = console
        control = ctl
        bootSeconds = values["BOOT_S"] ?? "?"
    }

    var log: String { String(decoding: FileManager.default.contents(atPath: console) ?? Data(), as: UTF8.self) }

    /// The console's finished lines: the file is read while the guest may be half-way through
    /// writing one (a result line cut in the middle would read as a wrong result).
    var completeLines: [Substring] {
        let text = log
        let end = text.lastIndex(where: \.isNewline) ?? text.startIndex
        return text[..<end].split(whereSeparator: \.isNewline)
    }

    /// Runs a shell line in the guest (see Tools/vmpeer/README.md).
    func guest(_ command: String) {
        let fd = open(control, O_WRONLY | O_NONBLOCK)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let line = Array((command + "\n").utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    /// Kills the VM (blocking: it runs from `defer`; run.sh -k returns in a moment).
    func stop() {
        runCommandBlocking("/bin/bash", [packageRoot + "/Tools/vmpeer/run.sh", "-k", runDirectory], timeout: 30)
        try? FileManager.default.removeItem(atPath: runDirectory)
    }
}

/// `pppbridge run` as a child process, its output in a file.
final class BridgeProcess {
    let child: ChildProcess
    let logPath: String
    let pcapPath: String

    static var binary: String {
        // The test bundle sits beside the products of the same build.
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("pppbridge").path
    }

    /// `capture` adds --debug and --pcap; `namespace` runs it inside that network namespace.
    init(_ arguments: [String], capture: Bool = true, namespace: String? = nil) throws {
        let base = NSTemporaryDirectory() + "pppbridge-interop-" + UUID().uuidString
        logPath = base + ".log"
        pcapPath = base + ".pcap"
        let run = ["run"] + arguments + (capture ? ["--debug", "--pcap", pcapPath] : [])
        if let namespace {
            child = try ChildProcess(KernelPeer.ip, ["netns", "exec", namespace, BridgeProcess.binary] + run, output: logPath)
        } else {
            child = try ChildProcess(BridgeProcess.binary, run, output: logPath)
        }
    }

    var output: String { String(decoding: FileManager.default.contents(atPath: logPath) ?? Data(), as: UTF8.self) }

    func has(_ text: String) -> Bool { output.contains(text) }

    var isRunning: Bool { child.isRunning }

    /// SIGTERM, then waits for the exit status.
    func terminate(timeout: TimeInterval = 15) async -> Int32? {
        child.signal(SIGTERM)
        return await child.wait(timeout)
    }

    func waitForExit(_ timeout: TimeInterval) async -> Int32? { await child.wait(timeout) }

    /// `terminate` for cleanup in a `defer` (the thread waits).
    @discardableResult
    func terminateBlocking(timeout: TimeInterval = 15) -> Int32? {
        child.signal(SIGTERM)
        return child.waitBlocking(timeout)
    }

    func cleanUp() {
        child.reap()
        try? FileManager.default.removeItem(atPath: logPath)
        try? FileManager.default.removeItem(atPath: pcapPath)
    }
}
