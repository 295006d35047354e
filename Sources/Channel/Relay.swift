import CSystem
import Glibc
import NetStack

/// What crossed one bridge (or the proxy): counted as it moves.
public struct TrafficCounters: Sendable, Equatable {
    /// Connections carried, and those still open.
    public var connections = 0
    public var active = 0
    public var bytesToTerminal = 0
    public var bytesToHost = 0
    /// Connections that could not be made (refused, unreachable) or ended in a reset.
    public var failures = 0
    /// Host clients refused because as many connections as allowed were open already (a
    /// terminal's beyond the limit are refused by our stack: `ChannelStatus.listenRefusals`).
    public var refused = 0
    public init() {}
}

/// One bridged connection: a host socket on one side, a connection of our stack on the other.
/// Each direction moves only as fast as its far side takes it: a host that does not read keeps
/// our stack's receive buffer full, which closes the terminal's window; a terminal that does
/// not read fills our send buffer and we stop reading the host socket.
final class Relay {
    let id: ConnectionID
    let fd: FileDescriptor
    let counters: Counter
    /// The host socket finished connecting (accepted ones start connected).
    var hostConnected: Bool
    /// Our stack's connection is established (accepted ones start established).
    var stackEstablished: Bool
    /// Bytes from the terminal waiting for the host socket.
    #if DEBUG
    var toHost: [UInt8] = []
    #else
    // Unchecked in release builds (docs/PERFORMANCE.md): `RelayTable` touches it one call at a
    // time, never from a closure, and the SOCKS proxy sets it once, before the relay is added.
    @exclusivity(unchecked) var toHost: [UInt8] = []
    #endif
    var toHostStart = 0
    /// The host half-closed: carried to the terminal as our FIN.
    var hostEOF = false
    /// The host socket may have bytes to read: set when epoll says so (or at the start), cleared
    /// when a read finds it empty. A pump reads it only then, not once per segment moved.
    var hostReadable = true
    /// The terminal half-closed: carried to the host as shutdown(SHUT_WR).
    var stackEOF = false
    /// Called once the host socket connected; false refuses the connection.
    var onHostConnected: ((Relay) -> Bool)?
    /// Called when the host socket could not connect, with its errno; the relay is then gone
    /// from the table and the stack connection is the caller's to answer and close.
    var onHostConnectFailed: ((Relay, Int32) -> Void)?
    var onFinished: ((Relay) -> Void)?
    var interest: UInt32 = 0
    /// The socket is in epoll (it is taken out while there is nothing to wait for).
    var watched = false
    /// In its table: set by `add`, cleared when it leaves. A relay found in a work list, or
    /// called back by epoll, is pumped only while this holds.
    var attached = false
    /// Listed to be pumped this batch (`dirty`): each relay is listed once at most.
    var isDirty = false
    /// For its reports (`ConnectionReport`): where it goes and who opened it, its number on the
    /// channel (given when it opens), what went wrong, and what it carried each way.
    var destination = ""
    var source = ""
    var number = 0
    var failure: String?
    var bytesToTerminal = 0
    var bytesToHost = 0

    final class Counter {
        var value = TrafficCounters()
        /// Told of each connection carried as it opens (true) and ends (false).
        var onChange: ((Relay, Bool) -> Void)?
    }

    init(id: ConnectionID, fd: FileDescriptor, counters: Counter, hostConnected: Bool, stackEstablished: Bool, destination: String = "",
         source: String = "") {
        self.id = id
        self.fd = fd
        self.counters = counters
        self.hostConnected = hostConnected
        self.stackEstablished = stackEstablished
        self.destination = destination
        self.source = source
        HostSocket.setNoDelay(fd)
    }

    var pendingToHost: Int { toHost.count - toHostStart }
}

