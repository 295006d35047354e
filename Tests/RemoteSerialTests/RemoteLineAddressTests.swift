import Testing
@testable import RemoteSerial

@Suite struct RemoteLineAddressTests {
    @Test func namesOfNetworkLinesParse() throws {
        let raw = try RemoteLineAddress.parse("tcp:127.0.0.1:17501").get()
        #expect(raw == RemoteLineAddress(kind: .tcp, host: .ipv4([127, 0, 0, 1]), port: 17501))
        #expect(raw.description == "tcp:127.0.0.1:17501")
        let telnet = try RemoteLineAddress.parse("rfc2217:localhost:2001").get()
        #expect(telnet == RemoteLineAddress(kind: .rfc2217, host: .ipv4([127, 0, 0, 1]), port: 2001))
        let v6 = try RemoteLineAddress.parse("tcp:[::1]:4001").get()
        #expect(v6.host == .ipv6([UInt8](repeating: 0, count: 15) + [1]))
        #expect(v6.description == "tcp:[0:0:0:0:0:0:0:1]:4001")
        let mapped = try RemoteLineAddress.parse("rfc2217:[::ffff:192.0.2.7]:7000").get()
        #expect(mapped.host == .ipv6([UInt8](repeating: 0, count: 10) + [0xFF, 0xFF, 192, 0, 2, 7]))
        let full = try RemoteLineAddress.parse("tcp:[2001:db8:0:0:0:0:0:2]:1").get()
        #expect(full.host == .ipv6([0x20, 0x01, 0x0D, 0xB8] + [UInt8](repeating: 0, count: 11) + [2]))
    }

    @Test func whatIsNotANetworkLineOrIsMalformedIsRefusedWithAReason() throws {
        #expect(!RemoteLineAddress.isNetworkName("/dev/ttyACM0"))
        #expect(RemoteLineAddress.parse("/dev/ttyACM0") == .failure(.notANetworkLine))
        #expect(RemoteLineAddress.parse("tcp:127.0.0.1") == .failure(.noPort))
        #expect(RemoteLineAddress.parse("tcp:") == .failure(.noPort))
        #expect(try RemoteLineAddress.parse("tcp:LocalHost:80").get().host == .ipv4([127, 0, 0, 1]))
        for port in ["0", "65536", "+17", "-1", "1e3", "", "0x10", "123456", " 80", "080", "00080"] {
            #expect(RemoteLineAddress.parse("tcp:127.0.0.1:\(port)") == .failure(.badPort), "\(port)")
        }
        for host in ["", "example.com", "127.0.0.256", "127.0.0", "0127.0.0.1", "010.0.0.1", "1.2.3.4.5", "[::1", "[]", "[1:2:3:4:5:6:7:8:9]",
                     "[1::2::3]", "[12345::]", "[::g]", "[::1.2.3]",
                     "0.0.0.0", "[::]", "[fe80::1]", "[FE80::abcd]"] {
            #expect(RemoteLineAddress.parse("rfc2217:\(host):80") == .failure(.badHost), "\(host)")
        }
    }
}
