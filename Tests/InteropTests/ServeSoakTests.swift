import ChannelTestSupport
import Foundation
import Testing

/// A minute of `Tools/serve-soak.py` against 256 simulated terminals: hang-ups, devices that go
/// and come back, line noise, silences, configuration files edited, renamed and removed,
/// bridges added and removed, floods on the control socket and on bridges, descriptor
/// pressure, with data checked end to end. `Tools/test.sh` runs it on its own, after the other
/// suites: its reopen deadlines are the service's, not a loaded machine's.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ServeSoakTests {
    @Test func aMinuteOfFaultsAgainst256TerminalsLosesAndLeaksNothing() async throws {
        let r = try await runCommand("/usr/bin/python3", [packageRoot + "/Tools/serve-soak.py", "--seconds", "60", "--terminals", "256",
                                                          "--binary", BridgeProcess.binary, "--metrics-port", String(Host.freePort())],
                                     timeout: 540)
        print(r.output)
        let line = try #require(r.output.split(separator: "\n").last { $0.hasPrefix("RESULT soak ") }, "no RESULT line")
        var values: [String: Double] = [:]
        for word in line.split(separator: " ") {
            let pair = word.split(separator: "=")
            if pair.count == 2, let v = Double(pair[1]) { values[String(pair[0])] = v }
        }
        #expect(values["terminals"] == 256)
        #expect((values["faults"] ?? 0) >= 100, "too few faults to mean anything")
        #expect((values["bytes_checked"] ?? 0) > 1_000_000, "too little data checked")
        #expect(values["crashes"] == 0)
        #expect(values["reopened_late"] == 0)
        #expect(values["bytes_lost"] == 0)
        #expect(abs(values["fd_delta"] ?? 99) <= 2)
        #expect((values["rss_delta_percent"] ?? 99) <= 10)
        #expect(values["metrics_mismatches"] == 0)
        #expect(values["bridge_failures"] == 0)
        #expect(r.status == 0)
    }
}
