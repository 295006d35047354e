import CSystem
import Glibc
import NetStack
import PPP

/// Hands the link's IP packets to a TUN interface and the kernel's packets to the link: what
/// pppd does with the kernel's PPP driver, for kernels and containers without one. When IPCP
/// opens, the interface gets the negotiated point-to-point addresses and MTU and goes up.
public final class TunAttachment: NetworkAttachment {
    public let requestedName: String
    public private(set) var name: String
    public let descriptor: FileDescriptor
    private let output: (String) -> Void
    private var up = false
    /// The interface's MTU: the largest packet a read can return.
    private var mtu = 1500
    private var fromKernel: [[UInt8]] = []
    public private(set) var packetsToKernel = 0
    public private(set) var packetsFromKernel = 0
    public private(set) var writeDrops = 0

    /// Opens (creates) the TUN interface; needs CAP_NET_ADMIN.
    public init(name: String, output: @escaping (String) -> Void) throws(SystemError) {
        var actual = [CChar](repeating: 0, count: Int(IFNAMSIZ))
        let fd = pppbridge_tun_open(name, &actual)
        guard fd >= 0 else { throw SystemError("open TUN \(name)") }
        requestedName = name
        self.name = String(decoding: actual.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        descriptor = FileDescriptor(fd)
        self.output = output
    }

    deinit { descriptor.close() }

    public var finished: Bool { false }

    public func linkUp(_ result: IPCPResult, mtu: Int, now: Instant) throws(SystemError) {
        guard pppbridge_if_configure(name, result.localAddress.value.bigEndian, result.peerAddress.value.bigEndian, Int32(mtu)) == 0 else {
            throw SystemError("configure \(name)")
        }
        up = true
        self.mtu = mtu
        output("tun: \(name) up, \(result.localAddress) peer \(result.peerAddress) mtu \(mtu)")
    }

    public func linkDown() { up = false }

    public func receive(packet: [UInt8], now: Instant) {
        guard up else { return }
        let n = packet.withUnsafeBytes { Glibc.write(descriptor.rawValue, $0.baseAddress, $0.count) }
        // A full TUN queue drops, as a kernel interface would.
        if n == packet.count { packetsToKernel += 1 } else { writeDrops += 1 }
    }

    public func takeOutgoing(now: Instant) -> [[UInt8]] {
        defer { fromKernel.removeAll(keepingCapacity: true) }
        return fromKernel
    }

    public var pollAt: Instant? { nil }
    public func poll(now: Instant) {}
    public var descriptors: [FileDescriptor] { [descriptor] }

    public func readable(_ fd: FileDescriptor, room: Int, now: Instant) throws(SystemError) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        var budget = room
        // After the first, a packet is read only when the largest one would still fit: one read
        // beyond the room would be dropped at the queue, a loss of our making for the kernel's
        // TCP. (The first always is: the session asks only when the largest fits, or when no IP
        // data is queued at all behind a limit smaller than the MTU.)
        while budget > 0 && (budget == room || budget >= mtu) {
            guard let n = try readAvailable(descriptor, into: &buffer), n > 0 else { return }
            // Only IPv4 rides our link (IPCP); the kernel's IPv6 chatter is not for it.
            guard up, buffer[0] >> 4 == 4 else { continue }
            fromKernel.append(Array(buffer[0..<n]))
            packetsFromKernel += 1
            budget -= n
        }
    }

    public func report() -> [String] {
        ["tun: \(name) to kernel \(packetsToKernel) packets (dropped \(writeDrops)), from kernel \(packetsFromKernel)"]
    }
}
