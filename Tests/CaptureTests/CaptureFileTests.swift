@testable import Capture
import Foundation
import Framing
import Glibc
import NetStack
import PPP
import Testing
import TestSupport

/// Collects what a capture says when it stops.
final class StopMessages: @unchecked Sendable {
    var lines: [String] = []
    func append(_ s: String) { lines.append(s) }
}

func fileMode(_ path: String) -> mode_t {
    var st = stat()
    return lstat(path, &st) == 0 ? st.st_mode & 0o777 : 0
}

@Suite struct CaptureFileTests {
    @Test func aFullDiskStopsTheCaptureAndSaysSoOnce() throws {
        let said = StopMessages()
        let file = try CaptureFile(path: "/dev/full", replaces: .pcap)
        file.onStop = said.append
        #expect(!file.write([1, 2, 3]))
        #expect(!file.write([4, 5, 6]))
        #expect(said.lines.count == 1)
        #expect(said.lines.first?.contains("No space left on device") == true)
        print("/dev/full: \(said.lines)")

        // The writers on top of it: the first write fails, the link's later frames are dropped quietly.
        let pcapSaid = StopMessages()
        let pcap = try PcapWriter(path: "/dev/full", linkType: .pppWithDirection, onStop: pcapSaid.append)
        #expect(throws: CaptureError.self) { try pcap.write(packet: [0xFF, 0x03, 0xC0, 0x21, 9, 1, 0, 4], time: CaptureTime(seconds: 1, microseconds: 0), direction: .sent) }
        let recordSaid = StopMessages()
        let record = try PPPDRecordWriter(path: "/dev/full", startTime: 0, onStop: recordSaid.append)
        for i in 0..<10 { record.record(.received, [0x7E, 0xFF, 0x7D, 0x23, 0x7E], elapsedTenths: Int64(i)) }
        record.close()
        #expect(pcapSaid.lines.count == 1 && recordSaid.lines.count == 1)
    }

    @Test func aRecordStopsAtItsLimitAndSaysSoOnce() throws {
        let scratch = try ScratchDirectory()
        let path = scratch.path + "/line.record"
        let said = StopMessages()
        let record = try PPPDRecordWriter(path: path, startTime: 0, masking: nil, limit: 1000, onStop: said.append)
        for i in 0..<100 { record.record(.sent, [UInt8](repeating: 0x41, count: 50), elapsedTenths: Int64(i)) }
        record.close()
        let size = try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
        #expect(size <= 1000 && size > 900)
        #expect(said.lines == ["pppbridge: capture \(path) stopped: reached its size limit of 1000 bytes"])
        // What was written reads back: whole entries only.
        #expect(try PPPDRecord(bytes: [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))).truncatedAt == nil)
    }

    @Test func capturesAreCreatedPrivateAndNeverThroughALink() throws {
        let scratch = try ScratchDirectory()
        let target = scratch.path + "/target"
        _ = FileManager.default.createFile(atPath: target, contents: Data("keep".utf8))
        let link = scratch.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        #expect(throws: CaptureError(link + " is a symbolic link, which is not written through")) { try PcapWriter(path: link) }
        #expect(throws: CaptureError.self) { try PPPDRecordWriter(path: link, startTime: 0) }
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "keep")

