import Crypto
import NetStack
import Payment
import PaymentKit

/// The terminal simulator's control commands (one JSON object per line on its control socket)
/// turned into the pad's typed inputs. Every field is checked here: a wrong or out-of-range
/// value is an error answer, never a trap.
enum TerminalControlCommands {
    /// How long a command takes the link down: whole or fractional seconds, at most a day (a
    /// longer or non-finite time would overflow the clock's arithmetic).
    static func downTime(_ v: JSONValue) -> Duration? {
        if let i = v.integer { return (0...86_400).contains(i) ? .seconds(i) : nil }
        guard case .number(let t) = v, let d = Double(t), d.isFinite, (0...86_400).contains(d),
              let ms = Int64(exactly: (d * 1000).rounded()) else { return nil }
        return .milliseconds(ms)
    }

    static func ok(_ extra: [(String, JSONValue)] = []) -> JSONValue { .object([("ok", true)] + extra) }
    static func no(_ why: String) -> JSONValue { ["ok": false, "error": .string(why)] }

    /// Handles one command against `core`; returns its answer.
    static func handle(core: TerminalCore, _ command: JSONValue, now: Instant) -> JSONValue {
        do throws(TerminalCore.PadRefusal) {
            switch command["cmd"]?.string ?? "" {
            case "presentCard":
                guard let pan = command["pan"]?.string else { return no("pan must be 12-19 digits with a valid check digit") }
                let data = CardData(pan: pan, expiry: command["expiry"]?.string ?? "3012", serviceCode: command["serviceCode"]?.string ?? "201")
                try core.presentCard(data, entryMode: command["entry"]?.string ?? "ICC", cvm: command["cvm"]?.string ?? "OnlinePIN",
                                     pin: command["pin"]?.string, now: now)
            case "enterPin":
                guard let pin = command["pin"]?.string else { return no("pin must be 4-12 digits") }
                try core.enterPIN(pin, now: now)
            case "removeCard":
                core.removeCard(now: now)
            case "pressCancel":
                try core.pressCancel(now: now)
            case "setBattery":
                guard let level = PaymentRules.fraction(command["level"]) else { return no("level is a number in [0,1]") }
                try core.setBattery(level, now: now)
            case "dropLinkAfterAuthorise":
                guard let downFor = downTime(command["downFor"] ?? 1) else { return no("downFor is 0...86400 seconds") }
                core.dropLinkAfterAuthorise(downFor: downFor)
            case "setClock":
                guard let t = command["now"]?.string.flatMap({ WallTime(rfc3339: $0) }) else { return no("now is RFC 3339 UTC") }
                core.setClock(t, now: now)
            case "powerOff":
                core.powerOff(now: now)
            case "provisionKey":
                guard let block = command["tr31"]?.string, let kbpk = command["kbpk"]?.string.flatMap(Hex.decode) else { return no("tr31 and kbpk") }
                try core.provisionKey(block: block, kbpk: kbpk, testKeys: command["testKeys"]?.bool ?? false)
            case "erasePairing":
                core.erasePairing()
            case "status":
                let s = core.padStatus
                return ok([("pairing", .bool(s.pairing)), ("bonds", .integer(Int64(s.bonds))), ("serial", .string(s.serial)), ("version", .string(s.version)),
                           ("loggedIn", .bool(s.loggedIn)), ("busy", .bool(s.busy)), ("phase", s.phase.map { .string($0) } ?? .null),
                           ("ksnCounter", .integer(Int64(s.ksnCounter))), ("battery", .number(PaymentRules.fraction(s.battery)))])
            default:
                return no("unknown command")
            }
            return ok()
        } catch {
            return no(error.description)
        }
    }
}
