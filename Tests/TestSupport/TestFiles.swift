import Foundation
import Glibc

/// The files the suites share: the PPP traces of `../shared/traces` beside the checkout, and
/// scratch directories that go when the test ends.
public enum Traces {
    /// `../shared/traces` beside the checkout, or PPPBRIDGE_TRACES; nil when neither is there.
    public static let directory: String? = {
        if let env = ProcessInfo.processInfo.environment["PPPBRIDGE_TRACES"] { return env }
        // Tests/TestSupport/TestFiles.swift -> the package root -> ../shared/traces
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        let candidate = url.deletingLastPathComponent().appendingPathComponent("shared/traces").path
        return FileManager.default.fileExists(atPath: candidate) ? candidate : nil
    }()

    public struct Missing: Error, CustomStringConvertible {
        public var description: String
    }

    /// The path of trace `name`; throws (failing the test) when the traces or it are missing.
    public static func path(_ name: String) throws -> String {
        guard let dir = directory else {
            throw Missing(description: "the shared traces are expected in ../shared/traces beside the checkout (or set PPPBRIDGE_TRACES)")
        }
        let path = dir + "/" + name
        guard FileManager.default.fileExists(atPath: path) else { throw Missing(description: "missing \(path)") }
        return path
    }

    /// Every capture in the directory (its tshark and tcpdump texts aside).
    public static var all: [String] {
        guard let dir = directory, let names = try? FileManager.default.contentsOfDirectory(atPath: dir) else { return [] }
        return names.filter { $0.hasSuffix(".pcap") || $0.hasSuffix(".pppd") }.sorted()
    }
}

/// A new directory of the test's own: mkdtemp(3) under /tmp, mode 0700, a short path (Unix
/// socket paths inside it stay far below sun_path's 108 bytes). The caller removes it, or
/// uses `ScratchDirectory`.
public enum TemporaryDirectory {
    public static func make(_ name: String) throws -> String {
        var template = Array("/tmp/pppbridge-\(name)-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw Traces.Missing(description: "mkdtemp /tmp/pppbridge-\(name)-XXXXXX failed (errno \(errno))")
        }
        return String(cString: made)
    }
}

/// A scratch directory (`TemporaryDirectory`) removed with everything in it when the test ends.
public final class ScratchDirectory {
    public let path: String
    public init(_ name: String = "test") throws {
        path = try TemporaryDirectory.make(name)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}
