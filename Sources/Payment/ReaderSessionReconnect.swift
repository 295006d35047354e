import Wire

/// Losing the reader and getting it back: one `reconnectStarted`, then one `reconnectSucceeded`
/// or `reconnectFailed`, and a payment in flight recovered with TransactionStatus.
extension ReaderSession {
    // MARK: Loss

    /// The logged-in link went: a reconnect episode, or the app is told it is disconnected.
    func lost(echoTimeout: Bool, protocolViolation: Bool, now: Instant) {
        guard let l = link else { return }
        var reason = l.shutdownReason ?? (explicitDisconnect ? .disconnectRequested : .unknown)
        if l.shutdownReason == nil, echoTimeout { reason = .linkTimeout }
        phase = .idle
        dropLink(now: now)
        if let i = install, i.restarting || reason == .updateRestart {
            // The reader restarts into the new version: reconnect without telling the app.
            return startEpisode(silent: true, reason: reason, now: now)
        }
        if protocolViolation {
            // A reader sending frames we cannot take (a zero or oversize length) is not
            // reconnected to: what waited on it fails with a message-format error.
            finishInstall(.failure(PaymentError(.messageFormat, "invalid frame from the reader")), now: now)
            info = nil
            failInFlight(PaymentError(.messageFormat, "invalid frame from the reader"))
            outputs.append(.disconnected(.unknown))
            return
        }
        if install?.duringConnect != nil {
            // The connect this required update belonged to fails: there is no session to get back.
            return finishInstall(.failure(PaymentError(.connectionLost, "the reader went during the required update")), now: now)
        }
        finishInstall(.failure(PaymentError(.connectionLost)), now: now)
        if reason.isExpected || !settings.autoReconnect {
            info = nil
            failInFlight(PaymentError(.connectionLost, "reader disconnected: \(reason)"))
            outputs.append(.disconnected(reason))
            return
        }
        startEpisode(silent: false, reason: reason, now: now)
    }

    func failInFlight(_ e: PaymentError) {
        if let p = payment {
            payment = nil
            timers[.recovery] = nil
            setState(.failed(e.code))
            finish(p.ticket, .failure(e))
        } else if state == .signature {
            setState(.failed(e.code))
        }
    }

    // MARK: Reconnect episodes

    static let backoff: [Double] = [0.5, 1, 2, 4, 8]

    func startEpisode(silent: Bool, reason: DisconnectReason, now: Instant) {
        nextEpisode += 1
        let e = Episode(id: nextEpisode, silent: silent, deadline: now + settings.reconnectTimeout)
        phase = .reconnecting(e)
        timers[.reconnectDeadline] = e.deadline
        if !silent { outputs.append(.reconnectStarted(episode: e.id, reason: reason)) }
        scheduleAttempt(now: now)
    }

    func scheduleAttempt(now: Instant) {
        guard case .reconnecting(var e) = phase else { return }
        let delay = Self.backoff[min(e.attempt, Self.backoff.count - 1)] * settings.backoffScale
        e.attempt += 1
        e.setup = .waiting
        phase = .reconnecting(e)
        timers[.backoff] = now + .milliseconds(Int64((delay * 1000).rounded()))
    }

    func attemptReconnect(now: Instant) {
        guard case .reconnecting(let e) = phase, e.setup == .waiting else { return }
        openLink(now: now)
    }

    /// The app cancels the reconnect episode it was told of.
    public func cancelReconnect(episode: Int, now: Instant) {
        guard case .reconnecting(let e) = phase, e.id == episode else { return }
        endEpisode(.failure(PaymentError(.reconnectCanceled)), now: now)
    }

    /// The episode's end: logged in again, or given up.
    func endEpisode(_ r: Result<Void, PaymentError>, now: Instant) {
        guard case .reconnecting(let e) = phase else { return }
        timers[.backoff] = nil
        timers[.reconnectDeadline] = nil
        switch r {
        case .success:
            phase = .connected
            if e.silent {
                // Back after an update restart: finished when the reader runs the new version.
                if let i = install {
                    if info?.softwareVersion == i.offer.version {
                        finishInstall(.success(()), now: now)
                    } else {
                        finishInstall(.failure(PaymentError(.updateIntegrity, "the reader came back with \(info?.softwareVersion ?? "?")")), now: now)
                    }
                }
            } else {
                outputs.append(.reconnectSucceeded)
            }
            recoverInFlight(now: now)
        case .failure(let error):
            phase = .idle
            dropLink(now: now)
            info = nil
            if e.silent {
                finishInstall(.failure(error), now: now)
            } else {
                outputs.append(.reconnectFailed)
            }
            failInFlight(error)
        }
    }

    // MARK: Recovery

    /// After a reconnect: what became of the payment that was in flight. A reader that says
    /// InProgress for ever, or never answers (hung, or hostile), must not hold the payment for
    /// ever: `Settings.recoveryLimit` after the first check it is abandoned (`abandonInFlight`).
    func recoverInFlight(now: Instant) {
        guard var p = payment, liveLink != nil else { return }
        let started = p.recoveryStarted ?? now
        p.recovering = true
        p.recoveryStarted = started
        payment = p
        if now - started >= settings.recoveryLimit { return abandonInFlight(now: now) }
        request(.transactionStatus, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID),
                                                                "SaleID": .string(p.saleID)]],
                purpose: .transactionStatus, answerWithin: Self.answerTimeout, now: now)
    }

    /// The reader said the payment is still in progress, or left the check unanswered: ask
    /// again in a second (the specification's pace).
    func checkAgainLater(now: Instant) {
        guard payment != nil else { return }
        timers[.recovery] = now + .milliseconds(Int64(max(50, (1000 * settings.backoffScale).rounded())))
    }

    /// Gives up on a payment still in progress: the reader is asked to abort it, and the app
    /// is told its outcome is unknown. It may have been charged, so the app reconciles with the
    /// gateway (not `connectionLost`, which says nothing was).
    func abandonInFlight(now: Instant) {
        guard let p = payment else { return }
        if liveLink != nil {
            request(.abort, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID), "SaleID": .string(p.saleID)],
                                   "AbortReason": "MerchantAbort"])
        }
        failInFlight(PaymentError(.unknownOutcome, "the reader still had the payment in progress after \(settings.recoveryLimit); it was asked to abort it"))
    }

    func transactionStatusAnswered(_ body: JSONValue, now: Instant) {
        guard payment != nil else { return }
        let status = PaymentResponseStatus(json: body["Response"])
        if status?.result == .success, let answer = body["RepeatedMessageResponse"]?["RepeatedResponseMessageBody"]?["PaymentResponse"] {
            paymentAnswered(answer, recovered: true)
        } else if status?.errorCondition == .inProgress {
            checkAgainLater(now: now)
        } else {
            // Never reached the reader: nothing was charged.
            failInFlight(PaymentError(.connectionLost, "the reader never received the payment"))
        }
    }
}
