import CSystem
import Dispatch
import Glibc
import NetStack
import Synchronization

/// Something the loop services: a link session. It says when it next needs service without any
/// I/O (`pollAt`, read after each service), and is serviced then, in a turn one of its
/// descriptors had I/O, or when woken.
public protocol LoopClient: AnyObject {
    var pollAt: Instant? { get }
    func service(now: Instant)
}

/// One epoll loop on one thread: every descriptor of every channel in the process is watched
/// here, and every protocol core is driven from here, so no locks are needed in the data path.
/// Calls from other threads are posted to it (`execute`, `sync`).
///
/// The loop is fair: a descriptor's handler is called once a turn and does a bounded amount of
/// work (its budget: one buffer read, a few requests), leaving the rest for the next turn
/// (epoll is level-triggered, so nothing is lost). Timers and clients' deadlines sit in heaps,
/// and a client is serviced only when its deadline is due, one of its descriptors had I/O, or
/// something `wake`s it: a turn costs the same with 1 or 1,000 idle clients. The clock is
/// injected; a loop on a `VirtualClock` is driven by `advance(by:)`, so the policies built on
/// the loop (holdoffs, pauses, the line clock) are tested without sleeping.
public final class EventLoop: @unchecked Sendable {
    public typealias Handler = (_ events: UInt32) -> Void

    /// The process's loop, on a thread of its own, started on first use. Traps when the
    /// process can make no epoll instance or thread; `sharedLoop()` says so instead.
    public static var shared: EventLoop {
        do { return try sharedLoop() } catch { fatalError("pppbridge: the shared event loop: \(error)") }
    }

    private static let sharedInstance = Mutex<EventLoop?>(nil)

    /// The process's loop, made and started on first use; a failure (no descriptors left, no
    /// thread) is thrown, and the next call tries again.
    public static func sharedLoop() throws(SystemError) -> EventLoop {
        let made: Result<EventLoop, SystemError> = sharedInstance.withLock { current in
            if let current { return .success(current) }
            do throws(SystemError) {
                let loop = try EventLoop()
                try loop.startThread()
                current = loop
                return .success(loop)
            } catch {
                return .failure(error)
            }
        }
        return try made.get()
    }

    private let epoll: Int32
    private let wakeReader: Int32
    let wakeWriter: Int32
    public let clock: LoopClock
    private struct Registration {
        var handler: Handler
        var interest: UInt32
        var client: ObjectIdentifier?
    }
    // Unchecked in release builds (docs/PERFORMANCE.md says why): plain values and standard
    // collections, never changed across a call back into this object.
    #if DEBUG
    private var registrations = DescriptorTable<Registration>()
    private var clients: [ObjectIdentifier: LoopClient] = [:]
    private var clientDeadlines = DeadlineHeap<ObjectIdentifier>()
    private var ready: [ObjectIdentifier] = []
    private var spareReady: [ObjectIdentifier] = []
    private var readySet: Set<ObjectIdentifier> = []
    private var timerDeadlines = DeadlineHeap<Int>()
    private var timerBodies: [Int: () -> Void] = [:]
    private var deferred: [() -> Void] = []
    #else
    @exclusivity(unchecked) private var registrations = DescriptorTable<Registration>()
    @exclusivity(unchecked) private var clients: [ObjectIdentifier: LoopClient] = [:]
    @exclusivity(unchecked) private var clientDeadlines = DeadlineHeap<ObjectIdentifier>()
    @exclusivity(unchecked) private var ready: [ObjectIdentifier] = []
    @exclusivity(unchecked) private var spareReady: [ObjectIdentifier] = []
    @exclusivity(unchecked) private var readySet: Set<ObjectIdentifier> = []
    @exclusivity(unchecked) private var timerDeadlines = DeadlineHeap<Int>()
    @exclusivity(unchecked) private var timerBodies: [Int: () -> Void] = [:]
    @exclusivity(unchecked) private var deferred: [() -> Void] = []
    #endif
    private var nextTimerID = 0
    let posted = Mutex<[@Sendable () -> Void]>([])
    let threadID = Mutex<pthread_t?>(nil)
    // Unchecked in release builds, as above: read and changed by `turn` and `run` alone (the
    // events' buffer by `epoll_wait`, its entries read between handlers), never across a
    // handler's call.
    #if DEBUG
    private var stopRequested = false
    private var events = [epoll_event](repeating: epoll_event(), count: 64)
    /// Turns taken (every `epoll_wait`), for tests and the benchmark.
    public private(set) var turns = 0
    #else
    @exclusivity(unchecked) private var stopRequested = false
    @exclusivity(unchecked) private var events = [epoll_event](repeating: epoll_event(), count: 64)
    /// Turns taken (every `epoll_wait`), for tests and the benchmark.
    @exclusivity(unchecked) public private(set) var turns = 0
    #endif
    // Unchecked in release builds, as above.
    /// The clock as of the current turn.
    #if DEBUG
    public private(set) var now: Instant
    #else
    @exclusivity(unchecked) public private(set) var now: Instant
    #endif

