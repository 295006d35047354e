import Wire

/// The line's flow policy, sans-IO: what may wait for the line (the output queue's limit and
/// the control frames' reserve), when the line is not read because that queue is full (the read
/// pause), and when a busy line is read on a clock (`LineReadModeration`), with their counters.
/// `LinkSession` holds one and does the system calls it implies; tests drive it on virtual time.
///
/// The limit: IP packets do not fill the queue beyond it. One that does not fit is dropped (TCP
/// retransmits, as behind any full router queue) and the line is not read until the queue is
/// back under half of it (one buffer every `maximumReadPause` at most), so a peer that floods us
/// with requests and never reads the answers backs up in its own line, not in our memory. By
/// default about two seconds of line time (`defaultLimit`); kept within
/// `minimumLimit...maximumLimit`, so the sums below cannot overflow.
///
/// LCP keep-alive depends on it staying short. Our Echo-Request (RFC 1661 §5.8) is a control
/// frame and goes out ahead of the queued IP data, after at most the rest of the IP frame being
/// written (and what the kernel's tty buffer already holds). The peer's reply can wait in its
/// side of the line while our reading is paused, which lasts until the queue is down to half:
/// about a second of line time at the default. Both stay far inside the interval × failures
/// (20 s) the PPP core allows, so its count of misses, which starts when the request is queued,
/// is not fooled by our own backlog; a line that takes no bytes at all (a peer that never reads,
/// CTS held low) is the dead peer echo is there to notice.
public struct LineFlowControl: Sendable {
    /// The smallest limit accepted: two full-size frames at the default MRU of 1500.
    public static let minimumLimit = 4096
    /// The largest limit accepted (64 MiB): far beyond any line's need, and small enough that
    /// the limit plus the control reserve cannot overflow.
    public static let maximumLimit = 64 << 20
    /// The limit for a line without a speed that paces it (a pty, a socket): bursts from the
    /// host are absorbed, and the line drains as fast as the other side reads.
    public static let unpacedLimit = 256 * 1024
    /// Control frames (LCP, IPCP, authentication, echo replies) may go this far beyond the
    /// limit: they are few and keep the link alive; past it they are dropped too (their own
    /// timers resend them).
    public static let controlReserve = 16 * 1024
    /// The longest the line goes unread while our queue is full. A pause must end by itself:
    /// the peer may be another of us whose own queue is full of what we have not read, paused
    /// in turn, and two pauses waiting for each other would never end (seen with the kernel's
    /// TCP on both ends of a pty). One buffer read per pause bounds what a flooding peer gets in
    /// (and what we answer is dropped at the full queue), while a paused peer of ours drains.
    public static let maximumReadPause: Duration = .milliseconds(200)

    /// The default limit: two seconds at `bitsPerSecond` (ten bits a byte on an 8N1 line), at
    /// least 8 KiB so a few full-size frames fit on a slow line (8 KiB is 8.5 s at 9600 baud);
    /// `unpacedLimit` without a speed.
    public static func defaultLimit(bitsPerSecond: Int?) -> Int {
        guard let speed = bitsPerSecond, speed > 0 else { return unpacedLimit }
        return min(max(speed / 10 * 2, 8 * 1024), maximumLimit)
    }

    /// IP packets do not fill the queue beyond this (clamped into `minimumLimit...maximumLimit`).
    public var limit: Int {
        didSet { limit = min(max(limit, Self.minimumLimit), Self.maximumLimit) }
    }
    /// What waits for the line: control frames ahead of IP frames.
    var queue = LineOutputQueue()
    /// While the line is busy it is read on a clock rather than on every arrival.
    public var moderation: LineReadModeration
    /// The line is not read while the queue is full.
    public private(set) var readPaused = false
    /// When the current pause began.
    private var readPausedSince: Instant?
    /// Something did not fit in the queue since the interest was last decided.
    private var overflowed = false
    private var tally = LineQueueCounters()

