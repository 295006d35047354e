import CSystem
import Dispatch
import Glibc
import NetStack
import Synchronization

/// Something the loop serves after every turn: a link session, a channel. It says when it next
/// needs service without any I/O (its timers), and is served with the loop's clock.
public protocol LoopClient: AnyObject {
    var pollAt: Instant? { get }
    func service(now: Instant)
}

/// A call posted to the loop and its result, handed between two threads by a semaphore.
private final class SyncBox<T>: @unchecked Sendable {
    var body: (() -> T)?
    var result: T?
    init(_ body: @escaping () -> T) { self.body = body }
}

/// One epoll loop on one thread: every descriptor of every channel in the process is watched
/// here, and every protocol core is driven from here, so no locks are needed in the data path.
/// Calls from other threads are posted to it (`execute`, `sync`).
public final class EventLoop: @unchecked Sendable {
    public typealias Handler = (_ events: UInt32) -> Void

    /// The process's loop, on a thread of its own, started on first use.
    public static let shared: EventLoop = {
        let loop = try! EventLoop()
        loop.startThread()
        return loop
    }()

    private let epoll: Int32
    private let wakeReader: Int32
    private let wakeWriter: Int32
    // Release builds skip the runtime exclusivity check on the properties in these #if blocks
    // (about 70 instructions an access, several on every turn): plain values and standard
    // collections, changed by assignment, `swap`, their own methods or a system call's buffer
    // argument, never across a call back into this object. Debug builds, so every test, keep it.
    #if DEBUG
    private var handlers: [Int32: Handler] = [:]
    private var interests: [Int32: UInt32] = [:]
    private var clients: [LoopClient] = []
    private var timers: [(at: Instant, id: Int, body: () -> Void)] = []
    #else
    @exclusivity(unchecked) private var handlers: [Int32: Handler] = [:]
    @exclusivity(unchecked) private var interests: [Int32: UInt32] = [:]
    @exclusivity(unchecked) private var clients: [LoopClient] = []
    @exclusivity(unchecked) private var timers: [(at: Instant, id: Int, body: () -> Void)] = []
    #endif
    private var nextTimerID = 0
    private let posted = Mutex<[@Sendable () -> Void]>([])
    private let threadID = Mutex<pthread_t?>(nil)
    private var stopRequested = false
    // Unchecked in release builds, as above.
    /// The clock as of the current turn.
    #if DEBUG
    public private(set) var now: Instant
    #else
    @exclusivity(unchecked) public private(set) var now: Instant
    #endif

    public init() throws(SystemError) {
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
        now = monotonicNow()
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeReader
        _ = epoll_ctl(epoll, EPOLL_CTL_ADD, wakeReader, &event)
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

    /// Runs `body` on the loop thread, soon.
    public func execute(_ body: @escaping @Sendable () -> Void) {
        posted.withLock { $0.append(body) }
        var b: UInt8 = 1
        _ = Glibc.write(wakeWriter, &b, 1)
    }

    /// Runs `body` on the loop thread and returns its result: at once when called there (or
    /// when no thread runs the loop), otherwise posted and waited for.
    public func sync<T>(_ body: () -> T) -> T {
        // A loop no thread is running yet (one a program runs on its own thread later) is the
        // caller's alone: the work is done at once.
        if inLoop || !isRunning { return body() }
        return withoutActuallyEscaping(body) { escapable in
            // The posted closure holds only the box, which lets go of `body` before the
            // caller resumes, so `body` never outlives this call.
            let box = SyncBox(escapable)
            let done = DispatchSemaphore(value: 0)
            execute {
                box.result = box.body?()
                box.body = nil
                done.signal()
            }
            done.wait()
            return box.result!
        }
    }

    /// Runs `body` on the loop thread: at once when called there or when no thread runs the
    /// loop, otherwise posted (the caller goes on; nothing waits). For async APIs that resume a
    /// continuation from the loop.
    public func enqueue(_ body: @escaping () -> Void) {
        let box = SyncBox(body)
        let posted = postWhileRunning {
            box.body?()
            box.body = nil
        }
        if !posted { body() }
    }

    /// Posts `work` if a thread runs the loop and it is not this one; false otherwise. Decided
    /// under the lock `run` clears the thread under, and `run` drains what was posted once it
    /// has cleared it: work posted this way always runs (a plain `execute` racing the loop's
    /// end could be left in the queue, and an async caller waiting on it would never resume).
    private func postWhileRunning(_ work: @escaping @Sendable () -> Void) -> Bool {
        threadID.withLock { id in
            guard let id, pthread_equal(id, pthread_self()) == 0 else { return false }
            self.posted.withLock { $0.append(work) }
            var b: UInt8 = 1
            _ = Glibc.write(self.wakeWriter, &b, 1)
            return true
        }
    }

    /// Runs `body` on the loop thread and returns its result without blocking the caller's
    /// thread: the calling task is suspended until the loop has run it (which `sync`, waiting on a
    /// semaphore, would do with a thread of the cooperative pool held). At once when called on the
    /// loop's thread or when no thread runs the loop. What async APIs use.
    public func perform<T>(_ body: @escaping () -> T) async -> T {
        let box = SyncBox(body)
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let posted = postWhileRunning {
                box.result = box.body?()
                box.body = nil
                c.resume()
            }
            if !posted {
                box.result = box.body?()
                box.body = nil
                c.resume()
            }
        }
        return box.result!
    }