    /// A loop on `clock` (the monotonic clock unless a test gives a `VirtualClock` or a
    /// `LeapingClock`).
    public init(clock: LoopClock = MonotonicClock()) throws(SystemError) {
        let e = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard e >= 0 else { throw SystemError("epoll_create1") }
        var fds: [Int32] = [0, 0]
        guard pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0 else {
            let error = SystemError("pipe2")
            Glibc.close(e)
            throw error
        }
        epoll = e
        wakeReader = fds[0]
        wakeWriter = fds[1]
        self.clock = clock
        now = clock.now
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeReader
        _ = epoll_ctl(epoll, EPOLL_CTL_ADD, wakeReader, &event)
        (clock as? LeapingClock)?.attach(self)
    }

    deinit {
        Glibc.close(wakeReader)
        Glibc.close(wakeWriter)
        Glibc.close(epoll)
    }

    /// True while a thread is inside `run`.
    public var isRunning: Bool { threadID.withLock { $0 != nil } }

    /// True on the loop's own thread.
    public var inLoop: Bool {
        threadID.withLock { id in id.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    // MARK: Descriptors (loop thread only)

    /// Watches `fd` for `events` (EPOLLIN, EPOLLOUT; errors and hang-ups always) and calls
    /// `handler` with what happened. The handler may (un)register anything, itself included.
    /// `client`, when given, is the client whose state the handler feeds: it is serviced in the
    /// same turn as the handler runs. The handler must do a bounded amount of work per call
    /// (a buffer, a few requests): the loop calls it again next turn while `fd` stays ready.
    public func register(_ fd: FileDescriptor, events: UInt32, serving client: LoopClient? = nil, handler: @escaping Handler) throws(SystemError) {
        var e = epoll_event()
        e.events = events
        e.data.fd = fd.rawValue
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, fd.rawValue, &e) == 0 else { throw SystemError("epoll_ctl add") }
        registrations[fd] = Registration(handler: handler, interest: events, client: client.map(ObjectIdentifier.init))
    }

    /// Changes what `fd` is watched for; nothing happens when it is already that.
    public func setInterest(_ fd: FileDescriptor, _ events: UInt32) {
        guard let current = registrations[fd]?.interest, current != events else { return }
        var e = epoll_event()
        e.events = events
        e.data.fd = fd.rawValue
        if epoll_ctl(epoll, EPOLL_CTL_MOD, fd.rawValue, &e) == 0 { registrations.modify(fd) { $0.interest = events } }
    }

    /// Stops watching `fd` (before it is closed, so a reused number is never confused with it).
    public func unregister(_ fd: FileDescriptor) {
        guard registrations.removeValue(forKey: fd) != nil else { return }
        _ = epoll_ctl(epoll, EPOLL_CTL_DEL, fd.rawValue, nil)
    }

    public var registeredDescriptors: Int { registrations.count }

    // MARK: Clients and timers (loop thread only)

    /// Serves `client` from now on: at once (this turn or the next), then whenever its
    /// `pollAt` is due, one of its descriptors had I/O, or it is woken.
    public func add(_ client: LoopClient) {
        let key = ObjectIdentifier(client)
        guard clients[key] == nil else { return }
        clients[key] = client
        markReady(key)
    }

    public func remove(_ client: LoopClient) {
        let key = ObjectIdentifier(client)
        guard clients.removeValue(forKey: key) != nil else { return }
        clientDeadlines.remove(key)
    }

    /// Services `client` on this turn or the next: its state changed other than through its
    /// own descriptors (a call from its owner, a timer of another object), so its `pollAt` may
    /// have moved.
    /// A client woken while it is being serviced is serviced again on the next turn: what
    /// woke it came from a callback of its own service, after it had taken its work.
    public func wake(_ client: LoopClient) {
        let key = ObjectIdentifier(client)
        guard clients[key] != nil else { return }
        markReady(key)
    }

    private func markReady(_ key: ObjectIdentifier) {
        if readySet.insert(key).inserted { ready.append(key) }
    }

    public var clientCount: Int { clients.count }
    public var timerCount: Int { timerBodies.count }

    /// Runs `body` once at `at` (or the first turn after). Returns an id for `cancelTimer`.
    @discardableResult
    public func schedule(at: Instant, _ body: @escaping () -> Void) -> Int {
        nextTimerID += 1
        timerBodies[nextTimerID] = body
        timerDeadlines.set(nextTimerID, at: at)
        return nextTimerID
    }

    public func cancelTimer(_ id: Int) {
        guard timerBodies.removeValue(forKey: id) != nil else { return }
        timerDeadlines.remove(id)
    }

    /// Runs `body` on the next turn, after that turn's I/O: for a handler that used up its
    /// budget with work still waiting that no descriptor will announce (lines already read).
    public func nextTurn(_ body: @escaping () -> Void) {
        deferred.append(body)
    }

    // MARK: Running

    /// Starts a thread that runs the loop for the life of the process.
    public func startThread() throws(SystemError) {
        let thread = Thread(self)
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        var t = pthread_t()
        let box = Unmanaged.passRetained(thread)
        // The loop belongs to that thread from the moment it exists, even before it enters `run`:
        // set under the lock the thread's `run` takes, so the two cannot cross.
        let result: Int32 = threadID.withLock { id in
            let r = pthread_create(&t, &attributes, { raw in
                guard let raw else { return nil }
                let thread = Unmanaged<EventLoop.Thread>.fromOpaque(raw).takeRetainedValue()
                thread.loop.run { false }
                return nil
            }, box.toOpaque())
            if r == 0 { id = t }
            return r
        }
        guard result == 0 else {
            box.release()
            throw SystemError("pthread_create", errno: Errno(result))
        }
    }

    private final class Thread {
        let loop: EventLoop
        init(_ loop: EventLoop) { self.loop = loop }
    }

    /// Runs the loop on the calling thread until `done` returns true (checked every turn) or
    /// `stop` is called.
    public func run(until done: () -> Bool) {
        threadID.withLock { $0 = pthread_self() }
        defer {
            threadID.withLock { $0 = nil }
            // What `enqueue` and `perform` posted before the thread was cleared still runs.
            runPosted()
        }
        stopRequested = false
        now = clock.now
        runPosted()
        while !stopRequested && !done() {
            turn(timeout: timeout(until: nextDeadline))
        }
    }

    /// A virtual loop's way forward: moves its clock by `duration`, taking every turn that
    /// falls due on the way, each at its deadline's instant (descriptors are polled without
    /// waiting). Runs on the calling thread, which owns the loop meanwhile. At most
    /// `turnLimit` turns at one instant: a client whose deadline never moves cannot hold a test
    /// forever.
    public func advance(by duration: Duration, turnLimit: Int = 100_000) {
        guard let virtual = clock as? VirtualClock else { return }
        threadID.withLock { $0 = pthread_self() }
        defer { threadID.withLock { $0 = nil } }
        let end = virtual.now + duration
        var turnsAtThisInstant = 0
        while true {
            let before = virtual.now
            turn(timeout: 0)
            guard let next = nextDeadline, next <= end else { break }
            if next > virtual.now { virtual.set(next) }
            turnsAtThisInstant = virtual.now == before ? turnsAtThisInstant + 1 : 0
            if turnsAtThisInstant >= turnLimit { break }
        }
        virtual.set(end)
        turn(timeout: 0)
    }

    /// A virtual loop's single step: one turn at the clock's present instant, descriptors
    /// polled without waiting. For tests that count what one turn does (a handler's budget).
    public func runTurn() {
        guard clock is VirtualClock else { return }
        threadID.withLock { $0 = pthread_self() }
        defer { threadID.withLock { $0 = nil } }
        turn(timeout: 0)
    }

    /// When the next turn is due without I/O: now when clients are waiting to be serviced or
    /// work was put off to the next turn, else the earliest timer or client deadline.
    private var nextDeadline: Instant? {
        if !ready.isEmpty || !deferred.isEmpty { return now }
        return earliest(timerDeadlines.earliest, clientDeadlines.earliest)
    }

    private func timeout(until deadline: Instant?) -> Int32 {
        guard let d = deadline else { return -1 }
        // Saturating: a deadline at either end of time (a peer's huge delay) waits the
        // longest epoll can, or not at all, instead of trapping.
        let remaining = (d - clock.now).nanoseconds
        let ms = remaining > .max - 999_999 ? .max / 1_000_000 : (remaining + 999_999) / 1_000_000
        return Int32(clamping: max(0, ms))
    }

    /// One turn: wait for I/O (at most `timeout` ms), call each ready descriptor's handler once,
    /// run what was posted or put off, the timers that are due, then service the clients that
    /// are due or had I/O, and take their new deadlines.
    private func turn(timeout: Int32) {
        turns &+= 1
        // What was put off before this turn began runs in it; what its handlers put off waits
        // for the next.
        var putOff: [() -> Void] = []
        swap(&putOff, &deferred)
        let n = events.withUnsafeMutableBufferPointer { epoll_wait(epoll, $0.baseAddress, Int32($0.count), timeout) }
        now = clock.now
        for i in 0..<max(0, Int(n)) {
            let fd = events[i].data.fd
            if fd == wakeReader {
                var sink = [UInt8](repeating: 0, count: 256)
                while Glibc.read(wakeReader, &sink, sink.count) > 0 {}
                continue
            }
            guard let registration = registrations[FileDescriptor(fd)] else { continue }
            if let client = registration.client { markReady(client) }
            registration.handler(events[i].events)
        }
        runPosted()
        for w in putOff { w() }
        if let first = timerDeadlines.earliest, first <= now {
            // Only the timers due now: one scheduled at `now` by a timer's body waits a turn.
            var due: [Int] = []
            while let id = timerDeadlines.popDue(now: now) { due.append(id) }
            for id in due {
                if let body = timerBodies.removeValue(forKey: id) { body() }
            }
        }
        while let key = clientDeadlines.popDue(now: now) { markReady(key) }
        guard !ready.isEmpty else { return }
        // The list and a spare trade places each turn, both keeping their storage: a turn that
        // services a client allocates nothing for the list (an empty array put in `ready`'s
        // place allocated one every turn, once it was appended to).
        var batch = spareReady
        spareReady = []
        swap(&batch, &ready)
        readySet.removeAll(keepingCapacity: true)
        for key in batch {
            guard let client = clients[key] else { continue }
            client.service(now: now)
            if clients[key] != nil { clientDeadlines.set(key, at: client.pollAt) }
        }
        batch.removeAll(keepingCapacity: true)
        spareReady = batch
    }

    /// Makes `run` return after the current turn (loop thread), or wakes it to return (others).
    public func stop() {
        execute { [unowned self] in self.stopRequested = true }
    }

    private func runPosted() {
        while true {
            let work = posted.withLock { p -> [@Sendable () -> Void] in
                let w = p
                p.removeAll()
                return w
            }
            if work.isEmpty { return }
            for w in work { w() }
        }
    }
}
