import CSystem
import Glibc
import NetStack
import RemoteSerial

/// The line PPP runs on: a serial device or pty we attach to, or a pty we create for another
/// program. Owns its descriptors and closes them on every path.
public final class SerialLine {
    /// The descriptor PPP reads and writes (non-blocking).
    public let descriptor: FileDescriptor
    /// For a pty we created: the name other programs open.
    public let peerPath: String?
    /// For a pty we created: we hold the other side open until a program attaches, so the
    /// line does not read as hung up before that (see `peerAttached`).
    private var heldPeer: Int32 = -1
    /// The rate that paces the line, in bits per second: what a serial device was set to, or is
    /// at for a tty handed to us. nil for a pty, which moves bytes as fast as the other side
    /// reads whatever speed it is set to, and for a socket. The line's output queue is sized
    /// from it (`LineFlowControl.defaultLimit`).
    public let bitsPerSecond: Int?
    private var symlinkPath: String?
    private var closed = false
    /// For a line on the network (`tcp:HOST:PORT`, `rfc2217:HOST:PORT`): where it is.
    public let remote: RemoteLineAddress?
    /// For `rfc2217:`: the port's settings, sent once the server takes COM-PORT-OPTION.
    public let comPortSettings: ComPortSettings?

    public struct Options: Sendable, Equatable {
        public var speed = 115_200
        /// RTS/CTS hardware flow control (pppd's `crtscts`).
        public var hardwareFlowControl = false
        public init() {}
    }

    /// Opens a serial device or an existing pty in raw mode, or connects to a serial line on
    /// the network when `path` is `tcp:HOST:PORT` or `rfc2217:HOST:PORT` (see `NetworkLine`).
    public convenience init(device path: String, options: Options = Options()) throws(SystemError) {
        if RemoteLineAddress.isNetworkName(path) {
            switch RemoteLineAddress.parse(path) {
            case let .success(address): try self.init(network: address, options: options)
            case let .failure(e): throw SystemError("\(PeerText.escaped(path)): \(e)", errno: .invalidArgument)
            }
        } else {
            try self.init(opening: path, options: options)
        }
    }

    private init(opening path: String, options: Options) throws(SystemError) {
        let fd = retryingOnInterrupt { open(path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC) }
        guard fd >= 0 else { throw SystemError("open \(path)") }
        do {
            try SerialLine.makeRaw(fd, options: options, name: path)
        } catch {
            Glibc.close(fd)
            throw error
        }
        descriptor = FileDescriptor(fd)
        peerPath = nil
        bitsPerSecond = SerialLine.pacingSpeed(fd)
        remote = nil
        comPortSettings = nil
    }

    /// Takes over a descriptor another program opened (a socket, a tty): made non-blocking,
    /// left in the mode it is in, closed with the line.
    public init(descriptor fd: FileDescriptor) throws(SystemError) {
        let flags = fcntl(fd.rawValue, F_GETFL)
        guard flags >= 0, fcntl(fd.rawValue, F_SETFL, flags | O_NONBLOCK) == 0 else { throw SystemError("fcntl descriptor \(fd.rawValue)") }
        _ = fcntl(fd.rawValue, F_SETFD, FD_CLOEXEC)
        descriptor = fd
        peerPath = nil
        bitsPerSecond = SerialLine.pacingSpeed(fd.rawValue)
        remote = nil
        comPortSettings = nil
    }

    /// Creates a pty; the caller prints `peerPath` (and `link`, when given, is made a symlink to it).
    public init(ptyLinkedAt link: String? = nil, options: Options = Options()) throws(SystemError) {
        let master = posix_openpt(O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC)
        guard master >= 0 else { throw SystemError("posix_openpt") }
        var slave: Int32 = -1
        var name = ""
        do throws(SystemError) {
            guard grantpt(master) == 0 else { throw SystemError("grantpt") }
            guard unlockpt(master) == 0 else { throw SystemError("unlockpt") }
            var buffer = [CChar](repeating: 0, count: 128)
            guard ptsname_r(master, &buffer, buffer.count) == 0 else { throw SystemError("ptsname_r") }
            name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            slave = retryingOnInterrupt { open(name, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC) }
            guard slave >= 0 else { throw SystemError("open \(name)") }
            // The line discipline lives on the slave side: make it raw for whoever attaches.
            try SerialLine.makeRaw(slave, options: options, name: name)
            if let link {
                unlink(link)
                guard symlink(name, link) == 0 else { throw SystemError("symlink \(link)") }
                symlinkPath = link
            }
        } catch {
            if slave >= 0 { Glibc.close(slave) }
            Glibc.close(master)
            throw error
        }
        descriptor = FileDescriptor(master)
        heldPeer = slave
        peerPath = name
        bitsPerSecond = nil
        remote = nil
        comPortSettings = nil
    }

