import Channel
import Dispatch
import Foundation
import Glibc
import NetStack
import Service
import Synchronization

// The C API of `include/pppbridge.h`. A `pb_channel *` is not a pointer to anything: it is a
// number handed out once (never again, for the life of the process) and looked up in a table,
// so a handle that was destroyed, or never was, is told apart and answered PB_INVALID instead
// of being followed into freed memory. Every channel runs on the library's shared event loop
// (a thread of its own), made on the first create; a failure to make it (no descriptors, no
// thread) is create's NULL and errno, never a trap.

public typealias DidOpen = @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void
public typealias DidClose = @convention(c) (OpaquePointer?, Int32, UnsafeMutableRawPointer?) -> Void
public typealias ConnectionCallback = @convention(c) (OpaquePointer?, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void

/// One C channel: the Swift channel, the caller's context and callbacks, and the addresses as
/// C strings that stay valid from did-open to did-close.
final class CChannel: ChannelDelegate, @unchecked Sendable {
    let channel: Channel
    let context: UnsafeMutableRawPointer?
    let didOpen: DidOpen?
    let didClose: DidClose?
    /// Four 16-byte buffers ("255.255.255.255" and its NUL), rewritten on the loop's thread.
    let addresses = UnsafeMutablePointer<CChar>.allocate(capacity: 64)

    /// The handle C holds.
    let handle: OpaquePointer
    /// Whether the last link reached IPCP: a reopen from did-close of a link that never did
    /// waits `failedReopenDelay` (a missing device would otherwise be retried every turn).
    var lastLinkOpened = false
    static let failedReopenDelay = Duration.seconds(1)

    /// pb_set_connection_callback's function (set and read on the loop's thread).
    var onConnection: ConnectionCallback?

    init(device: String, loop: EventLoop, handle: OpaquePointer, context: UnsafeMutableRawPointer?, didOpen: DidOpen?, didClose: DidClose?) {
        self.handle = handle
        channel = Channel(configuration: ChannelConfiguration(line: .device(device)), loop: loop)
        self.context = context
        self.didOpen = didOpen
        self.didClose = didClose
        addresses.initialize(repeating: 0, count: 64)
        channel.delegate = self
        channel.observe { [weak self] event in
            guard let self, case let .connection(report) = event, let callback = self.onConnection,
                  self.channel.delegate != nil else { return }
            StatusJSON.line(StatusJSON.connection(report)).trimmingCharacters(in: .newlines).withCString {
                callback(self.handle, $0, self.context)
            }
        }
    }

    deinit { addresses.deallocate() }

    func address(_ index: Int) -> UnsafePointer<CChar> { UnsafePointer(addresses + 16 * index) }

    private func store(_ text: String, at index: Int) {
        let bytes = Array(text.utf8.prefix(15))
        for (i, b) in bytes.enumerated() { addresses[16 * index + i] = CChar(bitPattern: b) }
        addresses[16 * index + bytes.count] = 0
    }

    func channelDidOpen(_ channel: Channel) {
        lastLinkOpened = true
        if let a = channel.currentAddresses {
            store(a.ip.description, at: 0)
            store(a.submask.description, at: 1)
            store(a.dns?.description ?? "", at: 2)
            store(a.terminalIP.description, at: 3)
        }
        didOpen?(handle, context)
    }

    /// True while did-close runs: an open from there is started on a later turn of the loop,
    /// so a device that fails at once (unplugged) cannot recurse open → did-close → open.
    var inDidClose = false

    func channelDidClose(_ channel: Channel, reason: ChannelCloseReason) {
        // Cleared first: a thread the callback wakes must not read the last link's addresses.
        for i in 0..<4 { addresses[16 * i] = 0 }
        inDidClose = true
        didClose?(handle, reason.code, context)
        inDidClose = false
    }
}

/// Live objects by handle. Handles count up from 1, shifted and tagged with the table's kind
/// (so no handle is a small integer a careless caller might pass, nor one kind's handle
/// another's), and are never reused.
final class HandleTable<Object: AnyObject & Sendable>: Sendable {
    private let state = Mutex<(next: UInt, table: [UInt: Object])>((1, [:]))
    private let tag: UInt

    init(tag: UInt) { self.tag = tag & 0xF }

    /// A new handle for the object `make` builds with it; nil when the object cannot be made
    /// (`make` sets errno) or the handles ran out.
    func insert(_ make: (OpaquePointer) -> Object?) -> OpaquePointer? {
        let key = state.withLock { s -> UInt in
            defer { s.next &+= 1 }
            return s.next << 4 | tag
        }
        guard let raw = UnsafeRawPointer(bitPattern: key) else {
            errno = EOVERFLOW
            return nil
        }
        let handle = OpaquePointer(raw)
        guard let object = make(handle) else { return nil }
        state.withLock { $0.table[key] = object }
        return handle
    }

    subscript(_ p: OpaquePointer?) -> Object? {
        guard let p else { return nil }
        return state.withLock { $0.table[Self.key(p)] }
    }

    /// Takes the object out: from then on the handle is invalid.
    func remove(_ p: OpaquePointer) -> Object? { state.withLock { $0.table.removeValue(forKey: Self.key(p)) } }

    private static func key(_ p: OpaquePointer) -> UInt { UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(p))) }
}