        let pcap = scratch.path + "/new.pcap", record = scratch.path + "/new.record"
        try PcapWriter(path: pcap).close()
        try PPPDRecordWriter(path: record, startTime: 0).close()
        #expect(fileMode(pcap) == 0o600 && fileMode(record) == 0o600)
        // A file already there, readable by all, is not replaced: captures hold what crossed
        // the line, and the file may be someone's.
        let existing = scratch.path + "/old.pcap"
        _ = FileManager.default.createFile(atPath: existing, contents: nil, attributes: [.posixPermissions: 0o644])
        #expect(throws: CaptureError.self) { try PcapWriter(path: existing) }
        #expect(fileMode(existing) == 0o644)
    }

    /// A capture is written over only a capture of its own kind that is ours and private: any
    /// other file a path names (a configuration file's `pcap` line) is left byte for byte.
    @Test func onlyACaptureOfOursIsReplaced() throws {
        let scratch = try ScratchDirectory()
        let precious = scratch.path + "/accounts.db"
        let contents = Data("SQLite format 3\0 not a capture".utf8)
        _ = FileManager.default.createFile(atPath: precious, contents: contents, attributes: [.posixPermissions: 0o600])
        #expect(throws: CaptureError.self) { try PcapWriter(path: precious) }
        #expect(throws: CaptureError.self) { try PPPDRecordWriter(path: precious, startTime: 0) }
        #expect(try Data(contentsOf: URL(fileURLWithPath: precious)) == contents)

        // A pcap of ours is replaced; a record file is not taken for one, nor the other way round.
        let pcap = scratch.path + "/session.pcap", record = scratch.path + "/session.record"
        let first = try PcapWriter(path: pcap)
        try first.write(packet: [0xFF, 0x03, 0xC0, 0x21, 9, 1, 0, 4], time: CaptureTime(seconds: 1, microseconds: 0), direction: .sent)
        first.close()
        try PcapWriter(path: pcap).close()
        #expect(try Data(contentsOf: URL(fileURLWithPath: pcap)).count == 24)
        try PPPDRecordWriter(path: record, startTime: 0).close()
        try PPPDRecordWriter(path: record, startTime: 0).close()
        #expect(throws: CaptureError.self) { try PcapWriter(path: record) }
        #expect(throws: CaptureError.self) { try PPPDRecordWriter(path: pcap, startTime: 0) }
        // An empty file of ours, 0600, is taken (what a caller makes to reserve the name).
        let empty = scratch.path + "/empty.pcap"
        _ = FileManager.default.createFile(atPath: empty, contents: nil, attributes: [.posixPermissions: 0o600])
        try PcapWriter(path: empty).close()
        #expect(try Data(contentsOf: URL(fileURLWithPath: empty)).count == 24)
    }

    /// In a shared directory another user may plant the file (it would then own what we write)
    /// or make it a second name of a file of ours: both are refused, and nothing is truncated.
    @Test func aPlantedOrHardLinkedFileIsRefused() throws {
        let scratch = try ScratchDirectory()
        let planted = scratch.path + "/planted.pcap"
        _ = FileManager.default.createFile(atPath: planted, contents: Data("theirs".utf8))
        // Another owner (nobody); only root can give a file away, as in a shared /tmp.
        if geteuid() == 0 {
            #expect(chown(planted, 65534, 65534) == 0)
            #expect(throws: CaptureError(planted + " belongs to another user or has other names (hard links); not written")) {
                try PcapWriter(path: planted)
            }
            #expect(try String(contentsOfFile: planted, encoding: .utf8) == "theirs")
        }
        let ours = scratch.path + "/ours"
        _ = FileManager.default.createFile(atPath: ours, contents: Data("keep".utf8))
        let second = scratch.path + "/second.pcap"
        #expect(link(ours, second) == 0)
        #expect(throws: CaptureError.self) { try PPPDRecordWriter(path: second, startTime: 0) }
        #expect(try String(contentsOfFile: ours, encoding: .utf8) == "keep")
    }
}

@Suite struct SecretMaskingTests {
    static let secret = Array("vmpeer-secret".utf8)

