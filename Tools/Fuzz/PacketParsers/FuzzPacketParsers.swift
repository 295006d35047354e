// libFuzzer target: the packet parsers `pppbridge decode` uses.
//
// The first byte picks what the rest is: a PPP packet (header included) for the frame printer,
// a control packet with its options, an IPv4 packet, a capture record of one of the link
// types for the tunnel decoder, or a SOCKS handshake as the channel's proxy reads it. Nothing
// may trap; parsed values must emit what was parsed; the SOCKS parser must reach the same end
// however its input is cut.
import Capture
import Framing
import NetStack
import PPP
import Proxy
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPacketParsers(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 1 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let body = Array(input[1...])
    switch input[0] % 5 {
    case 0:
        if let frame = PPPFrame(packet: body) {
            _ = FramePrinter.describe(frame, showPassword: true)
            precondition(PPPFrame(packet: frame.packet) == frame, "a PPP header did not round-trip")
        }
    case 1:
        if let packet = try? ControlPacket(parsing: body) {
            // A packet that parsed fits its length field, so it emits and parses back the same.
            guard let emitted = try? packet.emit() else { preconditionFailure("a parsed packet did not emit") }
            precondition((try? ControlPacket(parsing: emitted)) == packet, "a control packet did not round-trip")
            if let options = try? ConfigurationOption.parseList(packet.data) {
                precondition((try? ConfigurationOption.emitList(options)) == packet.data, "options did not round-trip")
                for o in options {
                    precondition(LCPOption(o).option == o && IPCPOption(o).option == o, "an option did not round-trip")
                }
            }
            for proto: ProtocolNumber in [.lcp, .ipcp, .ccp, .ipv6cp, .pap, .chap] {
                _ = ControlProtocolPrinter.describe(protocol: proto, information: body, showPassword: true)
            }
        }
    case 2:
        _ = IPPacketPrinter.describe(body)
        _ = body.withUnsafeBytes { try? VJCompressedHeader(parsing: $0) }
    case 4:
        // First bytes with bit 3 set configure a password, so both SOCKS5 methods and the SOCKS4
        // refusal run.
        let passwords: [String: String]? = input[0] & 0x08 != 0 ? ["user": "secret"] : nil
        if case let .request(r, _)? = socksStepsWhateverTheCut(body, passwords: passwords).last {
            _ = SocksNegotiation.successReply(for: r, bound: IPv4Address(127, 0, 0, 1), port: 1080)
            _ = r.host.description
        }
    default:
        for linkType in LinkType.allCases {
            for carried in Encapsulation.contents(linkType: linkType.rawValue, record: body).frames {
                _ = FramePrinter.describe(carried.frame)
            }
        }
    }
    return 0
}

#if FUZZING
@_cdecl("FuzzPacketParsers_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runFuzzer(argc, argv, fuzzPacketParsers)
}
#else
@main struct Replay {
    static func main() { replay(fuzzPacketParsers) }
}
#endif
