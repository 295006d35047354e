import Crypto

/// The reader protocol's envelope (nexo Retailer shape, JSON encoding): a `SaleToPOIRequest` or
/// `SaleToPOIResponse` holding a `MessageHeader` and exactly one body named
/// `<MessageCategory><MessageType>` (`EventNotification` for events).
public struct PaymentMessage: Sendable, Equatable {
    public enum Direction: String, Sendable {
        case request = "SaleToPOIRequest"
        case response = "SaleToPOIResponse"
    }

    public enum MessageClass: String, Sendable, CaseIterable { case service = "Service", device = "Device", event = "Event" }
    public enum MessageType: String, Sendable, CaseIterable { case request = "Request", response = "Response", notification = "Notification" }

    /// The categories this protocol carries (a subset of nexo's list).
    public enum Category: String, Sendable, CaseIterable {
        case login = "Login", logout = "Logout", payment = "Payment", reversal = "Reversal", abort = "Abort"
        case transactionStatus = "TransactionStatus", diagnosis = "Diagnosis", admin = "Admin"
        case display = "Display", print = "Print", transmit = "Transmit", event = "Event"
    }

    public struct Header: Sendable, Equatable {
        public var protocolVersion: String?
        public var messageClass: MessageClass
        public var category: Category
        public var type: MessageType
        /// ServiceID for Service messages, DeviceID for Device messages; nil for events.
        public var identifier: String?
        public var saleID: String
        public var poiID: String

        public init(protocolVersion: String? = "3.1", messageClass: MessageClass, category: Category, type: MessageType,
                    identifier: String?, saleID: String, poiID: String) {
            self.protocolVersion = protocolVersion
            self.messageClass = messageClass
            self.category = category
            self.type = type
            self.identifier = identifier
            self.saleID = saleID
            self.poiID = poiID
        }

        package var json: JSONValue {
            var m: [(String, JSONValue)] = []
            if let protocolVersion { m.append(("ProtocolVersion", .string(protocolVersion))) }
            m.append(("MessageClass", .string(messageClass.rawValue)))
            m.append(("MessageCategory", .string(category.rawValue)))
            m.append(("MessageType", .string(type.rawValue)))
            if let identifier { m.append((messageClass == .device ? "DeviceID" : "ServiceID", .string(identifier))) }
            m.append(("SaleID", .string(saleID)))
            m.append(("POIID", .string(poiID)))
            return .object(m)
        }

        /// The same header for the answer.
        public func response() -> Header {
            var h = self
            h.type = .response
            return h
        }
    }

    public var direction: Direction
    public var header: Header
    public var body: JSONValue

    public init(direction: Direction, header: Header, body: JSONValue) {
        self.direction = direction
        self.header = header
        self.body = body
    }

    public var bodyName: String {
        header.messageClass == .event ? "EventNotification" : header.category.rawValue + header.type.rawValue
    }

    public var json: JSONValue {
        .object([(direction.rawValue, .object([("MessageHeader", header.json), (bodyName, body)]))])
    }

    /// The frame payload.
    public var encoded: [UInt8] { json.serialized }

    /// Decodes one frame payload. A failure carries the ServiceID when one could be read, so the
    /// receiver can answer `Failure/MessageFormat` to it.
    public static func decode(_ payload: [UInt8]) throws -> PaymentMessage {
        let value: JSONValue
        do { value = try JSONParser.parse(payload) } catch let error as JSONError {
            throw MessageFormatError(reason: error.description, header: nil)
        }
        guard let top = value.members, top.count == 1, let direction = Direction(rawValue: top[0].0),
              let content = top[0].1.members else {
            throw MessageFormatError(reason: "expected one SaleToPOIRequest or SaleToPOIResponse object", header: nil)
        }
        guard let rawHeader = content.first(where: { $0.0 == "MessageHeader" })?.1 else {
            throw MessageFormatError(reason: "no MessageHeader", header: nil)
        }
        let header = try parseHeader(rawHeader)
        let message = PaymentMessage(direction: direction, header: header, body: .object([]))
        guard content.count == 2 else {
            throw MessageFormatError(reason: "expected the header and exactly one body", header: header)
        }
        guard let body = content.first(where: { $0.0 == message.bodyName })?.1, body.members != nil else {
            throw MessageFormatError(reason: "no \(message.bodyName) object", header: header)
        }
        let expected: Direction = header.type == .response ? .response : .request
        guard direction == expected else {
            throw MessageFormatError(reason: "\(header.type.rawValue) inside \(direction.rawValue)", header: header)
        }
        return PaymentMessage(direction: direction, header: header, body: body)
    }

