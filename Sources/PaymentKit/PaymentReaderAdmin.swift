import Channel
import Crypto
import Glibc
import NetStack
import Payment

/// Reboot, diagnosis and software updates.
extension PaymentReader {
    // MARK: Reboot, diagnosis, updates

    /// Reboots the reader (idle only). It disconnects with `rebootRequested`; no reconnect.
    public func rebootReader() async throws(PaymentError) {
        let _: Bool = try await run { [self] finish in
            if busy(finish) { return }
            guard let l = link else { return finish(.failure(PaymentError(.notConnected))) }
            l.request(.admin, body: ["ServiceIdentification": "Reboot"], answer: { response in
                let status = PaymentResponseStatus(json: response.body["Response"])
                finish(status?.result == .success ? .success(true) : .failure(Self.map(status ?? .failure(.messageFormat))))
            }, ifLost: { [weak l] in
                // The answer may be overtaken by the reboot itself.
                finish(l?.shutdownReason == .rebootRequested ? .success(true) : .failure(PaymentError(.connectionLost, "the reader went away")))
            })
        }
    }

    /// Asks the reader for its state; with `host` it also pings the gateway through the proxy.
    public func diagnose(host: Bool = false) async throws(PaymentError) -> JSONValue {
        try await run { [self] finish in
            guard let l = link else { return finish(.failure(PaymentError(.notConnected))) }
            l.request(.diagnosis, body: ["HostDiagnosisFlag": .bool(host)], answer: { finish(.success($0.body)) },
                      ifLost: { finish(.failure(PaymentError(.connectionLost, "the reader went away"))) })
        }
    }

    /// Installs the optional update the reader offered; returns when the reader runs it.
    public func installAvailableUpdate() async throws(PaymentError) {
        let _: Bool = try await run { [self] finish in
            if busy(finish) { return }
            guard link != nil, let offer else { return finish(.failure(PaymentError(.notConnected, "no update available"))) }
            startInstall(offer, duringConnect: nil) { finish($0.map { true }) }
        }
    }

    func startInstall(_ offer: UpdateOffer, duringConnect: ((Result<Void, PaymentError>) -> Void)?,
                              finish: ((Result<Void, PaymentError>) -> Void)?) {
        guard let l = link else { return }
        let update = ReaderSoftwareUpdate(deviceSoftwareVersion: offer.version, durationEstimate: offer.durationEstimate,
                                          requiredAt: offer.requiredAt, size: offer.size)
        install = Install(update: update, offer: offer, duringConnect: duringConnect, finish: finish)
        let cancelable = Cancelable(loop: loop) { [weak self] in
            guard let self, let i = self.install, !i.restarting, let l = self.link else { return }
            l.request(.admin, body: ["ServiceIdentification": "CancelUpdate"])
        }
        delegate?.reader(self, didStartInstallingUpdate: update, cancelable: cancelable)
        l.request(.admin, body: ["ServiceIdentification": "InstallUpdate"]) { [weak self] response in
            guard let self else { return }
            if PaymentResponseStatus(json: response.body["Response"])?.result != .success {
                self.finishInstall(.failure(PaymentError(.updateIntegrity, "the reader did not start the update")))
            }
        }
    }

    func finishInstall(_ r: Result<Void, PaymentError>) {
        guard let i = install else { return }
        install = nil
        switch r {
        case .success:
            delegate?.reader(self, didFinishInstallingUpdate: i.update, error: nil)
        case .failure(let e):
            delegate?.reader(self, didFinishInstallingUpdate: i.update, error: e)
        }
        if let connect = i.duringConnect {
            switch r {
            case .success: connect(.success(()))
            case .failure(let e):
                // A required update that does not install leaves a reader we cannot use.
                connect(.failure(e.code == .updateCanceled ? PaymentError(.unsupportedReaderVersion, "required update canceled") : e))
            }
        }
        i.finish?(r)
    }
}
