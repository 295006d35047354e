import Wire

// The SDK's vocabulary: what the reader session core and the async SDK both speak.

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
