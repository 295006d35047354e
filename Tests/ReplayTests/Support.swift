import Foundation

/// Files kept beside these tests.
enum TestFiles {
    static let directory: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent().path
    static func path(_ name: String) -> String { directory + "/" + name }
}
