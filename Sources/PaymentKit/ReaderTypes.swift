import Channel
import NetStack
import Payment

/// Stops a reconnect episode or an update installation.
public final class Cancelable: @unchecked Sendable {
    private let action: () -> Void
    private let loop: EventLoop
    init(loop: EventLoop, _ action: @escaping () -> Void) {
        self.loop = loop
        self.action = action
    }
    public func cancel() {
        nonisolated(unsafe) let action = self.action
        loop.execute { action() }
    }
}

/// The SDK's callbacks, on the event loop's thread (Stripe's reconnection and update delegate
/// shapes). Every method has a default that does nothing.
public protocol PaymentReaderDelegate: AnyObject {
    func reader(_ reader: PaymentReader, didChangeState state: PaymentState)
    func reader(_ reader: PaymentReader, didReport event: ReaderEvent)
    func reader(_ reader: PaymentReader, didStartReconnect cancelable: Cancelable, disconnectReason: DisconnectReason)
    func readerDidSucceedReconnect(_ reader: PaymentReader)
    func readerDidFailReconnect(_ reader: PaymentReader)
    func reader(_ reader: PaymentReader, didDisconnect reason: DisconnectReason)
    func reader(_ reader: PaymentReader, didReportAvailableUpdate update: ReaderSoftwareUpdate)
    func reader(_ reader: PaymentReader, didStartInstallingUpdate update: ReaderSoftwareUpdate, cancelable: Cancelable)
    func reader(_ reader: PaymentReader, didReportReaderSoftwareUpdateProgress progress: Float)
    func reader(_ reader: PaymentReader, didFinishInstallingUpdate update: ReaderSoftwareUpdate?, error: PaymentError?)
    /// Host-relay route: whether to forward this authorisation (masked PAN, amount, KSN only).
    func reader(_ reader: PaymentReader, shouldSubmit summary: [String: String]) -> Bool
    /// Discovery: the readers found so far (scan), or the one held close (proximity: first with
    /// its serial only, then again with its battery level).
    func reader(_ reader: PaymentReader, didUpdateDiscoveredReaders readers: [DiscoveredReader])
    /// Pairing: whether the 6-digit passkey matches the one on the reader's display. The
    /// default says no: a pairing nobody confirmed is rejected.
    func reader(_ reader: PaymentReader, confirmPairing passkey: String) -> Bool
}

extension PaymentReaderDelegate {
    public func reader(_ reader: PaymentReader, didChangeState state: PaymentState) {}
    public func reader(_ reader: PaymentReader, didReport event: ReaderEvent) {}
    public func reader(_ reader: PaymentReader, didStartReconnect cancelable: Cancelable, disconnectReason: DisconnectReason) {}
    public func readerDidSucceedReconnect(_ reader: PaymentReader) {}
    public func readerDidFailReconnect(_ reader: PaymentReader) {}
    public func reader(_ reader: PaymentReader, didDisconnect reason: DisconnectReason) {}
    public func reader(_ reader: PaymentReader, didReportAvailableUpdate update: ReaderSoftwareUpdate) {}
    public func reader(_ reader: PaymentReader, didStartInstallingUpdate update: ReaderSoftwareUpdate, cancelable: Cancelable) {}
    public func reader(_ reader: PaymentReader, didReportReaderSoftwareUpdateProgress progress: Float) {}
    public func reader(_ reader: PaymentReader, didFinishInstallingUpdate update: ReaderSoftwareUpdate?, error: PaymentError?) {}
    public func reader(_ reader: PaymentReader, shouldSubmit summary: [String: String]) -> Bool { true }
    public func reader(_ reader: PaymentReader, didUpdateDiscoveredReaders readers: [DiscoveredReader]) {}
    public func reader(_ reader: PaymentReader, confirmPairing passkey: String) -> Bool { false }
}

/// How to reach and log in to a reader.
public struct ReaderConnectionConfiguration: Sendable {
    public var locationID: String
    public var autoReconnectOnUnexpectedDisconnect = true
    public var reconnectTimeout: Duration = .seconds(60)
    public var connectTimeout: Duration = .seconds(10)
    /// Reconnect backoff 0.5, 1, 2, 4, 8, 8 … s times this (tests use 0.01).
    public var backoffScale = 1.0
    /// How long a payment still in progress after a reconnect is checked on before it is
    /// aborted and fails `unknownOutcome` (`ReaderSession.Settings.recoveryLimit`).
    public var recoveryLimit: Duration = .seconds(300)
    /// The terminal's reader port inside the link; the host's local-only bridge uses the same.
    public var readerPort: UInt16 = 6000
    /// The gateway the terminal may reach through the SOCKS proxy (the only destination allowed).
    public var gateway: TCPEndpoint
    public var socksPort: UInt16 = 1080
    public var environment = "int"
    public var licence = "LIC-TEST-0001"
    public var merchantID = "999008881"
    public var terminalID = "001"
    public var sessionToken: String?
    public var saleID = "HOST-1"
    /// LCP echo every `echoInterval`; three missed bring the link down.
    public var echoInterval: Duration = .seconds(1)
    public var pcapPath: String?
    /// Pair with a reader that requires it and has no bond yet (else `pairingRequired`).
    public var autoPair = false
    /// Where bonds with paired readers are kept.
    public var bonds = BondStore()

    public init(locationID: String, gateway: TCPEndpoint) {
        self.locationID = locationID
        self.gateway = gateway
    }
}
