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
        /// Asked to close; the link is still going down. Retiring: for good.
        case closing(retiring: Bool)
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

    /// Whether the link is opening or open (the line is held).
    public var holdsLine: Bool { state == .opening || state == .open || state == .closing(retiring: false) || state == .closing(retiring: true) }

    public mutating func handle(_ event: Event, device: Device, now: Instant) -> [Action] {
        switch (event, state) {
        case (_, .retired):
            return []
        case (.retire, .opening), (.retire, .open), (.retire, .closing(false)):
            let needsClose = state != .closing(retiring: false)
            state = .closing(retiring: true)
            return needsClose ? [.closeLink] : []
        case (.retire, .closing(true)):
            return []
        case (.retire, _):
            state = .retired
            return [.retired]
        case (_, .closing(true)) where event != .linkClosed:
            return []
        case (.start, .opening), (.start, .open):
            failures = 0
            return []
        case (.start, .closing(false)):
            // Reopened while going down: wanted again once it is down.
            state = .closing(retiring: false)
            return []
        case (.start, _):
            failures = 0
            return attempt(device, now: now)
        case (.stop, .opening), (.stop, .open):
            state = .closing(retiring: false)
            return [.closeLink]
        case (.stop, .closing):
            return []
        case (.stop, _):
            state = .closed
            return []
        case let (.deviceChanged(appeared), .gaveUp):
            // A device that appears anew is a new line: maxfail counts from zero again.
            guard appeared, device == .present else { return [] }
            failures = 0
            return attempt(device, now: now)
        case (.deviceChanged, .waiting):
            return device == .present ? attempt(device, now: now) : []
        case (.deviceChanged, _):
            return []
        case (.linkOpened, .opening):
            state = .open
            reachedOpen = true
            failures = 0
            return []
        case (.linkOpened, _):
            return []
        case (.linkClosed, .closing(true)):
            state = .retired
            return [.retired]
        case (.linkClosed, .closing(false)):
            state = .closed
            return []
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
