import Channel
import RemoteSerial
import Foundation

/// One encoder for a channel's status, for `run`'s status file and `serve`'s control socket
/// alike. Peer text reaches it (a close reason carries what the terminal sent), so it goes
/// through JSONSerialization, which escapes every string.
public enum StatusJSON {
    /// The status as a JSON object (for `run`'s status file and `serve`'s control socket).
    public static func object(_ s: ChannelStatus) -> [String: Any] {
        func traffic(_ t: TrafficCounters) -> [String: Any] {
            ["connections": t.connections, "active": t.active, "bytes_to_terminal": t.bytesToTerminal,
             "bytes_to_host": t.bytesToHost, "failures": t.failures, "refused": t.refused]
        }
        var object: [String: Any] = [
            "state": s.state.rawValue,
            "bridges": s.bridges.map { b in traffic(b.traffic).merging(["kind": b.kind.rawValue, "port": Int(b.port)]) { $1 } },
            "line_bytes_in": s.lineBytesIn, "line_bytes_out": s.lineBytesOut,
            "frames_in": s.framesIn, "frames_out": s.framesOut, "frames_dropped": s.framesDropped, "opens": s.opens,
        ]
        if let a = s.addresses {
            object["ip"] = a.ip.description
            object["submask"] = a.submask.description
            object["dns"] = a.dns.map { $0.description as Any } ?? NSNull()
            object["terminal_ip"] = a.terminalIP.description
        }
        if let p = s.proxy {
            object["proxy"] = traffic(p).merging(["refused": s.proxyRefusals, "refused_by_policy": s.proxyPolicyRefusals,
                                                  "handshake_timeouts": s.proxyHandshakeTimeouts]) { $1 }
        }
        let q = s.lineQueue
        object["line_queue"] = ["queued": q.queued, "peak": q.peak, "dropped_packets": q.droppedPackets,
                                "dropped_control_bytes": q.droppedControlBytes, "read_pauses": q.readPauses,
                                "busy_periods": q.busyPeriods, "clocked_reads": q.clockedReads, "arrival_reads": q.arrivalReads,
                                "clock_ended_sparse": q.clockEndedSparse, "clock_ended_over_band": q.clockEndedOverBand,
                                "clock_ended_paused": q.clockEndedPaused]
        object["accept_backoffs"] = s.acceptBackoffs
        object["listen_refusals"] = s.listenRefusals
        if let r = s.lastCloseReason { object["last_close_reason"] = r.description }
        if let c = s.comPort {
            // What the device server answered to our settings (RFC 2217); absent: not answered.
            var port: [String: Any] = [:]
            if let v = c.baudRate { port["baud"] = Int(v) }
            if let v = c.dataBits { port["data_bits"] = Int(v) }
            if let v = c.parity { port["parity"] = Int(v) }
            if let v = c.stopBits { port["stop_bits"] = Int(v) }
            if let v = c.control { port["control"] = Int(v) }
            if let v = c.modemState { port["modem_state"] = Int(v) }
            object["rfc2217"] = port
        }
        return object
    }

    /// A connection's report as an event object (`serve`'s control socket, the C API's
    /// connection callback): `{"event": "connection-opened" | "connection-closed" |
    /// "connection-refused", "connection": N, "bridge": "host:5000" or "proxy": true,
    /// "destination", "source", "failure"?, "bytes_to_terminal"/"bytes_to_host" when closed}`.
    public static func connection(_ report: ConnectionReport) -> [String: Any] {
        var object: [String: Any] = ["event": "connection-" + report.phase.rawValue, "connection": report.number,
                                     "destination": report.destination, "source": report.source]
        switch report.carrier {
        case let .bridge(spec): object["bridge"] = spec.description
        case .proxy: object["proxy"] = true
        }
        if let failure = report.failure { object["failure"] = failure }
        if report.phase == .closed {
            object["bytes_to_terminal"] = report.bytesToTerminal
            object["bytes_to_host"] = report.bytesToHost
        }
        return object
    }

    /// `object` as JSON text and a newline; keys sorted so the file reads the same each time.
    public static func line(_ object: [String: Any]) -> String {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]) else { return "{}\n" }
        return String(decoding: data, as: UTF8.self) + "\n"
    }
}