    public init(limit: Int, readModeration: LineReadModeration.Settings = .standard) {
        self.limit = min(max(limit, Self.minimumLimit), Self.maximumLimit)
        moderation = LineReadModeration(settings: readModeration)
    }

    /// Bytes waiting for the line.
    public var queued: Int { queue.count }

    /// The room IP sources are told of (they count packets unframed).
    public var room: Int { max(0, limit - queue.count) }

    /// Whether `bytes` of control frames may be queued; when not, they are counted as dropped.
    public mutating func admitControl(bytes: Int) -> Bool {
        guard queue.controlFits(bytes, limit: limit, reserve: Self.controlReserve) else {
            tally.droppedControlBytes += bytes
            overflowed = true
            return false
        }
        return true
    }

    /// Whether an IP packet of `size` bytes may be queued when `room` is left of what the
    /// sources were told (decided before it is framed: a drop here is like a frame lost on the
    /// line). A packet larger than the room still goes when no IP data is queued (a peer MRU up
    /// to 16384 against a small limit), so full-size segments are never refused for good.
    public mutating func admitPacket(size: Int, room: Int) -> Bool {
        guard size <= room || queue.dataCount == 0 else {
            tally.droppedPackets += 1
            overflowed = true
            return false
        }
        return true
    }

    /// Notes the queue's high-water mark after frames were added.
    mutating func queuedMore() {
        tally.peak = max(tally.peak, queue.count)
    }

    /// Whether a fast source (TUN) may be read: while a packet of `largestPacket` still fits.
    public func sourceMayRead(largestPacket: Int) -> Bool {
        queue.sourceMayRead(limit: limit, largestPacket: largestPacket)
    }

    /// Decides, after a turn's work, whether the line is read: returns true while it is watched
    /// for arrivals (neither paused nor read on the clock).
    ///
    /// Full is when a packet or control frames did not fit and were dropped. A queue that merely
    /// reached the limit is not: our own sources (TUN, the stack's TCP) fill it to the brim
    /// while the line is busy, and pausing then would pause a peer of ours in turn. Reading
    /// resumes only once half the limit has drained, so a flood is not let in again a frame at
    /// a time (and a paused line always has output to wait for).
    public mutating func decideReading(now: Instant) -> Bool {
        let full = overflowed
        overflowed = false
        var pause = queue.count > limit / 2 && (readPaused || full)
        if pause, let since = readPausedSince, now - since >= Self.maximumReadPause {
            // Time is up: one buffer is read this turn, then (still full) a new pause begins.
            pause = false
        }
        if pause && !readPaused {
            tally.readPauses += 1
            readPausedSince = now
            // The pause ends with one buffer read on arrival, as without the clock.
            moderation.leaveClock(now: now)
        } else if !pause {
            readPausedSince = nil
        }
        readPaused = pause
        // A line read on the clock is not watched for arrivals: that is what saves the wakeups.
        return !pause && !moderation.onClock
    }

    /// Whether a read on the clock is due.
    public func clockReadDue(now: Instant) -> Bool {
        guard !readPaused, let due = moderation.nextRead else { return false }
        return due <= now
    }

    /// When the policy next needs a turn: the pause's end, or the clock's next read.
    public var pollAt: Instant? {
        let pauseEnds = readPausedSince.map { $0 + Self.maximumReadPause }
        guard !readPaused, let next = moderation.nextRead else { return pauseEnds }
        return pauseEnds.map { min($0, next) } ?? next
    }

    /// What the queue held and dropped, and how the line was read.
    public var counters: LineQueueCounters {
        var c = tally
        c.queued = queue.count
        c.limit = limit
        c.busyPeriods = moderation.busyPeriods
        c.clockedReads = moderation.clockedReads
        c.arrivalReads = moderation.arrivalReads
        c.clockEndedSparse = moderation.endedSparse
        c.clockEndedOverBand = moderation.endedOverBand
        c.clockEndedPaused = moderation.endedPaused
        return c
    }
}
