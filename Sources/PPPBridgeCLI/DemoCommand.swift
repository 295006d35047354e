import Channel
import Service
import Dispatch
import Foundation
import Glibc
import NetStack
import PPP
import Simulation

/// `pppbridge demo`: the whole channel with no hardware. A pty pair; on one end a simulated
/// terminal (our stack in the terminal role, serving echo), on the other the channel (host
/// role). The link comes up, a bridge each way and a proxied connection carry data, and what
/// happened is printed in a few lines.
struct DemoCommand {
    var output: (String) -> Void
    var error: (String) -> Void

    static let usage = """
    usage: pppbridge demo [--pcap FILE] [--bytes N] [--no-payment]

    Runs the channel against a simulated terminal on a pty pair, with no hardware: brings the
    PPP link up, opens a host→terminal bridge, a terminal→host bridge and a connection through
    the SOCKS proxy, moves N bytes (default 262144) through each and checks them, then closes
    the link. Then a whole payment: a gateway simulator on loopback, a payment terminal
    simulator on a pty, the host SDK over the channel: merchant login, the reader found by
    proximity, a card paying 10.50 EUR with its PIN (E2EE to the gateway through the SOCKS
    proxy), half of it refunded by authorisation code, the link's capture (FILE-payment.pcap)
    searched for the card number. Exit status 0 when every byte arrived intact and the payment
    and refund were approved with no clear card number on the link.
    """

    func run(_ arguments: [String]) -> Int32 {
        var pcap: String?
        var bytes = 256 * 1024
        var payment = true
        var it = ArgumentCursor(arguments)
        while let a = it.next() {
            switch a {
            case "-h", "--help":
                output(DemoCommand.usage)
                return CommandLineTool.Status.success
            case "--pcap":
                guard let v = it.next() else { error("pppbridge demo: --pcap needs a file"); return CommandLineTool.Status.usage }
                pcap = v
            case "--no-payment":
                payment = false
            case "--bytes":
                guard let v = it.next(), let n = decimal(v, as: Int.self), n > 0 else { error("pppbridge demo: --bytes takes a count"); return CommandLineTool.Status.usage }
                bytes = n
            default:
                error("pppbridge demo: unknown option \(a)")
                return CommandLineTool.Status.usage
            }
        }
        let result = Locked<Int32>(1)
        let done = DispatchSemaphore(value: 0)
        nonisolated(unsafe) let out = output, err = error
        let withPayment = payment
        Task {
            do {
                var status = try await DemoCommand.demo(bytes: bytes, pcap: pcap, output: out)
                if withPayment {
                    let paid = await PaymentDemo.run(pcap: pcap, output: out)
                    out(paid ? "demo: the payment went through end to end" : "demo: the payment FAILED")
                    if !paid { status = 1 }
                }
                result.set(status)
            } catch {
                err("pppbridge demo: \(error)")
            }
            done.signal()
        }
        done.wait()
        return result.get()
    }

    static func demo(bytes: Int, pcap: String?, output: @escaping (String) -> Void) async throws -> Int32 {
        var ok = true
        let bridgePort = try freePort(), hostPort = try freePort(), proxiedPort = try freePort()
        let terminal = try SimulatedTerminal(line: .pty(linkedAt: nil), echoPorts: [bridgePort])
        try terminal.start()
        let echoServer = try EchoServer(port: hostPort)
        let proxiedServer = try EchoServer(port: proxiedPort)
        defer {
            echoServer.stop()
            proxiedServer.stop()
        }
        guard let path = terminal.linePath else { return 1 }
        output("terminal: simulated (our stack, terminal role) on pty \(path), echo on port \(bridgePort)")

        var c = ChannelConfiguration(line: .device(path))
        c.relayDNS = false
        c.pcapPath = pcap
        // The proxied server is on the host's loopback, which the proxy opens only when named.
        c.socks?.allow = [SocksDestination(host: "127.0.0.1", port: proxiedPort)]
        c.link.echo.interval = .seconds(5)
        c.link.echo.failureLimit = 3
        let channel = Channel(configuration: c)
        let started = monotonicNow()
        let a = try await channel.open()
        _ = await terminal.waitUntilUp()
        output("link: up in \(milliseconds(monotonicNow() - started)) ms; host \(a.ip), terminal \(a.terminalIP), submask \(a.submask)")

        try channel.addBridge(.hostToTerminal, port: bridgePort)
        try channel.addBridge(.terminalToHost, port: hostPort)
        output("bridges: host→terminal on port \(bridgePort), terminal→host on port \(hostPort); SOCKS proxy on \(a.ip):1080")

        // host → terminal: a host client on loopback through the bridge to the terminal's echo.
        let up = pattern(bytes, seed: 1)
        var t = monotonicNow()
        let echoed = await exchange(TCPEndpoint(IPv4Address(127, 0, 0, 1), bridgePort), up)
        let upOK = echoed == up
        ok = ok && upOK
        output("host→terminal: host client sent \(up.count) B to 127.0.0.1:\(bridgePort), got \(echoed?.count ?? 0) B back from the terminal's echo, \(upOK ? "identical" : "DIFFERENT") (\(milliseconds(monotonicNow() - t)) ms)")

        // terminal → host: the terminal connects to our PPP address; the bridge to the host's echo.
        let down = pattern(bytes, seed: 2)
        t = monotonicNow()
        let r = await terminal.transfer(to: TCPEndpoint(a.ip, hostPort), payload: down)
        let downOK = r.succeeded && r.received == down
        ok = ok && downOK
        output("terminal→host: terminal sent \(r.sent) B to \(a.ip):\(hostPort), the host's echo returned \(r.received.count) B, \(downOK ? "identical" : "DIFFERENT (\(r.outcome))") (\(milliseconds(monotonicNow() - t)) ms)")

        // terminal → proxy → host: SOCKS5 CONNECT to a host server on loopback.
        let proxied = pattern(bytes / 4, seed: 3)
        t = monotonicNow()
        let p = await terminal.transfer(to: TCPEndpoint(IPv4Address(127, 0, 0, 1), proxiedPort), via: TCPEndpoint(a.ip, 1080), payload: proxied)
        let proxyOK = p.succeeded && p.received == proxied
        ok = ok && proxyOK
        output("proxy: terminal asked SOCKS5 for 127.0.0.1:\(proxiedPort), sent \(p.sent) B, got \(p.received.count) B back, \(proxyOK ? "identical" : "DIFFERENT (\(p.outcome))") (\(milliseconds(monotonicNow() - t)) ms)")

        let status = channel.status
        let reason = await channel.close()
        await terminal.stop()
        output("link: closed (\(reason)); the line carried \(status.lineBytesIn) B in and \(status.lineBytesOut) B out, \(status.framesDropped) frames dropped")
        if let pcap { output("capture: every frame is in \(pcap) (tshark -r \(pcap))") }
        output(ok ? "demo: every byte arrived intact" : "demo: FAILED")
        return ok ? 0 : 1
    }