private let channels = HandleTable<CChannel>(tag: 0x1)

private func unwrap(_ p: OpaquePointer?) -> CChannel? { channels[p] }

private let invalid: Int32 = -6
private let openFailed: Int32 = -7
private let noSuchBridge: Int32 = -5

@_cdecl("pb_channel_create")
public func pb_channel_create(_ device: UnsafePointer<CChar>?, _ context: UnsafeMutableRawPointer?,
                              _ didOpen: DidOpen?, _ didClose: DidClose?) -> OpaquePointer? {
    guard let device, device.pointee != 0 else {
        errno = EINVAL
        return nil
    }
    let loop: EventLoop
    do { loop = try EventLoop.sharedLoop() } catch {
        errno = error.errno.rawValue
        return nil
    }
    return channels.insert { handle in
        CChannel(device: String(cString: device), loop: loop, handle: handle, context: context, didOpen: didOpen, didClose: didClose)
    }
}

@_cdecl("pb_open_channel")
public func pb_open_channel(_ p: OpaquePointer?) -> Int32 {
    guard let c = unwrap(p) else { return invalid }
    if c.channel.loop.inLoop && c.inDidClose {
        // From did-close: on a later turn, and a second later when the link never came up
        // (a device that is missing fails again at once), as pppd's holdoff would.
        let loop = c.channel.loop
        let at = c.lastLinkOpened ? loop.now : loop.now + CChannel.failedReopenDelay
        c.lastLinkOpened = false
        loop.schedule(at: at) { [weak c] in try? c?.channel.start() }
        return 0
    }
    c.channel.loop.sync { c.lastLinkOpened = false }
    do { try c.channel.start() } catch { return openFailed }
    return 0
}

@_cdecl("pb_close_channel")
public func pb_close_channel(_ p: OpaquePointer?) -> Int32 {
    guard let c = unwrap(p) else { return invalid }
    c.channel.requestClose()
    return 0
}

private func addBridge(_ p: OpaquePointer?, _ kind: BridgeKind, _ port: UInt16) -> Int32 {
    guard let c = unwrap(p), port != 0 else { return invalid }
    do { try c.channel.addBridge(kind, port: port) } catch { return error.rawValue }
    return 0
}

@_cdecl("pb_add_host_to_terminal_bridge")
public func pb_add_host_to_terminal_bridge(_ p: OpaquePointer?, _ port: UInt16) -> Int32 { addBridge(p, .hostToTerminal, port) }

@_cdecl("pb_add_host_to_terminal_bridge_local")
public func pb_add_host_to_terminal_bridge_local(_ p: OpaquePointer?, _ port: UInt16) -> Int32 { addBridge(p, .hostToTerminalLocal, port) }

