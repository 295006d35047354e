import Foundation
import Glibc
import Payment
import PaymentKit
import Testing
import TestSupport

/// Discovery believes only lines in a directory nobody else can write to.
@Suite struct LineTrustTests {
    @Test(arguments: [(0o700, true), (0o755, true), (0o770, false), (0o720, false), (0o777, false), (0o1777, false), (0o1770, false)])
    func aDirectoryOthersCanWriteToIsNotTrusted(mode: Int, trusted: Bool) throws {
        let directory = try TemporaryDirectory.make("trust")
        defer { rmdir(directory) }
        #expect(chmod(directory, mode_t(mode)) == 0)
        do {
            _ = try ReaderLines.scan(directory + "/*")
            #expect(trusted, "mode 0\(String(mode, radix: 8)) was trusted")
        } catch {
            #expect(!trusted, "mode 0\(String(mode, radix: 8)) refused: \(error)")
            #expect(error.code == .bluetoothDisabled)
        }
    }
}
