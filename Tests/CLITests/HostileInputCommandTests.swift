import Capture
import Foundation
import Glibc
@testable import PPPBridgeCLI
@testable import Service
import Testing
import TestSupport

/// A scratch directory removed when the test ends.
final class Scratch {
    let path: String
    init() throws {
        path = try TemporaryDirectory.make("cli")
    }
    func file(_ name: String, _ bytes: [UInt8], mode: Int = 0o600) -> String {
        let p = path + "/" + name
        _ = FileManager.default.createFile(atPath: p, contents: Data(bytes), attributes: [.posixPermissions: mode])
        return p
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

func le32(_ v: UInt32) -> [UInt8] { [UInt8(v & 0xFF), UInt8((v >> 8) & 0xFF), UInt8((v >> 16) & 0xFF), UInt8(v >> 24)] }

@Suite struct HostileCaptureDecodeTests {
    static let lcpConfigureRequest: [UInt8] = [0xFF, 0x03, 0xC0, 0x21, 0x01, 0x01, 0x00, 0x04]

    @Test func decodeCountsOutOfRangeMicrosecondsInsteadOfTrapping() throws {
        let scratch = try Scratch()
        var bytes: [UInt8] = [0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0] + le32(0) + le32(0) + le32(65535) + le32(9)
        for usec: UInt32 in [0x7FFF_FFFF, 0x8000_0000] {
            bytes += le32(1_700_000_000) + le32(usec) + le32(8) + le32(8) + HostileCaptureDecodeTests.lcpConfigureRequest
        }
        let c = Captured()
        #expect(c.run(["decode", scratch.file("usec.pcap", bytes)]) == 0)
        print(c.out.joined(separator: "\n"))
        #expect(c.out.filter { $0.hasPrefix("#") }.count == 2)
        #expect(c.out.contains("time stamps: 2 records with microseconds out of range, read normalised"))
        #expect(c.out.last == "errors: 0 malformed packets, 0 unreadable headers")
    }

    @Test func decodeOfPcapngTimesNearTwoToTheSixtyThirdDoesNotTrap() throws {
        let scratch = try Scratch()
        func block(_ type: UInt32, _ body: [UInt8]) -> [UInt8] { le32(type) + le32(UInt32(12 + body.count)) + body + le32(UInt32(12 + body.count)) }
        var bytes = block(0x0A0D_0D0A, le32(0x1A2B_3C4D) + [1, 0, 0, 0] + le32(.max) + le32(.max))
        bytes += block(1, [9, 0, 0, 0] + le32(0) + [9, 0, 1, 0, 0, 0, 0, 0] + le32(0))   // DLT_PPP, if_tsresol 10^0
        for stamp: UInt64 in [0x8000_0000_0000_0005, 0x7FFF_FFFF_FFFF_FFF0] {
            bytes += block(6, le32(0) + le32(UInt32(stamp >> 32)) + le32(UInt32(stamp & 0xFFFF_FFFF)) + le32(8) + le32(8)
                + HostileCaptureDecodeTests.lcpConfigureRequest)
        }
        let c = Captured()
        #expect(c.run(["decode", scratch.file("resol0.pcapng", bytes)]) == 0, "\(c.err)")
        print(c.out.joined(separator: "\n"))
        #expect(c.out.filter { $0.hasPrefix("#") }.count == 2)
    }

    @Test func decodeWritesPAPPasswordsAsStarsUnlessAsked() throws {
        let scratch = try Scratch()
        let source = try sharedTrace("pppd-record_pap.pppd")
        let masked = scratch.path + "/masked.pcap", kept = scratch.path + "/kept.pcap"
        #expect(Captured().run(["decode", source, "--pcap", masked]) == 0)
        #expect(Captured().run(["decode", source, "--pcap", kept, "--capture-secrets"]) == 0)
        let secret = Data("vmpeer-secret".utf8), stars = Data("*************".utf8)
        let maskedBytes = try Data(contentsOf: URL(fileURLWithPath: masked)), keptBytes = try Data(contentsOf: URL(fileURLWithPath: kept))
        #expect(maskedBytes.range(of: secret) == nil && maskedBytes.range(of: stars) != nil)
        #expect(keptBytes.range(of: secret) != nil)
        #expect(maskedBytes.count == keptBytes.count)
    }
}

@Suite struct StatusFileTests {
    @Test func statusJSONParsesBackWhateverThePeerSent() throws {
        // A close reason carries what the terminal sent: quotes, backslashes, control characters,
        // an escape sequence, bytes that were not UTF-8 (decoded to U+FFFD), a line separator.
        let hostile = String(decoding: [0x22, 0x5C, 0x00, 0x01, 0x0A, 0x1B, 0x5B, 0x32, 0x4A, 0xFF, 0xC3, 0x28, 0xE2, 0x80, 0xA8, 0x7D, 0x22], as: UTF8.self)
        let text = ChannelRun.encode(["state": "closed", "bridges": [["kind": "host", "port": 9000]], "last_close_reason": "peer terminated: " + hostile, "dns": NSNull()])
        #expect(text.hasSuffix("}\n"))
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        #expect(parsed["last_close_reason"] as? String == "peer terminated: " + hostile)
        #expect(parsed["state"] as? String == "closed")
        #expect(parsed["dns"] is NSNull)
        // The old hand-made quoting left the NUL and newline raw: not JSON.
        #expect(!text.utf8.contains(0x00) && !text.dropLast().contains("\n"))
    }

    @Test func statusFileIsPrivateAndNeverWrittenThroughALink() throws {
        let scratch = try Scratch()
        let target = scratch.file("elsewhere", Array("keep".utf8), mode: 0o644)
        let link = scratch.path + "/status.json"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        #expect(throws: CaptureError(link + " is a symbolic link, which is not written through")) {
            try ChannelRun.writeStatusFile("{}\n", to: link)
        }
        // A link planted at the temporary name is refused too.
        let status = scratch.path + "/real.json"
        try FileManager.default.createSymbolicLink(atPath: status + ".tmp", withDestinationPath: target)
        #expect(throws: CaptureError.self) { try ChannelRun.writeStatusFile("{}\n", to: status) }
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "keep")
        try FileManager.default.removeItem(atPath: status + ".tmp")
        try ChannelRun.writeStatusFile("{\"state\": \"open\"}\n", to: status)
        var st = stat()
        #expect(lstat(status, &st) == 0 && st.st_mode & 0o777 == 0o600)
        // `run` refuses a linked --status-json before opening anything.
        let c = Captured()
        #expect(c.run(["run", "--pty", "--status-json", link]) == 7)
        #expect(c.err == ["pppbridge: \(link) is a symbolic link, which is not written through"])
    }
}

