import Wire

/// When the line is read: on every arrival, or on a clock while it is busy.
///
/// A pty or a virtio serial port hands us a frame or two per wakeup: at a few megabytes a
/// second that is hundreds of wakeups per megabyte each way (data one way, ACKs the other),
/// each a context switch and three or four system calls, and they, not the protocol work, are
/// most of the CPU a transfer costs. So, as a network card moderates its interrupts and Linux's
/// NAPI polls a busy card instead of taking one interrupt a packet, the session stops waiting
/// for each arrival once data comes in steadily at a moderate rate and reads the line every
/// `interval` instead, taking all that gathered meanwhile at once: fewer wakeups, fewer writes
/// to the host sockets, fewer ACKs. (A flow of ACKs alone is left alone: what wakes a sender
/// is its own source and the line taking bytes, so gathering ACKs only delays them.)
///
/// The clock holds each frame up to `interval`, which costs a sender whose congestion window
/// is what limits it: it waits longer for each ACK. So it only runs in a band:
/// - It takes over when a whole `window` of arrivals brought more than `enterFrames` frames
///   and at least `enterBytes`, at most `maximumFrames` and `maximumBytes` (1,000 to 10,000
///   frames and 1 to 16 MB a second). Every real serial line stays below the band (4 Mbit/s
///   is 500 kB/s), and so does a flow of ACKs; a fast pty stays above it, where the kernel's
///   buffers and ours already batch the reads.
/// - A read on it must bring half as many frames again as the average read on arrival before
///   it did, at least two: request and response traffic (a payment, a round trip) sends
///   nothing more until answered, so a read on the clock finds one message. It must also
///   bring what the band asks for in an interval, in bytes (so a data flow that dwindles to
///   ACKs leaves), and no more than the band allows.
/// - Either way, the line goes back to arrivals and stays there for `holdOff`, doubled (up to
///   16 times) each time the clock gave up at its first read: sustained request and response
///   traffic has one message wait for the clock after 0.1 s, 0.3 s, 0.7 s, 1.5 s, then once
///   every 1.6 s. A read on the clock that gathered brings the hold-off back to `holdOff`.
///
/// Sans-IO: it is told what each read brought (bytes, and frames ended) and when, and says
/// when to read next.
public struct LineReadModeration: Sendable {
    public struct Settings: Sendable, Equatable {
        /// How often a busy line is read; zero: always on arrival.
        public var interval: Duration
        /// The band, over `window` of reads on arrival: more than `enterFrames` frames and at
        /// least `enterBytes` bytes, at most `maximumFrames` frames and `maximumBytes` bytes.
        public var enterFrames: Int
        public var enterBytes: Int
        public var maximumFrames: Int
        public var maximumBytes: Int
        public var window: Duration
        /// After the clock gives up, how long the line is read on arrival before it may take
        /// over again (at first: see `maximumHoldOffFactor`).
        public var holdOff: Duration

        public init(interval: Duration, enterFrames: Int = 4, enterBytes: Int = 4096, maximumFrames: Int = 40,
                    maximumBytes: Int = 64 * 1024, window: Duration = .milliseconds(4), holdOff: Duration = .milliseconds(100)) {
            self.interval = interval
            self.enterFrames = enterFrames
            self.enterBytes = enterBytes
            self.maximumFrames = maximumFrames
            self.maximumBytes = maximumBytes
            self.window = window
            self.holdOff = holdOff
        }

        /// Every two milliseconds, for lines carrying 1,000 to 10,000 frames and 1 to 16 MB
        /// a second.
        public static let standard = Settings(interval: .milliseconds(2))
        /// Read on every arrival.
        public static let off = Settings(interval: .zero)
        /// The longest interval accepted.
        public static let maximumInterval: Duration = .milliseconds(20)
        /// How far the hold-off doubles while the clock keeps giving up at once.
        public static let maximumHoldOffFactor = 16
    }

    public let settings: Settings
    /// Reading on the clock: when the next read is due. nil while reading on arrival.
    public private(set) var nextRead: Instant?
    private var windowStart: Instant?
    private var lastArrival: Instant?
    private var windowBytes = 0
    private var windowFrames = 0
    private var windowReads = 0
    /// What a read on the clock must bring to stay on it: more frames than one arrival would
    /// have (set when the clock takes over), and no more than the band allows in an interval.
    private var gatheredEnough = 2
    private let framesPerIntervalLimit: Int
    private let bytesPerIntervalMinimum: Int
    private let bytesPerIntervalLimit: Int
    /// Not back on the clock before this.
    private var heldOffUntil: Instant?
    /// The next hold-off, and whether a read on the clock gathered in this busy period.
    private var holdOffFactor = 1
    private var gathered = false
    /// Times the clock took over, and reads made on it.
    public private(set) var busyPeriods = 0
    public private(set) var clockedReads = 0
    /// Reads made on arrival that brought bytes.
    public private(set) var arrivalReads = 0
    /// Why busy periods ended: a read on the clock brought too little (fewer frames than it
    /// must, or too few bytes), more than the band allows, or the session stopped reading the
    /// line (a full output queue).
    public private(set) var endedSparse = 0
    public private(set) var endedOverBand = 0
    public private(set) var endedPaused = 0

