import Capture
import Foundation
import Framing
import Glibc
import NetStack
import PPP
import Testing
import TestSupport

/// Capture files built byte by byte, as a hostile file would be.
enum CraftedCapture {
    static func le16(_ v: UInt16) -> [UInt8] { [UInt8(v & 0xFF), UInt8(v >> 8)] }
    static func le32(_ v: UInt32) -> [UInt8] { le16(UInt16(v & 0xFFFF)) + le16(UInt16(v >> 16)) }
    static func le64(_ v: UInt64) -> [UInt8] { le32(UInt32(v & 0xFFFF_FFFF)) + le32(UInt32(v >> 32)) }

    /// An LCP Echo-Request in DLT_PPP form.
    static let lcpEcho: [UInt8] = [0xFF, 0x03, 0xC0, 0x21, 0x09, 0x01, 0x00, 0x08, 0x12, 0x34, 0x56, 0x78]

    /// Classic pcap, microsecond stamps, the given link type, one record per (seconds, microseconds, data).
    static func pcap(linkType: UInt32, _ records: [(UInt32, UInt32, [UInt8])]) -> [UInt8] {
        var out: [UInt8] = [0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0] + le32(0) + le32(0) + le32(65535) + le32(linkType)
        for (s, us, data) in records {
            out += le32(s) + le32(us) + le32(UInt32(data.count)) + le32(UInt32(data.count)) + data
        }
        return out
    }

    /// pcapng: a section header, an interface (DLT_PPP) with if_tsresol `resolution`, and one
    /// enhanced packet block per 64-bit time stamp.
    static func pcapng(resolution: UInt8, stamps: [UInt64], data: [UInt8]) -> [UInt8] {
        func block(_ type: UInt32, _ body: [UInt8]) -> [UInt8] {
            let length = UInt32(12 + body.count)
            return le32(type) + le32(length) + body + le32(length)
        }
        var out = block(0x0A0D_0D0A, le32(0x1A2B_3C4D) + le16(1) + le16(0) + le64(.max))
        // if_tsresol (9), length 1, padded to 4; then opt_endofopt.
        out += block(1, le16(9) + le16(0) + le32(0) + le16(9) + le16(1) + [resolution, 0, 0, 0] + le32(0))
        let padded = data + [UInt8](repeating: 0, count: (4 - data.count % 4) % 4)
        for t in stamps {
            out += block(6, le32(0) + le32(UInt32(t >> 32)) + le32(UInt32(t & 0xFFFF_FFFF)) + le32(UInt32(data.count))
                + le32(UInt32(data.count)) + padded)
        }
        return out
    }

    static func write(_ bytes: [UInt8], _ name: String, in scratch: ScratchDirectory) -> String {
        let path = scratch.path + "/" + name
        _ = FileManager.default.createFile(atPath: path, contents: Data(bytes))
        return path
    }
}

@Suite struct HostileTimeStampTests {
    @Test func microsecondsPastInt32AreNormalisedAndCounted() throws {
        let scratch = try ScratchDirectory()
        let path = CraftedCapture.write(CraftedCapture.pcap(linkType: 9, [(10, 0x7FFF_FFFF, CraftedCapture.lcpEcho),
                                                                          (10, 0x8000_0000, CraftedCapture.lcpEcho)]), "usec.pcap", in: scratch)
        let t = try Trace(path: path)
        #expect(t.frames.count == 2)
        #expect(t.recordsWithAdjustedTime == 2)
        for f in t.frames { #expect((0..<1_000_000).contains(f.time.microseconds)) }
        let gap = t.frames[1].time.interval(since: t.frames[0].time)
        print("out-of-range microseconds: times \(t.frames.map(\.time)), gap \(gap) s")
        #expect(gap.isFinite)
    }

    @Test func pcapngSecondsNearTwoToTheSixtyThirdGiveFiniteIntervals() throws {
        let scratch = try ScratchDirectory()
        let path = CraftedCapture.write(CraftedCapture.pcapng(resolution: 0, stamps: [0x8000_0000_0000_0005, 0x7FFF_FFFF_FFFF_FFF0, 3],
                                                              data: CraftedCapture.lcpEcho), "resol0.pcapng", in: scratch)
        let t = try Trace(path: path)
        #expect(t.frames.count == 3)
        for f in t.frames {
            #expect(f.time.interval(since: t.origin).isFinite)
            #expect(t.origin.interval(since: f.time).isFinite)
        }
        print("pcapng if_tsresol 0: times \(t.frames.map(\.time))")
    }

    @Test func extremeTimesNeverOverflow() {
        let far = CaptureTime(seconds: .max, microseconds: 999_999)
        let before = CaptureTime(seconds: .min, microseconds: 0)
        #expect(far.interval(since: before).isFinite && before.interval(since: far) < 0)
        #expect(CaptureTime.normalised(seconds: .max, microseconds: .max).time.seconds == .max)
        #expect(CaptureTime.normalised(seconds: .min, microseconds: .min).time.seconds == .min)
        #expect(CaptureTime.normalised(seconds: 5, microseconds: -1).time == CaptureTime(seconds: 4, microseconds: 999_999))
        #expect(CaptureTime(tenthsOfSeconds: .max, since: .max).seconds == .max)
    }
}

@Suite struct TunnelledPPPTests {
    static let lcp: [UInt8] = [0xFF, 0x03, 0xC0, 0x21, 0x09, 0x07, 0x00, 0x08, 0xC1, 0x34, 0x39, 0x22]

