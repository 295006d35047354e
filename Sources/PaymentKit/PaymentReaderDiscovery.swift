import Channel
import Payment

/// Discovery over the machine's lines (SPEC §4.5): the lines are the shell's to scan; the
/// session counts it as the operation in progress.
extension PaymentReader {
    // MARK: Discovery

    /// Discovers readers on the lines matching `pattern` (SPEC §4.5): updates go to the
    /// delegate; it ends when `connect(_:configuration:)` picks a reader (returned), at the
    /// scan's timeout (`discoveryTimedOut`) or on `cancel()` (`canceled`).
    @discardableResult
    public func discoverReaders(_ configuration: DiscoveryConfiguration, pattern: String = ReaderLines.defaultPattern) async throws(PaymentError) -> DiscoveredReader? {
        try await run { [self] finish in
            if let refusal = core.beginDiscovery() { return finish(.failure(refusal)) }
            do throws(PaymentError) { _ = try ReaderLines.scan(pattern) } catch {
                core.discoveryEnded(state: .failed(error.code))
                drain()
                return finish(.failure(error))
            }
            discovery = DiscoveryRun(core: DiscoveryCore(configuration: configuration, now: loop.now), pattern: pattern, finish: finish)
            drain()
            discoveryTick()
        }
    }

    func discoveryTick() {
        guard var d = discovery else { return }
        d.timer = nil
        let seen = (try? ReaderLines.scan(d.pattern)) ?? []
        let events = d.core.tick(seen, now: loop.now)
        discovery = d
        for e in events {
            switch e {
            case .update(let readers): delegate?.reader(self, didUpdateDiscoveredReaders: readers)
            case .failed(let code): return endDiscovery(.failure(PaymentError(code, "no reader chosen in time")), state: .failed(code))
            }
        }
        guard discovery != nil else { return }
        discovery?.timer = loop.schedule(at: d.core.nextTick(after: loop.now)) { [weak self] in self?.discoveryTick() }
    }

    func endDiscovery(_ result: Result<DiscoveredReader?, PaymentError>, state: PaymentState?) {
        guard let d = discovery else { return }
        discovery = nil
        if let t = d.timer { loop.cancelTimer(t) }
        core.discoveryEnded(state: state)
        drain()
        d.finish(result)
    }
}