    static func parseHeader(_ raw: JSONValue) throws -> Header {
        func field(_ name: String) -> String? { raw[name]?.string }
        let loose = Header(protocolVersion: field("ProtocolVersion"), messageClass: .service, category: .login, type: .request,
                           identifier: field("ServiceID") ?? field("DeviceID"), saleID: field("SaleID") ?? "", poiID: field("POIID") ?? "")
        func bad(_ why: String) -> MessageFormatError {
            MessageFormatError(reason: why, header: nil, serviceID: isIdentifier(loose.identifier) ? loose.identifier : nil)
        }
        guard raw.members != nil else { throw bad("MessageHeader is not an object") }
        guard let c = field("MessageClass").flatMap(MessageClass.init) else { throw bad("MessageClass") }
        guard let cat = field("MessageCategory").flatMap(Category.init) else { throw bad("MessageCategory") }
        guard let t = field("MessageType").flatMap(MessageType.init) else { throw bad("MessageType") }
        guard let sale = field("SaleID"), (1...32).contains(sale.utf8.count) else { throw bad("SaleID") }
        guard let poi = field("POIID"), (1...32).contains(poi.utf8.count) else { throw bad("POIID") }
        let id: String?
        switch c {
        case .service:
            guard isIdentifier(field("ServiceID")) else { throw bad("ServiceID must be 1 to 10 digits") }
            id = field("ServiceID")
        case .device:
            guard isIdentifier(field("DeviceID")) else { throw bad("DeviceID must be 1 to 10 digits") }
            id = field("DeviceID")
        case .event:
            guard cat == .event, t == .notification else { throw bad("an Event message is an Event Notification") }
            id = nil
        }
        if c != .event && (cat == .event || t == .notification) { throw bad("only Event messages are notifications") }
        if cat == .login || cat == .diagnosis {
            guard field("ProtocolVersion") != nil else { throw bad("ProtocolVersion is required for \(cat.rawValue)") }
        }
        return Header(protocolVersion: field("ProtocolVersion"), messageClass: c, category: cat, type: t,
                      identifier: id, saleID: sale, poiID: poi)
    }

    static func isIdentifier(_ s: String?) -> Bool {
        guard let s else { return false }
        return (1...10).contains(s.utf8.count) && s.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }
}

/// A frame that is not a valid message. `serviceID` is set when the sender can be answered.
public struct MessageFormatError: Error, Equatable, Sendable, CustomStringConvertible {
    public var reason: String
    public var header: PaymentMessage.Header?
    public var serviceID: String?

    public init(reason: String, header: PaymentMessage.Header?, serviceID: String? = nil) {
        self.reason = reason
        self.header = header
        self.serviceID = serviceID ?? header.flatMap { $0.messageClass == .service ? $0.identifier : nil }
    }

    public var description: String { "message format: \(reason)" }
}

/// nexo's Response element: Result, ErrorCondition and URL-encoded AdditionalResponse.
public struct PaymentResponseStatus: Sendable, Equatable {
    public enum Result: String, Sendable { case success = "Success", failure = "Failure", partial = "Partial" }
    public enum ErrorCondition: String, Sendable, CaseIterable {
        case aborted = "Aborted", busy = "Busy", cancel = "Cancel", deviceOut = "DeviceOut", inProgress = "InProgress"
        case loggedOut = "LoggedOut", messageFormat = "MessageFormat", notAllowed = "NotAllowed", notFound = "NotFound"
        case paymentRestriction = "PaymentRestriction", refusal = "Refusal", unavailableDevice = "UnavailableDevice"
        case unavailableService = "UnavailableService", invalidCard = "InvalidCard", unreachableHost = "UnreachableHost"
        case wrongPIN = "WrongPIN"
    }

    public var result: Result
    public var errorCondition: ErrorCondition?
    public var additional: [(String, String)]

    public init(result: Result, errorCondition: ErrorCondition? = nil, additional: [(String, String)] = []) {
        self.result = result
        self.errorCondition = errorCondition
        self.additional = additional
    }

    public static let success = PaymentResponseStatus(result: .success)
    public static func failure(_ condition: ErrorCondition, _ additional: [(String, String)] = []) -> PaymentResponseStatus {
        PaymentResponseStatus(result: .failure, errorCondition: condition, additional: additional)
    }

    public static func == (a: PaymentResponseStatus, b: PaymentResponseStatus) -> Bool {
        a.result == b.result && a.errorCondition == b.errorCondition && a.additional.elementsEqual(b.additional, by: { $0 == $1 })
    }

    public func value(_ key: String) -> String? { additional.first { $0.0 == key }?.1 }

    public var json: JSONValue {
        var m: [(String, JSONValue)] = [("Result", .string(result.rawValue))]
        if let errorCondition { m.append(("ErrorCondition", .string(errorCondition.rawValue))) }
        if !additional.isEmpty {
            m.append(("AdditionalResponse", .string(additional.map { "\(FormEncoding.encode($0.0))=\(FormEncoding.encode($0.1))" }.joined(separator: "&"))))
        }
        return .object(m)
    }

    public init?(json: JSONValue?) {
        guard let json, let r = json["Result"]?.string.flatMap(Result.init) else { return nil }
        result = r
        errorCondition = json["ErrorCondition"]?.string.flatMap(ErrorCondition.init)
        additional = FormEncoding.decode(json["AdditionalResponse"]?.string ?? "")
    }
}

/// `k=v&k=v` with percent-encoding, as nexo's AdditionalResponse and EventDetails use.
public enum FormEncoding {
    public static func encode(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            switch b {
            case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, 0x2D, 0x2E, 0x5F, 0x7E: out.unicodeScalars.append(Unicode.Scalar(b))
            default: out += "%" + (b < 16 ? "0" : "") + String(b, radix: 16, uppercase: true)
            }
        }
        return out
    }

    public static func decode(_ s: String) -> [(String, String)] {
        guard !s.isEmpty else { return [] }
        return s.split(separator: "&", omittingEmptySubsequences: true).map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            return (unescape(String(parts[0])), parts.count > 1 ? unescape(String(parts[1])) : "")
        }
    }

    static func unescape(_ s: String) -> String {
        var out = [UInt8]()
        let b = Array(s.utf8)
        var i = 0
        while i < b.count {
            if b[i] == 0x25, i + 2 < b.count, let hi = Hex.nibbleValue(b[i + 1]), let lo = Hex.nibbleValue(b[i + 2]) {
                out.append(hi << 4 | lo)
                i += 3
            } else {
                out.append(b[i] == 0x2B ? 0x20 : b[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
