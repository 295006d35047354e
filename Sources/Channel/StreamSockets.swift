import Glibc
import CSystem
import NetStack

/// A host TCP connection served by an event loop: non-blocking, bytes in through `onData`,
/// out through `send` (queued while the socket is full), end through `onClose`. For the
/// programs built on the channel (the payment layer's gateway, the reader client, control
/// sockets). All methods run on the loop's thread.
public final class StreamConnection {
    public let loop: EventLoop
    public private(set) var descriptor: FileDescriptor
    public let peer: TCPEndpoint?
    private var outgoing: [UInt8] = []
    private var connecting: Bool
    private var writeShutdownPending = false
    private var closed = false
    /// Bytes as they arrive.
    public var onData: (([UInt8]) -> Void)?
    /// The peer finished sending (half-close); the connection may still send.
    public var onEndOfStream: (() -> Void)?
    /// Once, when the connection is gone; nil error means an orderly close.
    public var onClose: ((SystemError?) -> Void)?
    /// Once, when an outgoing connection is established.
    public var onConnected: (() -> Void)?

    init(loop: EventLoop, descriptor: FileDescriptor, peer: TCPEndpoint?, connecting: Bool) {
        self.loop = loop
        self.descriptor = descriptor
        self.peer = peer
        self.connecting = connecting
    }

    /// A connection let go without `close` is closed: the loop holds it only weakly, so nothing
    /// would serve its descriptor again (a readable socket nobody reads wakes the loop forever).
    deinit {
        if !closed {
            loop.unregister(descriptor)
            descriptor.close()
        }
    }

    /// Starts connecting to `endpoint`; `onConnected` or `onClose` follows.
    public static func connect(to endpoint: TCPEndpoint, loop: EventLoop) throws(SystemError) -> StreamConnection {
        let fd = try HostSocket.connect(to: endpoint)
        let c = StreamConnection(loop: loop, descriptor: fd, peer: endpoint, connecting: true)
        do throws(SystemError) { try c.register() } catch {
            c.close()
            throw error
        }
        return c
    }

    func register() throws(SystemError) {
        try loop.register(descriptor, events: interest) { [weak self] events in self?.handle(events) }
    }

    /// The peer's end of stream was seen (and handed to `onEndOfStream`).
    private var readDone = false

    /// Bytes read per turn at most.
    public static let readBudget = 65_536
    /// This connection's read per turn (at most `readBudget`): a line protocol whose requests
    /// are small reads less, so one turn's bytes are few requests' work.
    public var readLimit = StreamConnection.readBudget

    /// While true nothing is read: the owner has work queued from earlier reads and takes no
    /// more until it is done (the peer's bytes wait in the socket, and its sends then block).
    public var readingPaused = false {
        didSet {
            guard readingPaused != oldValue, !closed else { return }
            loop.setInterest(descriptor, interest)
        }
    }

    private var interest: UInt32 {
        let read: UInt32 = readDone || readingPaused ? 0 : EPOLLIN.rawValue | EPOLLRDHUP.rawValue
        return connecting || !outgoing.isEmpty ? read | EPOLLOUT.rawValue : read
    }

    public var isOpen: Bool { !closed }

    /// Bytes sent but not yet taken by the socket (a peer that does not read lets them grow).
    public var queuedBytes: Int { outgoing.count }

    public func send(_ bytes: [UInt8]) {
        guard !closed else { return }
        outgoing += bytes
        if !connecting { flush() }
        // The flush may have ended the connection (and its descriptor number is free again).
        guard !closed else { return }
        loop.setInterest(descriptor, interest)
    }

    /// Half-closes once everything queued has been sent.
    public func shutdownWrite() {
        guard !closed else { return }
        writeShutdownPending = true
        if outgoing.isEmpty && !connecting { finishWriting() }
    }

    private func finishWriting() {
        Glibc.shutdown(descriptor.rawValue, Int32(SHUT_WR))
        // Both directions done: the connection is over.
        if readDone { finish(nil) }
    }

    /// Closes now (what is still queued is dropped); `onClose` is not called.
    public func close(reset: Bool = false) {
        guard !closed else { return }
        closed = true
        loop.unregister(descriptor)
        if reset { HostSocket.closeWithReset(descriptor) } else { descriptor.close() }
        onData = nil
        onClose = nil
        onConnected = nil
        onEndOfStream = nil
    }

    private func finish(_ error: SystemError?) {
        guard !closed else { return }
        let callback = onClose
        close()
        callback?(error)
    }

    private func flush() {
        while !outgoing.isEmpty {
            do throws(SystemError) {
                let n = try HostSocket.send(descriptor, outgoing[...])
                if n == 0 { break }
                outgoing.removeFirst(n)
            } catch {
                finish(error)
                return
            }
        }
        if outgoing.isEmpty && writeShutdownPending { finishWriting() }
    }

