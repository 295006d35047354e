/// The line's output queue in two parts: control frames, written first, and IP frames behind
/// them, so LCP (echoes above all), IPCP and authentication never wait for bulk data. A frame
/// once begun is finished before the other part is written: a frame of the other part inside
/// it would end it at its flag, and both would be lost to the FCS check (RFC 1662 §4).
struct LineOutputQueue {
    private var control: [UInt8] = []
    private var controlStart = 0
    private var data: [UInt8] = []
    private var dataStart = 0
    /// IP frames queued behind `data` once 64 KiB of it are written: the line writes what is
    /// left of `data`, then the two trade places. Nothing written is ever moved to make room
    /// (compacting `data` instead moved up to every byte once more).
    private var tail: [UInt8] = []
    /// The lengths of the IP frames in `data`, oldest first from `frameStart`; the oldest has
    /// `headWritten` bytes on the line already. A frame encoded onto the end of another that
    /// is not yet written shares its flag (`appendDataFrame`), and its length leaves it out;
    /// once `data` is all written it is emptied, so the next frame opens with its own.
    private var frameLengths: [Int] = []
    private var frameStart = 0
    private var headWritten = 0

    var controlCount: Int { control.count - controlStart }
    var dataCount: Int { data.count - dataStart + tail.count }
    /// What the IP part's arrays hold, written bytes not yet let go included.
    var dataStored: Int { data.count + tail.count }
    /// Where frames are appended: behind `data`, until enough of it is written.
    private var appendsToTail: Bool { !tail.isEmpty || dataStart >= LineOutputQueue.tailThreshold }
    private static let tailThreshold = 65536
    var count: Int { controlCount + dataCount }
    var isEmpty: Bool { count == 0 }

    /// Whether a fast source (TUN) may be read: while a packet of the largest size still fits
    /// (IP data is counted unframed by its sources, so the queue may run past the limit by the
    /// escapes), or when no IP data is queued and there is any room at all (a limit below the
    /// MTU: one packet at a time). Never with no room: a level-triggered descriptor whose handler
    /// reads nothing would wake the loop at once, every turn, while control frames fill the
    /// queue (a peer flooding Echo-Requests and reading nothing back).
    func sourceMayRead(limit: Int, largestPacket: Int) -> Bool {
        let room = limit - count
        return room >= largestPacket || (dataCount == 0 && room > 0)
    }

    /// Whether `bytes` of control frames fit: control may go `reserve` beyond the limit, and IP
    /// data counts up to the limit only, so escapes that take the data past it (up to twice its
    /// size for a payload of flags) never crowd out LCP, IPCP or an Echo-Reply.
    func controlFits(_ bytes: Int, limit: Int, reserve: Int) -> Bool {
        controlCount + min(dataCount, limit) + bytes <= limit + reserve
    }

    /// Appends control frames (each starting and ending with a flag).
    mutating func append(control frames: [UInt8]) {
        control += frames
    }

    /// Frames one IP packet straight onto the end of the queue: `encode` appends it to the
    /// buffer it is given, and says whether it did. Back to back, frames share a flag.
    mutating func appendDataFrame(_ encode: (inout [UInt8]) -> Bool) -> Bool {
        if appendsToTail {
            let before = tail.count
            guard encode(&tail) else { return false }
            if tail.count > before { frameLengths.append(tail.count - before) }
            return true
        }
        let before = data.count
        guard encode(&data) else { return false }
        if data.count > before { frameLengths.append(data.count - before) }
        return true
    }

    /// Appends one framed IP packet.
    mutating func append(dataFrame frame: [UInt8]) {
        guard !frame.isEmpty else { return }
        if appendsToTail { tail += frame } else { data += frame }
        frameLengths.append(frame.count)
    }

    /// What to write next: the rest of an IP frame already begun when control frames wait,
    /// else the control frames, else the IP frames (those of `data`; `tail`'s once it is gone).
    var next: ArraySlice<UInt8> {
        guard controlCount > 0 else { return data[dataStart...] }
        if headWritten > 0 { return data[dataStart..<(dataStart + frameLengths[frameStart] - headWritten)] }
        return control[controlStart...]
    }

    /// `n` bytes of `next` were written.
    mutating func written(_ n: Int) {
        if controlCount > 0 && headWritten == 0 {
            controlStart += min(n, controlCount)
            if controlStart == control.count {
                control.removeAll(keepingCapacity: true)
                controlStart = 0
            }
            return
        }
        var left = min(n, data.count - dataStart)
        dataStart += left
        while left > 0, frameStart < frameLengths.count {
            let rest = frameLengths[frameStart] - headWritten
            if left < rest {
                headWritten += left
                left = 0
            } else {
                left -= rest
                frameStart += 1
                headWritten = 0
            }
        }
        if dataStart == data.count {
            // `data` is all written: `tail` (empty or not) takes its place, keeping both arrays.
            swap(&data, &tail)
            tail.removeAll(keepingCapacity: true)
            dataStart = 0
            if data.isEmpty {
                frameLengths.removeAll(keepingCapacity: true)
                frameStart = 0
                headWritten = 0
            }
        }
        if frameStart >= 4096 && frameStart >= frameLengths.count - frameStart {
            // The lengths (one word a frame) compacted as the bytes once were.
            frameLengths.removeFirst(frameStart)
            frameStart = 0
        }
    }

    mutating func removeAll() {
        self = LineOutputQueue()
    }
}

/// The line's output queue: what it holds now, the most it held, and what it dropped.
public struct LineQueueCounters: Sendable, Equatable, CustomStringConvertible {
    public var queued = 0
    /// The limit in force (see `LineFlowControl.limit`).
    public var limit = 0
    public var peak = 0
    /// IP packets dropped because the queue was over its limit.
    public var droppedPackets = 0
    /// Bytes of control frames dropped because the queue was over its limit and reserve.
    public var droppedControlBytes = 0
    /// Times reading the line was paused until the queue drained.
    public var readPauses = 0
    /// Times the line was busy enough to be read on a clock, and the reads made on it
    /// (`LineReadModeration`).
    public var busyPeriods = 0
    public var clockedReads = 0
    /// Reads on arrival that brought bytes; and why busy periods ended: a read on the clock
    /// that brought too little, or more than the band allows, or reading paused.
    public var arrivalReads = 0
    public var clockEndedSparse = 0
    public var clockEndedOverBand = 0
    public var clockEndedPaused = 0
    public init() {}

    public var description: String {
        "line queue \(queued) B of \(limit) B (peak \(peak) B), dropped \(droppedPackets) packets and \(droppedControlBytes) control bytes, reading paused \(readPauses) times; \(arrivalReads) reads on arrival, \(clockedReads) on the clock in \(busyPeriods) busy periods (ended: \(clockEndedSparse) sparse, \(clockEndedOverBand) over the band, \(clockEndedPaused) paused)"
    }
}