@_cdecl("pb_add_terminal_to_host_bridge")
public func pb_add_terminal_to_host_bridge(_ p: OpaquePointer?, _ port: UInt16) -> Int32 { addBridge(p, .terminalToHost, port) }

@_cdecl("pb_remove_bridge")
public func pb_remove_bridge(_ p: OpaquePointer?, _ kind: Int32, _ port: UInt16) -> Int32 {
    let kinds: [Int32: BridgeKind] = [0: .hostToTerminal, 1: .hostToTerminalLocal, 2: .terminalToHost]
    guard let c = unwrap(p), let k = kinds[kind], port != 0 else { return invalid }
    return c.channel.removeBridge(k, port: port) ? 0 : noSuchBridge
}

@_cdecl("pb_set_keepalive")
public func pb_set_keepalive(_ p: OpaquePointer?, _ idle: UInt32, _ interval: UInt32, _ count: UInt32) -> Int32 {
    guard let c = unwrap(p), let i = Int32(exactly: idle), let v = Int32(exactly: interval), let n = Int32(exactly: count) else { return invalid }
    let k = KeepAliveSettings(idleSeconds: i, probeIntervalSeconds: v, probeCount: n)
    guard k.isValid else { return invalid }
    c.channel.setKeepAlive(k)
    return 0
}

nonisolated(unsafe) private let empty: UnsafePointer<CChar> = {
    let p = UnsafeMutablePointer<CChar>.allocate(capacity: 1)
    p.initialize(to: 0)
    return UnsafePointer(p)
}()

@_cdecl("pb_ip")
public func pb_ip(_ p: OpaquePointer?) -> UnsafePointer<CChar> { unwrap(p)?.address(0) ?? empty }

@_cdecl("pb_submask")
public func pb_submask(_ p: OpaquePointer?) -> UnsafePointer<CChar> { unwrap(p)?.address(1) ?? empty }

@_cdecl("pb_dns")
public func pb_dns(_ p: OpaquePointer?) -> UnsafePointer<CChar> { unwrap(p)?.address(2) ?? empty }

@_cdecl("pb_terminal_ip")
public func pb_terminal_ip(_ p: OpaquePointer?) -> UnsafePointer<CChar> { unwrap(p)?.address(3) ?? empty }

@_cdecl("pb_set_connection_callback")
public func pb_set_connection_callback(_ p: OpaquePointer?, _ callback: ConnectionCallback?) -> Int32 {
    guard let c = unwrap(p) else { return invalid }
    c.channel.loop.sync { c.onConnection = callback }
    return 0
}

@_cdecl("pb_channel_destroy")
public func pb_channel_destroy(_ p: OpaquePointer?) -> Int32 {
    guard let p, let live = unwrap(p) else { return invalid }
    // From a callback (the loop's thread) the channel would be freed in the middle of its own
    // work: refused, nothing done.
    if live.channel.loop.inLoop { return invalid }
    // Out of the table first: from here on every call with this handle is PB_INVALID, and a
    // second destroy finds nothing to free.
    guard let c = channels.remove(p) else { return invalid }
    // No callback after this returns: the delegate is let go on the loop first.
    c.channel.loop.sync { c.channel.delegate = nil }
    return 0
}

// MARK: The service: many terminals from a configuration directory