/// The relays of one application (the bridges, or the proxy), pumped from the loop.
final class RelayTable {
    unowned let loop: EventLoop
    weak var host: StackAttachment?
    // `dirty`: relays to pump, in the order they were marked; a list with a flag on each relay
    // rather than a set of ids, so marking one hashes nothing.
    //
    // Unchecked in release builds (docs/PERFORMANCE.md says why): plain values and standard
    // collections, never changed across a call back into this object.
    #if DEBUG
    private(set) var relays: [ConnectionID: Relay] = [:]
    private var dirty: [Relay] = []
    #else
    @exclusivity(unchecked) private(set) var relays: [ConnectionID: Relay] = [:]
    @exclusivity(unchecked) private var dirty: [Relay] = []
    #endif
    private var spareDirty: [Relay] = []
    /// The most a relay reads from its host socket, or sends to it, in one system call: the
    /// bytes go straight between the socket and the connection's buffers.
    private static let chunk = 65536
    /// Why the last relay that failed did: what a report shows beside the count.
    var lastFailure: String?

    /// The terminal's part of the process's descriptors: every relay's host socket holds one.
    private let share: DescriptorShare?

    init(loop: EventLoop, share: DescriptorShare? = nil) {
        self.loop = loop
        self.share = share
    }

    /// Takes a descriptor's worth of the budget before a host socket is made for a relay;
    /// false when the terminal's part is used up. The relay gives it back when it goes.
    func acquireDescriptor() -> Bool { share?.acquire() ?? true }
    func releaseDescriptor() { share?.release() }

    var count: Int { relays.count }

    func add(_ r: Relay) {
        relays[r.id] = r
        r.attached = true
        // Counted and reported once in the table: a report's reader may act on the channel
        // (its callback may call in), and the relay is one of the channel's by then.
        r.counters.value.connections += 1
        r.counters.value.active += 1
        r.counters.onChange?(r, true)
        guard r.attached else { return }
        r.interest = wantedInterest(r)
        do {
            try watch(r)
        } catch {
            fail(r, "host socket not watched: \(error)", now: loop.now)
            return
        }
        markDirty(r)
    }

    private func markDirty(_ r: Relay) {
        guard !r.isDirty else { return }
        r.isDirty = true
        dirty.append(r)
    }

    func event(_ id: ConnectionID, _ event: TCPEvent, now: Instant) {
        guard let r = relays[id] else { return }
        switch event {
        case .established:
            r.stackEstablished = true
            markDirty(r)
        case .readable, .writable, .peerFinished:
            markDirty(r)
        case let .closed(reason):
            if reason == .closed {
                // Both FINs are through, but what the terminal sent may still wait in our
                // receive buffer and in `toHost`: the relay stays until the host has it all.
                markDirty(r)
            } else {
                // A reset or timeout is passed on to the host as a reset; the stack may let go.
                // What came before the reset and still waits for the host goes first, as far
                // as the host socket takes it now: what is in `toHost`, and what is still in
                // our receive buffer (it may have come in the same line read as the reset).
                if r.hostConnected, let host, host.stackIsUp {
                    if r.pendingToHost == 0 {
                        r.toHost.removeAll(keepingCapacity: true)
                        r.toHostStart = 0
                    }
                    host.stack!.read(id, appendingTo: &r.toHost, now: now)
                    if r.pendingToHost > 0, let n = try? HostSocket.send(r.fd, r.toHost[r.toHostStart...]) {
                        r.counters.value.bytesToHost += n
                        r.bytesToHost += n
                    }
                }
                r.counters.value.failures += 1
                lastFailure = "terminal side: \(reason.rawValue)"
                r.failure = r.failure ?? "terminal side: \(reason.rawValue)"
                host?.stack?.abort(id, now: nil)
                remove(r, reset: true)
            }
        }
    }

    // `dirty` starts over empty while its relays are pumped (a pump may add to it): it trades
    // places with a spare, so it is not allocated anew every batch. (Not through a function
    // taking it `inout`: that would hold it for the whole pump.)
    func step(now: Instant) {
        guard !dirty.isEmpty else { return }
        var work = spareDirty
        spareDirty = []
        swap(&work, &dirty)
        for r in work {
            r.isDirty = false
            if r.attached { pump(r, now: now) }
        }
        work.removeAll(keepingCapacity: true)
        spareDirty = work
    }

