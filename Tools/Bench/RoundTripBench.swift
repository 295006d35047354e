// The round trips `bridge` times: a 200-byte request written, the whole reply read, over three
// paths held open side by side and timed in turn (`interleavedRoundTrips`), so a change in the
// machine's pace during the run (a neighbour on the host, the CPU's clock) falls on all three
// alike:
//
//   raw echo   the pty pair itself: client on one end, an echo thread on the other. Two
//              wakeups per round trip.
//   raw relay  the hops a bridge adds, with no protocol on them: a loopback TCP connection to a
//              relay thread (poll, read, write) that copies it onto a pty pair and the answers
//              back, an echo thread on the far end. Four wakeups per round trip (client, relay
//              twice, echo), as many as the bridge's (client, host loop twice, terminal loop):
//              the floor of a relay built as ours is, one thread per side waiting on all its
//              descriptors.
//   ours       a bridge through the channel and PPP to our terminal-role stack's echo service.
import CSystem
import Foundation
import Glibc

let roundTripRequestSize = 200

/// Round trips timed one by one, in seconds: their mean (the ratio the bench has always
/// printed) and their median, which a stall of the whole machine (a neighbour taking the CPU
/// for a millisecond) moves far less than it moves the mean.
struct RoundTrips {
    var mean: Double
    var median: Double
    init(_ samples: [Double]) {
        let sorted = samples.sorted()
        mean = samples.reduce(0, +) / Double(max(1, samples.count))
        median = sorted.isEmpty ? 0 : sorted[sorted.count / 2]
    }
}

/// One end of a request/response path: writes a request, reads the whole reply.
struct EchoClient {
    let fd: Int32
    func roundTrip(_ request: [UInt8], _ reply: inout [UInt8]) {
        writeAll(fd, request)
        readExactly(fd, request.count, into: &reply)
    }
}

/// Echoes what `fd` brings until it ends or fails, then closes it.
func echoUntilClosed(_ fd: Int32) {
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return }
        guard writeFully(fd, buffer[..<n]) else { return }
    }
}

/// Writes all of `bytes`, at most 64 KiB a call; false when the descriptor fails (the other end
/// has gone).
func writeFully(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
    var offset = bytes.startIndex
    while offset < bytes.endIndex {
        let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, min($0.count, 65536)) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return false }
        offset += n
    }
    return true
}

/// The raw echo: the client holds the pty's master; an echo thread serves its slave until the
/// master closes.
func rawEchoPath() -> EchoClient {
    let (m, s) = ptyPair()
    Thread.detachNewThread { echoUntilClosed(s) }
    return EchoClient(fd: m)
}

/// The raw relay: a loopback connection to a relay thread between it and a pty pair, an echo
/// thread on the pty's far end. Closing the client ends both threads.
func rawRelayPath() -> EchoClient {
    let (m, s) = ptyPair()
    Thread.detachNewThread { echoUntilClosed(s) }
    let port = loopbackFreePort()
    let listener = loopbackListener(port)
    Thread.detachNewThread {
        let c = accept4(listener, nil, nil, Int32(SOCK_CLOEXEC.rawValue))
        close(listener)
        guard c >= 0 else { close(m); return }
        defer { close(c); close(m) }
        // As the channel's relays do: no Nagle delay on the host socket.
        var on: Int32 = 1
        setsockopt(c, Int32(IPPROTO_TCP), TCP_NODELAY, &on, 4)
        var fds = [pollfd(fd: c, events: Int16(POLLIN), revents: 0), pollfd(fd: m, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            if poll(&fds, 2, -1) < 0 {
                if errno == EINTR { continue }
                return
            }
            for (i, (from, to)) in [(c, m), (m, c)].enumerated() where fds[i].revents != 0 {
                let n = buffer.withUnsafeMutableBytes { read(from, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0, writeFully(to, buffer[..<n]) else { return }
            }
        }
    }
    return EchoClient(fd: loopbackConnect(port))
}

/// `warmUpRounds` untimed round trips on each path: connections set up, buffers and caches warm.
func warmUp(_ paths: [EchoClient]) {
    let request = [UInt8](repeating: 0x41, count: roundTripRequestSize)
    var reply = [UInt8](repeating: 0, count: roundTripRequestSize)
    for path in paths {
        for _ in 0..<warmUpRounds { path.roundTrip(request, &reply) }
    }
}

/// `rounds` timed round trips on each path, in `blocks` blocks taken in turn. The order turns
/// by one each block and runs backwards every other three blocks, so over six blocks each path
/// takes each place twice and follows each other path as often as it precedes it: what one path
/// leaves behind (a loop thread finishing its turn, a timer) falls on the others alike.
func interleavedRoundTrips(_ paths: [EchoClient], rounds: Int, blocks: Int) -> [RoundTrips] {
    let request = [UInt8](repeating: 0x41, count: roundTripRequestSize)
    var reply = [UInt8](repeating: 0, count: roundTripRequestSize)
    let clock = ContinuousClock()
    var samples = [[Double]](repeating: [], count: paths.count)
    for block in 0..<blocks {
        // Rounds spread evenly over the blocks; the first `rounds % blocks` take one more.
        let count = rounds / blocks + (block < rounds % blocks ? 1 : 0)
        let backwards = (block / paths.count) % 2 == 1
        for turn in 0..<paths.count {
            let i = ((backwards ? paths.count - 1 - turn : turn) + block) % paths.count
            for _ in 0..<count {
                let start = clock.now
                paths[i].roundTrip(request, &reply)
                samples[i].append(seconds(clock.now - start))
            }
        }
    }
    return samples.map(RoundTrips.init)
}
