import Foundation
import Glibc
import NetStack
import Testing
import TestSupport
@testable import Channel

/// The pieces `serve` stands on: line assembly for control sockets, the directory watcher and
/// the service manager's notify socket.
@Suite struct ServiceSupportTests {
    @Test func linesAreCutAndOverlongOnesReportedOnce() {
        var a = LineAssembler(limit: 8)
        #expect(a.feed(Array("ab".utf8)) == [])
        #expect(a.feed(Array("c\nde\n".utf8)) == [.line(Array("abc".utf8)), .line(Array("de".utf8))])
        // Nine bytes without a newline: reported at once, then dropped up to the newline.
        #expect(a.feed(Array("123456789".utf8)) == [.tooLong])
        #expect(a.feed(Array(String(repeating: "x", count: 100_000).utf8)) == [])
        #expect(a.feed(Array("yy\nok\n".utf8)) == [.line(Array("ok".utf8))])
        // A long line that arrives whole is refused the same way.
        #expect(a.feed(Array("0123456789\nz\n".utf8)) == [.tooLong, .line(Array("z".utf8))])
    }

    @Test func theWatcherReportsNamesAppearingAndGoing() throws {
        let directory = try TemporaryDirectory.make("watch")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let loop = try EventLoop()
        let watcher = try DirectoryWatcher(loop: loop)
        var seen: [String] = []
        watcher.onChange = { c in if c.directory == directory { seen.append(c.name + (c.appeared ? "+" : "")) } }
        #expect(watcher.watch(exactly: [directory: .contents, directory + "/missing": .names]) == [directory + "/missing": SystemError("watch \(directory)/missing", errno: Errno(ENOENT))])
        symlink("/dev/null", directory + "/line")
        try "x".write(toFile: directory + "/t1.conf", atomically: false, encoding: .utf8)
        unlink(directory + "/line")
        let deadline = loop.now + .seconds(5)
        loop.run { seen.contains("line") && seen.contains("t1.conf") || loop.now > deadline }
        // Created (appeared), written, deleted.
        #expect(seen.first == "line+" && seen.contains("t1.conf+") && seen.contains("t1.conf") && seen.last == "line", "\(seen)")
        #expect(DirectoryWatcher.component(of: directory + "/a/b", in: directory) == "a")
        #expect(DirectoryWatcher.component(of: "/dev/serial/by-id/x", in: "/dev") == "serial")
        #expect(DirectoryWatcher.component(of: "/devx/y", in: "/dev") == nil)
        #expect(DirectoryWatcher.component(of: "/dev/x", in: "/") == "dev")
        #expect(DirectoryWatcher.nearestExistingDirectory(of: directory + "/a/b/c") == directory)
        #expect(DirectoryWatcher.nearestExistingDirectory(of: directory + "/c") == directory)
        #expect(DirectoryWatcher.parent(of: "/dev") == "/")
    }

    @Test func theNotifierSendsDatagramsToTheManagersSocket() throws {
        let path = NSTemporaryDirectory() + "pppbridge-notify-\(UUID().uuidString.prefix(8))"
        defer { unlink(path) }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var a = try UnixSocket.address(path)
        let bound = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        #expect(bound == 0)
        #expect(ServiceNotifier(environment: [:]) == nil)
        #expect(ServiceNotifier(environment: ["NOTIFY_SOCKET": "relative/path"]) == nil)
        let notifier = try #require(ServiceNotifier(environment: ["NOTIFY_SOCKET": path]))
        #expect(notifier.notify("READY=1\nSTATUS=2 of 2 terminals up"))
        var buffer = [UInt8](repeating: 0, count: 256)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        #expect(n > 0 && String(decoding: buffer[..<max(n, 0)], as: UTF8.self) == "READY=1\nSTATUS=2 of 2 terminals up")
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "30000000"]) == .seconds(15))
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"]) == nil || getpid() == 1)
        #expect(ServiceNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "x"]) == nil)
    }
}