    // MARK: Descriptors (loop thread only)

    /// Watches `fd` for `events` (EPOLLIN, EPOLLOUT; errors and hang-ups always) and calls
    /// `handler` with what happened. The handler may (un)register anything, itself included.
    public func register(_ fd: Int32, events: UInt32, handler: @escaping Handler) throws(SystemError) {
        var e = epoll_event()
        e.events = events
        e.data.fd = fd
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &e) == 0 else { throw SystemError("epoll_ctl add") }
        handlers[fd] = handler
        interests[fd] = events
    }

    /// Changes what `fd` is watched for; nothing happens when it is already that.
    public func setInterest(_ fd: Int32, _ events: UInt32) {
        guard let current = interests[fd], current != events else { return }
        var e = epoll_event()
        e.events = events
        e.data.fd = fd
        if epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &e) == 0 { interests[fd] = events }
    }

    /// Stops watching `fd` (before it is closed, so a reused number is never confused with it).
    public func unregister(_ fd: Int32) {
        guard handlers.removeValue(forKey: fd) != nil else { return }
        interests[fd] = nil
        _ = epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil)
    }

    public var registeredDescriptors: Int { handlers.count }

    // MARK: Clients and timers (loop thread only)

    public func add(_ client: LoopClient) {
        guard !clients.contains(where: { $0 === client }) else { return }
        clients.append(client)
    }

    public func remove(_ client: LoopClient) {
        clients.removeAll { $0 === client }
    }

    /// Runs `body` once at `at` (or the first turn after). Returns an id for `cancelTimer`.
    @discardableResult
    public func schedule(at: Instant, _ body: @escaping () -> Void) -> Int {
        nextTimerID += 1
        timers.append((at, nextTimerID, body))
        return nextTimerID
    }

    public func cancelTimer(_ id: Int) { timers.removeAll { $0.id == id } }

    // MARK: Running

    /// Starts a thread that runs the loop for the life of the process.
    public func startThread() {
        let thread = Thread(self)
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        var t = pthread_t()
        let box = Unmanaged.passRetained(thread).toOpaque()
        pthread_create(&t, &attributes, { raw in
            let thread = Unmanaged<EventLoop.Thread>.fromOpaque(raw!).takeRetainedValue()
            thread.loop.run { false }
            return nil
        }, box)
        pthread_attr_destroy(&attributes)
        // The loop belongs to that thread from now on, even before it enters `run`.
        threadID.withLock { $0 = t }
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
        var events = [epoll_event](repeating: epoll_event(), count: 64)
        now = monotonicNow()
        runPosted()
        while !stopRequested && !done() {
            var deadline: Instant?
            for c in clients { deadline = earliest(deadline, c.pollAt) }
            for t in timers { deadline = earliest(deadline, t.at) }
            var timeout: Int32 = -1
            if let d = deadline {
                // Saturating: a deadline at either end of time (a peer's huge delay) waits the
                // longest epoll can, or not at all, instead of trapping.
                let remaining = (d - monotonicNow()).nanoseconds
                let ms = remaining > .max - 999_999 ? .max / 1_000_000 : (remaining + 999_999) / 1_000_000
                timeout = Int32(clamping: max(0, ms))
            }
            let n = events.withUnsafeMutableBufferPointer { epoll_wait(epoll, $0.baseAddress, Int32($0.count), timeout) }
            now = monotonicNow()
            for i in 0..<max(0, Int(n)) {
                let fd = events[i].data.fd
                if fd == wakeReader {
                    var sink = [UInt8](repeating: 0, count: 256)
                    while Glibc.read(wakeReader, &sink, sink.count) > 0 {}
                    continue
                }
                handlers[fd]?(events[i].events)
            }
            runPosted()
            if !timers.isEmpty {
                let due = timers.filter { $0.at <= now }
                timers.removeAll { $0.at <= now }
                for t in due { t.body() }
            }
            for c in clients where clients.contains(where: { $0 === c }) { c.service(now: now) }
        }
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