public typealias ServiceEventCallback = @convention(c) (OpaquePointer?, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void

/// One C service: the Swift service and the caller's callback and context.
final class CService: @unchecked Sendable {
    let service: TerminalService
    init(service: TerminalService) { self.service = service }
}

private let services = HandleTable<CService>(tag: 0x3)

private func unwrapService(_ p: OpaquePointer?) -> CService? { services[p] }

@_cdecl("pb_service_open")
public func pb_service_open(_ directory: UnsafePointer<CChar>?, _ onEvent: ServiceEventCallback?, _ context: UnsafeMutableRawPointer?) -> OpaquePointer? {
    guard let directory, directory.pointee != 0 else {
        errno = EINVAL
        return nil
    }
    let path = String(cString: directory)
    // The context pointer is the caller's, handed back as it came.
    let contextBits = UInt(bitPattern: context)
    return services.insert { handle in
        let made: Result<TerminalService, SystemError>
        do throws(SystemError) { made = .success(try TerminalService(directory: path)) } catch { made = .failure(error) }
        guard case let .success(service) = made else {
            if case let .failure(e) = made { errno = e.errno.rawValue }
            return nil
        }
        if let onEvent {
            service.observe { event in
                // Not after pb_service_close: the handle leaves the table first.
                guard unwrapService(handle) != nil else { return }
                event.json.withCString { onEvent(handle, $0, UnsafeMutableRawPointer(bitPattern: contextBits)) }
            }
        }
        return CService(service: service)
    }.map { handle in
        services[handle]?.service.start()
        return handle
    }
}

@_cdecl("pb_service_request")
public func pb_service_request(_ p: OpaquePointer?, _ request: UnsafePointer<CChar>?, _ reply: UnsafeMutablePointer<CChar>?, _ size: Int) -> Int32 {
    guard let s = unwrapService(p), let request, size >= 0 else { return invalid }
    let answer: String
    let code: Int32
    switch ControlRequest.decode(Array(String(cString: request).utf8)) {
    case let .failure(e):
        answer = StatusJSON.line(["ok": false, "code": Int(e.code), "error": e.message]).trimmingCharacters(in: .newlines)
        code = cCode(e.code)
    case let .success(r):
        let reply = s.service.reply(r)
        answer = reply.json
        code = cCode(reply.code)
    }
    if let reply, size > 0 {
        let bytes = Array(answer.utf8.prefix(size - 1))
        for (i, b) in bytes.enumerated() { reply[i] = CChar(bitPattern: b) }
        reply[bytes.count] = 0
    }
    return code
}

private let noSuchTerminal: Int32 = -8
private let badRequest: Int32 = -9

/// The control socket's codes as the header gives them (its -6 and -7 are PB_INVALID and
/// PB_OPEN_FAILED in C).
private func cCode(_ code: Int32) -> Int32 {
    switch code {
    case ControlReplyCode.noSuchTerminal: return noSuchTerminal
    case ControlReplyCode.badRequest: return badRequest
    default: return code
    }
}


private func serviceBridge(_ p: OpaquePointer?, _ terminal: UnsafePointer<CChar>?, _ bridge: UnsafePointer<CChar>?, add: Bool) -> Int32 {
    guard let s = unwrapService(p), let terminal, let bridge, let spec = BridgeSpec(parsing: String(cString: bridge)) else { return invalid }
    let name = String(cString: terminal)
    return cCode(s.service.reply(add ? .addBridge(terminal: name, spec) : .removeBridge(terminal: name, spec)).code)
}

@_cdecl("pb_service_add_bridge")
public func pb_service_add_bridge(_ p: OpaquePointer?, _ terminal: UnsafePointer<CChar>?, _ bridge: UnsafePointer<CChar>?) -> Int32 {
    serviceBridge(p, terminal, bridge, add: true)
}

@_cdecl("pb_service_remove_bridge")
public func pb_service_remove_bridge(_ p: OpaquePointer?, _ terminal: UnsafePointer<CChar>?, _ bridge: UnsafePointer<CChar>?) -> Int32 {
    serviceBridge(p, terminal, bridge, add: false)
}

@_cdecl("pb_service_close")
public func pb_service_close(_ p: OpaquePointer?) -> Int32 {
    guard let p, let live = unwrapService(p) else { return invalid }
    // From an event callback (the loop's thread) the wait below would wait for that very
    // thread: refused, nothing done.
    if live.service.loop.inLoop { return invalid }
    guard let s = services.remove(p) else { return invalid }
    // Every link closed (LCP Terminate-Request): the caller's thread waits, the loop's never
    // does (the loop answers `stop` on its own thread).
    let done = DispatchSemaphore(value: 0)
    let service = s.service
    Task.detached {
        await service.stop()
        done.signal()
    }
    done.wait()
    return 0
}
