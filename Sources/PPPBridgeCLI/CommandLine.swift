/// The `pppbridge` command line: parses arguments and runs a command, writing to the given
/// sinks so tests can run it in-process. Returns the exit status.
public struct CommandLineTool {
    public var standardOutput: (String) -> Void
    public var standardError: (String) -> Void

    public init(standardOutput: @escaping (String) -> Void, standardError: @escaping (String) -> Void) {
        self.standardOutput = standardOutput
        self.standardError = standardError
    }

    /// Exit statuses.
    public enum Status {
        public static let success: Int32 = 0
        /// Bad usage or an input that cannot be read.
        public static let usage: Int32 = 2
    }

    public static let usage = """
    pppbridge — a user-space PPP/TCP bridge for payment terminals on serial lines

    usage: pppbridge <command> [options]

    commands:
      demo          the channel against a simulated terminal on a pty pair: a bridge each
                    way and a proxied connection, no hardware needed
      run           bring a PPP link up on a serial device, pty or device server (--device PATH | --pty)
      serve         many terminals in one process from a directory of configuration files,
                    with a control socket, metrics and the service manager's notifications
      ctl           talk to `serve`'s control socket: list, status, add-bridge, events ...
      simulate      many simulated terminals on ptys in one process (for `serve`'s scale and
                    fault tests)
      decode FILE   print every PPP frame of a capture (pcap link types 1, 9, 50, 204, or a
                    pppd `record` file) in pppd's debug-log style, optionally writing a pcap
      replay FILE   play a captured session against this build's link and stack on virtual
                    time: the states it reaches and where its answers differ

    payments (a reader over PPP; the card stays in the reader, E2EE to the gateway):
      pay           take a payment: pay --amount 10.50 --currency EUR --gateway ADDR:PORT
      refund        refund by authorisation code: refund --auth 000001 --amount 10.50 ...
      reader        reader discover | connect | reboot | update
      gateway       run the gateway simulator on loopback
      terminal      run a payment terminal simulator on a pty
      control       send one command to a terminal simulator's control socket
      help          print this text; `pppbridge help COMMAND` or `pppbridge COMMAND --help`
                    explain one command
    """

    public func run(_ arguments: [String]) -> Int32 {
        guard let command = arguments.first else {
            standardError(CommandLineTool.usage)
            return Status.usage
        }
        let rest = Array(arguments.dropFirst())
        switch command {
        case "-h", "--help", "help":
            if rest.first == "decode" {
                standardOutput(DecodeCommand.usage)
            } else if rest.first == "replay" {
                standardOutput(ReplayCommand.usage)
            } else if rest.first == "demo" {
                standardOutput(DemoCommand.usage)
            } else if rest.first == "run" {
                standardOutput(RunCommand.usage)
            } else if rest.first == "serve" {
                standardOutput(ServeCommand.usage)
            } else if rest.first == "simulate" {
                standardOutput(SimulateCommand.usage)
            } else if rest.first == "ctl" {
                standardOutput(CtlCommand.usage)
            } else if rest.first == "pay" || rest.first == "refund" {
                standardOutput(PayCommand.usage)
            } else if rest.first == "reader" {
                standardOutput(ReaderCommand.usage)
            } else if rest.first == "gateway" {
                standardOutput(GatewayCommand.usage)
            } else if rest.first == "terminal" {
                standardOutput(TerminalCommand.usage)
            } else if rest.first == "control" {
                standardOutput(ControlCommand.usage)
            } else {
                standardOutput(CommandLineTool.usage)
            }
            return Status.success
        case "decode":
            return DecodeCommand(output: standardOutput, error: standardError).run(rest)
        case "replay":
            return ReplayCommand(output: standardOutput, error: standardError).run(rest)
        case "demo":
            return DemoCommand(output: standardOutput, error: standardError).run(rest)
        case "run":
            return RunCommand(output: standardOutput, error: standardError).run(rest)
        case "serve":
            return ServeCommand(output: standardOutput, error: standardError).run(rest)
        case "simulate":
            return SimulateCommand(output: standardOutput, error: standardError).run(rest)
        case "ctl":
            return CtlCommand(output: standardOutput, error: standardError).run(rest)
        case "pay":
            return PayCommand(output: standardOutput, error: standardError).run(rest)
        case "refund":
            return PayCommand(output: standardOutput, error: standardError, refund: true).run(rest)
        case "reader":
            return ReaderCommand(output: standardOutput, error: standardError).run(rest)
        case "gateway":
            return GatewayCommand(output: standardOutput, error: standardError).run(rest)
        case "terminal":
            return TerminalCommand(output: standardOutput, error: standardError).run(rest)
        case "control":
            return ControlCommand(output: standardOutput, error: standardError).run(rest)
        default:
            standardError("pppbridge: unknown command '\(command)' (see `pppbridge --help`)")
            return Status.usage
        }
    }
}

