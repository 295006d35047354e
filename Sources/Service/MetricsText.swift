import Channel

/// `serve`'s metrics in Prometheus' text format 0.0.4: per terminal the link's state, opens,
/// close reasons, line bytes and frames each way, dropped frames and echo failures; per bridge
/// connections, bytes and failures; per proxy connections and refusals.
enum MetricsText {
    /// A family: its HELP and TYPE lines, then its samples.
    private struct Family {
        let name: String
        let help: String
        let type: String
        var samples: [(labels: [(String, String)], value: Int)] = []
    }

    static func render(_ service: Service) -> String {
        var families: [String: Family] = [:]
        var order: [String] = []
        func add(_ name: String, _ type: String, _ help: String, _ labels: [(String, String)], _ value: Int) {
            if families[name] == nil {
                families[name] = Family(name: name, help: help, type: type)
                order.append(name)
            }
            families[name]!.samples.append((labels, value))
        }
        let terminals = service.terminals.keys.sorted().compactMap { service.terminals[$0] }
        add("pppbridge_terminals", "gauge", "Terminals configured.", [], terminals.count)
        add("pppbridge_terminals_up", "gauge", "Terminals whose link is open.", [], terminals.filter { $0.state == .open }.count)
        add("pppbridge_configuration_errors_total", "counter", "Configuration files refused.", [], service.configurationErrors)
        let budget = service.descriptors
        add("pppbridge_descriptors_limit", "gauge", "The process's limit on open descriptors (its soft RLIMIT_NOFILE, raised to the hard one).", [],
            budget.limit)
        add("pppbridge_descriptors_reserved", "gauge", "Descriptors kept for lines, captures, listeners and local clients.", [], budget.reserve)
        add("pppbridge_host_descriptors", "gauge", "Descriptors the terminals' host connections and DNS queries hold.", [], budget.held)
        add("pppbridge_host_descriptors_refused_total", "counter", "Host connections and DNS queries refused for want of descriptors.", [],
            budget.refused)
        if let c = service.controlServer {
            add("pppbridge_control_clients", "gauge", "Control socket clients connected.", [], c.clientCount)
            add("pppbridge_control_clients_closed_total", "counter", "Control clients let go, by why.", [("reason", "idle")], c.clientsTimedOut)
            add("pppbridge_control_clients_closed_total", "counter", "Control clients let go, by why.", [("reason", "made_room")], c.clientsEvicted)
            add("pppbridge_control_clients_closed_total", "counter", "Control clients let go, by why.", [("reason", "not_reading")], c.clientsDropped)
            add("pppbridge_control_clients_closed_total", "counter", "Control clients let go, by why.", [("reason", "refused")], c.clientsRefused)
            add("pppbridge_control_clients_closed_total", "counter", "Control clients let go, by why.", [("reason", "sent_nothing")],
                c.clientsSendingNothing)
        }
        if let m = service.metricsServer {
            add("pppbridge_metrics_clients_closed_total", "counter", "Metrics clients let go before they finished, by why.", [("reason", "timeout")],
                m.timedOut)
            add("pppbridge_metrics_clients_closed_total", "counter", "Metrics clients let go before they finished, by why.", [("reason", "made_room")],
                m.evicted)
            add("pppbridge_metrics_clients_closed_total", "counter", "Metrics clients let go before they finished, by why.", [("reason", "refused")],
                m.refused)
        }
        for t in terminals {
            let terminal = ("terminal", t.name)
            add("pppbridge_terminal_up", "gauge", "Whether the terminal's link is open.", [terminal], t.state == .open ? 1 : 0)
            for state in TerminalSupervisor.State.names where state != "retired" {
                add("pppbridge_terminal_state", "gauge", "The terminal's state (1 for the current one).", [terminal, ("state", state)],
                    t.state.name == state ? 1 : 0)
            }
            add("pppbridge_terminal_failed_opens", "gauge", "Failed opens in a row (pppd's maxfail counts these).", [terminal], t.failures)
            add("pppbridge_link_opens_total", "counter", "Links that reached IPCP.", [terminal], t.opens)
            for reason in ChannelCloseReason.names {
                add("pppbridge_link_closes_total", "counter", "Links that ended, by reason.", [terminal, ("reason", reason)], t.closeReasons[reason] ?? 0)
            }
            let totals = t.totals
            add("pppbridge_line_bytes_total", "counter", "Bytes on the line.", [terminal, ("direction", "in")], totals.bytesIn)
            add("pppbridge_line_bytes_total", "counter", "Bytes on the line.", [terminal, ("direction", "out")], totals.bytesOut)
            add("pppbridge_line_frames_total", "counter", "PPP frames on the line.", [terminal, ("direction", "in")], totals.framesIn)
            add("pppbridge_line_frames_total", "counter", "PPP frames on the line.", [terminal, ("direction", "out")], totals.framesOut)
            add("pppbridge_line_frames_dropped_total", "counter", "Received frames dropped (bad FCS, runts, too long, aborted, bad header).",
                [terminal], totals.dropped)
            add("pppbridge_echo_failures_total", "counter", "LCP echo requests left unanswered.", [terminal], t.echoFailures)
            if let share = t.descriptors {
                add("pppbridge_terminal_host_descriptors", "gauge", "Descriptors the terminal's host connections and DNS queries hold.",
                    [terminal], share.held)
                add("pppbridge_terminal_host_descriptors_refused_total", "counter",
                    "The terminal's host connections and DNS queries refused at its part of the descriptors.", [terminal], share.refused)
            }
            let status = t.channel.status
            for b in status.bridges {
                let labels = [terminal, ("bridge", b.kind.rawValue + ":" + String(b.port))]
                add("pppbridge_bridge_connections_total", "counter", "Connections a bridge carried.", labels, b.traffic.connections)
                add("pppbridge_bridge_connections", "gauge", "Connections a bridge carries now.", labels, b.traffic.active)
                add("pppbridge_bridge_bytes_total", "counter", "Bytes a bridge carried.", labels + [("direction", "to_terminal")], b.traffic.bytesToTerminal)
                add("pppbridge_bridge_bytes_total", "counter", "Bytes a bridge carried.", labels + [("direction", "to_host")], b.traffic.bytesToHost)
                add("pppbridge_bridge_failures_total", "counter", "Bridge connections that failed or were reset.", labels, b.traffic.failures)
                add("pppbridge_bridge_refused_total", "counter", "Host clients refused at the bridge's connection limit.", labels, b.traffic.refused)
            }
            if let p = status.proxy {
                add("pppbridge_proxy_connections_total", "counter", "Connections the SOCKS proxy carried.", [terminal], p.connections)
                add("pppbridge_proxy_connections", "gauge", "Connections the SOCKS proxy carries now.", [terminal], p.active)
                add("pppbridge_proxy_failures_total", "counter", "Proxied connections that failed or were reset.", [terminal], p.failures)
                add("pppbridge_proxy_refusals_total", "counter", "SOCKS requests refused.", [terminal], status.proxyRefusals)
            }
        }
        var text = ""
        for name in order {
            guard let f = families[name] else { continue }
            text += "# HELP \(f.name) \(f.help)\n# TYPE \(f.name) \(f.type)\n"
            for s in f.samples {
                let labels = s.labels.isEmpty ? "" : "{" + s.labels.map { "\($0.0)=\"\(escape($0.1))\"" }.joined(separator: ",") + "}"
                text += "\(f.name)\(labels) \(s.value)\n"
            }
        }
        return text
    }

    /// A label value as the format wants it: backslash, double quote and newline escaped.
    static func escape(_ value: String) -> String {
        var out = ""
        for c in value.unicodeScalars {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
