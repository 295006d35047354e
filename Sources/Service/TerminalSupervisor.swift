import NetStack

/// The rules that keep one terminal's link up, as pppd's `persist`, `holdoff` and `maxfail`
/// have them, with no I/O: events and the time in, actions out, and the next instant it needs
/// (`pollAt`). `ServedTerminal` is its shell: it opens and closes the channel, looks at the
/// device, and runs the timer.
///
/// - A device that is not there is waited for; so is one whose line another terminal holds.
/// - A link that ends is opened again after the holdoff (a second at least after an open that
///   never reached IPCP); `maxfail` failed opens in a row leave the terminal given up until
///   it is opened again or its device appears anew.
/// - Closed by request, it stays closed; retired (its file changed or went), it lets go of the
///   link and says when it has.
public struct TerminalSupervisor: Sendable, Equatable {
    public enum State: Equatable, Sendable {
        /// Not wanted: before the first start, and after a stop.
        case closed
        /// Wanted, and the device is missing or its line another terminal's.
        case waiting
        case opening
        case open
        /// Wanted; the link ended and opens again at the instant.
        case holdoff(until: Instant)
        /// `maxfail` failed opens in a row.
        case gaveUp(failures: Int)
        /// Asked to close; the link is still going down, and then does what `after` says.
        case closing(after: AfterClose)
        /// Let go for good.
        case retired

        /// The name the control socket and the metrics give it.
        public var name: String {
            switch self {
            case .closed: return "closed"
            case .waiting: return "waiting"
            case .opening: return "opening"
            case .open: return "open"
            case .holdoff: return "holdoff"
            case .gaveUp: return "gave-up"
            case .closing: return "closing"
            case .retired: return "retired"
            }
        }

        public static let names = ["closed", "waiting", "opening", "open", "holdoff", "gave-up", "closing", "retired"]
    }

    /// What the shell found at the device path when the event came.
    /// What a closing link does once it is down.
    public enum AfterClose: Equatable, Sendable {
        /// Stays closed (`ctl close`).
        case stayClosed
        /// Opens again (`ctl open` came while it was closing).
        case reopen
        /// Is let go for good.
        case retire
    }

    public enum Device: Equatable, Sendable {
        case present
        case missing
        /// The path leads to the line another terminal (named) holds.
        case heldBy(String)
    }

    public enum Event: Equatable, Sendable {
        /// Keep the link up (a new terminal, `ctl open`): maxfail counts from zero again.
        case start
        /// Close the link and keep it closed (`ctl close`).
        case stop
        /// Let go for good (the file changed or was removed, or the service stops).
        case retire
        /// Something changed at the device's path (`appeared`: a name was created there).
        case deviceChanged(appeared: Bool)
        case linkOpened
        /// The link ended, or an open failed.
        case linkClosed
        /// The time passed (`pollAt` was due).
        case tick
    }

    public enum Action: Equatable, Sendable {
        case openLink
        case closeLink
        /// Entered waiting: for the device, or (`holder`) for the terminal that holds its line.
        case announceWaiting(holder: String?)
        case announceGaveUp(failures: Int)
        /// The link is let go after `retire`.
        case retired
    }

    /// pppd's holdoff: from a link's end to the next open.
    public let holdoff: Duration
    /// pppd's maxfail (0: never give up).
    public let maxfail: Int
    /// An open that failed is not retried sooner than this, whatever the holdoff.
    public static let failedOpenPause = Duration.seconds(1)

    public private(set) var state = State.closed
    /// Failed opens in a row (links that never reached IPCP).
    public private(set) var failures = 0
    /// Whether the link being opened (or the last one) reached IPCP.
    private var reachedOpen = false

    public init(holdoff: Duration, maxfail: Int) {
        self.holdoff = holdoff
        self.maxfail = maxfail
    }

    /// When `tick` is next due.
    public var pollAt: Instant? {
        if case let .holdoff(until) = state { return until }
        return nil
    }

    public mutating func handle(_ event: Event, device: Device, now: Instant) -> [Action] {
        switch (event, state) {
        case (.retire, .retired):
            // Asked again (a second stop of the service): it is let go already.
            return [.retired]
        case (_, .retired):
            return []
        case (.retire, .opening), (.retire, .open):
            state = .closing(after: .retire)
            return [.closeLink]
        case (.retire, .closing(.retire)):
            return []
        case (.retire, .closing):
            // A second close request stops waiting for the terminal's goodbye.
            state = .closing(after: .retire)
            return [.closeLink]
        case (.retire, _):
            state = .retired
            return [.retired]
        case (_, .closing(.retire)) where event != .linkClosed:
            return []
        case (.start, .opening), (.start, .open):
            failures = 0
            return []
        case (.start, .closing):
            // Wanted again: opened once the link is down.
            failures = 0
            state = .closing(after: .reopen)
            return []
        case (.start, _):
            failures = 0
            return attempt(device, now: now)
        case (.stop, .opening), (.stop, .open):
            state = .closing(after: .stayClosed)
            return [.closeLink]
        case (.stop, .closing):
            state = .closing(after: .stayClosed)
            return []
        case (.stop, _):
            state = .closed
            return []
        case let (.deviceChanged(appeared), .gaveUp):
            // A device that appears anew is a new line: maxfail counts from zero again.
            guard appeared, device != .missing else { return [] }
            failures = 0
            return attempt(device, now: now)
        case (.deviceChanged, .waiting):
            return device == .missing ? [] : attempt(device, now: now)
        case (.deviceChanged, _):
            return []
        case (.linkOpened, .opening):
            state = .open
            reachedOpen = true
            failures = 0
            return []
        case (.linkOpened, _):
            return []
        case (.linkClosed, .closing(.retire)):
            state = .retired
            return [.retired]
        case (.linkClosed, .closing(.stayClosed)):
            state = .closed
            return []
        case (.linkClosed, .closing(.reopen)):
            return attempt(device, now: now)
        case (.linkClosed, .opening), (.linkClosed, .open):
            return reopenLater(device, now: now)
        case (.linkClosed, _):
            return []
        case (.tick, .holdoff(let until)):
            return now >= until ? attempt(device, now: now) : []
        case (.tick, _):
            return []
        }
    }

    private mutating func attempt(_ device: Device, now: Instant) -> [Action] {
        switch device {
        case .missing:
            return enterWaiting(holder: nil)
        case let .heldBy(holder):
            return enterWaiting(holder: holder)
        case .present:
            state = .opening
            reachedOpen = false
            return [.openLink]
        }
    }

    private mutating func enterWaiting(holder: String?) -> [Action] {
        guard state != .waiting else { return [] }
        state = .waiting
        return [.announceWaiting(holder: holder)]
    }

    private mutating func reopenLater(_ device: Device, now: Instant) -> [Action] {
        if !reachedOpen { failures += 1 }
        if maxfail > 0 && failures >= maxfail {
            state = .gaveUp(failures: failures)
            return [.announceGaveUp(failures: failures)]
        }
        if device == .missing { return enterWaiting(holder: nil) }
        let pause = reachedOpen ? holdoff : max(holdoff, TerminalSupervisor.failedOpenPause)
        state = .holdoff(until: now + pause)
        return []
    }
}
