import Channel
import Foundation
import Glibc
import NetStack

/// How `serve` divides the process's descriptors (docs/SERVICE.md, "Descriptors"): the local
/// clients' limits shrink where the process has few, and a reserve keeps what is open at
/// start, what those clients may hold and a margin out of the terminals' pool.
struct ServiceLimits {
    let descriptorLimit: Int
    /// Descriptors kept free beyond everything counted, for what the process opens briefly
    /// (a configuration file being read, a device being checked, a name lookup).
    static let margin = 8

    var controlClients: Int { min(ControlServer.defaultClientLimit, max(4, descriptorLimit / 32)) }
    var metricsClients: Int { min(MetricsServer.defaultClientLimit, max(2, descriptorLimit / 64)) }

    func baseReserve(openNow: Int) -> Int { openNow + controlClients + metricsClients + ServiceLimits.margin }
}

/// A running `serve`: the loop, the service, its control socket, metrics and notifications.
public final class ServiceRunner {
    let directory: String
    let controlPath: String
    let metricsEndpoint: TCPEndpoint?
    let defaults: TerminalFile.Defaults
    let environment: [String: String]
    let output: (String) -> Void
    let error: (String) -> Void
    private var done = false
    private var notifier: ServiceNotifier?
    private var lastStatus = ""

    public init(directory: String, controlPath: String, metrics: TCPEndpoint?, defaults: TerminalFile.Defaults, environment: [String: String],
                output: @escaping (String) -> Void, error: @escaping (String) -> Void) {
        self.directory = directory
        self.controlPath = controlPath
        metricsEndpoint = metrics
        self.defaults = defaults
        self.environment = environment
        self.output = output
        self.error = error
    }

    /// Runs the service on this thread until SIGINT or SIGTERM; the exit status (0, or 1 when
    /// the loop, the control socket or the metrics port could not be made).
    public func run() -> Int32 {
        let loop: EventLoop
        let service: Service
        let control: ControlServer
        var metrics: MetricsServer?
        let signals: SignalWatcher
        // As many descriptors as the hard limit allows (systemd's LimitNOFILE=), then a budget
        // of them: see `ServiceLimits`.
        let limits = ServiceLimits(descriptorLimit: DescriptorBudget.raiseSoftLimit().soft)
        do {
            loop = try EventLoop()
            let budget = DescriptorBudget(limit: limits.descriptorLimit, reserve: 0)
            service = try Service(directory: directory, defaults: defaults, environment: environment, loop: loop,
                                  descriptors: budget, baseReserve: 0,
                                  say: { [output] in output("serve: " + $0) }, complain: error)
            control = try ControlServer(path: controlPath, loop: loop, clientLimit: limits.controlClients) { [unowned service] (r: ControlRequest) in
                service.answer(r)
            }
            if let metricsEndpoint {
                metrics = try MetricsServer(on: metricsEndpoint, loop: loop, clientLimit: limits.metricsClients) { [unowned service] in
                    MetricsText.render(service)
                }
            }
            signals = try SignalWatcher(signals: [SIGINT, SIGTERM, SIGHUP], loop: loop) { [unowned self, unowned service] signo in
                if signo == SIGHUP {
                    output("serve: SIGHUP: reading \(directory) again")
                    service.scan()
                } else {
                    self.stop(service, loop, control)
                }
            }
        } catch let e {
            error("pppbridge serve: \(e)")
            return 1
        }
        defer {
            signals.cancel()
            control.close()
            metrics?.close()
        }
        // What is open now (the loop, its listeners, the watcher) and what the local clients
        // may hold stay out of the terminals' pool.
        service.baseReserve = limits.baseReserve(openNow: DescriptorBudget.openDescriptors() ?? 32)
        service.updateReserve()
        service.controlServer = control
        service.metricsServer = metrics
        notifier = ServiceNotifier(environment: environment)
        service.publish = { [unowned self, unowned service] event in
            control.publish(Service.eventObject(event))
            self.updateStatus(service)
        }
        output("serve: control on \(controlPath)")
        if let e = metrics?.endpoint { output("serve: metrics on http://\(e)/metrics") }
        service.scan()
        lastStatus = statusText(service)
        notifier?.notify("READY=1\nSTATUS=" + lastStatus)
        ready = true
        if let interval = ServiceNotifier.watchdogInterval(environment: environment) {
            var ping: (() -> Void)!
            ping = { [weak self] in
                guard let self, !self.done else { return }
                self.notifier?.notify("WATCHDOG=1")
                loop.schedule(at: loop.now + interval, ping)
            }
            ping()
        }
        loop.run { self.done }
        return 0
    }

    private func statusText(_ service: Service) -> String {
        "\(service.openCount) of \(service.terminals.count) terminals up"
    }

    private var ready = false

    private func updateStatus(_ service: Service) {
        guard ready else { return }
        let text = statusText(service)
        guard text != lastStatus else { return }
        lastStatus = text
        notifier?.notify("STATUS=" + text)
    }

    private var stopping = false

    /// Closes every link (LCP Terminate-Request), then ends; a link that does not finish its
    /// goodbye within 5 seconds is not waited for.
    private func stop(_ service: Service, _ loop: EventLoop, _ control: ControlServer) {
        guard !stopping else { return }
        stopping = true
        output("serve: stopping")
        notifier?.notify("STOPPING=1")
        // No request opens a link again from here.
        control.close()
        service.closeAll { [weak self] in self?.done = true }
        loop.schedule(at: loop.now + .seconds(5)) { [weak self] in self?.done = true }
    }
}