    func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count else { return false }
        return (0...(haystack.count - needle.count)).contains { Array(haystack[$0..<($0 + needle.count)]) == needle }
    }

    /// The recorded PAP session (pppd against slirp), written through our writers.
    func writeCaptures(masking: SecretMasker?, in scratch: ScratchDirectory) throws -> (pcap: [UInt8], record: [UInt8]) {
        let source = try Traces.path("pppd-record_pap.pppd")
        let pcapPath = scratch.path + "/pap.pcap", recordPath = scratch.path + "/pap.record"
        let trace = try Trace(path: source)
        let pcap = try PcapWriter(path: pcapPath, linkType: .pppWithDirection, masking: masking)
        for f in trace.frames { try pcap.write(packet: f.frame.uncompressedPacket, time: f.time, direction: f.direction) }
        pcap.close()
        let record = try PPPDRecordWriter(path: recordPath, startTime: 0, masking: masking)
        for case let .data(direction, bytes, tenths) in try PPPDRecord(bytes: [UInt8](Data(contentsOf: URL(fileURLWithPath: source)))).events {
            record.record(direction, bytes, elapsedTenths: tenths)
        }
        record.close()
        return ([UInt8](try Data(contentsOf: URL(fileURLWithPath: pcapPath))), [UInt8](try Data(contentsOf: URL(fileURLWithPath: recordPath))))
    }

    @Test func papPasswordsAreStarsInBothCapturesUnlessAsked() throws {
        let scratch = try ScratchDirectory()
        let stars = [UInt8](repeating: SecretMasker.mask, count: SecretMaskingTests.secret.count)
        let (pcap, record) = try writeCaptures(masking: SecretMasker(), in: scratch)
        #expect(!contains(pcap, SecretMaskingTests.secret) && contains(pcap, stars))
        #expect(!contains(record, SecretMaskingTests.secret) && contains(record, stars))

        // Both read back frame for frame: only the password changed, and the record's FCS is right.
        let original = try Traces.load("pppd-record_pap.pppd")
        let masked = try Trace(path: scratch.path + "/pap.record")
        #expect(masked.frames.count == original.frames.count)
        #expect(masked.sentCounters.badFCS == 0 && masked.receivedCounters.badFCS == 0)
        let request = try PAPPacket(ControlPacket(parsing: try #require(masked.frames.first { $0.frame.protocol == ProtocolNumber.pap }).frame.information))
        #expect(request == .authenticateRequest(identifier: 1, peerID: Array("vmpeer".utf8), password: stars))
        let fromPcap = try Trace(path: scratch.path + "/pap.pcap")
        #expect(fromPcap.frames.map(\.frame.information.count) == original.frames.map(\.frame.information.count))
        #expect(zip(fromPcap.frames, original.frames).filter { $0.frame.information != $1.frame.information }.map(\.0.frame.protocol) == [ProtocolNumber.pap])

        let kept = try writeCaptures(masking: nil, in: scratch)
        #expect(contains(kept.pcap, SecretMaskingTests.secret) && contains(kept.record, SecretMaskingTests.secret))
    }

    @Test(.enabled(if: ExternalTool.present("tshark"), "tshark is not installed (Tools/install-deps.sh test installs it)"))
    func maskedPAPDecodesInTshark() throws {
        let scratch = try ScratchDirectory()
        _ = try writeCaptures(masking: SecretMasker(), in: scratch)
        let tshark = try #require(ExternalTool.find("tshark"))
        let r = try ExternalTool.run(tshark, ["-r", scratch.path + "/pap.pcap", "-Y", "pap", "-T", "fields", "-e", "pap.peer_id", "-e", "pap.password", "-e", "_ws.malformed"])
        print("tshark on the masked PAP: \(r.output)")
        #expect(r.status == 0)
        #expect(r.output.split(separator: "\n").first == "vmpeer\t*************\t")
    }

    /// A SOCKS5 username/password request (RFC 1929) from the terminal to the proxy, in IPv4/TCP
    /// with a correct checksum.
    static func socksAuthentication(port: UInt16 = 1080) -> [UInt8] {
        let payload: [UInt8] = [0x01, 4] + Array("user".utf8) + [6] + Array("hunter".utf8)
        let source = IPv4Address(192, 168, 53, 2), destination = IPv4Address(192, 168, 53, 1)
        var tcp: [UInt8] = BigEndian.bytes(UInt16(40000)) + BigEndian.bytes(port) + BigEndian.bytes(UInt32(1)) + BigEndian.bytes(UInt32(1))
            + [0x50, 0x18, 0x10, 0x00, 0, 0, 0, 0] + payload
        let sum = InternetChecksum.pseudoHeaderSum(source: source, destination: destination, protocol: IPProtocol.tcp, length: tcp.count)
        BigEndian.put(InternetChecksum.finish(InternetChecksum.sum(tcp, into: sum)), into: &tcp, at: 16)
        return IPv4Header(protocol: IPProtocol.tcp, source: source, destination: destination, payloadLength: tcp.count).emit() + tcp
    }

    static func tcpChecksumVerifies(_ ip: [UInt8]) -> Bool {
        guard let h = ip.withUnsafeBytes({ try? IPv4Header(parsing: $0) }) else { return false }
        let tcp = ip[h.headerLength..<h.totalLength]
        let sum = InternetChecksum.pseudoHeaderSum(source: h.source, destination: h.destination, protocol: IPProtocol.tcp, length: tcp.count)
        return InternetChecksum.finish(InternetChecksum.sum(tcp, into: sum)) == 0
    }

    @Test func socksPasswordsAreMaskedWithTheChecksumKeptRight() throws {
        let packet = SecretMaskingTests.socksAuthentication()
        #expect(SecretMaskingTests.tcpChecksumVerifies(packet))
        var masker = SecretMasker(socksPorts: [1080])
        let result = masker.masked(protocol: ProtocolNumber.ipv4, information: packet, direction: .received)
        let masked = try #require(result)
        #expect(masked.count == packet.count)
        #expect(!contains(masked, Array("hunter".utf8)) && contains(masked, Array("user".utf8) + [6] + Array("******".utf8)))
        #expect(SecretMaskingTests.tcpChecksumVerifies(masked))
        // Other ports, and a payload that is not exactly one request, are left alone.
        var other = SecretMasker(socksPorts: [1081])
        #expect(other.masked(protocol: ProtocolNumber.ipv4, information: packet, direction: .received) == nil)
        var longer = SecretMasker(socksPorts: [1080])
        #expect(longer.masked(protocol: ProtocolNumber.ipv4, information: Array(packet.dropLast()), direction: .received) == nil)
    }

    @Test func socksPasswordsInVJFramesAreMasked() throws {
        let packet = SecretMaskingTests.socksAuthentication()
        let headers = 40
        // RFC 1144 §3.2.2: the uncompressed form carries the slot in the protocol field.
        var uncompressed = packet
        uncompressed[9] = 3
        var masker = SecretMasker(socksPorts: [1080])
        let resultUC = masker.masked(protocol: ProtocolNumber.vjUncompressedTCP, information: uncompressed, direction: .received)
        let maskedUC = try #require(resultUC)
        #expect(maskedUC[9] == 3 && !contains(maskedUC, Array("hunter".utf8)))
        var restored = maskedUC
        restored[9] = IPProtocol.tcp.rawValue
        #expect(SecretMaskingTests.tcpChecksumVerifies(restored))
        // §3.2.3: a compressed frame of that slot (C set), its checksum, no deltas, the data.
        let checksum = Array(packet[(20 + 16)..<(20 + 18)])
        let compressed: [UInt8] = [0x40, 3] + checksum + Array(packet[headers...])
        let resultC = masker.masked(protocol: ProtocolNumber.vjCompressedTCP, information: compressed, direction: .received)
        let maskedC = try #require(resultC)
        #expect(!contains(maskedC, Array("hunter".utf8)))
        #expect(Array(maskedC[2..<4]) == Array(restored[(20 + 16)..<(20 + 18)]))
        // Without the slot's uncompressed frame the compressed one cannot be placed: left alone.
        var fresh = SecretMasker(socksPorts: [1080])
        #expect(fresh.masked(protocol: ProtocolNumber.vjCompressedTCP, information: compressed, direction: .received) == nil)
    }

    /// The line ended right after a PAP password, before the FCS: the last two bytes are
    /// password bytes, not an FCS, and are masked with the rest.
    @Test func anUnterminatedPAPFrameIsMaskedToItsLastByte() {
        let password = Array("secret".utf8)
        let info: [UInt8] = [1, 1, 0, UInt8(4 + 1 + 4 + 1 + password.count), 4] + Array("user".utf8) + [UInt8(password.count)] + password
        let raw: [UInt8] = [0xFF, 0x7D, 0x23, 0xC0, 0x23] + info.flatMap { $0 < 0x20 ? [0x7D, $0 ^ 0x20] : [$0] }
        var masker = SecretMasker()
        let out = HeldFrame.masked(raw, direction: .received, masker: &masker)
        #expect(!contains(out, Array("et".utf8)) && !contains(out, Array("secret".utf8)))
        #expect(Array(out.suffix(password.count)) == [UInt8](repeating: 0x2A, count: password.count))
    }

    @Test func hostilePAPLengthsMaskWhatIsThere() {
        // Peer-ID length past the packet: nothing to mask; password length past it: mask to the end.
        var m = SecretMasker()
        #expect(m.masked(protocol: ProtocolNumber.pap, information: [1, 1, 0, 9, 200, 0x41], direction: nil) == nil)
        #expect(m.masked(protocol: ProtocolNumber.pap, information: [1, 1, 0, 9, 1, 0x41, 200, 0x42, 0x43], direction: nil)
            == [1, 1, 0, 9, 1, 0x41, 200, 0x2A, 0x2A])
        #expect(m.masked(protocol: ProtocolNumber.pap, information: [2, 1, 0, 5, 0], direction: nil) == nil)
    }
}
