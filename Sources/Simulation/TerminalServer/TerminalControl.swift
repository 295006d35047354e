import Channel
import Glibc
import NetStack
import Payment
import PaymentKit

/// A client of the terminal simulator's control socket (a Unix socket): one JSON line out, one
/// back. Blocking, with a timeout; for tests, demos and `pppbridge control`.
public final class TerminalControl: @unchecked Sendable {
    private let descriptor: FileDescriptor
    private var buffer: [UInt8] = []

    public init(path: String, timeoutSeconds: Int = 10) throws(SystemError) {
        let s = try UnixSocket.connectToOwn(path)
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(s.rawValue, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(s.rawValue, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        descriptor = s
    }

    deinit { descriptor.close() }

    /// Sends one command and returns the simulator's answer.
    public func send(_ command: JSONValue) throws(SystemError) -> JSONValue {
        try send(line: command.serialized + [0x0A])
    }

    /// Sends `line` as it is (a newline is the caller's) and returns the next answer.
    public func send(line: [UInt8]) throws(SystemError) -> JSONValue {
        var sent = 0
        while sent < line.count {
            let n = line[sent...].withUnsafeBytes { Glibc.send(descriptor.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                throw SystemError("send")
            }
            sent += n
        }
        while true {
            if let newline = buffer.firstIndex(of: 0x0A) {
                let reply = Array(buffer[..<newline])
                buffer.removeFirst(newline + 1)
                return (try? JSONParser.parse(reply)) ?? ["ok": false, "error": "unreadable answer"]
            }
            // The simulator's answers are short: one that never ends is not one.
            guard buffer.count <= 1 << 20 else { throw SystemError("recv", errno: Errno(EMSGSIZE)) }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { recv(descriptor.rawValue, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw SystemError("recv", errno: n == 0 ? .connectionReset : .current) }
            buffer += chunk[0..<n]
        }
    }
}
