import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// Losing the reader and getting it back: one did-start, then one did-succeed or did-fail,
/// and a payment in flight recovered with TransactionStatus.
extension PaymentReader {
    // MARK: Loss and reconnection

    func lost(_ l: ReaderLink, _ channelReason: ChannelCloseReason?) {
        guard l === link else { return }
        link = nil
        var reason = l.shutdownReason ?? (explicitDisconnect ? .disconnectRequested : .unknown)
        if l.shutdownReason == nil, let r = channelReason, case .echoTimeout = r { reason = .linkTimeout }
        if let i = install, i.restarting || reason == .updateRestart {
            // The reader restarts into the new version: reconnect without telling the app.
            return startEpisode(silent: true, reason: reason)
        }
        if l.protocolViolation {
            // A reader sending frames we cannot take (a zero or oversize length) is not
            // reconnected to: what waited on it fails with a message-format error.
            if install != nil { finishInstall(.failure(PaymentError(.messageFormat, "invalid frame from the reader"))) }
            infoValue = nil
            failInFlight(PaymentError(.messageFormat, "invalid frame from the reader"))
            delegate?.reader(self, didDisconnect: .unknown)
            return
        }
        if install != nil { finishInstall(.failure(PaymentError(.connectionLost))) }
        if reason.isExpected || !(configuration?.autoReconnectOnUnexpectedDisconnect ?? false) {
            infoValue = nil
            failInFlight(PaymentError(.connectionLost, "reader disconnected: \(reason)"))
            delegate?.reader(self, didDisconnect: reason)
            return
        }
        startEpisode(silent: false, reason: reason)
    }

    func failInFlight(_ e: PaymentError) {
        if let p = payment {
            payment = nil
            setState(.failed(e.code))
            p.finish(.failure(e))
        } else if stateValue == .signature {
            setState(.failed(e.code))
        }
    }

    static let backoff: [Double] = [0.5, 1, 2, 4, 8]

    func startEpisode(silent: Bool, reason: DisconnectReason) {
        guard let c = configuration else { return }
        nextEpisode += 1
        let id = nextEpisode
        var e = Episode(id: id, silent: silent, deadline: loop.now + c.reconnectTimeout)
        e.deadlineTimer = loop.schedule(at: e.deadline) { [weak self] in
            self?.endEpisode(id, .failure(PaymentError(.reconnectTimeout, "no reader within \(c.reconnectTimeout)")))
        }
        episode = e
        if !silent {
            let cancelable = Cancelable(loop: loop) { [weak self] in
                self?.endEpisode(id, .failure(PaymentError(.reconnectCanceled)))
            }
            delegate?.reader(self, didStartReconnect: cancelable, disconnectReason: reason)
        }
        scheduleAttempt(id)
    }

    func scheduleAttempt(_ id: Int) {
        guard var e = episode, e.id == id else { return }
        let delay = Self.backoff[min(e.attempt, Self.backoff.count - 1)] * scale
        e.attempt += 1
        e.timer = loop.schedule(at: loop.now + .milliseconds(Int64(delay * 1000))) { [weak self] in self?.attempt(id) }
        episode = e
    }

    func attempt(_ id: Int) {
        guard let e = episode, e.id == id else { return }
        establish { [weak self] r in
            guard let self, let e = self.episode, e.id == id else {
                if case .success(let l) = r { l.teardown() }
                return
            }
            switch r {
            case .success(let l):
                self.episode?.candidate = nil
                self.adopt(l)
                self.endEpisode(id, .success(()))
            case .failure:
                self.episode?.candidate = nil
                self.scheduleAttempt(id)
            }
        }
    }

    func endEpisode(_ id: Int, _ r: Result<Void, PaymentError>) {
        guard let e = episode, e.id == id else { return }
        episode = nil
        if let t = e.timer { loop.cancelTimer(t) }
        if let t = e.deadlineTimer { loop.cancelTimer(t) }
        switch r {
        case .success:
            if e.silent {
                // Back after an update restart: finished when the reader runs the new version.
                if let i = install {
                    if infoValue?.softwareVersion == i.offer.version {
                        finishInstall(.success(()))
                    } else {
                        finishInstall(.failure(PaymentError(.updateIntegrity, "the reader came back with \(infoValue?.softwareVersion ?? "?")")))
                    }
                }
            } else {
                delegate?.readerDidSucceedReconnect(self)
            }
            recoverInFlight()
        case .failure(let error):
            e.candidate?.teardown()
            link?.teardown()
            link = nil
            infoValue = nil
            if e.silent {
                finishInstall(.failure(error))
            } else {
                delegate?.readerDidFailReconnect(self)
            }
            failInFlight(error)
        }
    }

    /// After a reconnect: what became of the payment that was in flight.
    func recoverInFlight() {
        guard var p = payment, let l = link else { return }
        p.recovering = true
        payment = p
        l.request(.transactionStatus, body: ["MessageReference": ["MessageCategory": "Payment", "ServiceID": .string(p.serviceID), "SaleID": .string(p.saleID)]]) { [weak self] response in
            guard let self, self.payment != nil else { return }
            let status = PaymentResponseStatus(json: response.body["Response"])
            if status?.result == .success, let body = response.body["RepeatedMessageResponse"]?["RepeatedResponseMessageBody"]?["PaymentResponse"] {
                self.paymentAnswered(body, recovered: true)
            } else if status?.errorCondition == .inProgress {
                self.loop.schedule(at: self.loop.now + .milliseconds(Int64(max(50, 1000 * self.scale)))) { [weak self] in self?.recoverInFlight() }
            } else {
                // Never reached the reader: nothing was charged.
                self.failInFlight(PaymentError(.connectionLost, "the reader never received the payment"))
            }
        }
    }
}
