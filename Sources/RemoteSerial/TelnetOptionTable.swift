/// Where one side of one option stands (RFC 1143's Q method, without its queue bit: we never
/// change our mind while a request is out).
enum OptionState: Sendable, Equatable {
    case no, yes, wantNo, wantYes
}

/// Both sides of every option, and what a peer may make us say about them.
///
/// RFC 1143 §7 is what keeps negotiation from looping between two correct peers; a hostile one
/// can still say WILL/WONT to an option we accept, over and over, and have us answer each
/// change. So every option has a budget of answers; past it, what the peer says of that
/// option is ignored (and counted), and the state stays as it is.
struct TelnetOptionTable: Sendable {
    /// What we do ourselves (answered by DO/DONT).
    private(set) var us = [OptionState](repeating: .no, count: 256)
    /// What the peer does (answered by WILL/WONT).
    private(set) var him = [OptionState](repeating: .no, count: 256)
    /// Answers left per option (both sides together).
    private var answersLeft = [UInt8](repeating: TelnetOptionTable.answersPerOption, count: 256)
    /// The answers a peer may draw on one option: a real server settles each in one or two.
    static let answersPerOption: UInt8 = 8
    /// Requests about options ignored because their budget was spent.
    private(set) var ignored = 0

    let ourOptions: Set<UInt8>
    let hisOptions: Set<UInt8>

    init(ours: Set<TelnetOption>, his: Set<TelnetOption>) {
        ourOptions = Set(ours.map(\.rawValue))
        hisOptions = Set(his.map(\.rawValue))
    }

    /// We ask to enable `option` on our side: WILL, unless it is on or asked for.
    mutating func requestOurs(_ option: TelnetOption) -> TelnetCommand? {
        let o = Int(option.rawValue)
        guard us[o] == .no else { return nil }
        us[o] = .wantYes
        return .will
    }

    /// We ask the peer to enable `option`: DO, unless it is on or asked for.
    mutating func requestHis(_ option: TelnetOption) -> TelnetCommand? {
        let o = Int(option.rawValue)
        guard him[o] == .no else { return nil }
        him[o] = .wantYes
        return .do
    }

    func isOn(ours option: TelnetOption) -> Bool { us[Int(option.rawValue)] == .yes }
    func isOn(his option: TelnetOption) -> Bool { him[Int(option.rawValue)] == .yes }

    /// The peer said `command` (WILL, WONT, DO or DONT) of `option`: our answer, if any, and
    /// whether the state of that option changed.
    mutating func received(_ command: TelnetCommand, option: UInt8) -> (answer: TelnetCommand?, changed: Bool) {
        let o = Int(option)
        guard answersLeft[o] > 0 else {
            ignored &+= 1
            return (nil, false)
        }
        let before = (us[o], him[o])
        var answer: TelnetCommand?
        switch command {
        case .will:
            // RFC 1143 §7, "Upon receipt of WILL".
            switch him[o] {
            case .no: if hisOptions.contains(option) { him[o] = .yes; answer = .do } else { answer = .dont }
            case .yes: break
            case .wantNo: him[o] = .no  // an answer to our DONT that is an error; stay off
            case .wantYes: him[o] = .yes
            }
        case .wont:
            switch him[o] {
            case .no: break
            case .yes: him[o] = .no; answer = .dont
            case .wantNo, .wantYes: him[o] = .no
            }
        case .do:
            switch us[o] {
            case .no: if ourOptions.contains(option) { us[o] = .yes; answer = .will } else { answer = .wont }
            case .yes: break
            case .wantNo: us[o] = .no
            case .wantYes: us[o] = .yes
            }
        case .dont:
            switch us[o] {
            case .no: break
            case .yes: us[o] = .no; answer = .wont
            case .wantNo, .wantYes: us[o] = .no
            }
        default:
            return (nil, false)
        }
        if answer != nil { answersLeft[o] -= 1 }
        return (answer, before != (us[o], him[o]))
    }
}
