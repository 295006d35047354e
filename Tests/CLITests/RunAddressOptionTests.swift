import Testing

/// `pppbridge run` options about the link's addresses.
@Suite struct RunAddressOptionTests {
    @Test func aHostRoleTUNNeedsBothAddressesChosen() {
        for chosen in [[], ["--local-ip", "10.0.2.2"], ["--terminal-ip", "10.0.2.15"]] {
            let c = Captured()
            #expect(c.run(["run", "--pty", "--tun", "pb9"] + chosen) == 2, "\(chosen)")
            #expect(c.err.count == 1 && c.err.joined().contains("needs --local-ip and --terminal-ip"), "\(chosen): \(c.err)")
            // Refused before a pty or TUN is opened.
            #expect(c.out.isEmpty, "\(c.out)")
            print(c.err.joined())
        }
    }
}
