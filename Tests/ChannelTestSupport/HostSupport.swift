import Crypto
import Dispatch
import Foundation
import Glibc
import NetStack
import Channel
import Synchronization

/// Host-side helpers for channel tests: plain blocking sockets on loopback, with timeouts.
public enum Host {
    /// A listening TCP socket on `address:port` (SO_REUSEADDR; `receiveBuffer` sets SO_RCVBUF,
    /// which accepted sockets inherit).
    public static func listener(port: UInt16, address: IPv4Address = IPv4Address(127, 0, 0, 1), receiveBuffer: Int32? = nil) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, 4)
        if var size = receiveBuffer { setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, 4) }
        var a = Host.address(TCPEndpoint(address, port))
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard r == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw SystemError("bind")
        }
        return fd
    }

    public static func address(_ endpoint: TCPEndpoint) -> sockaddr_in {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = endpoint.port.bigEndian
        a.sin_addr.s_addr = endpoint.address.value.bigEndian
        return a
    }

    public static func localPort(_ fd: Int32) -> UInt16 {
        var a = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return UInt16(bigEndian: a.sin_port)
    }

    /// A port nobody listens on right now (bound and released), for a test that binds it
    /// itself a moment later. Taken outside the kernel's ephemeral range: a port the kernel
    /// picks for a bind to port 0 comes from that range, from which every `connect` in the
    /// suites running beside this one also draws its source port, and one of those took the
    /// port before the test bound it (bind: Address already in use, in CI). Outside it only
    /// an explicit bind competes; successive calls in this process walk on from a random
    /// start, so they hand out the same port again only after some 20,000 others. A range
    /// that leaves no room outside it gets the kernel's choice, as before.
    public static func freePort() -> UInt16 {
        let candidates = portsOutsideTheEphemeralRange
        if !candidates.isEmpty {
            for _ in 0..<candidates.count {
                let port = nextPortWalk.withLock { next -> UInt16 in
                    if next == nil { next = Int.random(in: 0..<candidates.count) }
                    defer { next = (next! + 1) % candidates.count }
                    return UInt16(candidates.lowerBound + next!)
                }
                if canBind(port) { return port }
            }
        }
        return kernelChosenPort()
    }

    /// 10000 up to the ephemeral range's start, else from its end up to 65000; empty when
    /// the range leaves neither (then the kernel chooses).
    private static let portsOutsideTheEphemeralRange: Range<Int> = {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        let bounds = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int($0) }
        let (low, high) = bounds.count == 2 ? (bounds[0], bounds[1]) : (32768, 60999)
        if low > 12000 { return 10000..<low }
        if high < 63000 { return (high + 1)..<65000 }
        return 0..<0
    }()

    private static let nextPortWalk = Mutex<Int?>(nil)

    private static func canBind(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var a = Host.address(TCPEndpoint(IPv4Address(127, 0, 0, 1), port))
        return withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } } == 0
    }

    private static func kernelChosenPort() -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var a = Host.address(TCPEndpoint(IPv4Address(127, 0, 0, 1), 0))
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        return localPort(fd)
    }

    public static func setTimeout(_ fd: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// A blocking connect; the descriptor, or the errno.
    public static func connect(_ endpoint: TCPEndpoint, timeout: Int = 20) -> Result<Int32, SystemError> {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        setTimeout(fd, seconds: timeout)
        var a = Host.address(endpoint)
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        if r != 0 {
            let e = SystemError("connect \(endpoint)")
            close(fd)
            return .failure(e)
        }
        return .success(fd)
    }

    public static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    /// Reads until end of stream (or a timeout/reset: then `clean` is false).
    public static func readAll(_ fd: Int32) -> (bytes: [UInt8], clean: Bool) {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return (out, true) }
            if n < 0 { return (out, false) }
            out += buffer[0..<n]
        }
    }

    /// Connects, sends `payload` (from another thread), half-closes, and reads until the other
    /// side closes; a read or write that waits `timeout` seconds ends it (`clean` false).
    public static func exchange(_ endpoint: TCPEndpoint, _ payload: [UInt8], timeout: Int = 20) async -> (bytes: [UInt8], clean: Bool)? {
        await withCheckedContinuation { c in
            Thread.detachNewThread {
                guard case let .success(fd) = connect(endpoint, timeout: timeout) else { return c.resume(returning: nil) }
                let writer = DispatchGroup()
                writer.enter()
                Thread.detachNewThread {
                    _ = sendAll(fd, payload)
                    shutdown(fd, Int32(SHUT_WR))
                    writer.leave()
                }
                let r = readAll(fd)
                writer.wait()
                close(fd)
                c.resume(returning: r)
            }
        }
    }

    public static func openDescriptors() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
    }

    /// This process's descriptors open on the file at `path` (symbolic links followed), as
    /// `/proc/self/fd` names them: unlike `openDescriptors`, it counts only what is open on
    /// that file, not what other suites running beside a test open.
    public static func descriptors(openOn path: String) -> Int {
        guard let resolved = realpath(path, nil) else { return 0 }
        let target = String(cString: resolved)
        free(resolved)
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return fds.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0)")) == target }.count
    }

    public enum SocketEnd: Sendable { case local, remote, either }

    /// This process's open TCP sockets with `port` at their local or remote end (or either),
    /// listeners included: the descriptors whose socket inode `/proc/net/tcp` lists so. Unlike
    /// `openDescriptors`, it does not count what other suites running beside a test open.
    public static func socketsOnPort(_ port: UInt16, at end: SocketEnd = .either) -> Int {
        guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return -1 }
        var inodes: Set<String> = []
        for line in table.split(separator: "\n").dropFirst() {
            let f = line.split(separator: " ")
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            guard f.count > 9, let local = f[1].split(separator: ":").last, let remote = f[2].split(separator: ":").last,
                  let lp = UInt16(local, radix: 16), let rp = UInt16(remote, radix: 16) else { continue }
            let matches = switch end {
            case .local: lp == port
            case .remote: rp == port
            case .either: lp == port || rp == port
            }
            if matches { inodes.insert(String(f[9])) }
        }
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return fds.filter { fd in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)"),
                  target.hasPrefix("socket:[") else { return false }
            return inodes.contains(String(target.dropFirst(8).dropLast()))
        }.count
    }

    public static func sha(_ b: [UInt8]) -> String { Digest.hex(Digest.hash(.sha256, b)!) }

    public static func random(_ n: Int, seed: UInt64) -> [UInt8] {
        var s = SplitMix64(seed: seed)
        var out = [UInt8]()
        out.reserveCapacity(n)
        while out.count < n {
            let v = s.next()
            withUnsafeBytes(of: v) { out += $0 }
        }
        return Array(out.prefix(n))
    }
}

