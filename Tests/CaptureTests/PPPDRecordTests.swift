import Capture
import Crypto
import Foundation
import Framing
import NetStack
import PPP
import Testing
import TestSupport

/// The three raw async streams pppd recorded against slirp: our de-framer must give exactly
/// the frames `pppdump -p` gives, with every FCS good, and the MANIFEST's facts.
@Suite struct PPPDRecordTests {
    static let files = ["pppd-record_default", "pppd-record_escaped", "pppd-record_pap"]

    /// Reads `TZ=UTC pppdump -p FILE` output: each `sent`/`rcvd` entry's hex bytes.
    static func pppdumpFrames(_ name: String) throws -> [(Direction, [UInt8])] {
        let text = try String(contentsOfFile: try Traces.path(name + ".pppdump.txt"), encoding: .utf8)
        var frames: [(Direction, [UInt8])] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let hexPart: Substring
            if line.hasPrefix("sent  ") || line.hasPrefix("rcvd  ") {
                frames.append((line.hasPrefix("sent") ? .sent : .received, []))
                hexPart = line.dropFirst(6)
            } else if line.hasPrefix("      ") {
                hexPart = line.dropFirst(6)
            } else {
                continue
            }
            // 16 bytes of "xx " then the ASCII column; the hex column is 48 characters wide.
            let bytes = hexPart.prefix(48).split(separator: " ").map { UInt8($0, radix: 16)! }
            frames[frames.count - 1].1 += bytes
        }
        return frames
    }

    @Test(arguments: files)
    func framesEqualPppdump(name: String) throws {
        let trace = try Traces.load(name + ".pppd")
        let expected = try PPPDRecordTests.pppdumpFrames(name)
        #expect(!expected.isEmpty)
        #expect(trace.frames.count == expected.count)
        for (ours, theirs) in zip(trace.frames, expected) {
            #expect(ours.direction == theirs.0, "frame #\(ours.number)")
            #expect(ours.frame.packet == theirs.1, "frame #\(ours.number)")
        }
        // Zero FCS errors and nothing else dropped, in either direction.
        #expect(trace.sentCounters.droppedFrames == 0 && trace.receivedCounters.droppedFrames == 0)
        #expect(trace.sentCounters.badFCS == 0 && trace.receivedCounters.badFCS == 0)
        // The trailing 0x03 (end of sent data) is an entry, not a cut-off file.
        #expect(trace.truncatedAt == nil)
    }

    @Test(arguments: [
        ("pppd-record_default.pppd", "daa7e1825f5bfa4e05889d1f97d8b6b8df78b311ccadcdfe9dc4d23a4cbddf0e"),
        ("pppd-record_escaped.pppd", "c968e047a81373fb648d63c38c052c170f0042bd0c66b35ff9161cda82ebf74e"),
        ("pppd-record_pap.pppd", "89981b879fd155f1cb440ce222de655437d4ea451f9e806e214d484974af631b"),
    ])
    func traceFilesAreTheManifestOnes(name: String, sha256: String) throws {
        let data = try #require(FileManager.default.contents(atPath: try Traces.path(name)))
        #expect(Digest.hex(try #require(Digest.hash(.sha256, [UInt8](data)))) == sha256)
    }

    /// Direction and payload bytes of every data entry, for the byte-level facts.
    static func rawStream(_ name: String, _ direction: Direction) throws -> [UInt8] {
        let data = try #require(FileManager.default.contents(atPath: try Traces.path(name)))
        let record = try PPPDRecord(bytes: [UInt8](data))
        return record.events.flatMap { e -> [UInt8] in
            if case let .data(d, bytes, _) = e, d == direction { return bytes }
            return []
        }
    }

    func protocolCounts(_ t: Trace, _ d: Direction) -> [ProtocolNumber: Int] {
        t.frames.filter { $0.direction == d }.reduce(into: [:]) { $0[$1.frame.protocol, default: 0] += 1 }
    }

    @Test func defaultSession() throws {
        let name = "pppd-record_default.pppd"
        let t = try Traces.load(name)
        let sentBytes = try PPPDRecordTests.rawStream(name, .sent)
        let receivedBytes = try PPPDRecordTests.rawStream(name, .received)
        #expect(sentBytes.starts(with: [0x7E, 0xFF, 0x7D, 0x23, 0xC0, 0x21, 0x7D, 0x21, 0x7D, 0x21, 0x7D, 0x20, 0x7D, 0x34]))
        #expect(t.frames.count == 99)
        #expect(t.frames.filter { $0.direction == .sent }.count == 50)
        #expect(try t.lcpOptions(1) == [.asyncControlCharacterMap(0), .magicNumber(0x0CF6_7E7E), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.lcpOptions(2) == [.maximumReceiveUnit(1500), .magicNumber(0x3F8D_7100), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.control(3).1.code == ControlCode.configureAck && t.control(4).1.code == ControlCode.configureAck)
        #expect(try t.ipcpOptions(5) == [.ipAddress(.any), .compression(protocol: .vjCompressedTCP, data: [15, 1])])
        let (ccp, emptyRequest) = try t.control(6)
        #expect(ccp == ProtocolNumber.ccp && emptyRequest.code == ControlCode.configureRequest && emptyRequest.data.isEmpty)
        #expect(try t.ipcpOptions(7) == [.compression(protocol: .vjCompressedTCP, data: [15, 1]), .ipAddress(.any)])
        #expect(try t.control(8).1.code == ControlCode.configureNak)
        #expect(try t.ipcpOptions(8) == [.ipAddress(IPv4Address(10, 0, 2, 15))])
        #expect(try t.ipcpOptions(9) == [.ipAddress(IPv4Address(10, 0, 2, 2))])
        #expect(try t.ipcpOptions(10) == [.ipAddress(IPv4Address(10, 0, 2, 2)), .compression(protocol: .vjCompressedTCP, data: [15, 1])])
        #expect(t.text(11) == ["LCP ProtRej id=0x2 80 fd 01 01 00 04"])
        #expect(try t.ipcpOptions(12) == [.compression(protocol: .vjCompressedTCP, data: [15, 1]), .ipAddress(IPv4Address(10, 0, 2, 15))])
        #expect(try t.control(13).1.code == ControlCode.configureAck && t.control(14).1.code == ControlCode.configureAck)
        for n in 15...20 {
            let text = try #require(t.text(n).first)
            #expect(text.contains("ICMP echo") && t.frames(n)[0].frame.information.count == 84)
        }
        #expect(t.text(21).first?.hasPrefix("IP 10.0.2.15 > 10.0.2.2 TCP 42184 > 9000 S ") == true)
        #expect(t.text(21).first?.contains("mss 1460") == true)
        #expect(t.frames(23)[0].frame.protocol == ProtocolNumber.vjUncompressedTCP && t.frames(23)[0].direction == .sent)
        #expect(t.frames(25)[0].frame.protocol == ProtocolNumber.vjUncompressedTCP && t.frames(25)[0].direction == .received)
        #expect(protocolCounts(t, .sent) == [.lcp: 4, .ipcp: 4, .ipv4: 7, .vjUncompressedTCP: 2, .vjCompressedTCP: 33])
        #expect(protocolCounts(t, .received) == [.lcp: 3, .ipcp: 4, .ccp: 1, .ipv4: 7, .vjUncompressedTCP: 2, .vjCompressedTCP: 32])
        // Escapes and flags on the line.
        #expect(sentBytes.filter { $0 == 0x7D }.count == 4615)
        #expect(receivedBytes.filter { $0 == 0x7D }.count == 105)
        #expect(sentBytes.filter { $0 == 0x7E }.count == 55)
        #expect(receivedBytes.filter { $0 == 0x7E }.count == 57)
        // slirp honours ACCM 0: outside LCP only 0x7D and 0x7E are escaped.
        let escapedOutsideLCP = escapedValues(receivedBytes, skippingLCP: true)
        #expect(escapedOutsideLCP == [0x7D: 32, 0x7E: 32])
        #expect(t.text(98) == ["LCP TermReq id=0x3 \"User request\""])
        #expect(t.text(99) == ["LCP TermAck id=0x3"])
    }

    @Test func escapedSession() throws {
        let name = "pppd-record_escaped.pppd"
        let t = try Traces.load(name)
        #expect(t.frames.count == 101)
        #expect(try t.lcpOptions(1) == [.maximumReceiveUnit(576), .magicNumber(0x89A3_0B1F), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.lcpOptions(2) == [.maximumReceiveUnit(1500), .magicNumber(0x62A3_6551), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(t.text(7) == ["LCP EchoReq id=0x0 magic=0x89a30b1f"])
        #expect(t.text(8) == ["LCP EchoRep id=0x0 magic=0x62a36551"])
        let lcp = try t.frames.filter { $0.frame.protocol == ProtocolNumber.lcp }.map { ($0, try ControlPacket(parsing: $0.frame.information)) }
        let requests = lcp.filter { $0.1.code == ControlCode.echoRequest }
        let replies = lcp.filter { $0.1.code == ControlCode.echoReply }
        #expect(requests.map(\.1.identifier) == Array(0...10))
        #expect(replies.map(\.1.identifier) == Array(0...10))
        for (request, reply) in zip(requests, replies) { #expect(reply.0.number == request.0.number + 1) }
        #expect(try t.ipcpOptions(5) == [.ipAddress(.any), .compression(protocol: .vjCompressedTCP, data: [15, 1])])
        #expect(try t.ipcpOptions(9) == [.ipAddress(.any)])
        #expect(try t.ipcpOptions(10) == [.ipAddress(IPv4Address(10, 0, 2, 15))])
        #expect(try t.control(11).1.code == ControlCode.configureReject)
        #expect(try t.ipcpOptions(11) == [.compression(protocol: .vjCompressedTCP, data: [15, 1])])
        #expect(try t.ipcpOptions(12) == [.ipAddress(.any)])
        #expect(try t.control(13).1.code == ControlCode.protocolReject)
        #expect(try t.ipcpOptions(14) == [.ipAddress(IPv4Address(10, 0, 2, 15))])
        #expect(try t.control(15).1.code == ControlCode.configureAck)
        #expect(try t.control(16).1.code == ControlCode.configureNak && t.ipcpOptions(16) == [.ipAddress(IPv4Address(10, 0, 2, 2))])
        #expect(try t.control(17).1.identifier == 3 && t.ipcpOptions(17) == [.ipAddress(IPv4Address(10, 0, 2, 2))])
        #expect(try t.control(18).1.code == ControlCode.configureAck)
        #expect(t.frames.allSatisfy { $0.frame.protocol != ProtocolNumber.vjCompressedTCP && $0.frame.protocol != ProtocolNumber.vjUncompressedTCP })
        let tcp = t.frames.filter { $0.frame.protocol == ProtocolNumber.ipv4 && $0.frame.information[9] == IPProtocol.tcp.rawValue }
        #expect(tcp.filter { $0.direction == .sent }.count == 28)
        #expect(tcp.filter { $0.direction == .received }.count == 27)
        let sentBytes = try PPPDRecordTests.rawStream(name, .sent)
        let receivedBytes = try PPPDRecordTests.rawStream(name, .received)
        #expect(sentBytes.filter { $0 == 0x7D }.count == 1644)
        #expect(receivedBytes.filter { $0 == 0x7D }.count == 1621)
        // Every control character, 0x7D and 0x7E went escaped both ways, in IP frames too.
        let everyEscapable = Set(Array(0x00...0x1F) + [0x7D, 0x7E])
        #expect(Set(escapedValues(sentBytes, skippingLCP: true).keys.map(Int.init)) == everyEscapable)
        #expect(Set(escapedValues(receivedBytes, skippingLCP: true).keys.map(Int.init)) == everyEscapable)
        // MRU 576: slirp's largest frame is 555 bytes with its FCS (553 without).
        let largest = try #require(t.frames.filter { $0.direction == .received }.map(\.frame).max { $0.packet.count < $1.packet.count })
        #expect(largest.packet.count + FCSKind.fcs16.byteCount == 555 && largest.information.count <= 576)
        #expect(t.text(100) == ["LCP TermReq id=0x3 \"User request\""])
        #expect(t.text(101) == ["LCP TermAck id=0x3"])
    }

    @Test func papSession() throws {
        let name = "pppd-record_pap.pppd"
        let t = try Traces.load(name)
        #expect(t.frames.count == 35)
        #expect(try t.lcpOptions(1) == [.asyncControlCharacterMap(0), .magicNumber(0xE714_D289), .protocolFieldCompression, .addressControlFieldCompression])
        #expect(try t.lcpOptions(2) == [.maximumReceiveUnit(1500), .authenticationProtocol(ProtocolNumber.pap, data: []),
                                        .magicNumber(0xA0DC_CD88), .protocolFieldCompression, .addressControlFieldCompression])
        let request = t.frames(5)[0]
        #expect(request.direction == .sent)
        #expect(request.frame.packet.starts(with: [0xC0, 0x23, 0x01, 0x01, 0x00, 0x19, 0x06]))
        #expect(try PAPPacket(t.control(5).1) == .authenticateRequest(identifier: 1, peerID: Array("vmpeer".utf8), password: Array("vmpeer-secret".utf8)))
        #expect(try PAPPacket(t.control(6).1) == .authenticateAck(identifier: 1, message: Array("Login ok".utf8)))
        #expect(t.text(5) == ["PAP AuthReq id=0x1 user=\"vmpeer\" password=<hidden>"])
        #expect(try t.control(13).1.code == ControlCode.protocolReject)
        let sent = protocolCounts(t, .sent), received = protocolCounts(t, .received)
        #expect(sent[ProtocolNumber.vjUncompressedTCP] == 1 && sent[ProtocolNumber.vjCompressedTCP] == 3)
        #expect(received[ProtocolNumber.vjUncompressedTCP] == 1 && received[ProtocolNumber.vjCompressedTCP] == 2)
        #expect(t.text(34) == ["LCP TermReq id=0x3 \"User request\""])
        #expect(t.text(35) == ["LCP TermAck id=0x3"])
    }

    /// Counts, per original value, the bytes sent escaped in `stream`, optionally leaving out
    /// LCP frames (which escape every control character whatever the ACCM).
    func escapedValues(_ stream: [UInt8], skippingLCP: Bool) -> [UInt8: Int] {
        var counts: [UInt8: Int] = [:]
        var frame: [UInt8] = []
        var escapedInFrame: [UInt8] = []
        var escaped = false
        for b in stream {
            if b == 0x7E {
                let isLCP = frame.starts(with: [0xFF, 0x03, 0xC0, 0x21]) || frame.starts(with: [0xC0, 0x21])
                if !(skippingLCP && isLCP) { for v in escapedInFrame { counts[v, default: 0] += 1 } }
                frame = []
                escapedInFrame = []
                continue
            }
            if b == 0x7D { escaped = true; continue }
            let v = escaped ? b ^ 0x20 : b
            if escaped { escapedInFrame.append(v) }
            escaped = false
            frame.append(v)
        }
        return counts
    }
}

