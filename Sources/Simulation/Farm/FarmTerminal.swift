import Channel
import Glibc
import NetStack
import PPP

/// One terminal of a farm: a pty linked at its name (the device), and on it our stack in the
/// terminal role, serving echo. When its link goes down it starts again on the same device
/// after a pause, as a terminal does; its behaviour and any fault asked for decide the rest.
/// Loop thread only.
final class FarmTerminal {
    let index: Int
    let linkPath: String
    let behaviour: FarmBehaviour
    private unowned let farm: TerminalFarm
    private var loop: EventLoop { farm.loop }
    /// The device: nil while it is gone (a hang-up's down time).
    private var line: SerialLine?
    /// The terminal's stack on the device, while it runs.
    private var incarnation: SimulatedTerminal?
    /// A restart, a fault's end or the next scheduled hang-up.
    private var restartTimer: Int?
    private var faultTimer: Int?
    private var hangUpTimer: Int?
    private var noiseUntil: Instant?
    private var noiseRate = 0.0
    /// A fault holds the terminal down until its timer ends it.
    private var heldDown = false
    private var random: SplitMix64
    private var closed = false

    private(set) var opens = 0
    private(set) var downs = 0
    private(set) var hangUps = 0
    private(set) var faults = 0
    private(set) var startFailures = 0
    var isUp: Bool { incarnation?.isUp ?? false }

    init(index: Int, linkPath: String, behaviour: FarmBehaviour, farm: TerminalFarm, seed: UInt64) {
        self.index = index
        self.linkPath = linkPath
        self.behaviour = behaviour
        self.farm = farm
        random = SplitMix64(seed: seed)
    }

    func start() {
        makeDevice()
        boot()
        scheduleHangUp()
    }

    /// Ends everything: the stack, the device and its name.
    func close() {
        closed = true
        for t in [restartTimer, faultTimer, hangUpTimer] { if let t { loop.cancelTimer(t) } }
        restartTimer = nil
        faultTimer = nil
        hangUpTimer = nil
        incarnation?.hangUp()
        incarnation = nil
        line?.close()
        line = nil
    }

    func apply(_ fault: FarmFault) {
        guard !closed else { return }
        faults += 1
        if let t = faultTimer { loop.cancelTimer(t) }
        faultTimer = nil
        switch fault {
        case let .hangUp(downFor):
            hangUp(downFor: downFor)
        case let .silence(duration):
            heldDown = true
            cancelRestart()
            incarnation?.freeze()
            faultTimer = loop.schedule(at: loop.now + duration) { [weak self] in
                guard let self else { return }
                self.faultTimer = nil
                self.heldDown = false
                self.restart()
            }
        case let .noise(rate, duration):
            noiseUntil = loop.now + duration
            noiseRate = rate
            incarnation?.lineNoise = LineNoise(bitErrorRate: rate, seed: random.next())
            faultTimer = loop.schedule(at: loop.now + duration) { [weak self] in
                guard let self else { return }
                self.faultTimer = nil
                self.noiseUntil = nil
                self.incarnation?.lineNoise = self.standingNoise
            }
        }
    }

    private var standingNoise: LineNoise? {
        if case let .noisy(rate) = behaviour { return LineNoise(bitErrorRate: rate, seed: random.next()) }
        return nil
    }

    /// The line goes: the device's name is removed, its pty closed (the host reads a hang-up),
    /// and a new device comes back after `downFor`.
    private func hangUp(downFor: Duration) {
        hangUps += 1
        heldDown = true
        cancelRestart()
        incarnation?.hangUp()
        incarnation = nil
        line?.close()
        line = nil
        // Back at once: the new device is there before the host has read the hang-up (a
        // terminal's program restarting fast).
        guard downFor > .zero else {
            heldDown = false
            makeDevice()
            return boot()
        }
        faultTimer = loop.schedule(at: loop.now + downFor) { [weak self] in
            guard let self else { return }
            self.faultTimer = nil
            self.heldDown = false
            self.makeDevice()
            self.boot()
        }
    }

    private func scheduleHangUp() {
        guard case let .hangsUp(every) = behaviour, every > .zero else { return }
        // Half to one and a half times `every`: the terminals' hang-ups do not line up.
        let fraction = 0.5 + Double(random.next() >> 11) / Double(UInt64(1) << 53)
        hangUpTimer = loop.schedule(at: loop.now + every * fraction) { [weak self] in
            guard let self, !self.closed else { return }
            self.hangUpTimer = nil
            if !self.heldDown { self.hangUp(downFor: .zero) }
            self.scheduleHangUp()
        }
    }

    private func makeDevice() {
        guard !closed, line == nil else { return }
        do {
            line = try SerialLine(ptyLinkedAt: linkPath)
        } catch {
            startFailures += 1
            farm.complain("\(linkPath): \(error)")
        }
    }

    /// A new stack on the device (a copy of its descriptor, so the device outlives it).
    private func boot() {
        guard !closed, !heldDown, let line, incarnation == nil else { return }
        // A silent terminal's line is there and nothing ever reads it.
        if behaviour == .silent { return }
        let copy = FileDescriptor(dup(line.descriptor.rawValue))
        guard copy.rawValue >= 0 else {
            startFailures += 1
            farm.complain("\(linkPath): dup: \(SystemError("dup").description)")
            return scheduleRestart()
        }
        var link = LinkConfiguration.terminal()
        link.echo = farm.configuration.echo
        if behaviour == .refusesLCP {
            // RFC 1661 §6.2: the host is asked for PAP, and nobody's secret is known here.
            link.lcp.requireAuthentication = [.pap]
        }
        let t: SimulatedTerminal
        do {
            if case let .slow(delay) = behaviour {
                t = try SimulatedTerminal(line: .descriptor(copy), link: link, loop: loop)
                t.add(DelayedEcho(port: farm.echoPort(index), delay: delay))
            } else {
                t = try SimulatedTerminal(line: .descriptor(copy), echoPorts: [farm.echoPort(index)], link: link, loop: loop)
            }
        } catch {
            copy.close()
            startFailures += 1
            farm.complain("\(linkPath): \(error)")
            return scheduleRestart()
        }
        t.onUp = { [weak self] _ in self?.opens += 1 }
        t.onDown = { [weak self, weak t] _ in
            guard let self, let t, self.incarnation === t else { return }
            self.downs += 1
            // Let go of it after its own callback has returned.
            if !self.heldDown { self.scheduleRestart() }
        }
        if let until = noiseUntil, until > loop.now {
            t.lineNoise = LineNoise(bitErrorRate: noiseRate, seed: random.next())
        } else {
            t.lineNoise = standingNoise
        }
        incarnation = t
        do { try t.start() } catch {
            incarnation = nil
            startFailures += 1
            farm.complain("\(linkPath): \(error)")
            scheduleRestart()
        }
    }

    private func cancelRestart() {
        if let t = restartTimer { loop.cancelTimer(t) }
        restartTimer = nil
    }

    private func scheduleRestart() {
        guard restartTimer == nil, !closed else { return }
        restartTimer = loop.schedule(at: loop.now + farm.configuration.restartDelay) { [weak self] in
            guard let self else { return }
            self.restartTimer = nil
            self.restart()
        }
    }

    /// The stack that was is let go (its link is down or frozen) and a new one boots.
    private func restart() {
        guard !closed, !heldDown else { return }
        incarnation?.hangUp()
        incarnation = nil
        boot()
    }
}
