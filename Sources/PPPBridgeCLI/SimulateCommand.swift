import Channel
import Glibc
import NetStack
import Service
import Simulation

/// `pppbridge simulate`: many simulated terminals in one process, for `serve` to run.
struct SimulateCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge simulate --terminals N --dir DIR [--echo-base N] [--control PATH]
                              [--misbehave KIND:COUNT]... [--ber RATE] [--slow-delay MS]
                              [--hangup-every S] [--restart-delay MS] [--seed N]

    N simulated terminals (our stack in the terminal role) on N ptys, in one process on one
    loop: terminal n's pty is linked at DIR/tn and serves echo (RFC 862) on its PPP address,
    port N+n (--echo-base; a `serve` bridge host:N+n reaches it).
    A terminal whose link goes down starts again on the same pty after the restart delay. Runs
    until SIGINT/SIGTERM, then removes the links.

      --terminals N       how many (1 to 4000; each holds a pty)
      --dir DIR           where the links go (an existing directory)
      --echo-base N       terminal n's echo port is N+n (default 20000)
      --control PATH      a control socket (JSON lines, 0600): {"cmd":"status"}, {"cmd":"list"},
                          {"cmd":"hangup","terminal":N,"downFor":S}, {"cmd":"silence",
                          "terminal":N,"for":S}, {"cmd":"noise","terminal":N,"ber":R,"for":S}
      --misbehave K:C     the last C terminals not yet given a behaviour misbehave as K, all the
                          time: hangup (drops its line every --hangup-every seconds, about),
                          silent (its line is there, nothing answers), noise (bit errors at
                          --ber on all it writes), refuse-lcp (demands PAP the host cannot
                          give), slow (echo answered --slow-delay ms late)
      --ber RATE          the noisy terminals' bit-error rate (default 0.0001)
      --slow-delay MS     the slow terminals' delay (default 300)
      --hangup-every S    the hanging-up terminals' period (default 10)
      --restart-delay MS  a terminal's pause after its link went down (default 1000)
      --seed N            seeds the terminals' choices (default 1)
    """

    func run(_ arguments: [String]) -> Int32 {
        var count: Int?
        var directory: String?
        var control: String?
        var echoBase: UInt16 = 20_000
        var kinds: [(String, Int)] = []
        var ber = 0.0001
        var slowDelay = 300
        var hangUpEvery = 10
        var restartDelay = 1000
        var seed: UInt64 = 1
        var i = 0
        func value(_ flag: String) -> String? {
            i += 1
            guard i < arguments.count else {
                error("pppbridge simulate: \(flag) needs a value")
                return nil
            }
            return arguments[i]
        }
        func number<T: FixedWidthInteger>(_ flag: String, _ range: ClosedRange<T>) -> T? {
            guard let v = value(flag) else { return nil }
            guard let n = decimal(v, as: T.self), range.contains(n) else {
                error("pppbridge simulate: \(flag) takes a whole number from \(range.lowerBound) to \(range.upperBound)")
                return nil
            }
            return n
        }
        while i < arguments.count {
            switch arguments[i] {
            case "-h", "--help":
                output(Self.usage)
                return CommandLineTool.Status.success
            case "--terminals": guard let n = number("--terminals", 1...TerminalFarm.maximumCount) else { return CommandLineTool.Status.usage }; count = n
            case "--dir": guard let v = value("--dir") else { return CommandLineTool.Status.usage }; directory = v
            case "--control": guard let v = value("--control") else { return CommandLineTool.Status.usage }; control = v
            case "--echo-base": guard let n = number("--echo-base", UInt16(1)...UInt16.max) else { return CommandLineTool.Status.usage }; echoBase = n
            case "--slow-delay": guard let n = number("--slow-delay", 0...600_000) else { return CommandLineTool.Status.usage }; slowDelay = n
            case "--hangup-every": guard let n = number("--hangup-every", 1...86_400) else { return CommandLineTool.Status.usage }; hangUpEvery = n
            case "--restart-delay": guard let n = number("--restart-delay", 0...600_000) else { return CommandLineTool.Status.usage }; restartDelay = n
            case "--seed": guard let n = number("--seed", UInt64(0)...UInt64.max) else { return CommandLineTool.Status.usage }; seed = n
            case "--ber":
                guard let v = value("--ber") else { return CommandLineTool.Status.usage }
                guard let r = Double(v), r.isFinite, r > 0, r <= 0.5 else {
                    error("pppbridge simulate: --ber takes a rate above 0, at most 0.5 (0.0001 is one bit in 10,000)")
                    return CommandLineTool.Status.usage
                }
                ber = r
            case "--misbehave":
                guard let v = value("--misbehave") else { return CommandLineTool.Status.usage }
                let parts = v.split(separator: ":", omittingEmptySubsequences: false)
                let known = ["hangup", "silent", "noise", "refuse-lcp", "slow"]
                guard parts.count == 2, known.contains(String(parts[0])), let c = decimal(String(parts[1]), as: Int.self), c >= 1 else {
                    error("pppbridge simulate: --misbehave takes KIND:COUNT, KIND one of \(known.joined(separator: ", "))")
                    return CommandLineTool.Status.usage
                }
                kinds.append((String(parts[0]), c))
            default:
                error("pppbridge simulate: unknown option \(arguments[i]) (see `pppbridge simulate --help`)")
                return CommandLineTool.Status.usage
            }
            i += 1
        }
        guard let count, let directory else {
            error("pppbridge simulate: --terminals and --dir are required (see `pppbridge simulate --help`)")
            return CommandLineTool.Status.usage
        }
        var isDirectory = stat()
        guard stat(directory, &isDirectory) == 0, (isDirectory.st_mode & S_IFMT) == S_IFDIR else {
            error("pppbridge simulate: --dir \(directory) is not a directory")
            return CommandLineTool.Status.usage
        }
        var configuration = TerminalFarm.Configuration(directory: directory, count: count)
        guard Int(echoBase) + count - 1 <= Int(UInt16.max) else {
            error("pppbridge simulate: --echo-base \(echoBase) leaves no port for terminal \(count - 1)")
            return CommandLineTool.Status.usage
        }
        configuration.echoBasePort = echoBase
        configuration.restartDelay = .milliseconds(Int64(restartDelay))
        configuration.seed = seed
        // Behaviours from the last terminal down, in the order given.
        var next = count - 1
        for (kind, c) in kinds {
            for _ in 0..<c where next >= 0 {
                let b: FarmBehaviour = switch kind {
                case "hangup": .hangsUp(every: .seconds(Int64(hangUpEvery)))
                case "silent": .silent
                case "noise": .noisy(bitErrorRate: ber)
                case "refuse-lcp": .refusesLCP
                default: .slow(.milliseconds(Int64(slowDelay)))
                }
                configuration.behaviours[next] = b
                next -= 1
            }
        }
        // Two descriptors a pty (until the host opens it) and a copy for the running stack.
        DescriptorBudget.raiseSoftLimit()
        nonisolated(unsafe) var farm: TerminalFarm?
        nonisolated(unsafe) var server: FarmControl?
        let say = error
        return serveUntilSignalled("simulate", error: error, { loop in
            let made: SystemError? = loop.sync {
                let f = TerminalFarm(configuration: configuration, loop: loop) { say("pppbridge simulate: \($0)") }
                f.start()
                farm = f
                if let control {
                    do throws(SystemError) { server = try FarmControl(farm: f, path: control) } catch { return error }
                }
                return nil
            }
            if let made { throw made }
            let misbehaving = configuration.behaviours.count
            output("pppbridge simulate: \(count) terminals linked at \(directory)/t0 ... t\(count - 1)"
                + (misbehaving > 0 ? ", \(misbehaving) misbehaving" : "") + (control.map { "; control \($0)" } ?? ""))
        }, stop: {
            guard let loop = farm?.loop else { return }
            await loop.perform {
                server?.close()
                farm?.close()
            }
        })
    }
}
