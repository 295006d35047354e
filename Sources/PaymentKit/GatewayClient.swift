import Channel
import NetStack
import Payment

/// One request to the gateway from the host (login, signature, relayed authorisations): a
/// loopback connection, one frame each way.
public enum GatewayClient {
    public static func exchange(_ request: JSONValue, with gateway: TCPEndpoint, loop: EventLoop, timeout: Duration,
                                observer: (([UInt8]) -> Void)?, completion: @escaping (JSONValue?) -> Void) {
        exchange(payload: request.serialized, with: gateway, loop: loop, timeout: timeout, observer: observer) { answer in
            completion(answer.flatMap { try? JSONParser.parse($0) })
        }
    }

    /// The same with the request's bytes, and the answer's frame payload as it came.
    public static func exchange(payload: [UInt8], with gateway: TCPEndpoint, loop: EventLoop, timeout: Duration,
                                observer: (([UInt8]) -> Void)?, completion: @escaping ([UInt8]?) -> Void) {
        var done = false
        var timer: Int?
        var connection: StreamConnection?
        let finish: ([UInt8]?) -> Void = { answer in
            guard !done else { return }
            done = true
            if let timer { loop.cancelTimer(timer) }
            connection?.close()
            completion(answer)
        }
        do {
            let frame = try PaymentFrame.encode(payload)
            let c = try StreamConnection.connect(to: gateway, loop: loop)
            connection = c
            var decoder = PaymentFrameDecoder()
            observer?(frame)
            c.onConnected = { c.send(frame) }
            c.onData = { bytes in
                observer?(bytes)
                if let first = (try? decoder.feed(bytes))?.first { finish(first) }
            }
            c.onClose = { _ in finish(nil) }
            timer = loop.schedule(at: loop.now + timeout) { finish(nil) }
        } catch {
            finish(nil)
        }
    }

    /// Logs in to the gateway (merchant credentials, licence, environment).
    public static func login(gateway: TCPEndpoint, environment: String, licence: String, user: String, password: String,
                             loop: EventLoop = .shared) async throws(PaymentError) -> JSONValue {
        let answer = await withCheckedContinuation { (c: CheckedContinuation<JSONValue?, Never>) in
            let once = Once(c)
            loop.enqueue {
                exchange(["Type": "Login", "Environment": .string(environment), "Licence": .string(licence), "User": .string(user),
                          "Password": .string(password)], with: gateway, loop: loop, timeout: .seconds(10), observer: nil) { once.resume($0) }
            }
        }
        guard let answer else { throw PaymentError(.gatewayUnreachable) }
        guard answer["Result"]?.string == "ok" else {
            let code = answer["Error"]?.string.flatMap { Int($0) }.flatMap(PaymentErrorCode.init(rawValue:)) ?? .loginFailed
            throw PaymentError(code, answer["Reason"]?.string ?? "")
        }
        return answer
    }
}