    /// A line on the network: a non-blocking connection under way (see `NetworkLine`).
    init(connected fd: FileDescriptor, remote: RemoteLineAddress, comPort: ComPortSettings?, bitsPerSecond: Int) {
        descriptor = fd
        peerPath = nil
        self.bitsPerSecond = bitsPerSecond
        self.remote = remote
        comPortSettings = comPort
    }

    static func makeRaw(_ fd: Int32, options: Options, name: String) throws(SystemError) {
        var t = termios()
        guard tcgetattr(fd, &t) == 0 else { throw SystemError("tcgetattr \(name)") }
        cfmakeraw(&t)
        t.c_cflag |= tcflag_t(CLOCAL | CREAD)
        if options.hardwareFlowControl { t.c_cflag |= tcflag_t(CRTSCTS) } else { t.c_cflag &= ~tcflag_t(CRTSCTS) }
        // VMIN 1, VTIME 0: a read returns as soon as a byte is there.
        withUnsafeMutableBytes(of: &t.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        guard let speed = SerialLine.speedConstant(options.speed) else {
            throw SystemError("speed \(options.speed) is not a standard rate", errno: Errno(EINVAL))
        }
        cfsetispeed(&t, speed)
        cfsetospeed(&t, speed)
        guard tcsetattr(fd, TCSANOW, &t) == 0 else { throw SystemError("tcsetattr \(name)") }
    }

    private static let rates: [Int: Int32] = [
        1200: B1200, 2400: B2400, 4800: B4800, 9600: B9600, 19200: B19200, 38400: B38400, 57600: B57600,
        115_200: B115200, 230_400: B230400, 460_800: B460800, 500_000: B500000, 576_000: B576000,
        921_600: B921600, 1_000_000: B1000000, 1_152_000: B1152000, 1_500_000: B1500000,
        2_000_000: B2000000, 3_000_000: B3000000, 4_000_000: B4000000,
    ]

    static func speedConstant(_ rate: Int) -> speed_t? {
        rates[rate].map { speed_t($0) }
    }

    /// The output speed of a tty that is not a pseudo-terminal; nil for anything else.
    static func pacingSpeed(_ fd: Int32) -> Int? {
        guard isatty(fd) == 1, !isPseudoTerminal(fd) else { return nil }
        var t = termios()
        guard tcgetattr(fd, &t) == 0 else { return nil }
        let constant = cfgetospeed(&t)
        return rates.first { speed_t($0.value) == constant }?.key
    }

    /// By device number (the kernel's devices.txt): 2 and 3 are the old BSD pty masters and
    /// slaves, 5:2 is /dev/ptmx (every Unix98 master), 136–143 the Unix98 slaves (/dev/pts).
    static func isPseudoTerminal(_ fd: Int32) -> Bool {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return false }
        let device = UInt64(st.st_rdev)
        let major = (device >> 8) & 0xFFF | (device >> 32) & ~0xFFF
        let minor = device & 0xFF | (device >> 12) & ~0xFF
        return major == 2 || major == 3 || (major == 5 && minor == 2) || (136...143).contains(major)
    }

    /// For a pty we created: the other side has a program on it (it sent us bytes), so we let
    /// go of our own hold; when that program goes, reads then fail and the line is down.
    public func peerAttached() {
        guard heldPeer >= 0 else { return }
        Glibc.close(heldPeer)
        heldPeer = -1
    }

    /// Closes the line (and removes the symlink we made). Idempotent; also done on deinit.
    public func close() {
        guard !closed else { return }
        closed = true
        descriptor.close()
        if heldPeer >= 0 { Glibc.close(heldPeer) }
        heldPeer = -1
        // Only our own link: another line may have taken the name over since.
        if let symlinkPath, let peerPath {
            var target = [CChar](repeating: 0, count: 256)
            let n = readlink(symlinkPath, &target, target.count - 1)
            if n > 0, String(decoding: target[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) == peerPath { unlink(symlinkPath) }
        }
    }

    deinit { close() }
}
