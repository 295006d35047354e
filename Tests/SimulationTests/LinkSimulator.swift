import Framing
import NetStack
import PPP

/// One direction of a serial line in virtual time: bytes leave at the line rate (10 bits per
/// byte, 8N1), arrive after a delay, and may lose whole frames or single bits. Seeded, so a
/// run repeats exactly.
struct ImpairedLine {
    var bytesPerSecond = 11_520
    var frameLoss = 0.0
    /// Probability that any one bit is flipped.
    var bitErrorRate = 0.0
    var delay: Duration = .milliseconds(5)
    var rng: SplitMix64
    private(set) var busyUntil = Instant.zero
    private var inFlight: [(at: Instant, bytes: [UInt8])] = []
    private var head = 0
    private(set) var framesDropped = 0
    private(set) var bitsFlipped = 0
    private(set) var bytesCarried = 0

    init(seed: UInt64) { rng = SplitMix64(seed: seed) }

    private mutating func chance(_ p: Double) -> Bool {
        p > 0 && Double(rng.next() >> 11) / Double(1 << 53) < p
    }

    /// Queues `stream` behind what is already on the wire; frames (the bytes between flags)
    /// are dropped whole with probability `frameLoss`.
    mutating func send(_ stream: [UInt8], now: Instant) {
        guard !stream.isEmpty else { return }
        var out: [UInt8] = []
        out.reserveCapacity(stream.count)
        var frameStart = 0
        for (i, byte) in stream.enumerated() where byte == 0x7E {
            if i > frameStart {
                if chance(frameLoss) { framesDropped += 1 } else { out += stream[frameStart..<i] }
            }
            out.append(0x7E)
            frameStart = i + 1
        }
        if frameStart < stream.count { out += stream[frameStart...] }
        if bitErrorRate > 0 {
            for i in out.indices {
                for bit in 0..<8 where chance(bitErrorRate) {
                    out[i] ^= 1 << UInt8(bit)
                    bitsFlipped += 1
                }
            }
        }
        let start = max(now, busyUntil)
        busyUntil = start + .nanoseconds(Int64(stream.count) * 1_000_000_000 / Int64(bytesPerSecond))
        bytesCarried += out.count
        inFlight.append((busyUntil + delay, out))
    }

    var nextArrival: Instant? { head < inFlight.count ? inFlight[head].at : nil }

    mutating func receive(upTo now: Instant) -> [UInt8] {
        var out: [UInt8] = []
        while head < inFlight.count && inFlight[head].at <= now {
            out += inFlight[head].bytes
            head += 1
        }
        if head > 1024 {
            inFlight.removeFirst(head)
            head = 0
        }
        return out
    }
}

/// One end of the simulated link: a PPP link and, once IPCP opens, our IP stack on it.
struct SimulatedEnd {
    var link: PPPLink
    var stack: IPStack?
    var events: [LinkEvent] = []
    let seed: UInt64
    var tcp: TCPConfiguration

    init(_ configuration: LinkConfiguration, seed: UInt64, tcp: TCPConfiguration) {
        link = PPPLink(configuration: configuration, random: SplitMix64(seed: seed))
        self.seed = seed
        self.tcp = tcp
    }
}

/// Two of our stacks, host role and terminal role, over a pair of impaired lines.
struct LinkSimulator {
    var host: SimulatedEnd
    var terminal: SimulatedEnd
    var hostToTerminal: ImpairedLine
    var terminalToHost: ImpairedLine
    var now = Instant.zero

    static let hostAddress = IPv4Address(10, 64, 0, 1)
    static let terminalAddress = IPv4Address(10, 64, 0, 2)

    init(seed: UInt64, frameLoss: Double = 0, bitErrorRate: Double = 0, vj: Bool = true, tcp: TCPConfiguration = TCPConfiguration()) {
        var hostLink = LinkConfiguration.host(local: Self.hostAddress, terminal: Self.terminalAddress)
        var terminalLink = LinkConfiguration.terminal()
        if !vj {
            hostLink.ipcp.vj = nil
            terminalLink.ipcp.vj = nil
        }
        host = SimulatedEnd(hostLink, seed: seed &+ 1, tcp: tcp)
        terminal = SimulatedEnd(terminalLink, seed: seed &+ 2, tcp: tcp)
        hostToTerminal = ImpairedLine(seed: seed &+ 3)
        terminalToHost = ImpairedLine(seed: seed &+ 4)
        for line in [\LinkSimulator.hostToTerminal, \LinkSimulator.terminalToHost] {
            self[keyPath: line].frameLoss = frameLoss
            self[keyPath: line].bitErrorRate = bitErrorRate
        }
    }

    mutating func start() {
        host.link.open(now: now)
        terminal.link.open(now: now)
    }

    /// Runs `application` after every step until it returns true or `limit` passes.
    /// Returns whether the application finished.
    mutating func run(for limit: Duration, application: (inout LinkSimulator) -> Bool) -> Bool {
        let end = now + limit
        while now <= end {
            Self.step(&host, incoming: &terminalToHost, now: now)
            Self.step(&terminal, incoming: &hostToTerminal, now: now)
            if application(&self) { return true }
            Self.flush(&host, &hostToTerminal, now: now)
            Self.flush(&terminal, &terminalToHost, now: now)
            guard let next = earliest(host.link.pollAt, terminal.link.pollAt, host.stack?.pollAt, terminal.stack?.pollAt,
                                      hostToTerminal.nextArrival, terminalToHost.nextArrival) else { return false }
            now = max(now, next)
            if let p = host.link.pollAt, p <= now { host.link.poll(now: now) }
            if let p = terminal.link.pollAt, p <= now { terminal.link.poll(now: now) }
            if let p = host.stack?.pollAt, p <= now { host.stack?.poll(now: now) }
            if let p = terminal.stack?.pollAt, p <= now { terminal.stack?.poll(now: now) }
        }
        return false
    }

    private static func step(_ end: inout SimulatedEnd, incoming: inout ImpairedLine, now: Instant) {
        let bytes = incoming.receive(upTo: now)
        if !bytes.isEmpty { end.link.receive(bytes, now: now) }
        for event in end.link.takeEvents() {
            end.events.append(event)
            if case let .ipcpOpened(result) = event {
                var c = IPStackConfiguration(address: result.localAddress)
                c.mtu = end.link.transmitMRU
                c.tcp = end.tcp
                if result.transmitVJ != nil { c.tcp.timestamps = false }
                end.stack = IPStack(configuration: c, seed: end.seed)
            }
        }
        for packet in end.link.takeReceivedIPPackets() { end.stack?.receive(packet: packet, now: now) }
    }

    private static func flush(_ end: inout SimulatedEnd, _ line: inout ImpairedLine, now: Instant) {
        for packet in end.stack?.takeOutgoing() ?? [] { end.link.send(ipPacket: packet, now: now) }
        line.send(end.link.takeTransmit(), now: now)
    }
}
