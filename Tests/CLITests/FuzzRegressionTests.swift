import Foundation
import Testing

/// Every input that once crashed a fuzz target, or that replays an attack found by hand, is
/// committed under Tools/Fuzz/regressions/TARGET/ and replayed here through the target's plain
/// build (the same entry point libFuzzer drives), so it can never come back unseen.
@Suite struct FuzzRegressionTests {
    static let root: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url
    }()

    static var targets: [String] {
        let dir = root.appendingPathComponent("Tools/Fuzz/regressions").path
        return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).sorted()
    }

    @Test func everyTargetHasRegressionInputs() {
        #expect(Set(Self.targets).isSuperset(of: ["stack", "link"]))
    }

    @Test(arguments: FuzzRegressionTests.targets)
    func regressionInputsReplayCleanly(target: String) async throws {
        let dir = Self.root.appendingPathComponent("Tools/Fuzz/regressions/\(target)")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted().map { dir.appendingPathComponent($0).path }
        try #require(!files.isEmpty)
        // The test bundle sits beside the products of the same build.
        let binary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("pppbridge-fuzz-\(target)")
        try #require(FileManager.default.isExecutableFile(atPath: binary.path), "missing \(binary.path)")
        let process = Process()
        process.executableURL = binary
        process.arguments = files
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        let status: Int32 = try await withCheckedThrowingContinuation { continuation in
            process.terminationHandler = { continuation.resume(returning: $0.terminationStatus) }
            do { try process.run() } catch { continuation.resume(throwing: error) }
        }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(status == 0, "\(text)")
        #expect(text.split(separator: "\n").filter { $0.hasPrefix("ok ") }.count == files.count, "\(text)")
    }
}
