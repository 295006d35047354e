// bridge: the channel end to end over a pty pair, against the pty itself.
//
//   swift run -c release pppbridge-bench bridge [--mib N] [--rounds N] [--blocks N]
//
// On one end of a pty pair runs our stack in the terminal role (discard, echo), on the other
// the channel (host role) with a host→terminal bridge to each and a terminal→host bridge to a
// sink on loopback. Measured: bulk host→terminal (a host client writes N MiB into the bridge to
// the terminal's discard), bulk terminal→host (the terminal writes N MiB through the bridge to
// the host's sink) and the round trip of a 200-byte request through the bridge to the
// terminal's echo. The reference, in the same run: the same N MiB copied raw through a pty
// pair each way, and 200 bytes echoed raw through a pty pair and through a raw relay (the
// round trips are timed in turn with the bridge's: see RoundTripBench.swift).
//
// The terminal runs on an event loop thread of its own, so the host side (the channel's loop
// thread: its stack, relays and syscalls) is measured alone: its CPU time per MB
// (CLOCK_THREAD_CPUTIME_ID, user and system) and its heap allocations per MB and per segment
// (CAllocationCounter), beside the raw copy's CPU per MB at each end of the pty.
import CAllocationCounter
import CSystem
import Channel
import Dispatch
import Foundation
import Glibc
import NetStack
import Simulation

struct BridgeOptions {
    var mebibytes = 16
    /// `--report`: both ends' stack and link counters at the end (how many segments and ACKs
    /// the transfers took, which the instruction counts per MB depend on).
    var report = false
    /// Timed round trips, after `warmUpRounds` untimed: a few hundred microseconds each, so
    /// 200 of them (the old default) were over in 40 ms and swung with the CPU's clock.
    var rounds = 2000
    /// How many blocks the timed round trips of each path are taken in, in turn (a multiple of
    /// six balances the order: see `interleavedRoundTrips`).
    var blocks = 24
    /// How both ends read a busy line (`--line-poll-interval`, microseconds; 0: on arrival).
    var lineReadModeration = LineReadModeration.Settings.standard
}

/// Round trips made before the timed ones, on each path alike.
let warmUpRounds = 100

/// A pty pair, both ends raw and blocking.
func ptyPair() -> (master: Int32, slave: Int32) {
    let m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)
    guard m >= 0, grantpt(m) == 0, unlockpt(m) == 0 else { fail("posix_openpt") }
    var name = [CChar](repeating: 0, count: 128)
    guard ptsname_r(m, &name, name.count) == 0 else { fail("ptsname_r") }
    let s = open(String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self), O_RDWR | O_NOCTTY | O_CLOEXEC)
    guard s >= 0 else { fail("open pty") }
    for fd in [m, s] {
        var t = termios()
        tcgetattr(fd, &t)
        cfmakeraw(&t)
        tcsetattr(fd, TCSANOW, &t)
    }
    return (m, s)
}

func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
    guard writeFully(fd, bytes[...]) else { fail("write: \(String(cString: strerror(errno)))") }
}

func readExactly(_ fd: Int32, _ count: Int, into buffer: inout [UInt8]) {
    var got = 0
    while got < count {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, count - got) }
        if n <= 0 { if n < 0 && errno == EINTR { continue }; fail("read: \(n < 0 ? String(cString: strerror(errno)) : "end of stream")") }
        got += n
    }
}

/// The calling thread's CPU time (user and system).
func threadCPU() -> Duration {
    var t = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t)
    return .seconds(Int64(t.tv_sec)) + .nanoseconds(Int64(t.tv_nsec))
}

/// How many times the calling thread has gone to sleep (voluntary context switches): each one
/// is a wakeup to pay for later, which on a virtual machine can cost more than the work itself.
func threadSleeps() -> Int {
    // RUSAGE_THREAD (1): <sys/resource.h> names it only under _GNU_SOURCE.
    var usage = rusage()
    guard getrusage(__rusage_who_t(1), &usage) == 0 else { return 0 }
    return usage.ru_nvcsw
}