/// A loopback TCP server on its own threads: echo (reads to the end, echoes, closes) or hold
/// (keeps every connection open until stopped).
public final class LoopbackServer: @unchecked Sendable {
    public enum Mode: Sendable { case echo, hold }
    public let port: UInt16
    public let listener: Int32
    private let mode: Mode
    private let lock = NSLock()
    private var held: [Int32] = []
    private var stopped = false
    private(set) var accepted = 0

    /// `receiveBuffer` sets SO_RCVBUF on the listener (accepted sockets inherit it).
    /// A server on a port free a moment ago: `Host.freePort` closes the port it found, and a
    /// suite running beside this one may take it before the bind, so another is tried then.
    public static func onFreePort(mode: Mode) throws -> (server: LoopbackServer, port: UInt16) {
        var attempt = 0
        while true {
            let port = Host.freePort()
            do {
                return (try LoopbackServer(port: port, mode: mode), port)
            } catch {
                attempt += 1
                if attempt == 5 { throw error }
            }
        }
    }

    public init(port: UInt16, mode: Mode, address: IPv4Address = IPv4Address(127, 0, 0, 1), receiveBuffer: Int32? = nil) throws {
        self.port = port
        self.mode = mode
        listener = try Host.listener(port: port, address: address, receiveBuffer: receiveBuffer)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// The accept thread owns the listener and alone closes it, once `accept` fails (`stop`
    /// shuts it down): a close from `stop` could race an `accept` on a number another test's
    /// socket or pty has been given meanwhile.
    private func acceptLoop() {
        defer { close(listener) }
        while true {
            let c = accept(listener, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                return
            }
            lock.lock()
            accepted += 1
            let done = stopped
            if mode == .hold && !done { held.append(c) }
            lock.unlock()
            if done { close(c); return }
            if mode == .echo {
                Thread.detachNewThread {
                    Host.setTimeout(c, seconds: 60)
                    let r = Host.readAll(c)
                    _ = Host.sendAll(c, r.bytes)
                    close(c)
                }
            }
        }
    }

    public var acceptedCount: Int { lock.lock(); defer { lock.unlock() }; return accepted }

    /// Stops accepting and closes the held clients; a second call does nothing (closing twice
    /// would close whatever another test opened under the same number).
    public func stop() {
        lock.lock()
        guard !stopped else {
            lock.unlock()
            return
        }
        stopped = true
        let h = held
        held = []
        lock.unlock()
        // Wakes the accept thread, which closes the listener.
        shutdown(listener, Int32(SHUT_RDWR))
        // Read what the clients sent first: closing with unread data would reset them.
        var sink = [UInt8](repeating: 0, count: 65536)
        for c in h {
            while recv(c, &sink, sink.count, Int32(MSG_DONTWAIT)) > 0 {}
            close(c)
        }
    }
}

/// Runs `body` on a thread of its own and waits for it without holding a thread of the test
/// runner's pool: for blocking work (a scripted peer driven in a tight loop, a process wait).
/// `body` records no issues (they could not be attributed to the test from that thread); it
/// returns what the test then checks.
public func offThePool<T>(_ body: @escaping () -> T) async -> T {
    let box = UncheckedBox(body)
    let result = await withCheckedContinuation { (c: CheckedContinuation<UncheckedBox<T>, Never>) in
        Thread.detachNewThread { c.resume(returning: UncheckedBox(box.value())) }
    }
    return result.value
}

/// Carries a value across threads where the caller guarantees one side uses it at a time.
public struct UncheckedBox<T>: @unchecked Sendable {
    public let value: T
    public init(_ value: T) { self.value = value }
}

public final class Locked<T>: @unchecked Sendable {
    private var v: T
    private let lock = NSLock()
    public init(_ v: T) { self.v = v }
    public var value: T { lock.lock(); defer { lock.unlock() }; return v }
    public func mutate(_ f: (inout T) -> Void) { lock.lock(); f(&v); lock.unlock() }
}