    public init(settings: Settings) {
        var s = settings
        // Below 100 µs the clock would only spin: such an interval turns it off.
        s.interval = s.interval < .microseconds(100) ? .zero : min(s.interval, Settings.maximumInterval)
        s.window = min(max(s.window, .milliseconds(1)), .seconds(1))
        s.holdOff = max(s.holdOff, .zero)
        s.enterFrames = max(s.enterFrames, 1)
        s.maximumFrames = max(s.maximumFrames, s.enterFrames)
        s.enterBytes = max(s.enterBytes, 1)
        s.maximumBytes = max(s.maximumBytes, s.enterBytes)
        self.settings = s
        // The band's top rates over one interval; the ratio is at most 20 (interval ≤ 20 ms,
        // window ≥ 1 ms), so the products stay far inside Int.
        let ratio = s.interval / s.window
        framesPerIntervalLimit = Int(min(Double(s.maximumFrames) * ratio, Double(Int32.max)))
        bytesPerIntervalMinimum = Int(min(Double(s.enterBytes) * ratio, Double(Int32.max)))
        bytesPerIntervalLimit = Int(min(Double(s.maximumBytes) * ratio, Double(Int32.max)))
    }

    /// Whether the line is read on the clock (and not watched for arrivals).
    public var onClock: Bool { nextRead != nil }

    /// A read made because bytes arrived brought `bytes` bytes that ended `frames` frames.
    public mutating func readOnArrival(bytes: Int, frames: Int, now: Instant) {
        if bytes > 0 { arrivalReads &+= 1 }
        guard nextRead == nil, settings.interval > .zero else { return }
        if let until = heldOffUntil {
            guard now >= until else { return }
            heldOffUntil = nil
        }
        // A read that found nothing (a hang-up, a spurious wakeup) says nothing of the rate.
        guard bytes > 0 else { return }
        let frames = max(0, frames)
        guard let start = windowStart, let last = lastArrival else { return startWindow(bytes: bytes, frames: frames, now: now) }
        if now - start <= settings.window {
            windowBytes = windowBytes > Int.max - bytes ? Int.max : windowBytes + bytes
            windowFrames = windowFrames > Int.max - frames ? Int.max : windowFrames + frames
            windowReads += 1
            lastArrival = now
            return
        }
        // A window closed. Its rate counts only if the arrivals ran on through it: the last
        // one in its second half, and this one soon after (not a burst, then silence).
        let half = settings.window / 2
        let steady = last - start >= half && now - last <= half
        // Half as many frames again as an average read on arrival, rounded up; at least two.
        let reads = max(1, windowReads)
        let enough = max(2, (windowFrames * 3 + 2 * reads - 1) / (2 * reads))
        // Arrivals that came about an interval apart or slower gather nothing on the clock: at
        // least three reads in the window, on average closer than three quarters of an
        // interval, and a gathering the band allows.
        let close = windowReads >= 3 && (last - start) * 4 < settings.interval * (3 * (windowReads - 1))
        if steady && close && enough <= framesPerIntervalLimit
            && windowFrames > settings.enterFrames && windowFrames <= settings.maximumFrames
            && windowBytes >= settings.enterBytes && windowBytes <= settings.maximumBytes {
            gatheredEnough = enough
            busyPeriods += 1
            nextRead = now + settings.interval
            windowStart = nil
            gathered = false
            return
        }
        startWindow(bytes: bytes, frames: frames, now: now)
    }

    private mutating func startWindow(bytes: Int, frames: Int, now: Instant) {
        windowStart = now
        lastArrival = now
        windowBytes = bytes
        windowFrames = frames
        windowReads = 1
    }

    /// The read due at `nextRead` brought `bytes` bytes that ended `frames` frames (`bytes`
    /// beyond the band when the read filled the reader's buffer: more was waiting).
    public mutating func readOnClock(bytes: Int, frames: Int, now: Instant) {
        guard nextRead != nil else { return }
        clockedReads += 1
        if frames >= gatheredEnough && frames <= framesPerIntervalLimit
            && bytes >= bytesPerIntervalMinimum && bytes <= bytesPerIntervalLimit {
            nextRead = now + settings.interval
            gathered = true
            holdOffFactor = 1
            return
        }
        // One arrival's worth or less (the peer waits for us, or the line slowed down, or
        // only ACKs come), or more than the band (the line sped up, and the clock holds its
        // sender back). Gave up at its first read: the next hold-off is twice as long.
        let first = !gathered
        if bytes > bytesPerIntervalLimit || frames > framesPerIntervalLimit { endedOverBand &+= 1 } else { endedSparse &+= 1 }
        leave(now: now)
        if first { holdOffFactor = min(holdOffFactor * 2, Settings.maximumHoldOffFactor) }
    }

    /// Back to reading on arrival, for `holdOff` at least: the session stopped reading the line
    /// (its output queue is full).
    public mutating func leaveClock(now: Instant) {
        guard nextRead != nil else { return }
        endedPaused &+= 1
        leave(now: now)
    }

    private mutating func leave(now: Instant) {
        nextRead = nil
        windowStart = nil
        heldOffUntil = now + settings.holdOff * holdOffFactor
    }
}