/// What one thread spent: CPU time, heap allocations and sleeps.
struct ThreadCost {
    var cpu: Duration
    var allocations: UInt64
    var sleeps: Int
    static func now() -> ThreadCost { ThreadCost(cpu: threadCPU(), allocations: allocation_counter_thread(), sleeps: threadSleeps()) }
    static func - (a: ThreadCost, b: ThreadCost) -> ThreadCost {
        ThreadCost(cpu: a.cpu - b.cpu, allocations: a.allocations - b.allocations, sleeps: a.sleeps - b.sleeps)
    }
}

/// CPU milliseconds per MB (10^6 bytes).
func msPerMB(_ cpu: Duration, _ bytes: Int) -> Double { seconds(cpu) * 1000 / (Double(bytes) / 1e6) }

/// Bytes per second of a raw copy of `count` bytes from one end of a pty pair to the other, and
/// the CPU time of the writing and the reading end.
func rawCopy(_ count: Int, masterToSlave: Bool) -> (rate: Double, writer: Duration, reader: Duration) {
    let (m, s) = ptyPair()
    defer { close(m); close(s) }
    let (from, to) = masterToSlave ? (m, s) : (s, m)
    let data = [UInt8](repeating: 0x55, count: count)
    let clock = ContinuousClock()
    let start = clock.now
    let done = DispatchSemaphore(value: 0)
    let readerCPU = BenchLocked(0)
    Thread.detachNewThread {
        let before = threadCPU()
        var buffer = [UInt8](repeating: 0, count: 65536)
        var got = 0
        while got < count {
            let n = buffer.withUnsafeMutableBytes { read(to, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            got += n
        }
        readerCPU.add(Int((threadCPU() - before) / .nanoseconds(1)))
        done.signal()
    }
    let before = threadCPU()
    writeAll(from, data)
    let writer = threadCPU() - before
    done.wait()
    return (Double(count) / seconds(clock.now - start), writer, .nanoseconds(Int64(readerCPU.value)))
}

func loopbackFreePort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &a) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { s -> Int32 in
            _ = bind(fd, s, length)
            return getsockname(fd, s, &length)
        }
    }
    return UInt16(bigEndian: a.sin_port)
}

func loopbackConnect(_ port: UInt16) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, 4)
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard r == 0 else { fail("connect 127.0.0.1:\(port): \(String(cString: strerror(errno)))") }
    return fd
}

/// A listening socket on 127.0.0.1:`port`.
func loopbackListener(_ port: UInt16) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, 4)
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    let bound = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard fd >= 0, bound == 0, listen(fd, 4) == 0 else { fail("listen 127.0.0.1:\(port): \(String(cString: strerror(errno)))") }
    return fd
}

/// A loopback sink: accepts one connection, reads it to the end, closes; returns the count.
func startSink(_ port: UInt16) -> (listener: Int32, received: () -> Int) {
    let fd = loopbackListener(port)
    let total = BenchLocked(0)
    Thread.detachNewThread {
        let c = accept(fd, nil, nil)
        guard c >= 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(c, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            total.add(n)
        }
        close(c)
    }
    return (fd, { total.value })
}

final class BenchLocked: @unchecked Sendable {
    private var v: Int
    private let lock = NSLock()
    init(_ v: Int) { self.v = v }
    var value: Int { lock.lock(); defer { lock.unlock() }; return v }
    func add(_ n: Int) { lock.lock(); v += n; lock.unlock() }
}