    /// The link is down: every host connection is reset, every descriptor closed.
    func closeAll() {
        for r in Array(relays.values) {
            r.failure = r.failure ?? "the link closed"
            remove(r, reset: true)
        }
        dirty.removeAll()
    }

    // MARK: Moving bytes

    private func hostEvent(_ r: Relay, _ events: UInt32) {
        let now = loop.now
        guard r.attached else { return }
        if !r.hostConnected {
            guard events & (EPOLLOUT.rawValue | EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 else { return }
            let e = HostSocket.pendingError(r.fd)
            if e != 0 {
                r.counters.value.failures += 1
                r.failure = SystemError("connect \(r.destination)", errno: Errno(e)).description
                let failed = r.onHostConnectFailed
                relays[r.id] = nil
                r.attached = false
                loop.unregister(r.fd)
                r.fd.close()
                releaseDescriptor()
                r.counters.value.active -= 1
                r.counters.onChange?(r, false)
                if let failed { failed(r, e) } else { host?.stack?.abort(r.id, now: now) }
                return
            }
            r.hostConnected = true
            if r.onHostConnected?(r) == false {
                fail(r, "refused once connected", now: now)
                return
            }
        }
        if events & EPOLLERR.rawValue != 0, case let e = HostSocket.pendingError(r.fd), e != 0 {
            fail(r, "host socket: \(SystemError("connection", errno: Errno(e)))", now: now)
            return
        }
        if events & (EPOLLIN.rawValue | EPOLLHUP.rawValue) != 0 {
            r.hostReadable = true
            readHost(r, now: now)
        }
        guard r.attached else { return }
        pump(r, now: now)
    }

    private func readHost(_ r: Relay, now: Instant) {
        guard let host, host.stackIsUp else { return }
        while !r.hostEOF && r.stackEstablished {
            let room = host.writableBytes(r.id)
            guard room > 0 else {
                host.stack!.notifyWhenWritable(r.id)
                return
            }
            // Read straight into the connection's send buffer: offered one contiguous piece of at
            // most `room` bytes (fewer where the buffer wraps), so a read that fills it says
            // nothing about the socket being drained.
            let fd = r.fd.rawValue
            var want = 0
            var n = 0
            var readErrno: Int32 = 0
            host.stack!.write(r.id, now: now) { space in
                want = min(space.count, RelayTable.chunk)
                n = retryingOnInterrupt { read(fd, space.baseAddress, want) }
                if n < 0 { readErrno = errno }
                return n
            }
            // Not offered any room (the connection went): nothing was read.
            guard want > 0 else { return }
            if n > 0 {
                r.counters.value.bytesToTerminal += n
                r.bytesToTerminal += n
                if n < want {
                    // Drained for now; epoll (level-triggered) says when there is more.
                    r.hostReadable = false
                    return
                }
            } else if n == 0 {
                r.hostEOF = true
                host.stack!.shutdownWrite(r.id, now: now)
            } else {
                if readErrno == EAGAIN || readErrno == EWOULDBLOCK {
                    r.hostReadable = false
                    return
                }
                fail(r, "host \(SystemError("read", errno: Errno(readErrno)))", now: now)
                return
            }
        }
    }

    private func pump(_ r: Relay, now: Instant) {
        guard r.attached, let host, host.stackIsUp else { return }
        if r.hostConnected {
            while true {
                if r.pendingToHost > 0 {
                    do {
                        let n = try HostSocket.send(r.fd, r.toHost[r.toHostStart...])
                        r.toHostStart += n
                        r.counters.value.bytesToHost += n
                        r.bytesToHost += n
                    } catch {
                        fail(r, "host send: \(error)", now: now)
                        return
                    }
                    if r.pendingToHost > 0 { break }
                    r.toHost.removeAll(keepingCapacity: true)
                    r.toHostStart = 0
                }
                if r.stackEOF || !r.stackEstablished { break }
                // Sent from the stack's receive buffer where the bytes lie, as much as the socket
                // takes (a piece at a time where the buffer wraps); what it does not take stays
                // there, and our window reopens only as the host reads.
                var offered = 0
                var failure: SystemError?
                let sent = host.stack!.read(r.id, maximum: RelayTable.chunk, now: now) { bytes in
                    offered = bytes.count
                    do throws(SystemError) {
                        return try HostSocket.send(r.fd, bytes)
                    } catch {
                        failure = error
                        return 0
                    }
                }
                if let failure {
                    fail(r, "host send: \(failure)", now: now)
                    return
                }
                r.counters.value.bytesToHost += sent
                r.bytesToHost += sent
                if sent > 0 && sent == offered { continue }
                if offered == 0 && host.atEndOfStream(r.id) {
                    r.stackEOF = true
                    shutdown(r.fd.rawValue, Int32(SHUT_WR))
                }
                break
            }
            // The host's bytes wait in its socket until our send buffer has room.
            if !r.hostEOF && r.hostReadable { readHost(r, now: now) }
            guard r.attached else { return }
        }
        if r.hostEOF && r.stackEOF && r.pendingToHost == 0 {
            host.stack!.close(r.id, now: now)
            remove(r, reset: false)
            return
        }
        let stackFinished = host.state(r.id).map { $0 == .closed } ?? true
        if stackFinished && r.stackEOF && r.pendingToHost == 0 {
            // The terminal's side finished while the host still had its direction open:
            // nothing the host sends can be carried any more.
            host.stack!.abort(r.id, now: nil)
            remove(r, reset: true)
            return
        }
        let want = wantedInterest(r)
        if want == 0 {
            // Nothing to wait for on the socket now. It is taken out of epoll, which would
            // otherwise report a hang-up (both directions shut) on every turn.
            if r.watched {
                loop.unregister(r.fd)
                r.watched = false
            }
            r.interest = 0
        } else if !r.watched {
            r.interest = want
            do { try watch(r) } catch { fail(r, "host socket not watched: \(error)", now: now) }
        } else if want != r.interest {
            r.interest = want
            loop.setInterest(r.fd, want)
        }
    }

    private func watch(_ r: Relay) throws(SystemError) {
        // The relay is held strongly for the length of the call: it may leave the table in it.
        // Unowned, not weak: the handler is unregistered before the relay leaves the table
        // (`remove`, `setInterest`), so it never runs without one; and a weak reference would
        // give the relay a side table, making every retain and release of it the slow kind.
        try loop.register(r.fd, events: r.interest, serving: host?.loopClient) { [unowned self, unowned r] events in
            let relay = r
            self.hostEvent(relay, events)
        }
        r.watched = true
    }

    private func wantedInterest(_ r: Relay) -> UInt32 {
        guard r.hostConnected else { return EPOLLOUT.rawValue }
        var e: UInt32 = 0
        if !r.hostEOF && r.stackEstablished && (host?.writableBytes(r.id) ?? 0) > 0 { e |= EPOLLIN.rawValue }
        if r.pendingToHost > 0 { e |= EPOLLOUT.rawValue }
        return e
    }

    /// The host side failed: reset both.
    private func fail(_ r: Relay, _ why: String, now: Instant) {
        r.counters.value.failures += 1
        lastFailure = why
        r.failure = r.failure ?? why
        host?.stack?.abort(r.id, now: now)
        remove(r, reset: true)
    }

    private func remove(_ r: Relay, reset: Bool) {
        guard r.attached else { return }
        r.attached = false
        relays.removeValue(forKey: r.id)
        loop.unregister(r.fd)
        if reset { HostSocket.closeWithReset(r.fd) } else { r.fd.close() }
        releaseDescriptor()
        r.counters.value.active -= 1
        r.counters.onChange?(r, false)
        r.onFinished?(r)
    }
}
