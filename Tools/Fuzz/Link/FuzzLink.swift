// libFuzzer target: a whole link, as the terminal's side of the line drives it. Line bytes go
// through our RFC 1662 decoder into `PPPLink` (LCP, authentication, IPCP, VJ) in the host role,
// and the IP packets it delivers into an `IPStack` with a TCP listener (port 80) and a UDP
// socket (port 53); what the stack sends goes back through the link.
//
// Input: a flags byte, then frames, each a 2-byte big-endian length and that many bytes: the
// PPP protocol number (2 bytes) and the information field. Flags:
//   bit 0  raw: the frame bytes go to the line as they are (no framing, no fix-ups), to reach
//          the decoder's own corners;
//   bit 1  fix-ups: a Configure-Ack for LCP or IPCP carries our last Configure-Request's
//          identifier and options (so negotiation can finish), and TCP segments take the
//          sequence and acknowledgment numbers the stack expects;
//   bit 2  the host requires PAP (user "terminal", password "secret"); bit 3 requires CHAP.
// Otherwise each frame is framed with FCS-16 and every control character escaped, and IPv4
// packets (protocol 0x0021) get their header and TCP/UDP/ICMP checksums fixed, so mutations
// reach the state machines instead of dying at a checksum. Frames arrive 100 virtual ms apart,
// with the link's and the stack's timers run in between. Nothing may trap; the stack's memory
// stays within its bounds.
import FuzzSupport
import Framing
import NetStack
import PPP

let host = IPv4Address(10, 0, 0, 1)
let terminal = IPv4Address(10, 0, 0, 2)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzLink(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let flags = input[0]
    let raw = flags & 1 != 0
    let fixUps = flags & 2 != 0

    var configuration = LinkConfiguration.host(local: host, terminal: terminal, dns: [IPv4Address(10, 0, 0, 53)])
    configuration.captureFrames = true
    configuration.authentication.peers = [Credentials(name: "terminal", secret: "secret")]
    if flags & 4 != 0 { configuration.lcp.requireAuthentication = .pap }
    if flags & 8 != 0 { configuration.lcp.requireAuthentication = .chapMD5 }
    var link = PPPLink(configuration: configuration, random: SplitMix64(seed: 1))
    var stackConfiguration = IPStackConfiguration(address: host)
    stackConfiguration.tcp.receiveBufferSize = 8192
    var stack = IPStack(configuration: stackConfiguration, seed: 2)
    try? stack.listen(port: 80)
    try? stack.bindUDP(port: 53)
    let encoder = HDLCEncoder(fcs: .fcs16, escapes: .allControlCharacters)
    var lastRequest: [ProtocolNumber: [UInt8]] = [:]
    var expected = TCPExpectations()
    var now = Instant.zero
    link.open(now: now)

    var i = 1
    while i + 2 <= input.count {
        let n = min(Int(input[i]) << 8 | Int(input[i + 1]), input.count - i - 2)
        var frame = Array(input[(i + 2)..<(i + 2 + n)])
        i += 2 + n
        if raw {
            link.receive(frame, now: now)
        } else if frame.count >= 2 {
            let proto = ProtocolNumber(UInt16(frame[0]) << 8 | UInt16(frame[1]))
            var information = Array(frame[2...])
            if fixUps, information.first == 2, let request = lastRequest[proto] {
                // RFC 1661 §5.2: an Ack repeats the request's identifier and options exactly.
                information = [2] + request.dropFirst()
            }
            if proto == .ipv4 {
                if fixUps { expected.apply(to: &information) }
                fixIPv4Checksums(&information)
            }
            frame = encoder.encode(protocol: proto, information: information)
            link.receive(frame, now: now)
        }
        for packet in link.takeReceivedIPPackets() { stack.receive(packet: packet, now: now) }
        if let id = stack.accept(port: 80) {
            FuzzDepth.count("tcp-established")
            _ = stack.read(id, now: now)
        }
        if stack.receiveDatagram(port: 53) != nil { FuzzDepth.count("udp-delivered") }
        for packet in stack.takeOutgoing() {
            expected.learn(from: packet)
            _ = link.send(ipPacket: packet, now: now)
        }
        _ = stack.takeEvents()
        drain(&link, lastRequest: &lastRequest)
        now = now + .milliseconds(100)
        if let p = link.pollAt, p <= now { link.poll(now: now) }
        if let p = stack.pollAt, p <= now { stack.poll(now: now) }
        drain(&link, lastRequest: &lastRequest)
        precondition(stack.reassemblyBytes.fragments <= stackConfiguration.reassembly.memory, "reassembly over its limit")
    }
    let counters = stack.counters
    FuzzDepth.count("datagrams-reassembled", counters.datagramsReassembled)
    FuzzDepth.count("tcp-segments-in", counters.tcp.segmentsReceived)
    link.close(now: now)
    drain(&link, lastRequest: &lastRequest)
    return 0
}

/// Takes what the link sent and said: our Configure-Requests (for the Ack fix-up) and how far
/// the link got.
func drain(_ link: inout PPPLink, lastRequest: inout [ProtocolNumber: [UInt8]]) {
    _ = link.takeTransmit()
    for (direction, frame) in link.takeCapturedFrames() where direction == .sent && frame.information.first == 1 {
        lastRequest[frame.protocol] = frame.information
    }
    for event in link.takeEvents() {
        switch event {
        case .lcpOpened: FuzzDepth.count("lcp-opened")
        case .authenticated: FuzzDepth.count("authenticated")
        case .ipcpOpened: FuzzDepth.count("ipcp-opened")
        default: break
        }
    }
}

#if FUZZING
@_cdecl("FuzzLink_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzLink)
}
#else
@main struct Replay {
    static func main() { replay(fuzzLink) }
}
#endif