func bridge(_ o: BridgeOptions) async {
    let count = o.mebibytes << 20
    let rawUpCopy = rawCopy(count, masterToSlave: true)
    let rawDownCopy = rawCopy(count, masterToSlave: false)
    let rawUp = rawUpCopy.rate, rawDown = rawDownCopy.rate
    print(String(format: "raw pty: copy %.1f MB/s one way, %.1f MB/s the other", rawUp / 1e6, rawDown / 1e6))
    print(String(format: "raw pty CPU per MB: writing end %.2f ms, reading end %.2f ms (one way); %.2f ms, %.2f ms (the other)",
                 msPerMB(rawUpCopy.writer, count), msPerMB(rawUpCopy.reader, count), msPerMB(rawDownCopy.writer, count), msPerMB(rawDownCopy.reader, count)))

    let discardPort = loopbackFreePort(), echoPort = loopbackFreePort(), sinkPort = loopbackFreePort()
    let terminal: SimulatedTerminal
    let terminalLoop: EventLoop
    do {
        // The terminal on a loop thread of its own: the host side's thread is then measured alone.
        terminalLoop = try EventLoop()
        try terminalLoop.startThread()
        terminal = try SimulatedTerminal(line: .pty(linkedAt: nil), services: [(.discard, discardPort), (.echo, echoPort)], loop: terminalLoop)
        terminal.readModeration = o.lineReadModeration
        try terminal.start()
    } catch { fail("terminal: \(error)") }
    var c = ChannelConfiguration(line: .device(terminal.linePath!))
    c.relayDNS = false
    c.socks = nil
    c.lineReadModeration = o.lineReadModeration
    let channel = Channel(configuration: c)
    let addresses: ChannelAddresses
    do {
        addresses = try await channel.open()
        _ = await terminal.waitUntilUp()
        try channel.addBridge(.hostToTerminal, port: discardPort)
        try channel.addBridge(.hostToTerminal, port: echoPort)
        try channel.addBridge(.terminalToHost, port: sinkPort)
    } catch { fail("channel: \(error)") }

    // What the host side's loop thread has spent so far.
    let hostLoop = EventLoop.shared
    func hostCost() async -> ThreadCost { await hostLoop.perform { ThreadCost.now() } }
    // The data segments a transfer takes: full-sized ones (the link's MSS, 1460).
    let segmentsPerTransfer = (count + 1459) / 1460

    // host → terminal: write N MiB into the bridge to discard; done when discard closes.
    let clock = ContinuousClock()
    let data = [UInt8](repeating: 0x55, count: count)
    var costBefore = await hostCost()
    var start = clock.now
    let up = loopbackConnect(discardPort)
    writeAll(up, data)
    shutdown(up, Int32(SHUT_WR))
    var sink = [UInt8](repeating: 0, count: 16)
    while read(up, &sink, sink.count) > 0 {}
    close(up)
    let oursUp = Double(count) / seconds(clock.now - start)
    let upCost = await hostCost() - costBefore
    let upPhase = (monotonicSeconds(start), monotonicSeconds(clock.now))
    let upSegments = segmentsPerTransfer

    // terminal → host: the terminal writes N MiB through the bridge to the host's sink.
    let (listener, received) = startSink(sinkPort)
    costBefore = await hostCost()
    start = clock.now
    let r = await terminal.transfer(to: TCPEndpoint(addresses.ip, sinkPort), payload: data)
    let oursDown = Double(count) / seconds(clock.now - start)
    let downCost = await hostCost() - costBefore
    let downPhase = (monotonicSeconds(start), monotonicSeconds(clock.now))
    let downSegments = segmentsPerTransfer
    close(listener)
    guard r.succeeded, received() == count else { fail("terminal→host transfer: \(r.outcome), \(received()) of \(count) bytes") }

    // 200-byte request/response: raw through the pty, through the raw relay, and through the
    // bridge to the terminal's echo, taken in turn after the warm-up (which sets the bridge's
    // connection up end to end). What each side spends is taken over all the timed blocks: the
    // loops have little to do while the raw paths are timed (a delayed ACK for the last answer
    // of a block, 40 ms on, when the other paths' blocks take longer than that).
    let paths = [rawEchoPath(), rawRelayPath(), EchoClient(fd: loopbackConnect(echoPort))]
    warmUp(paths)
    let terminalCost = { await terminalLoop.perform { ThreadCost.now() } }
    let (hostBefore, terminalBefore) = (await hostCost(), await terminalCost())
    let timed = interleavedRoundTrips(paths, rounds: o.rounds, blocks: o.blocks)
    let (hostRound, terminalRound) = (await hostCost() - hostBefore, await terminalCost() - terminalBefore)
    for path in paths { close(path.fd) }
    let (rawRTT, relayRTT, oursRTT) = (timed[0], timed[1], timed[2])
    // How the host side read its line: on arrival, or on the clock (`LineReadModeration`).
    let hostLine = channel.status.lineQueue
    if o.report {
        for line in channel.report() { print("host:", line) }
        for line in terminal.report() { print("terminal:", line) }
    }
    _ = await channel.close()
    await terminal.stop()

    print(String(format: "bridge: host→terminal %.1f MB/s, terminal→host %.1f MB/s", oursUp / 1e6, oursDown / 1e6))
    print(String(format: "200-byte round trips, %d each in %d blocks taken in turn: raw pty echo %.1f µs (median %.1f µs), raw relay %.1f µs (median %.1f µs), bridge %.1f µs (median %.1f µs)",
                 o.rounds, o.blocks, rawRTT.mean * 1e6, rawRTT.median * 1e6, relayRTT.mean * 1e6, relayRTT.median * 1e6,
                 oursRTT.mean * 1e6, oursRTT.median * 1e6))
    let mb = Double(count) / 1e6
    func perSegment(_ c: ThreadCost, _ n: Int) -> Double { Double(c.allocations) / Double(max(1, n)) }
    print(String(format: "host side per MB: host→terminal %.2f ms CPU, %.0f allocations (%.2f per 1460-byte segment); terminal→host %.2f ms CPU, %.0f allocations (%.2f per segment)",
                 msPerMB(upCost.cpu, count), Double(upCost.allocations) / mb, perSegment(upCost, upSegments),
                 msPerMB(downCost.cpu, count), Double(downCost.allocations) / mb, perSegment(downCost, downSegments)))
    func perRound(_ c: ThreadCost) -> String {
        String(format: "%.1f µs CPU, %.2f sleeps, %.2f allocations", seconds(c.cpu) * 1e6 / Double(o.rounds),
               Double(c.sleeps) / Double(o.rounds), Double(c.allocations) / Double(o.rounds))
    }
    // Every sleep is a wakeup the round trip waits for; a wakeup that finds its CPU idle costs an
    // idle exit on top (tens of microseconds on a virtual machine).
    print("per round trip: host side \(perRound(hostRound)); terminal side \(perRound(terminalRound))")
    print("host side's line: \(hostLine.clockedReads) reads on the clock in \(hostLine.busyPeriods) busy periods")
    // CLOCK_MONOTONIC, as `perf record -k CLOCK_MONOTONIC` stamps samples: `perf report --time A,B`
    // then shows one direction alone.
    print(String(format: "phases (CLOCK_MONOTONIC s): host→terminal %.6f,%.6f terminal→host %.6f,%.6f", upPhase.0, upPhase.1, downPhase.0, downPhase.1))
    print(String(format: "RESULT bridge up_ratio=%.3f down_ratio=%.3f rtt_ratio=%.2f rtt_median_ratio=%.2f relay_rtt_median_ratio=%.2f rtt_median_over_relay=%.2f up_cpu_ms_per_mb=%.2f down_cpu_ms_per_mb=%.2f raw_cpu_ms_per_mb=%.2f up_allocs_per_segment=%.2f down_allocs_per_segment=%.2f",
                 oursUp / rawUp, oursDown / rawDown, oursRTT.mean / rawRTT.mean, oursRTT.median / rawRTT.median,
                 relayRTT.median / rawRTT.median, oursRTT.median / relayRTT.median,
                 msPerMB(upCost.cpu, count), msPerMB(downCost.cpu, count),
                 msPerMB(rawUpCopy.writer, count), perSegment(upCost, upSegments), perSegment(downCost, downSegments)))
}

/// A ContinuousClock instant as CLOCK_MONOTONIC seconds (the clock it reads on Linux).
func monotonicSeconds(_ instant: ContinuousClock.Instant) -> Double {
    let offset = ContinuousClock.now - instant
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9 - seconds(offset)
}

func parseBridge(_ args: ArraySlice<String>) -> BridgeOptions {
    var o = BridgeOptions()
    var it = args.makeIterator()
    while let a = it.next() {
        if a == "--report" {
            o.report = true
            continue
        }
        guard let v = it.next().flatMap({ Int($0) }), v >= 0 else { fail("\(a) needs a number") }
        switch a {
        case "--mib", "--rounds":
            guard v > 0 else { fail("\(a) needs a positive number") }
            if a == "--mib" { o.mebibytes = v } else { o.rounds = v }
        case "--blocks":
            guard v > 0 else { fail("\(a) needs a positive number") }
            o.blocks = v
        case "--line-poll-interval": o.lineReadModeration.interval = .microseconds(v)
        default: fail("unknown option \(a)")
        }
    }
    return o
}
