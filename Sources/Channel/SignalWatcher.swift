import CSystem
import Glibc

/// The self-pipe the watched signals write to, so the loop sees them as readable bytes.
nonisolated(unsafe) private var signalPipeWriter: Int32 = -1

/// Turns signals into calls on the loop (one watcher per process at a time): the handler only
/// writes the signal's number to a pipe.
public final class SignalWatcher {
    private let reader: FileDescriptor
    private let writer: FileDescriptor
    private let signals: [Int32]
    private unowned let loop: EventLoop
    private var cancelled = false

    public init(signals: [Int32], loop: EventLoop, handler: @escaping (Int32) -> Void) throws(SystemError) {
        var fds: [Int32] = [0, 0]
        guard pipe2(&fds, O_NONBLOCK | O_CLOEXEC) == 0 else { throw SystemError("pipe2") }
        reader = FileDescriptor(fds[0])
        writer = FileDescriptor(fds[1])
        self.signals = signals
        self.loop = loop
        do {
            try loop.register(reader, events: EPOLLIN.rawValue) { [reader] _ in
                var b: UInt8 = 0
                while read(reader.rawValue, &b, 1) == 1 { handler(Int32(b)) }
            }
        } catch {
            Glibc.close(fds[0])
            Glibc.close(fds[1])
            throw error
        }
        signalPipeWriter = writer.rawValue
        // A parent may have started us with these blocked; we must see them.
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for s in signals { sigaddset(&unblock, s) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        for s in signals {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { signo in
                var b = UInt8(truncatingIfNeeded: signo)
                _ = write(signalPipeWriter, &b, 1)
            }
            sigemptyset(&action.sa_mask)
            action.sa_flags = Int32(SA_RESTART)
            sigaction(s, &action, nil)
        }
    }

    /// Restores the default dispositions and closes the pipe.
    public func cancel() {
        guard !cancelled else { return }
        cancelled = true
        for s in signals { signal(s, SIG_DFL) }
        signalPipeWriter = -1
        loop.unregister(reader)
        reader.close()
        writer.close()
    }

    deinit { cancel() }
}