@Suite struct SecretSourceTests {
    @Test func secretFilesLoseOneTrailingNewlineAndWarnWhenOthersMayRead() throws {
        let scratch = try Scratch()
        let privateFile = scratch.file("pw", Array("s3cret: with spaces \n".utf8))
        #expect(try SecretSource.read(privateFile).get() == SecretSource.FileText(text: "s3cret: with spaces ", warning: nil))
        let crlf = scratch.file("crlf", Array("pw\r\n".utf8))
        #expect(try SecretSource.read(crlf).get().text == "pw")
        let open = scratch.file("open", Array("pw\n\n".utf8), mode: 0o644)
        let read = try SecretSource.read(open).get()
        #expect(read.text == "pw\n")
        #expect(read.warning == "\(open) can be read by group or others (mode 0644); chmod 600 keeps the secret yours")
        #expect(throws: SecretError.self) { try SecretSource.read(scratch.path + "/missing").get() }
        #expect(throws: SecretError.self) { try SecretSource.read(scratch.path).get() }
        #expect(throws: SecretError.self) { try SecretSource.read(scratch.file("big", [UInt8](repeating: 0x41, count: 70_000))).get() }
        #expect(throws: SecretError.self) { try SecretSource.read(scratch.file("binary", [0xFF, 0xFE])).get() }
    }

    @Test func pairFilesHoldOneNameAndSecretPerLine() throws {
        let pairs = try SecretSource.pairs("alice:pw:with:colons\r\n\nbob:\n", path: "f").get()
        #expect(pairs.map(\.name) == ["alice", "bob"] && pairs.map(\.secret) == ["pw:with:colons", ""])
        #expect(throws: SecretError("f: line 2 is not NAME:SECRET")) { try SecretSource.pairs("a:b\nnocolon", path: "f").get() }
    }

    @Test func runTakesSecretsFromFilesAndTheEnvironment() throws {
        let scratch = try Scratch()
        let long = String(repeating: "x", count: 300)
        func run(_ args: [String], environment: [String: String] = [:]) -> (Int32, [String]) {
            var err: [String] = []
            let status = RunCommand(output: { _ in }, error: { err.append($0) }, environment: environment).run(args)
            return (status, err)
        }
        // Each is read and reaches the checks on names and secrets (a 300-byte one is refused there).
        let tooLong = "pppbridge run: names and secrets are at most 255 bytes"
        #expect(run(["--pty", "--user", "u", "--password-file", scratch.file("pw", Array((long + "\n").utf8))]) == (2, [tooLong]))
        #expect(run(["--pty", "--require-pap", "--peer-file", scratch.file("peers", Array("a:b\nc:\(long)\n".utf8))]) == (2, [tooLong]))
        #expect(run(["--pty", "--user", "u"], environment: ["PPPBRIDGE_PASSWORD": long]) == (2, [tooLong]))
        #expect(run(["--pty", "--user", "u"]) == (2, ["pppbridge run: --user and --password go together"]))
        // A missing file is one line and usage; an open one warns and goes on.
        let (status, err) = run(["--pty", "--password-file", scratch.path + "/none"])
        #expect(status == 2 && err.count == 1 && err[0].hasPrefix("pppbridge run: " + scratch.path + "/none: "))
        let openFile = scratch.file("open", Array("pw".utf8), mode: 0o640)
        let warned = run(["--pty", "--password-file", openFile])
        #expect(warned.1.first?.hasPrefix("pppbridge run: warning: \(openFile) can be read by group or others") == true)
        #expect(run(["--pty", "--socks-user-file", scratch.file("socks", Array("nocolon\n".utf8))]).1
            == ["pppbridge run: \(scratch.path)/socks: line 1 is not NAME:SECRET"])
    }
}
