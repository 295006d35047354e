import Channel
import NetStack
import Payment

/// The SDK's calls: each is one input to the session core under a ticket, answered by the
/// core's `finished` output for that ticket.
extension PaymentReader {
    // MARK: Connect

    /// Connects to the reader whose line is at `path` (its name is the reader's serial number),
    /// logs in with the location, and installs a required update before returning.
    public func connect(path: String, serialNumber: String? = nil, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        _ = try await call { [self] ticket, now in
            start(ticket, ReaderSession.Target(path: path, serial: serialNumber), configuration, now: now)
        }
    }

    /// Connects to a discovered reader; a discovery still running completes with it.
    public func connect(_ reader: DiscoveredReader, configuration: ReaderConnectionConfiguration) async throws(PaymentError) {
        await previousLinkClosed()
        _ = try await call { [self] ticket, now in
            // Discovery hands over to connecting directly (no idle state in between); a connect
            // refused at once leaves the discovery running.
            if discovery != nil {
                guard PaymentRules.isLocationID(configuration.locationID) else {
                    return core.refuse(ticket, PaymentError(.invalidLocationId, "location id must match [A-Za-z0-9_-]{1,64}"))
                }
                guard core.phase == .idle else { return core.refuse(ticket, PaymentError(.busy, "already connected")) }
                endDiscovery(.success(reader), state: nil)
            }
            start(ticket, ReaderSession.Target(path: reader.path, serial: reader.serialNumber, peripheral: reader), configuration, now: now)
        }
    }

    /// Hands a connect to the core; the configuration becomes the session's only if it is taken.
    private func start(_ ticket: Int, _ target: ReaderSession.Target, _ c: ReaderConnectionConfiguration, now: Instant) {
        let previous = configuration
        configuration = c
        var settings = ReaderSession.Settings(locationID: c.locationID, hostID: c.bonds.hostID)
        settings.environment = c.environment
        settings.licence = c.licence
        settings.merchantID = c.merchantID
        settings.terminalID = c.terminalID
        settings.sessionToken = c.sessionToken
        settings.saleID = c.saleID
        settings.autoReconnect = c.autoReconnectOnUnexpectedDisconnect
        settings.reconnectTimeout = c.reconnectTimeout
        settings.connectTimeout = c.connectTimeout
        settings.backoffScale = c.backoffScale
        settings.recoveryLimit = c.recoveryLimit
        settings.autoPair = c.autoPair
        core.connect(ticket, to: target, settings: settings, now: now)
        if case .connecting(let connecting) = core.phase, connecting.ticket == ticket { return }
        configuration = previous
    }

    // MARK: Payments

    /// A payment of `amountMinor` minor units. Declines come back as outcomes; failures throw.
    public func startPayment(amountMinor: Int64, currency: Currency, transactionID: String) async throws(PaymentError) -> PaymentOutcome {
        try Self.outcome(await call { [self] ticket, now in
            core.pay(ticket, type: .normal, amountMinor: amountMinor, currency: currency, transactionID: transactionID, now: now)
        })
    }

    /// The same with the amount as decimal text ("10.50"), parsed exactly in the currency's exponent.
    public func startPayment(amount: String, currency: Currency, transactionID: String) async throws(PaymentError) -> PaymentOutcome {
        guard let minor = currency.parse(amount) else {
            throw PaymentError(.invalidAmount, "\"\(amount)\" is not an amount in \(currency.code) (\(currency.exponent) decimals)")
        }
        return try await startPayment(amountMinor: minor, currency: currency, transactionID: transactionID)
    }

    /// A refund of `amount` in decimal text ("10.50"; exact, the currency's exponent honoured).
    public func startRefund(amount: String, currency: Currency, transactionID: String, originalOperationID: String) async throws(PaymentError) -> PaymentOutcome {
        guard let minor = currency.parse(amount) else {
            throw PaymentError(.invalidAmount, "\"\(amount)\" is not an amount in \(currency.code) (\(currency.exponent) decimals)")
        }
        return try await startRefund(amountMinor: minor, currency: currency, transactionID: transactionID, originalOperationID: originalOperationID)
    }

    /// A refund referencing an earlier operation by its operation ID or by the authorisation
    /// code on its receipt (no card needed).
    public func startRefund(amountMinor: Int64, currency: Currency, transactionID: String, originalOperationID: String) async throws(PaymentError) -> PaymentOutcome {
        try Self.outcome(await call { [self] ticket, now in
            core.pay(ticket, type: .refund, amountMinor: amountMinor, currency: currency, transactionID: transactionID,
                     original: originalOperationID, now: now)
        })
    }

    static func outcome(_ answer: ReaderSession.Answer) throws(PaymentError) -> PaymentOutcome {
        guard case .outcome(let o) = answer else { throw PaymentError(.messageFormat, "no outcome") }
        return o
    }

    /// Cancels what can be cancelled: discovery, a payment still waiting for the card
    /// (AbortRequest), a connect in progress. Ignored later.
    public func cancel() {
        loop.sync {
            tick()
            core.cancel(now: loop.now)
            drain()
        }
    }

    // MARK: Signature and reversal

    /// Sends the customer's signature for the approved payment waiting in `signature` state.
    public func submitSignature(image: [UInt8], format: Int) async throws(PaymentError) {
        _ = try await call { [self] ticket, _ in core.submitSignature(ticket, image: image, format: format) }
    }

    /// The customer would not sign: the payment is reversed.
    public func declineSignature() async throws(PaymentError) -> PaymentOutcome {
        try Self.outcome(await call { [self] ticket, now in core.declineSignature(ticket, now: now) })
    }

    /// Reverses an approved payment of this session (void).
    public func reverse(_ outcome: PaymentOutcome, reason: String = "MerchantCancel") async throws(PaymentError) -> PaymentOutcome {
        try Self.outcome(await call { [self] ticket, now in core.reverse(ticket, outcome, reason: reason, now: now) })
    }

    // MARK: Reboot, diagnosis, updates

    /// Reboots the reader (idle only). It disconnects with `rebootRequested`; no reconnect.
    public func rebootReader() async throws(PaymentError) {
        _ = try await call { [self] ticket, now in core.reboot(ticket, now: now) }
    }

    /// Asks the reader for its state; with `host` it also pings the gateway through the proxy.
    public func diagnose(host: Bool = false) async throws(PaymentError) -> JSONValue {
        guard case .json(let body) = try await call({ [self] ticket, now in core.diagnose(ticket, host: host, now: now) }) else {
            throw PaymentError(.messageFormat, "no diagnosis")
        }
        return body
    }

    /// Installs the optional update the reader offered; returns when the reader runs it.
    public func installAvailableUpdate() async throws(PaymentError) {
        _ = try await call { [self] ticket, now in core.installAvailableUpdate(ticket, now: now) }
    }
}
