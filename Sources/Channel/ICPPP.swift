import NetStack

/// ICPPP's delegate, with the header's names (called on the channel's event loop).
public protocol ICPPPDelegate: AnyObject {
    func pppChannelDidOpen()
    func pppChannelDidClose()
}

/// The results the ICPPP calls return (the iSMP SDK's names; we return only these two).
public enum ISMPResult: Int32, Sendable {
    case success = 0
    case failure = 1
}

/// A thin face with the vendor header's names and integer returns over `Channel`, so code
/// written against ICPPP ports line by line. `channel` gives the Swift API behind it.
public final class ICPPP: ChannelDelegate {
    public let channel: Channel
    public weak var delegate: ICPPPDelegate?

    public init(configuration: ChannelConfiguration, loop: EventLoop = .shared) {
        channel = Channel(configuration: configuration, loop: loop)
        channel.delegate = self
    }

    /// Starts the link; did-open follows. Failure only when the line cannot be opened.
    public func openChannel() -> ISMPResult {
        do {
            try channel.start()
            return .success
        } catch {
            return .failure
        }
    }

    /// Closes the link; did-close follows.
    public func closeChannel() { channel.requestClose() }

    public func addiOSToTerminalBridgeOnPort(_ port: Int) -> Int32 { add(.hostToTerminal, port) }
    public func addTerminalToiOSBridgeOnPort(_ port: Int) -> Int32 { add(.terminalToHost, port) }
    public func addiOSToTerminalBridgeLocalOnPort(_ port: Int) -> Int32 { add(.hostToTerminalLocal, port) }

    private func add(_ kind: BridgeKind, _ port: Int) -> Int32 {
        guard let p = UInt16(exactly: port), p != 0 else { return BridgeError.initialisationFailed.rawValue }
        do {
            try channel.addBridge(kind, port: p)
            return 0
        } catch {
            return error.rawValue
        }
    }

    /// Keep-alive for the terminal's outbound connections through the proxy: idle delay,
    /// probe interval (seconds) and probe count. Failure for values the kernel does not take.
    public func setKeepAliveDelay(_ keepAliveDelay: Int32, interval keepAliveInterval: Int32, count keepAliveCount: Int32) -> ISMPResult {
        let k = KeepAliveSettings(idleSeconds: keepAliveDelay, probeIntervalSeconds: keepAliveInterval, probeCount: keepAliveCount)
        guard k.isValid else { return .failure }
        channel.setKeepAlive(k)
        return .success
    }

    public var IP: String { channel.ip ?? "" }
    public var submask: String { channel.submask ?? "" }
    public var dns: String { channel.dns ?? "" }
    public var terminalIP: String { channel.terminalIP ?? "" }

    public func channelDidOpen(_ channel: Channel) { delegate?.pppChannelDidOpen() }
    public func channelDidClose(_ channel: Channel, reason: ChannelCloseReason) { delegate?.pppChannelDidClose() }
}
