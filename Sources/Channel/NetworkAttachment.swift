import NetStack
import PPP

/// What carries IP over the link once IPCP is up: our own stack, or a TUN device that hands
/// the packets to the kernel. The session owns all I/O timing; an attachment is told about
/// packets, time and its own descriptors, and hands back packets for the link.
public protocol NetworkAttachment: AnyObject {
    func linkUp(_ result: IPCPResult, mtu: Int, now: Instant) throws(SystemError)
    func linkDown()
    /// One packet of a batch (a line read's worth). The session takes the output once the
    /// batch's packets are all in (`takeOutgoing`), and an attachment may wait for that to act
    /// on them.
    func receive(packet: [UInt8], now: Instant)
    func takeOutgoing(now: Instant) -> [[UInt8]]
    /// `takeOutgoing` into `packets`, which the session keeps from batch to batch (emptied
    /// first): an attachment that can hand its list over without allocating does so here.
    func takeOutgoing(now: Instant, into packets: inout [[UInt8]])
    /// Packets from `takeOutgoing`, handed back once framed, for their arrays to be reused.
    func recycle(_ packets: inout [[UInt8]])
    var pollAt: Instant? { get }
    func poll(now: Instant)
    /// Descriptors the session watches for input on the attachment's behalf.
    var descriptors: [FileDescriptor] { get }
    /// Called when one of `descriptors` is readable; `room` is how many bytes the line can
    /// still queue, so a fast source waits rather than growing memory.
    func readable(_ descriptor: FileDescriptor, room: Int, now: Instant) throws(SystemError)
    /// Lines for a person: counters on SIGUSR1 and at the end.
    func report() -> [String]
    /// True when the attachment has finished what it was asked to do (e.g. all pings sent and answered or timed out).
    var finished: Bool { get }
}

extension NetworkAttachment {
    public func takeOutgoing(now: Instant, into packets: inout [[UInt8]]) {
        packets.removeAll(keepingCapacity: true)
        packets += takeOutgoing(now: now)
    }

    public func recycle(_ packets: inout [[UInt8]]) {
        packets.removeAll(keepingCapacity: true)
    }
}