/// VJ decompression against the pppd record with VJ both ways (pppd's Linux slhc one way,
/// slirp's compressor the other): every compressed frame rebuilds into a packet whose checksums
/// verify, and the two transfers reassemble to the MANIFEST's SHA-256 values.
@Suite struct VJTraceTests {
    @Test func recordedVJSessionDecompressesToTheManifestDigests() throws {
        let trace = try Traces.load("pppd-record_default.pppd")
        var decompressors: [Direction: VJDecompressor] = [.sent: VJDecompressor(parameters: VJParameters()), .received: VJDecompressor(parameters: VJParameters())]
        var streams: [String: [UInt32: [UInt8]]] = [:]
        var compressedFrames = 0
        var compressor: [Direction: VJCompressor] = [.sent: VJCompressor(parameters: VJParameters()), .received: VJCompressor(parameters: VJParameters())]
        for f in trace.frames {
            let direction = try #require(f.direction)
            let packet: [UInt8]?
            switch f.frame.protocol {
            case .vjCompressedTCP:
                compressedFrames += 1
                packet = decompressors[direction]!.compressed(f.frame.information)
            case .vjUncompressedTCP: packet = decompressors[direction]!.uncompressed(f.frame.information)
            case .ipv4: packet = f.frame.information
            default: continue
            }
            let p = try #require(packet, "frame #\(f.number) did not decompress")
            let (ip, tcp, payload) = try p.withUnsafeBytes { raw -> (IPv4Header, TCPHeader?, [UInt8]) in
                let ip = try IPv4Header(parsing: raw)
                #expect(IPv4Header.checksumValid(UnsafeRawBufferPointer(rebasing: raw[0..<ip.headerLength])), "IP checksum of #\(f.number)")
                guard ip.protocol == IPProtocol.tcp else { return (ip, nil, []) }
                let segment = UnsafeRawBufferPointer(rebasing: raw[ip.headerLength..<ip.totalLength])
                #expect(IPPacketPrinter.transportChecksumValid(ip, segment), "TCP checksum of #\(f.number)")
                let tcp = try TCPHeader(parsing: segment)
                return (ip, tcp, Array(segment[tcp.headerLength...]))
            }
            _ = ip
            // Our compressor, fed the same packets, must produce what our decompressor restores.
            if tcp != nil {
                let (proto, bytes) = compressor[direction]!.compress(p)
                var check = VJDecompressor(parameters: VJParameters())
                if proto == 0x002F { #expect(check.uncompressed(bytes) == p) }
            }
            if let tcp, !payload.isEmpty {
                streams["\(tcp.sourcePort)>\(tcp.destinationPort)", default: [:]][tcp.sequenceNumber.rawValue] = payload
            }
        }
        #expect(compressedFrames == 65)
        #expect(decompressors.values.allSatisfy { $0.errors == 0 && $0.tossed == 0 })
        /// One direction of a connection, by its source or destination port.
        func assemble(_ direction: (String) -> Bool) -> [UInt8] {
            let pieces = (streams.first { direction($0.key) }?.value ?? [:]).sorted { $0.key < $1.key }
            var out: [UInt8] = []
            var next = pieces.first?.key ?? 0
            for (seq, bytes) in pieces where seq == next {
                out += bytes
                next = seq &+ UInt32(bytes.count)
            }
            return out
        }
        let upload = assemble { $0.hasSuffix(">9000") }
        #expect(upload.count == 20000)
        #expect(Digest.hex(Digest.hash(.sha256, upload)!) == "75af5fcf1fdb4e79a5a0ec92c697ee90d1d3b87b6f2c50c1dbf668c089743894")
        let http = assemble { $0.hasPrefix("8080>") }
        let headerEnd = try #require(http.firstRange(of: [13, 10, 13, 10]))
        let body = Array(http[headerEnd.upperBound...])
        #expect(body.count == 8192)
        #expect(Digest.hex(Digest.hash(.sha256, body)!) == "dc404a613fedaeb54034514bc6505f56b933caa5250299ba7d094377a51caa46")
    }
}
