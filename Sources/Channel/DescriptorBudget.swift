import Glibc

/// The process's descriptors as a budget (DESIGN.md, "Descriptors and memory are budgets").
/// What peers and local clients make us open (host connections of bridges and the proxy,
/// DNS relay sockets) is drawn from a pool: the soft limit less a reserve kept for what the
/// service itself needs (lines, captures, listeners, the control socket and its clients, the
/// metrics port). Each terminal draws through its own `DescriptorShare`, capped at a fair
/// part of the pool, so one terminal's clients can never take the descriptor another
/// terminal's line needs to open, nor the one the control socket needs to answer.
/// Loop thread only.
public final class DescriptorBudget: @unchecked Sendable {
    /// The soft limit the budget is taken from.
    public let limit: Int
    /// Descriptors kept out of the pool for the service's own needs.
    public var reserve: Int
    /// Descriptors drawn from the pool now.
    public private(set) var held = 0
    /// Draws refused (a terminal at its cap, or the pool empty).
    public private(set) var refused = 0
    /// Shares alive (the pool is divided among them).
    public private(set) var shareCount = 0
    /// The least a share may hold when the pool has room, however many shares divide it.
    public static let minimumShare = 8

    public init(limit: Int, reserve: Int) {
        self.limit = limit
        self.reserve = reserve
    }

    /// What host connections may hold in all.
    public var pool: Int { max(0, limit - reserve) }

    /// What one share may hold: its fair part of the pool, or the minimum when that is more.
    public var shareCap: Int { max(pool / max(1, shareCount), min(pool, DescriptorBudget.minimumShare)) }

    public func makeShare() -> DescriptorShare {
        shareCount += 1
        return DescriptorShare(budget: self)
    }

    fileprivate func shareEnded() { shareCount -= 1 }

    fileprivate func draw(_ share: DescriptorShare) -> Bool {
        guard held < pool, share.held < shareCap else {
            refused += 1
            return false
        }
        held += 1
        return true
    }

    fileprivate func giveBack() { held = max(0, held - 1) }

    /// Descriptors open in the process now (the entries of /proc/self/fd, less the one the
    /// count itself holds); nil where that cannot be read.
    public static func openDescriptors() -> Int? {
        guard let directory = opendir("/proc/self/fd") else { return nil }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { Array($0.prefix { $0 != 0 }) }
            if name != [0x2E] && name != [0x2E, 0x2E] { count += 1 }
        }
        return count - 1
    }

    /// Raises the soft limit on open descriptors to the hard limit (what systemd's
    /// `LimitNOFILE=` sets, or the shell's `ulimit -Hn`) and returns the limits now in force.
    @discardableResult
    public static func raiseSoftLimit() -> (soft: Int, hard: Int) {
        var limits = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limits) == 0 else { return (1024, 1024) }
        if limits.rlim_cur < limits.rlim_max {
            var raised = limits
            raised.rlim_cur = limits.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limits = raised }
        }
        // RLIM_INFINITY is all ones: far beyond any table the kernel keeps.
        let clamp = { (v: rlim_t) -> Int in v > rlim_t(Int32.max) ? Int(Int32.max) : Int(v) }
        return (clamp(limits.rlim_cur), clamp(limits.rlim_max))
    }
}

/// One terminal's draw on a `DescriptorBudget`; it gives up its part of the pool when it goes.
public final class DescriptorShare: @unchecked Sendable {
    public let budget: DescriptorBudget
    /// Descriptors this share holds now.
    public private(set) var held = 0
    /// Draws this share was refused.
    public private(set) var refused = 0

    fileprivate init(budget: DescriptorBudget) { self.budget = budget }

    deinit { budget.shareEnded() }

    /// Takes one descriptor's worth of the pool; false when the share or the pool is used up.
    public func acquire() -> Bool {
        guard budget.draw(self) else {
            refused += 1
            return false
        }
        held += 1
        return true
    }

    /// Gives back what `acquire` took.
    public func release() {
        guard held > 0 else { return }
        held -= 1
        budget.giveBack()
    }
}