    static func milliseconds(_ d: Duration) -> Int64 { d.nanoseconds / 1_000_000 }

    static func pattern(_ n: Int, seed: UInt64) -> [UInt8] {
        var g = SplitMix64(seed: seed)
        return (0..<n).map { _ in UInt8(truncatingIfNeeded: g.next()) }
    }

    static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let r = withUnsafeMutablePointer(to: &a) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { s -> Int32 in
                guard bind(fd, s, length) == 0 else { return -1 }
                return getsockname(fd, s, &length)
            }
        }
        guard r == 0 else { throw SystemError("bind") }
        return UInt16(bigEndian: a.sin_port)
    }

    /// Connects, sends (from another thread), half-closes, reads to the end.
    static func exchange(_ endpoint: TCPEndpoint, _ payload: [UInt8]) async -> [UInt8]? {
        await withCheckedContinuation { c in
            Thread.detachNewThread {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                var tv = timeval(tv_sec: 30, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                var a = sockaddr_in()
                a.sin_family = sa_family_t(AF_INET)
                a.sin_port = endpoint.port.bigEndian
                a.sin_addr.s_addr = endpoint.address.value.bigEndian
                let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                guard r == 0 else {
                    close(fd)
                    c.resume(returning: nil)
                    return
                }
                let writer = DispatchSemaphore(value: 0)
                Thread.detachNewThread {
                    var offset = 0
                    while offset < payload.count {
                        let n = payload[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                        if n <= 0 { break }
                        offset += n
                    }
                    shutdown(fd, Int32(SHUT_WR))
                    writer.signal()
                }
                var received: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 65536)
                while true {
                    let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                    if n <= 0 { break }
                    received += buffer[0..<n]
                }
                writer.wait()
                close(fd)
                c.resume(returning: received)
            }
        }
    }
}

/// A loopback echo server on its own threads: reads each client to the end, echoes, closes.
final class EchoServer: @unchecked Sendable {
    let listener: Int32

    init(port: UInt16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, 4)
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = port.bigEndian
        a.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard r == 0, listen(fd, 16) == 0 else {
            close(fd)
            throw SystemError("listen 127.0.0.1:\(port)")
        }
        listener = fd
        Thread.detachNewThread { [fd] in
            while true {
                let c = accept(fd, nil, nil)
                if c < 0 { if errno == EINTR { continue }; return }
                Thread.detachNewThread {
                    var data: [UInt8] = []
                    var buffer = [UInt8](repeating: 0, count: 65536)
                    while true {
                        let n = buffer.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                        if n <= 0 { break }
                        data += buffer[0..<n]
                    }
                    var offset = 0
                    while offset < data.count {
                        let n = data[offset...].withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                        if n <= 0 { break }
                        offset += n
                    }
                    close(c)
                }
            }
        }
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}

final class Locked<T>: @unchecked Sendable {
    private var value: T
    private let lock = NSLock()
    init(_ value: T) { self.value = value }
    func get() -> T { lock.lock(); defer { lock.unlock() }; return value }
    func set(_ v: T) { lock.lock(); value = v; lock.unlock() }
}
