/// Polls `condition` until it holds or `timeout` passes, and returns whether it held: the one
/// wait of every suite. The task sleeps between polls (no thread of the test runner's pool is
/// held), and looks once more after the deadline: a task starved past it on a loaded machine
/// still sees a condition that came true meanwhile.
public func eventually(within timeout: Duration, every interval: Duration = .milliseconds(20),
                       _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}
