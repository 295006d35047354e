import Channel
import NetStack
import Payment

/// An SDK error: one of the specification's codes and what happened.
public struct PaymentError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: PaymentErrorCode
    public let detail: String
    public init(_ code: PaymentErrorCode, _ detail: String = "") {
        self.code = code
        self.detail = detail
    }
    public var description: String { detail.isEmpty ? "\(code)" : "\(code): \(detail)" }
}

/// Why a reader went away (Stripe's names and raw values 0–6, the project's from 7).
public enum DisconnectReason: Int, Sendable, CustomStringConvertible {
    case unknown = 0, disconnectRequested, rebootRequested, securityReboot, criticallyLowBattery, poweredOff
    case bluetoothDisabled, bluetoothSignalLost, linkTimeout, updateRestart, pairingLost

    /// Disconnects the app asked for (never auto-reconnected).
    public var isExpected: Bool { self == .disconnectRequested || self == .rebootRequested || self == .updateRestart }

    public init(name: String) {
        switch name {
        case "disconnectRequested": self = .disconnectRequested
        case "rebootRequested": self = .rebootRequested
        case "securityReboot": self = .securityReboot
        case "criticallyLowBattery": self = .criticallyLowBattery
        case "poweredOff": self = .poweredOff
        case "updateRestart": self = .updateRestart
        case "pairingLost": self = .pairingLost
        case "linkTimeout": self = .linkTimeout
        default: self = .unknown
        }
    }

    public var description: String {
        switch self {
        case .unknown: return "unknown"
        case .disconnectRequested: return "disconnectRequested"
        case .rebootRequested: return "rebootRequested"
        case .securityReboot: return "securityReboot"
        case .criticallyLowBattery: return "criticallyLowBattery"
        case .poweredOff: return "poweredOff"
        case .bluetoothDisabled: return "bluetoothDisabled"
        case .bluetoothSignalLost: return "bluetoothSignalLost"
        case .linkTimeout: return "linkTimeout"
        case .updateRestart: return "updateRestart"
        case .pairingLost: return "pairingLost"
        }
    }
}

/// The payment manager's states (one operation at a time).
public enum PaymentState: Sendable, Equatable, CustomStringConvertible {
    case ready, login, discovery, connecting, interaction, authorizing, signature, finished
    case failed(PaymentErrorCode)

    /// States in which a new operation may start.
    public var isIdle: Bool {
        switch self {
        case .ready, .finished, .failed: return true
        default: return false
        }
    }

    public var description: String {
        switch self {
        case .ready: return "ready"
        case .login: return "login"
        case .discovery: return "discovery"
        case .connecting: return "connecting"
        case .interaction: return "interaction"
        case .authorizing: return "authorizing"
        case .signature: return "signature"
        case .finished: return "finished"
        case .failed(let c): return "failed(\(c.rawValue))"
        }
    }
}

/// A software update a reader offers.
public struct ReaderSoftwareUpdate: Sendable, Equatable {
    public var deviceSoftwareVersion: String
    public var durationEstimate: String
    public var requiredAt: WallTime?
    public var size: Int
}

/// How a payment, refund or reversal ended.
public struct PaymentOutcome: Sendable, Equatable {
    public enum Result: String, Sendable { case approved, declined, reversed }
    public var result: Result
    public var responseCode: String
    public var approvalCode: String?
    public var operationID: String?
    public var poiTransactionID: String?
    public var transactionID: String
    public var amountMinor: Int64
    public var currency: Currency
    public var maskedPAN: String?
    public var authenticatedByPin: Bool
    public var signatureRequired: Bool
    /// The result came back through TransactionStatus after a reconnect.
    public var recovered = false
}

/// What the reader shows and reports while an operation runs.
public enum ReaderEvent: Sendable, Equatable {
    case display(readerMessage: String, text: String)
    case phase(String)
    case cardInserted
    case cardRemoved
    case receipt([String])
    case notification(String, details: String)
}

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
