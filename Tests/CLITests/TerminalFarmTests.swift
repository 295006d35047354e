import Channel
import Foundation
import Glibc
import NetStack
import Testing
import TestSupport
@testable import Service
@testable import Simulation

/// The simulator of many terminals, and `Service` against it on one loop: real ptys, our
/// stack at both ends.
@Suite(.serialized) struct TerminalFarmTests {
    private static func directory() throws -> String { try TemporaryDirectory.make("farm") }

    /// Polls `condition` on the loop until it holds (30 s at most: it waits for ptys and the
    /// kernel, not for a timer of ours).
    /// `condition` asked on the loop's thread, for up to 30 s.
    private static func eventually(_ loop: EventLoop, _ condition: @escaping () -> Bool) async -> Bool {
        await TestSupport.eventually(within: .seconds(30)) { await loop.perform(condition) }
    }

    private static func linkTarget(_ path: String) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        let n = readlink(path, &buffer, buffer.count - 1)
        return n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
    }

    /// A terminal's program that hangs up and makes its link again at once (the kernel hands
    /// the new pty the number the old one had) before serve has read the hang-up: the new link
    /// is opened, not taken for the one left behind. (The link was stamped when the hang-up
    /// was read, by then the new one, and serve waited for a change that had already come.)
    @Test func aPtyLinkMadeAgainAtOnceIsOpenedNotTakenForTheOneThatHungUp() async throws {
        let root = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let config = root + "/conf", lines = root + "/lines"
        try FileManager.default.createDirectory(atPath: config, withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: lines, withIntermediateDirectories: false)
        let loop = try EventLoop()
        try loop.startThread()
        var farmConfiguration = TerminalFarm.Configuration(directory: lines, count: 2)
        farmConfiguration.restartDelay = .milliseconds(100)
        let farm = TerminalFarm(configuration: farmConfiguration, loop: loop)
        await loop.perform { farm.start() }
        for n in 0..<2 {
            #expect(FileManager.default.createFile(atPath: config + "/t\(n).conf", contents: Data("device \(lines)/t\(n)\nholdoff 1\n".utf8),
                                                   attributes: [.posixPermissions: 0o600]))
        }
        let made: Result<Service, Error> = await loop.perform {
            Result {
                try Service(directory: config, defaults: TerminalFile.Defaults(), environment: [:], loop: loop,
                            descriptors: DescriptorBudget(limit: 4_096, reserve: 0), baseReserve: 0, say: { _ in }, complain: { _ in })
            }
        }
        let service = try made.get()
        await loop.perform { service.scan() }
        #expect(await Self.eventually(loop) { service.terminals.values.allSatisfy { $0.state == .open } && service.terminals.count == 2 })

        for round in 1...3 {
            let before = Self.linkTarget(lines + "/t0")
            await loop.perform { _ = farm.apply(.hangUp(downFor: .zero), to: 0) }
            print("round \(round): t0 led to \(before), now to \(Self.linkTarget(lines + "/t0"))")
            #expect(await Self.eventually(loop) { service.terminals["t0"]?.opens == round + 1 && service.terminals["t0"]?.state == .open },
                    "round \(round): the new link was not opened")
        }
        // The other terminal was never touched.
        #expect(await loop.perform { service.terminals["t1"]?.opens } == 1)
        // The farm counts an open when its terminal's link comes up, a moment after the
        // service opened its side.
        let farmOpened = await Self.eventually(loop) { farm.status.map(\.opens) == [4, 1] }
        let farmStatus = await loop.perform { farm.status }
        #expect(farmOpened, "\(farmStatus.map(\.opens))")
        #expect(farmStatus.map(\.hangUps) == [3, 0])

        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            loop.enqueue {
                farm.close()
                service.closeAll { c.resume() }
            }
        }
    }

    /// Bit errors at the rate asked for, none on a clean line, and a rate that is not one is
    /// a clean line.
    @Test func lineNoiseFlipsBitsAtItsRate() {
        var noise = LineNoise(bitErrorRate: 0.001, seed: 7)
        var bytes = [UInt8](repeating: 0, count: 1_000_000)
        noise.apply(&bytes)
        let flipped = bytes.reduce(0) { $0 + $1.nonzeroBitCount }
        #expect(flipped == noise.bitsFlipped)
        // 8,000 expected; five standard deviations either way.
        #expect(abs(flipped - 8_000) < 450, "\(flipped)")
        for rate in [0.0, -1, .nan] {
            var clean = LineNoise(bitErrorRate: rate, seed: 1)
            var zeros = [UInt8](repeating: 0, count: 10_000)
            clean.apply(&zeros)
            #expect(zeros.allSatisfy { $0 == 0 } && clean.bitsFlipped == 0)
        }
        var all = LineNoise(bitErrorRate: 5, seed: 1)
        var ones = [UInt8](repeating: 0, count: 100)
        all.apply(&ones)
        #expect(ones.allSatisfy { $0 == 0xFF })
    }

    /// The control socket's requests: what is refused, and why.
    @Test func theFarmsControlAnswersAndRefuses() throws {
        let root = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let loop = try EventLoop(clock: VirtualClock())
        let farm = TerminalFarm(configuration: .init(directory: root, count: 2), loop: loop)
        farm.start()
        defer { farm.close() }
        let control = try FarmControl(farm: farm, path: root + "/control")
        defer { control.close() }
        func ask(_ text: String) -> [String: Any] { control.answer(Array(text.utf8)) }
        #expect(ask("{\"cmd\":\"status\"}")["terminals"] as? Int == 2)
        #expect(ask("not json")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"reboot\"}")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"hangup\"}")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"hangup\",\"terminal\":2}")["error"] as? String == "no terminal 2")
        #expect(ask("{\"cmd\":\"silence\",\"terminal\":0,\"for\":-1}")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"noise\",\"terminal\":0,\"for\":1,\"ber\":0.9}")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"noise\",\"terminal\":0,\"for\":1,\"ber\":0.001}")["ok"] as? Bool == true)
        #expect(ask("{\"cmd\":\"hangup\",\"terminal\":1,\"downFor\":1e300}")["ok"] as? Bool == false)
        #expect(ask("{\"cmd\":\"hangup\",\"terminal\":1,\"downFor\":2}")["ok"] as? Bool == true)
        // The hang-up removed the device's name; two seconds on it is back.
        #expect(access(root + "/t1", F_OK) != 0)
        loop.advance(by: .seconds(2))
        #expect(access(root + "/t1", F_OK) == 0)
        let list = try #require(ask("{\"cmd\":\"list\"}")["terminals"] as? [[String: Any]])
        #expect(list.map { $0["hangups"] as? Int } == [0, 1])
        #expect(list.map { $0["faults"] as? Int } == [1, 1])
    }
}