    static func ethernet(_ tags: [UInt16], etherType: UInt16, _ payload: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0x02, count: 12)
        for (i, tpid) in tags.enumerated() { out += BigEndian.bytes(tpid) + BigEndian.bytes(UInt16(100 + i)) }
        return out + BigEndian.bytes(etherType) + payload
    }

    static func ipv4(_ proto: IPProtocol, _ payload: [UInt8]) -> [UInt8] {
        IPv4Header(protocol: proto, source: IPv4Address(10, 0, 0, 1), destination: IPv4Address(10, 0, 0, 2), payloadLength: payload.count).emit() + payload
    }

    /// An IPv6 header whose chain starts with `extensions` (next header, then their bytes).
    static func ipv6(_ firstNext: IPProtocol, _ payload: [UInt8]) -> [UInt8] {
        [0x60, 0, 0, 0] + BigEndian.bytes(UInt16(payload.count)) + [firstNext.rawValue, 64] + [UInt8](repeating: 0x20, count: 32) + payload
    }

    /// Enhanced GRE (RFC 2637 §4.1) with key (payload length, call id) and a sequence number.
    static func pptpGRE(_ ppp: [UInt8]) -> [UInt8] {
        [0x30, 0x01, 0x88, 0x0B] + BigEndian.bytes(UInt16(ppp.count)) + [0x00, 0x2A] + [0, 0, 0, 1] + ppp
    }

    static func l2tpUDP(_ ppp: [UInt8]) -> [UInt8] {
        let l2tp: [UInt8] = [0x00, 0x02, 0x4A, 0x32, 0xD3, 0x5E] + ppp
        return BigEndian.bytes(UInt16(1701)) + BigEndian.bytes(UInt16(1701)) + BigEndian.bytes(UInt16(8 + l2tp.count)) + [0, 0] + l2tp
    }

    func frames(_ record: [UInt8]) -> RecordContents { Encapsulation.contents(linkType: 1, record: record) }

    @Test func pptpUnderStackedVLANsIPv6AndIPv4IsFound() {
        // Ethernet, 802.1ad and 802.1Q tags, IPv6 with a hop-by-hop and a destination options
        // header, IPv4 inside it, enhanced GRE, PPP: the shape of the public capture tshark reads.
        let hopByHop: [UInt8] = [60, 0, 1, 4, 0, 0, 0, 0]
        let destination: [UInt8] = [4, 1] + [UInt8](repeating: 1, count: 14)
        let inner = TunnelledPPPTests.ipv4(IPProtocol.gre, TunnelledPPPTests.pptpGRE(TunnelledPPPTests.lcp))
        let record = TunnelledPPPTests.ethernet([0x88A8, 0x8100], etherType: 0x86DD, TunnelledPPPTests.ipv6(IPProtocol(0), hopByHop + destination + inner))
        let c = frames(record)
        #expect(c.frames.count == 1)
        #expect(c.frames.first?.frame.protocol == ProtocolNumber.lcp)
        #expect(c.frames.first?.via == ["VLAN 100", "VLAN 101", "GRE call 42"])
        #expect(c.problems.isEmpty)
    }

