import Dispatch
import Glibc
import Synchronization

/// A call posted to the loop and its result, handed between two threads by a semaphore.
private final class SyncBox<T>: @unchecked Sendable {
    var body: (() -> T)?
    var result: T?
    init(_ body: @escaping () -> T) { self.body = body }
}

/// Calls into the loop from any thread: posted to it, run at once on it, or awaited.
extension EventLoop {
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
    /// Returns once the loop has taken a whole turn that began after this call: the timers and
    /// clients due at that turn's instant have run. What a test waits for after moving a
    /// `LeapingClock`: `perform {}` alone can return before them, since a turn runs what was
    /// posted before its timers and clients, and a turn that was already under way when the
    /// clock moved read the time before it did. At once when no thread runs the loop.
    public func fullTurn() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            // The posted closure runs in some turn N; the turn after it (N + 1) read the time
            // after this call; its put-off work runs before its timers, so a second put-off
            // (run in N + 2) is what follows all of N + 1.
            let posted = postWhileRunning { [unowned self] in
                self.nextTurn { self.nextTurn { c.resume() } }
            }
            if !posted { c.resume() }
        }
    }

    /// `fullTurn()` for a thread that may block (never a cooperative one): waits on a
    /// semaphore.
    public func waitForFullTurn() {
        let done = DispatchSemaphore(value: 0)
        let posted = postWhileRunning { [unowned self] in
            self.nextTurn { self.nextTurn { done.signal() } }
        }
        if posted { done.wait() }
    }
}
