import Foundation
import Testing

/// The shared PPP traces, `../shared/traces` beside the checkout (or PPPBRIDGE_TRACES).
enum Traces {
    static let directory: String? = {
        if let env = ProcessInfo.processInfo.environment["PPPBRIDGE_TRACES"] { return env }
        // Tests/ReplayTests/Support.swift -> the package root -> ../shared/traces
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        let candidate = url.deletingLastPathComponent().appendingPathComponent("shared/traces").path
        return FileManager.default.fileExists(atPath: candidate) ? candidate : nil
    }()

    static func path(_ name: String) throws -> String {
        let dir = try #require(directory, "the shared traces are expected in ../shared/traces beside the checkout (or set PPPBRIDGE_TRACES)")
        return dir + "/" + name
    }

    /// Every capture in the directory (its tshark and tcpdump texts aside).
    static var all: [String] {
        guard let dir = directory, let names = try? FileManager.default.contentsOfDirectory(atPath: dir) else { return [] }
        return names.filter { $0.hasSuffix(".pcap") || $0.hasSuffix(".pppd") }.sorted()
    }
}

/// Files kept beside these tests.
enum TestFiles {
    static let directory: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent().path
    static func path(_ name: String) -> String { directory + "/" + name }
}

/// A scratch directory removed when the test ends.
final class ScratchDirectory {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "pppbridge-replay-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// The peak resident set of this process so far, in KiB (Linux's VmHWM).
func peakResidentKiB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }
    return 0
}
