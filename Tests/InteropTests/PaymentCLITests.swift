import ChannelTestSupport
import Foundation
import Glibc
import Testing

/// The payment commands as a person runs them: `pppbridge gateway` and `pppbridge terminal` as
/// processes, then `pppbridge pay`, `refund`, `reader discover|connect|update` against them.
@Suite(.serialized, .timeLimit(.minutes(10))) struct PaymentCLITests {
    final class Service {
        let child: ChildProcess
        let log: String
        init(_ arguments: [String], log: String) throws {
            self.log = log
            child = try ChildProcess(BridgeProcess.binary, arguments, output: log)
        }
        var output: String { String(decoding: FileManager.default.contents(atPath: log) ?? Data(), as: UTF8.self) }
        func stop() -> Int32? {
            child.signal(SIGTERM)
            let status = child.wait(15)
            child.reap()
            return status
        }
    }

    @Test func payRefundAndUpdateFromTheCommandLine() throws {
        let directory = NSTemporaryDirectory() + "pppbridge-paycli-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let port = Host.freePort()
        let gateway = try Service(["gateway", "--port", "\(port)", "--offer-update", "1.1.0", "--update-size", "30000",
                                   "--signing-key", directory + "/update.key"], log: directory + "/gateway.log")
        defer { _ = gateway.stop() }
        #expect(eventually(10) { gateway.output.contains("listening on 127.0.0.1:\(port)") }, "\(gateway.output)")
        let key = try #require(gateway.output.split(separator: "\n").first { $0.contains("update public key") }?.split(separator: " ").last)
        let terminal = try Service(["terminal", "--gateway", "127.0.0.1:\(port)", "--link", directory + "/SIM-00000001", "--rssi", "-45",
                                    "--update-key", String(key), "--card", "4111111111111111:1234"], log: directory + "/terminal.log")
        defer { _ = terminal.stop() }
        #expect(eventually(10) { FileManager.default.fileExists(atPath: directory + "/SIM-00000001.advert") }, "\(terminal.output)")
        let pattern = directory + "/*"
        let gw = "127.0.0.1:\(port)"

        // Discovery lists the terminal from its advertisement.
        let listed = try runCommand(BridgeProcess.binary, ["reader", "discover", "--pattern", pattern, "--timeout", "1"], timeout: 30)
        #expect(listed.status == 0 && listed.output.contains("found: SIM-00000001 (SIM-00000001,") && listed.output.contains("-45 dBm"), "\(listed.output)")

        // A payment found by discovery, with its capture.
        let pcap = directory + "/pay.pcap"
        let paid = try runCommand(BridgeProcess.binary, ["pay", "--amount", "10.50", "--currency", "EUR", "--gateway", gw, "--pattern", pattern,
                                                         "--transaction-id", "0001CLI", "--pcap", pcap], timeout: 60)
        #expect(paid.status == 0, "\(paid.output)")
        #expect(paid.output.contains("result: approved 10.50 EUR, authorisation code 000001, operation OP-000001, response 00, card 411111******1111, PIN verified"), "\(paid.output)")
        for state in ["state: login", "state: discovery", "state: connecting", "state: interaction", "state: authorizing", "state: finished"] {
            #expect(paid.output.contains(state), "\(state) missing")
        }
        let capture = try #require(FileManager.default.contents(atPath: pcap))
        #expect(capture.count > 1000 && capture.range(of: Data("4111111111111111".utf8)) == nil, "a clear PAN in the capture")

        // Exponents: JPY has none, KWD three; amounts are taken exactly or refused.
        let yen = try runCommand(BridgeProcess.binary, ["pay", "--amount", "1050", "--currency", "JPY", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(yen.status == 0 && yen.output.contains("result: approved 1050 JPY"), "\(yen.output)")
        let dinar = try runCommand(BridgeProcess.binary, ["pay", "--amount", "1.250", "--currency", "KWD", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(dinar.status == 0 && dinar.output.contains("result: approved 1.250 KWD"), "\(dinar.output)")
        let fractionalYen = try runCommand(BridgeProcess.binary, ["pay", "--amount", "10.5", "--currency", "JPY", "--gateway", gw], timeout: 30)
        #expect(fractionalYen.status == 2 && fractionalYen.output.contains("is not an amount in JPY"), "\(fractionalYen.output)")

        // A declined payment exits 1.
        let declined = try runCommand(BridgeProcess.binary, ["pay", "--amount", "1.05", "--currency", "EUR", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(declined.status == 1 && declined.output.contains("result: declined 1.05 EUR") && declined.output.contains("response 05"), "\(declined.output)")

        // Refund by the authorisation code on the receipt, then one too many.
        let refunded = try runCommand(BridgeProcess.binary, ["refund", "--auth", "000001", "--amount", "10.00", "--currency", "EUR", "--gateway", gw,
                                                             "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(refunded.status == 0 && refunded.output.contains("result: approved 10.00 EUR"), "\(refunded.output)")
        let tooMuch = try runCommand(BridgeProcess.binary, ["refund", "--auth", "000001", "--amount", "0.51", "--currency", "EUR", "--gateway", gw,
                                                            "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(tooMuch.status == 1 && tooMuch.output.contains("3007"), "\(tooMuch.output)")

        // The optional update the gateway offers, installed with progress; the reader says so.
        let updated = try runCommand(BridgeProcess.binary, ["reader", "update", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 90)
        #expect(updated.status == 0 && updated.output.contains("update: 100%") && updated.output.contains("reader: now running 1.1.0"),
                "\(updated.output)\n\(terminal.output)\n\(gateway.output)")
        let connected = try runCommand(BridgeProcess.binary, ["reader", "connect", "--gateway", gw, "--device", directory + "/SIM-00000001"], timeout: 60)
        #expect(connected.status == 0 && connected.output.contains("software 1.1.0") && connected.output.contains("diagnosis:"), "\(connected.output)")

        #expect(terminal.stop() == 0)
        #expect(gateway.stop() == 0)
        #expect(gateway.output.contains("Authorise 0001CLI Normal 1050 978 → approved 00 OP-000001"), "\(gateway.output)")
    }
}
