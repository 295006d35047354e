import Capture
import Foundation
import Framing
import PPP
import Testing
import TestSupport

extension Traces {
    static func load(_ name: String) throws -> Trace {
        try Trace(path: try path(name))
    }
}

extension Trace {
    /// The frames of record `number` (tshark's frame number).
    func frames(_ number: Int) -> [TraceFrame] { frames.filter { $0.number == number } }

    /// The control packet of the one PPP frame of record `number`.
    func control(_ number: Int, sourceLocation: SourceLocation = #_sourceLocation) throws -> (ProtocolNumber, ControlPacket) {
        let f = try #require(frames(number).first, "no PPP frame in record #\(number)", sourceLocation: sourceLocation)
        return (f.frame.protocol, try ControlPacket(parsing: f.frame.information))
    }

    func lcpOptions(_ number: Int, sourceLocation: SourceLocation = #_sourceLocation) throws -> [LCPOption] {
        let (proto, packet) = try control(number, sourceLocation: sourceLocation)
        #expect(proto == ProtocolNumber.lcp, sourceLocation: sourceLocation)
        return try ConfigurationOption.parseList(packet.data).map(LCPOption.init)
    }

    func ipcpOptions(_ number: Int, sourceLocation: SourceLocation = #_sourceLocation) throws -> [IPCPOption] {
        let (proto, packet) = try control(number, sourceLocation: sourceLocation)
        #expect(proto == ProtocolNumber.ipcp, sourceLocation: sourceLocation)
        return try ConfigurationOption.parseList(packet.data).map(IPCPOption.init)
    }

    func text(_ number: Int) -> [String] { frames(number).map { FramePrinter.describe($0.frame).text } }
}

/// Runs external tools (tshark, tcpdump, pppdump) with a time limit.
enum ExternalTool {
    static func find(_ name: String) -> String? {
        for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"] where FileManager.default.isExecutableFile(atPath: dir + "/" + name) {
            return dir + "/" + name
        }
        return nil
    }

    /// Whether the tool is installed: a test that needs it is enabled only then, and shows as
    /// skipped otherwise. Under CI, which installs every tool, a missing one counts as present,
    /// so the test runs and fails rather than being skipped.
    static func present(_ name: String) -> Bool {
        find(name) != nil || ProcessInfo.processInfo.environment["CI"] != nil
    }

    struct Result {
        var status: Int32
        var output: String
        var error: String
    }

    static func run(_ path: String, _ arguments: [String], timeout: TimeInterval = 600) throws -> Result {
        let scratch = try ScratchDirectory()
        let outPath = scratch.path + "/out", errPath = scratch.path + "/err"
        FileManager.default.createFile(atPath: outPath, contents: nil)
        FileManager.default.createFile(atPath: errPath, contents: nil)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = arguments
        p.standardOutput = FileHandle(forWritingAtPath: outPath)
        p.standardError = FileHandle(forWritingAtPath: errPath)
        p.standardInput = FileHandle.nullDevice
        try p.run()
        let deadline = Date().addingTimeInterval(timeout)
        while p.isRunning && Date() < deadline { usleep(10_000) }
        if p.isRunning {
            p.terminate()
            p.waitUntilExit()
            throw CaptureError("\(path) did not finish within \(timeout) s")
        }
        p.waitUntilExit()
        let output = FileManager.default.contents(atPath: outPath) ?? Data()
        let error = FileManager.default.contents(atPath: errPath) ?? Data()
        return Result(status: p.terminationStatus, output: String(decoding: output, as: UTF8.self),
                      error: String(decoding: error, as: UTF8.self))
    }
}

func hex(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var chars = s.filter { !$0.isWhitespace }.makeIterator()
    while let a = chars.next(), let b = chars.next() { out.append(UInt8(String([a, b]), radix: 16)!) }
    return out
}
