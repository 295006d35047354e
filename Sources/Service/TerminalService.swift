import Channel
import Foundation
import Glibc
import NetStack
import Synchronization

/// Many terminals from a configuration directory, for a program to run itself: what `serve`
/// runs, without its control socket, metrics port or signals. One `NAME.conf` per terminal
/// (the format `pppbridge serve --help` and docs/SERVICE.md give), files followed as they come
/// and go, devices as they appear; requests as typed values, events as a stream.
///
/// It runs on an event loop (the process's shared one unless given another) and may be called
/// from any thread; `request` waits for the loop's answer (from async code, `perform` does the
/// same without holding a thread). Starting it raises the process's soft descriptor limit to
/// the hard one and divides the descriptors as `serve` does (docs/SERVICE.md, "Descriptors").
public final class TerminalService: @unchecked Sendable {
    public let loop: EventLoop
    public let directory: String
    private let service: Service
    private let subscribers = Mutex<(next: Int, table: [Int: AsyncStream<ServiceEvent>.Continuation])>((0, [:]))
    // Loop thread only.
    private var observers: [(ServiceEvent) -> Void] = []

    /// Opens `directory` (nothing runs until `start`). Throws when the directory cannot be
    /// watched or the loop cannot be made.
    public init(directory: String, defaults: TerminalFile.Defaults = TerminalFile.Defaults(), environment: [String: String] = [:],
                loop: EventLoop? = nil, log: @escaping @Sendable (String) -> Void = { _ in }) throws(SystemError) {
        let chosen: EventLoop
        if let loop { chosen = loop } else { chosen = try EventLoop.sharedLoop() }
        self.loop = chosen
        self.directory = directory
        let limits = ServiceLimits(descriptorLimit: DescriptorBudget.raiseSoftLimit().soft)
        let made: Result<Service, SystemError> = chosen.sync {
            do throws(SystemError) {
                let s = try Service(directory: directory, defaults: defaults, environment: environment, loop: chosen,
                                    descriptors: DescriptorBudget(limit: limits.descriptorLimit, reserve: 0),
                                    baseReserve: limits.baseReserve(openNow: DescriptorBudget.openDescriptors() ?? 32),
                                    say: { log($0) }, complain: { log($0) })
                return .success(s)
            } catch {
                return .failure(error)
            }
        }
        service = try made.get()
        service.publish = { [weak self] event in self?.deliver(event) }
    }

    deinit {
        subscribers.withLock { s in for c in s.table.values { c.finish() } }
        // The service's watcher, terminals and channels are the loop's: they are let go there,
        // never on whichever thread lets go of this object.
        let service = self.service
        loop.enqueue { withExtendedLifetime(service) {} }
    }

    /// Reads the directory and starts every terminal it describes.
    public func start() {
        loop.sync {
            service.updateReserve()
            service.scan()
        }
    }

    /// Answers `request` as the control socket would, as one JSON object (`{"ok":true,...}`
    /// or `{"ok":false,"code":N,"error":...}`). `subscribe` is acknowledged; events come
    /// through `events()` and `observe`.
    public func request(_ request: ControlRequest) -> String { reply(request).json }

    /// The answer with its code: 0 when it says ok, else the code it gives.
    public func reply(_ request: ControlRequest) -> ControlReply {
        ControlReply(loop.sync { service.answer(request) })
    }

    /// `request` from async code, without holding a thread while the loop answers.
    public func perform(_ request: ControlRequest) async -> String {
        await loop.perform { [service] in ControlReply(service.answer(request)).json }
    }

    /// The configured terminals' names, sorted.
    public var terminalNames: [String] {
        loop.sync { service.terminals.filter { !$0.value.retired }.keys.sorted() }
    }

    /// Events from now on; each call makes a new subscriber. The newest 1,024 are kept for a
    /// reader that falls behind.
    public func events() -> AsyncStream<ServiceEvent> {
        let (stream, continuation) = AsyncStream<ServiceEvent>.makeStream(bufferingPolicy: .bufferingNewest(1024))
        let key = subscribers.withLock { s -> Int in
            s.next += 1
            s.table[s.next] = continuation
            return s.next
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.subscribers.withLock { $0.table.removeValue(forKey: key) }
        }
        return stream
    }

    /// Calls `handler` on the loop's thread with every event from now on.
    public func observe(_ handler: @escaping (ServiceEvent) -> Void) {
        loop.sync { observers.append(handler) }
    }

    private func deliver(_ event: ServiceEvent) {
        for o in observers { o(event) }
        subscribers.withLock { s in for c in s.table.values { c.yield(event) } }
    }

    /// Closes every link (LCP Terminate-Request) and returns once all are down, or after
    /// `grace` (a terminal that does not answer its goodbye is not waited for longer).
    public func stop(grace: Duration = .seconds(5)) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            loop.enqueue { [service, loop] in
                let once = Mutex(false)
                let finish = {
                    let first = once.withLock { done -> Bool in
                        defer { done = true }
                        return !done
                    }
                    if first { c.resume() }
                }
                service.closeAll(then: finish)
                loop.schedule(at: loop.now + grace, finish)
            }
        }
    }
}

/// An answer of the service: the control socket's JSON object and its code.
public struct ControlReply: Sendable, Equatable {
    /// 0 when the answer says ok; else its code (ICPPP's -1…-4, or `ControlReplyCode`'s).
    public let code: Int32
    /// One JSON object, without a newline.
    public let json: String

    init(_ object: [String: Any]) {
        json = StatusJSON.line(object).trimmingCharacters(in: .newlines)
        code = object["ok"] as? Bool == true ? 0 : (object["code"] as? Int).flatMap { Int32(exactly: $0) } ?? ControlReplyCode.badRequest
    }
}

extension ServiceEvent {
    /// The event as the control socket's subscribers get it: one JSON object, without its
    /// newline (every string escaped).
    public var json: String { StatusJSON.line(Service.eventObject(self)).trimmingCharacters(in: .newlines) }
}
