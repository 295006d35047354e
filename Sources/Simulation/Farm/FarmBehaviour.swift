import Channel

/// What a simulated terminal of a farm does wrong on purpose, for as long as it runs.
public enum FarmBehaviour: Sendable, Equatable {
    case healthy
    /// Drops its line every so often (about `every`, give or take half): the device goes away
    /// and a new one comes back at once under the same name.
    case hangsUp(every: Duration)
    /// Its line is there, and nothing on it ever answers (a frozen terminal).
    case silent
    /// Everything it writes takes bit errors at this rate.
    case noisy(bitErrorRate: Double)
    /// Demands authentication the host cannot give (PAP, and no secret on the host's side),
    /// so its link never opens.
    case refusesLCP
    /// Answers its echo service this long after each request.
    case slow(Duration)

    /// The name `--misbehave` takes and the control socket prints.
    public var name: String {
        switch self {
        case .healthy: "healthy"
        case .hangsUp: "hangup"
        case .silent: "silent"
        case .noisy: "noise"
        case .refusesLCP: "refuse-lcp"
        case .slow: "slow"
        }
    }

    /// A line a healthy host can bring up and keep up with this terminal.
    public var linkCanStayUp: Bool {
        switch self {
        case .healthy, .slow: true
        default: false
        }
    }
}

/// A fault asked for over a farm's control socket, on one terminal, for a while.
public enum FarmFault: Sendable, Equatable {
    /// The line goes away (its name removed) and a new one comes back after `downFor`.
    case hangUp(downFor: Duration)
    /// The terminal freezes (its line stays, nothing answers), then restarts.
    case silence(for: Duration)
    /// Bursts of line noise: bit errors at `bitErrorRate` on what it writes, for a while.
    case noise(bitErrorRate: Double, for: Duration)
}