    @Test func everyTagTypeAndOuterHeaderIsWalked() {
        let gre = TunnelledPPPTests.pptpGRE(TunnelledPPPTests.lcp)
        let cases: [(String, [UInt8])] = [
            ("0x9100 tag", TunnelledPPPTests.ethernet([0x9100], etherType: 0x0800, TunnelledPPPTests.ipv4(IPProtocol.gre, gre))),
            ("PPPoE under a tag", TunnelledPPPTests.ethernet([0x8100], etherType: 0x8864,
                                                             [0x11, 0x00, 0x00, 0x11, 0x00, UInt8(TunnelledPPPTests.lcp.count - 2)] + Array(TunnelledPPPTests.lcp.dropFirst(2)))),
            ("IPv4 in IPv4", TunnelledPPPTests.ethernet([], etherType: 0x0800, TunnelledPPPTests.ipv4(IPProtocol(4), TunnelledPPPTests.ipv4(IPProtocol.gre, gre)))),
            ("IPv6 in IPv4", TunnelledPPPTests.ethernet([], etherType: 0x0800, TunnelledPPPTests.ipv4(IPProtocol(41), TunnelledPPPTests.ipv6(IPProtocol.gre, gre)))),
            ("IPv4 in IPv6", TunnelledPPPTests.ethernet([], etherType: 0x86DD, TunnelledPPPTests.ipv6(IPProtocol(4), TunnelledPPPTests.ipv4(IPProtocol.gre, gre)))),
            ("L2TP over IPv6", TunnelledPPPTests.ethernet([], etherType: 0x86DD, TunnelledPPPTests.ipv6(IPProtocol.udp, TunnelledPPPTests.l2tpUDP(TunnelledPPPTests.lcp)))),
            ("atomic IPv6 fragment", TunnelledPPPTests.ethernet([], etherType: 0x86DD, TunnelledPPPTests.ipv6(IPProtocol(44), [IPProtocol.gre.rawValue, 0, 0, 0, 0, 0, 0, 7] + gre))),
        ]
        for (name, record) in cases {
            let c = frames(record)
            #expect(c.frames.map(\.frame.protocol) == [ProtocolNumber.lcp], "\(name)")
        }
    }

    @Test func hostileHeadersAreBoundedNotTrusted() {
        let gre = TunnelledPPPTests.pptpGRE(TunnelledPPPTests.lcp)
        // Fifty IPv4-in-IPv4 layers: the walk stops at its depth, finds nothing and does not recurse on.
        var deep = TunnelledPPPTests.ipv4(IPProtocol.gre, gre)
        for _ in 0..<50 { deep = TunnelledPPPTests.ipv4(IPProtocol(4), deep) }
        #expect(frames(TunnelledPPPTests.ethernet([], etherType: 0x0800, deep)).frames.isEmpty)
        // Within the bound it is found.
        var shallow = TunnelledPPPTests.ipv4(IPProtocol.gre, gre)
        for _ in 0..<3 { shallow = TunnelledPPPTests.ipv4(IPProtocol(4), shallow) }
        #expect(frames(TunnelledPPPTests.ethernet([], etherType: 0x0800, shallow)).frames.count == 1)
        // An extension header whose length runs past the packet, a chain of 200 of them, a
        // fragment that is not the whole packet, a payload length beyond the record, a record
        // cut inside its tags: nothing found, nothing read past the end.
        let overrun = TunnelledPPPTests.ipv6(IPProtocol(0), [IPProtocol.gre.rawValue, 200, 0, 0, 0, 0, 0, 0] + gre)
        let chain = TunnelledPPPTests.ipv6(IPProtocol(60), (0..<200).flatMap { _ in [60, 0, 0, 0, 0, 0, 0, 0] as [UInt8] } + gre)
        let fragment = TunnelledPPPTests.ipv6(IPProtocol(44), [IPProtocol.gre.rawValue, 0, 0, 1, 0, 0, 0, 7] + gre)
        var lying = TunnelledPPPTests.ipv6(IPProtocol.gre, gre)
        lying[4] = 0xFF
        for (name, record) in [("overrun", TunnelledPPPTests.ethernet([], etherType: 0x86DD, overrun)),
                               ("chain", TunnelledPPPTests.ethernet([], etherType: 0x86DD, chain)),
                               ("fragment", TunnelledPPPTests.ethernet([], etherType: 0x86DD, fragment)),
                               ("payload length", TunnelledPPPTests.ethernet([], etherType: 0x86DD, lying)),
                               ("cut tags", Array(TunnelledPPPTests.ethernet(Array(repeating: 0x8100, count: 20), etherType: 0x0800, []).prefix(30)))] {
            #expect(frames(record).frames.isEmpty, "\(name)")
        }
    }
}
