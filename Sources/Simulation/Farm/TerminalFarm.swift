import Channel
import Glibc
import NetStack
import PPP

/// Many simulated terminals in one process, on one loop: terminal `n` is a pty linked at
/// `directory/tn` with our stack in the terminal role on it, serving echo. Some misbehave on
/// purpose (`behaviours`), and any can be given a fault over the control socket
/// (`FarmControl`), so a soak can drive hang-ups, silences and line noise against `serve`
/// with no other tools. Loop thread only, after `init`.
public final class TerminalFarm {
    public struct Configuration: Sendable {
        public var directory: String
        public var count: Int
        /// The behaviours of terminals other than healthy, by index.
        public var behaviours: [Int: FarmBehaviour] = [:]
        /// Terminal n's echo service listens on this port plus n (on its PPP address): a
        /// host bridge keeps the port on both sides, so each terminal has its own.
        public var echoBasePort: UInt16 = 20_000
        /// How long a terminal whose link went down waits before it starts again.
        public var restartDelay: Duration = .seconds(1)
        /// The terminals' own LCP echo (they notice a host that went away).
        public var echo = EchoConfiguration()
        /// Seeds every terminal's choices (hang-up times, noise), so a run can be repeated.
        public var seed: UInt64 = 1

        public init(directory: String, count: Int) {
            self.directory = directory
            self.count = count
        }
    }

    /// The most terminals one farm runs: each holds a pty, and the kernel's default
    /// `kernel.pty.max` is 4096.
    public static let maximumCount = 4_000

    public let loop: EventLoop
    public let configuration: Configuration
    private var terminals: [FarmTerminal] = []
    private let complaint: (String) -> Void

    public init(configuration: Configuration, loop: EventLoop, complain: @escaping (String) -> Void = { _ in }) {
        self.configuration = configuration
        self.loop = loop
        complaint = complain
    }

    func complain(_ text: String) { complaint(text) }

    /// Terminal `n`'s echo port.
    public func echoPort(_ n: Int) -> UInt16 { UInt16(clamping: Int(configuration.echoBasePort) + n) }

    /// The name of terminal `n`'s device.
    public func linkPath(_ n: Int) -> String { configuration.directory + "/t\(n)" }

    /// Makes every terminal's device and starts its stack.
    public func start() {
        var seeds = SplitMix64(seed: configuration.seed)
        let count = min(max(configuration.count, 0), Self.maximumCount, 65_536 - Int(configuration.echoBasePort))
        for n in 0..<count {
            let t = FarmTerminal(index: n, linkPath: linkPath(n), behaviour: configuration.behaviours[n] ?? .healthy, farm: self,
                                 seed: seeds.next())
            terminals.append(t)
            t.start()
        }
    }

    /// Ends every terminal and removes their devices' names.
    public func close() {
        for t in terminals { t.close() }
        terminals = []
    }

    /// Applies `fault` to terminal `n`; false when there is no such terminal.
    @discardableResult
    public func apply(_ fault: FarmFault, to n: Int) -> Bool {
        guard terminals.indices.contains(n) else { return false }
        terminals[n].apply(fault)
        return true
    }

    public struct TerminalStatus: Sendable, Equatable {
        public var index: Int
        public var behaviour: String
        public var up: Bool
        /// Times its link opened (IPCP), went down, hung up, and faults applied.
        public var opens: Int
        public var downs: Int
        public var hangUps: Int
        public var faults: Int
        public var startFailures: Int
    }

    public var status: [TerminalStatus] {
        terminals.map {
            TerminalStatus(index: $0.index, behaviour: $0.behaviour.name, up: $0.isUp, opens: $0.opens, downs: $0.downs,
                           hangUps: $0.hangUps, faults: $0.faults, startFailures: $0.startFailures)
        }
    }
}
