import Wire

/// When the line is read: on every arrival, or on a clock while it is busy.
///
/// A pty or a virtual serial port hands us a frame or two per wakeup, and at a few megabytes a
/// second that is a thousand wakeups per megabyte, each a context switch and three or four
/// system calls; they, not the protocol work, are most of the CPU a bulk transfer costs. So,
/// as a network card moderates its interrupts and Linux's NAPI polls a busy card instead of
/// taking one interrupt a packet, the session stops waiting for each arrival once bytes come
/// in steadily at a moderate rate and reads the line every `interval` instead, taking all that
/// gathered meanwhile at once: fewer wakeups, fewer writes to the host sockets, fewer ACKs.
///
/// The clock holds each frame up to `interval`, which costs a sender whose congestion window
/// is what limits it: it waits longer for each ACK. So it only runs in a band of rates:
/// - It takes over when a whole `window` of arrivals brought between `enterBytes` and
///   `maximumBytes`. Every real serial line stays below the band (4 Mbit/s is 500 kB/s, and
///   `enterBytes` per `window` is 1 MB/s); a fast pty stays above it, where the kernel's and
///   our buffers already batch the reads.
/// - A read on it must bring half as much again as the average read on arrival before it did
///   (or more than a tty hands over in one read, 4 KiB): request and response traffic (a
///   payment, a round trip) sends nothing more until answered, so a read on the clock finds
///   one message. It must also bring no more than the band's rate allows.
/// - Either way, the line goes back to arrivals and stays there for `holdOff`, so at most one
///   message in a `holdOff` waits for the clock.
///
/// Sans-IO: it is told what each read brought and when, and says when to read next.
public struct LineReadModeration: Sendable {
    public struct Settings: Sendable, Equatable {
        /// How often a busy line is read; zero: always on arrival.
        public var interval: Duration
        /// The band: bytes that must arrive within `window`, read on arrival, for the clock to
        /// take over (at least `enterBytes`, at most `maximumBytes`).
        public var enterBytes: Int
        public var maximumBytes: Int
        public var window: Duration
        /// After the clock gives up, how long the line is read on arrival before it may take
        /// over again.
        public var holdOff: Duration

        public init(interval: Duration, enterBytes: Int = 4096, maximumBytes: Int = 64 * 1024,
                    window: Duration = .milliseconds(4), holdOff: Duration = .milliseconds(100)) {
            self.interval = interval
            self.enterBytes = enterBytes
            self.maximumBytes = maximumBytes
            self.window = window
            self.holdOff = holdOff
        }

        /// Two milliseconds, for lines between 1 and 16 MB/s.
        public static let standard = Settings(interval: .milliseconds(2))
        /// Read on every arrival.
        public static let off = Settings(interval: .zero)
        /// The longest interval accepted.
        public static let maximumInterval: Duration = .milliseconds(20)
        /// What a tty hands over in one read at most (its line discipline's buffer): a read
        /// that brings more gathered more than any one arrival could.
        public static let ttyReadSize = 4096
    }

    public let settings: Settings
    /// Reading on the clock: when the next read is due. nil while reading on arrival.
    public private(set) var nextRead: Instant?
    private var windowStart: Instant?
    private var windowBytes = 0
    private var windowReads = 0
    /// What a read on the clock must bring to stay on it: more than one arrival would have
    /// (set when the clock takes over), and no more than the band allows in an interval.
    private var gatheredEnough = 0
    private let gatheredTooMuch: Int
    /// Not back on the clock before this.
    private var heldOffUntil: Instant?
    /// Times the clock took over, and reads made on it.
    public private(set) var busyPeriods = 0
    public private(set) var clockedReads = 0

    public init(settings: Settings) {
        var s = settings
        s.interval = min(max(s.interval, .zero), Settings.maximumInterval)
        s.window = max(s.window, .milliseconds(1))
        s.holdOff = max(s.holdOff, .zero)
        s.enterBytes = max(s.enterBytes, 1)
        s.maximumBytes = max(s.maximumBytes, s.enterBytes)
        self.settings = s
        // The band's top rate over one interval (both durations are at most a few seconds, so
        // the product stays far inside Int).
        let perInterval = Double(s.maximumBytes) * (s.interval / s.window)
        gatheredTooMuch = Int(min(perInterval, Double(Int.max / 2)))
    }

    /// Whether the line is read on the clock (and not watched for arrivals).
    public var onClock: Bool { nextRead != nil }

    /// A read made because bytes arrived brought `count` bytes.
    public mutating func readOnArrival(_ count: Int, now: Instant) {
        guard nextRead == nil, settings.interval > .zero else { return }
        if let until = heldOffUntil {
            guard now >= until else { return }
            heldOffUntil = nil
        }
        let count = max(0, count)
        guard let start = windowStart else { return startWindow(count, now: now) }
        let elapsed = now - start
        if elapsed <= settings.window {
            windowBytes = windowBytes > Int.max - count ? Int.max : windowBytes + count
            windowReads += 1
            return
        }
        // A window closed. Its rate counts only if the arrivals ran on right up to its end.
        let steady = elapsed <= settings.window + settings.window
        if steady && windowBytes >= settings.enterBytes && windowBytes <= settings.maximumBytes {
            let average = windowBytes / max(1, windowReads)
            gatheredEnough = min(average + average / 2 + 1, Settings.ttyReadSize)
            busyPeriods += 1
            nextRead = now + settings.interval
            windowStart = nil
            return
        }
        startWindow(count, now: now)
    }

    private mutating func startWindow(_ count: Int, now: Instant) {
        windowStart = now
        windowBytes = count
        windowReads = 1
    }

    /// The read due at `nextRead` brought `count` bytes (0: none were there).
    public mutating func readOnClock(_ count: Int, now: Instant) {
        guard nextRead != nil else { return }
        clockedReads += 1
        if count >= gatheredEnough && count <= gatheredTooMuch {
            nextRead = now + settings.interval
            return
        }
        // One arrival's worth or less (the peer waits for us, or the line slowed down), or
        // more than the band (the line sped up, and the clock holds its sender back).
        nextRead = nil
        windowStart = nil
        heldOffUntil = now + settings.holdOff
    }
}
