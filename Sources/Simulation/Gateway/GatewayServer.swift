import Channel
import Glibc
import NetStack
import Payment
import PaymentKit

/// The simulated acquirer as a loopback TCP server: frames in, the gateway core's answers out,
/// one answer per request, in order; a client may half-close after its request and still get
/// the answer. A request the core withholds (the "no answer" rule) leaves the connection open
/// and silent.
public final class GatewayServer: @unchecked Sendable {
    public let loop: EventLoop
    public let core: GatewayCore
    private var listener: StreamListener?
    private var clients: [ObjectIdentifier: StreamConnection] = [:]
    /// Every byte the gateway received and sent (tests look for card data in it).
    public private(set) var wireBytes: [UInt8] = []
    public var recordsBytes = false

    public init(configuration: GatewayCore.Configuration, loop: EventLoop = .shared) {
        self.loop = loop
        core = GatewayCore(configuration: configuration)
    }

    /// Listens on 127.0.0.1:`port` (0: a free port; see `endpoint`).
    public func start(port: UInt16 = 0) throws(SystemError) {
        let r: SystemError? = loop.sync {
            do throws(SystemError) {
                listener = try StreamListener(on: TCPEndpoint(IPv4Address(127, 0, 0, 1), port), loop: loop) { [weak self] c in self?.accepted(c) }
                return nil
            } catch {
                return error
            }
        }
        if let r { throw r }
    }

    public var endpoint: TCPEndpoint? { loop.sync { listener?.endpoint } }

    public func stop() {
        loop.sync {
            listener?.close()
            listener = nil
            for c in clients.values { c.close() }
            clients = [:]
        }
    }

    /// The core's journal (loop-safe copy).
    public var log: [String] { loop.sync { core.log } }
    /// The same with the count of lines ever written (to print only new ones).
    public var journal: RecentLines { loop.sync { core.journal } }
    public var recorded: [UInt8] { loop.sync { wireBytes } }

    private func accepted(_ c: StreamConnection) {
        let key = ObjectIdentifier(c)
        clients[key] = c
        var decoder = PaymentFrameDecoder()
        var withheld = false
        c.onData = { [weak self, unowned c] bytes in
            guard let self else { return }
            if self.recordsBytes { self.wireBytes += bytes }
            do {
                for frame in try decoder.feed(bytes) {
                    if let answer = self.core.handle(frame, now: WallTime.current()) {
                        // The core keeps its answers within a frame; one that is not ends the
                        // connection like a bad frame from the client.
                        let out = try PaymentFrame.encode(answer)
                        if self.recordsBytes { self.wireBytes += out }
                        c.send(out)
                    } else {
                        withheld = true
                    }
                }
            } catch {
                self.clients[key] = nil
                c.close(reset: true)
            }
        }
        c.onEndOfStream = { [unowned c] in
            // The client is done asking: close once the answers are out (unless one is
            // withheld, which keeps the connection silent until the client gives up).
            if !withheld { c.shutdownWrite() }
        }
        c.onClose = { [weak self] _ in self?.clients[key] = nil }
    }
}
