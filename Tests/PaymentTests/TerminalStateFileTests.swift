import Foundation
import Glibc
import NetStack
@testable import Payment
@testable import PaymentKit
@testable import Simulation
import Testing
import TestSupport

/// The simulator's state file refuses what it cannot trust (a link, a FIFO, a file open to
/// others, another format) with an error instead of hanging or starting on planted keys, and
/// keeps its counter across a save and a load.
@Suite struct TerminalStateFileTests {
    func scratch() throws -> String { try TemporaryDirectory.make("state") }

    func error(_ file: TerminalStateFile) -> String? {
        do { _ = try file.load() } catch { return error.description }
        return nil
    }

    @Test func aSavedStateLoadsBackPrivateWithItsCounter() throws {
        let dir = try scratch()
        defer { _ = try? FileManager.default.removeItem(atPath: dir) }
        let file = TerminalStateFile(path: dir + "/terminal.state")
        #expect(try file.load() == nil, "no file yet: a first start")
        let security = TerminalSecurity.testDevice()
        try file.save(security)
        var st = stat()
        #expect(lstat(dir + "/terminal.state", &st) == 0 && st.st_mode & 0o777 == 0o600)
        let loaded = try #require(try file.load())
        #expect(loaded.state == security.state)
    }

    @Test func aLinkAFIFOAFileOpenToOthersAndAnotherFormatAreRefused() throws {
        let dir = try scratch()
        defer { _ = try? FileManager.default.removeItem(atPath: dir) }
        let good = TerminalStateFile(path: dir + "/good.state")
        try good.save(TerminalSecurity.testDevice())

        #expect(symlink(dir + "/good.state", dir + "/link.state") == 0)
        #expect(error(TerminalStateFile(path: dir + "/link.state")) != nil, "a link someone planted is not followed")

        #expect(mkfifo(dir + "/fifo.state", 0o600) == 0)
        // Refused at once: opening a FIFO without a writer must not hang the start.
        #expect(error(TerminalStateFile(path: dir + "/fifo.state"))?.contains("not a regular file") == true)

        #expect(chmod(dir + "/good.state", 0o644) == 0)
        #expect(error(good)?.contains("open to group or others") == true)
        #expect(chmod(dir + "/good.state", 0o600) == 0)
        #expect(error(good) == nil)

        let other = dir + "/other.state"
        let fd = open(other, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        let text = Array("{\"not\":\"a state\"}".utf8)
        _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        #expect(error(TerminalStateFile(path: other))?.contains("not a terminal state file") == true)

        // A file too large to be one is not read in.
        let big = dir + "/big.state"
        let bfd = open(big, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        #expect(ftruncate(bfd, off_t(TerminalStateFile.maximumSize + 1)) == 0)
        close(bfd)
        #expect(error(TerminalStateFile(path: big))?.contains("too large") == true)
    }
}