    private func handle(_ events: UInt32) {
        if connecting {
            if events & (EPOLLOUT.rawValue | EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 {
                let e = HostSocket.pendingError(descriptor)
                if e != 0 { return finish(SystemError("connect \(peer.map { "\($0)" } ?? "")", errno: Errno(e))) }
                connecting = false
                onConnected?()
                if closed { return }
                flush()
                if closed { return }
                loop.setInterest(descriptor, interest)
            }
            return
        }
        if events & EPOLLOUT.rawValue != 0 {
            flush()
            if closed { return }
            loop.setInterest(descriptor, interest)
        }
        if readingPaused {
            // Nothing is read while the owner works through what it has; a connection that is
            // gone both ways (or failed) is ended now rather than reported every turn.
            if events & (EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { finish(nil) }
            return
        }
        if events & (EPOLLIN.rawValue | EPOLLRDHUP.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 {
            // One buffer per turn, not until EAGAIN: a peer that writes as fast as it can must
            // not keep the loop from everyone else. epoll is level-triggered, so what is left
            // is read next turn.
            var buffer = [UInt8](repeating: 0, count: max(1, min(readLimit, StreamConnection.readBudget)))
            let n = buffer.withUnsafeMutableBytes { b in retryingOnInterrupt { recv(descriptor.rawValue, b.baseAddress, b.count, 0) } }
            if n > 0 {
                onData?(Array(buffer[0..<n]))
                return
            }
            if n == 0 {
                // End of stream: with an `onEndOfStream` the connection lives on until our
                // side shuts down too; without one it is over.
                guard let eos = onEndOfStream else { return finish(nil) }
                onEndOfStream = nil
                readDone = true
                eos()
                if closed { return }
                if writeShutdownPending && outgoing.isEmpty { return finish(nil) }
                loop.setInterest(descriptor, interest)
                return
            }
            if errno == EAGAIN || errno == EWOULDBLOCK { return }
            return finish(SystemError("recv"))
        }
    }
}

/// A listening host TCP socket on an event loop; every accepted client becomes a
/// `StreamConnection` handed to `onAccept`.
public final class StreamListener {
    public let loop: EventLoop
    public let descriptor: FileDescriptor
    /// The TCP address it listens on; nil for a Unix socket.
    public let endpoint: TCPEndpoint?
    /// The Unix socket's path; nil for TCP.
    public let path: String?
    private var onAccept: ((StreamConnection) -> Void)?
    private var closed = false
    private var backoff = AcceptBackoff()
    private var backoffTimer: Int?
    /// Times the listener rested because accept(2) ran out of descriptors.
    public var acceptBackoffs: Int { backoff.count }
    /// Takes the next client off the listening socket: accept(2), unless a test stands in for
    /// a process out of descriptors (which it cannot make without starving its neighbours).
    var acceptNext: (StreamListener) -> HostSocket.Accepted = { l in
        l.path == nil ? HostSocket.accept(l.descriptor) : UnixSocket.accept(l.descriptor)
    }

    /// Listens on `endpoint` (port 0 picks a free one; `endpoint` then tells it).
    public convenience init(on endpoint: TCPEndpoint, loop: EventLoop, onAccept: @escaping (StreamConnection) -> Void) throws(SystemError) {
        let fd = try HostSocket.listen(on: endpoint)
        try self.init(descriptor: fd, endpoint: HostSocket.localEndpoint(fd) ?? endpoint, path: nil, loop: loop, onAccept: onAccept)
    }

    /// Listens on a Unix socket at `path`, mode `mode` (see `UnixSocket.listen`); the file is
    /// removed on `close`. Clients of another user (not root) are closed at once unless
    /// `anyUser`: then the socket's mode (0660: a group) decides who reaches it.
    public convenience init(unixPath: String, mode: mode_t = 0o600, anyUser: Bool = false, loop: EventLoop,
                            onAccept: @escaping (StreamConnection) -> Void) throws(SystemError) {
        let fd = try UnixSocket.listen(at: unixPath, mode: mode)
        try self.init(descriptor: fd, endpoint: nil, path: unixPath, loop: loop, onAccept: onAccept)
        checksPeerUser = !anyUser
    }

    private var checksPeerUser = true

    /// Watches the listening socket `fd`; when that fails, it is closed (and its file removed).
    private init(descriptor fd: FileDescriptor, endpoint: TCPEndpoint?, path: String?, loop: EventLoop,
                 onAccept: @escaping (StreamConnection) -> Void) throws(SystemError) {
        self.loop = loop
        descriptor = fd
        self.endpoint = endpoint
        self.path = path
        self.onAccept = onAccept
        do throws(SystemError) {
            try loop.register(fd, events: EPOLLIN.rawValue) { [weak self] _ in self?.acceptAll() }
        } catch {
            fd.close()
            if let path { unlink(path) }
            throw error
        }
    }

    /// Connections accepted per turn at most: a client that connects in a loop must not keep
    /// the loop from everyone else (the rest wait in the backlog for the next turn).
    public static let acceptBudget = 16

    private func acceptAll() {
        var accepted = 0
        while !closed && accepted < StreamListener.acceptBudget {
            accepted += 1
            let next = acceptNext(self)
            switch next {
            case .none:
                return
            case .outOfResources:
                // See `AcceptBackoff`: rest instead of spinning on a listener that stays readable.
                let pause = backoff.failed()
                loop.setInterest(descriptor, 0)
                backoffTimer = loop.schedule(at: loop.now + pause) { [weak self] in
                    guard let self, !self.closed else { return }
                    self.backoffTimer = nil
                    self.loop.setInterest(self.descriptor, EPOLLIN.rawValue)
                }
                return
            case let .client(fd, peer):
                backoff.succeeded()
                // A client whose user cannot be told is refused like another user's.
                if path != nil, checksPeerUser, UnixSocket.peerUser(fd).map({ $0 == getuid() || $0 == 0 }) != true {
                    fd.close()
                    continue
                }
                let c = StreamConnection(loop: loop, descriptor: fd, peer: path == nil ? peer : nil, connecting: false)
                do throws(SystemError) { try c.register() } catch {
                    c.close()
                    continue
                }
                onAccept?(c)
            }
        }
    }

    public func close() {
        guard !closed else { return }
        closed = true
        if let t = backoffTimer { loop.cancelTimer(t) }
        backoffTimer = nil
        loop.unregister(descriptor)
        descriptor.close()
        if let path { unlink(path) }
        onAccept = nil
    }
}
