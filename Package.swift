// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "pppbridge",
    products: [
        // What terminal-proxy programs link: no simulator or test double in it.
        .library(name: "PPPBridge", targets: ["Framing", "Wire", "PPP", "NetStack", "RemoteSerial", "Capture", "Replay", "Crypto", "Payment", "Proxy", "Channel", "PaymentKit", "Service"]),
        // The channel for C and every language that calls C (Sources/PPPBridgeC/include/pppbridge.h).
        .library(name: "PPPBridgeC", type: .dynamic, targets: ["PPPBridgeC"]),
        .executable(name: "pppbridge", targets: ["pppbridge"]),
        .executable(name: "pppbridge-bench", targets: ["PPPBridgeBench"]),
        // libFuzzer targets (Tools/fuzz.sh builds them with -sanitize=fuzzer,address); built
        // plainly they replay the files they are given.
        .executable(name: "pppbridge-fuzz-stream", targets: ["FuzzStreamDecoder"]),
        .executable(name: "pppbridge-fuzz-packets", targets: ["FuzzPacketParsers"]),
        .executable(name: "pppbridge-fuzz-stack", targets: ["FuzzIPStack"]),
        .executable(name: "pppbridge-fuzz-messages", targets: ["FuzzPaymentMessages"]),
        .executable(name: "pppbridge-fuzz-link", targets: ["FuzzLink"]),
        .executable(name: "pppbridge-fuzz-channel", targets: ["FuzzChannel"]),
        .executable(name: "pppbridge-fuzz-session", targets: ["FuzzReaderSession"]),
        .executable(name: "pppbridge-fuzz-remote", targets: ["FuzzRemoteSerial"]),
        .executable(name: "pppbridge-fuzz-replay", targets: ["FuzzReplay"]),
    ],
    targets: [
        // System libraries from Debian (libpcap-dev, libssl-dev).
        .systemLibrary(name: "CPcap", pkgConfig: "libpcap", providers: [.apt(["libpcap-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSystem"),

        // Sans-IO protocol cores.
        // Carry-less multiplication for the FCS of long frames (x86-64 PCLMULQDQ, checked at run time).
        .target(name: "CCarrylessMultiply"),
        // Sixteen bytes tested against the framing's special bytes with one vector mask (SSE2).
        .target(name: "CVectorScan"),
        .target(name: "Framing", dependencies: ["CCarrylessMultiply", "CVectorScan"]),
        .target(name: "PPP", dependencies: ["Framing", "Wire", "Crypto"]),
        .target(name: "Wire"),
        .target(name: "NetStack", dependencies: ["Wire"]),
        // Telnet with COM-PORT-OPTION (RFC 854, RFC 2217): a serial line on a device server.
        .target(name: "RemoteSerial"),

        // Captures in and out (libpcap, pppd record files) and their one-line descriptions.
        .target(name: "Capture", dependencies: ["CPcap", "Framing", "PPP", "Wire"]),
        .target(name: "Crypto", dependencies: ["COpenSSL"]),
        // A captured session played against our link and stack on virtual time.
        .target(name: "Replay", dependencies: ["Capture", "Framing", "PPP", "NetStack", "Wire"]),

        // The payment layer's sans-IO core: DUKPT, PIN blocks, TR-31, the reader protocol's
        // framing and messages, the host's reader session.
        .target(name: "Payment", dependencies: ["Crypto", "Wire"]),

        // The only layer that touches the OS: lines, the event loop, signals, captures.
        // The proxy's and the DNS relay's sans-IO logic: the SOCKS handshake parser and policy
        // replies, the relay's book of queries. Channel owns their sockets.
        .target(name: "Proxy", dependencies: ["NetStack"]),
        .target(name: "Channel", dependencies: ["CSystem", "Framing", "PPP", "NetStack", "Proxy", "RemoteSerial", "Capture", "Crypto"]),

        // The host SDK: discovery, the reader's link through the channel, the gateway client.
        .target(name: "PaymentKit", dependencies: ["Payment", "Channel", "NetStack", "PPP", "Crypto"]),

        // The C API: ICPPP's calls as C functions over `Channel`.
        .target(name: "PPPBridgeC", dependencies: ["Channel", "NetStack", "Service"], exclude: ["include"]),

        // Many terminals from a configuration directory: the supervisor, the control protocol,
        // metrics and the service manager's notifications; what `serve` runs and the C API's
        // pb_service_* calls open.
        .target(name: "Service", dependencies: ["CSystem", "Channel", "NetStack", "PPP", "Framing", "RemoteSerial", "Capture", "Crypto"]),

        // Every simulator and test double, outside the product: a terminal on a pty (Line),
        // the payment terminal's and gateway's cores (Terminal, Gateway) and their servers
        // (TerminalServer), many terminals in one process (Farm, `pppbridge simulate`).
        .target(name: "Simulation", dependencies: ["Channel", "NetStack", "PPP", "Payment", "PaymentKit", "Crypto", "Wire"]),

        // The command-line tool: its commands live in a library so tests can drive them.
        .target(name: "PPPBridgeCLI", dependencies: ["Framing", "PPP", "NetStack", "RemoteSerial", "Capture", "Replay", "Channel", "Crypto", "Payment", "PaymentKit", "Service", "Simulation"]),
        .executableTarget(name: "pppbridge", dependencies: ["PPPBridgeCLI"]),

        // Benchmarks against a plain C implementation of RFC 1662's byte loop.
        .target(
            name: "CFramingBaseline",
            path: "Tools/CFramingBaseline",
            cSettings: [.unsafeFlags(["-O2"])]
        ),
        // Counts the process's heap allocations per thread (the bench's allocations per MB).
        .target(name: "CAllocationCounter", path: "Tools/CAllocationCounter", cSettings: [.unsafeFlags(["-O2"])]),
        .executableTarget(
            name: "PPPBridgeBench",
            dependencies: ["Framing", "CFramingBaseline", "CAllocationCounter", "Channel", "NetStack", "CSystem", "Simulation"],
            path: "Tools/Bench"
        ),

        .target(name: "FuzzSupport", dependencies: ["NetStack", "Proxy"], path: "Tools/Fuzz/Support"),
        .executableTarget(name: "FuzzIPStack", dependencies: ["NetStack", "FuzzSupport"], path: "Tools/Fuzz/IPStack"),
        .executableTarget(name: "FuzzPaymentMessages", dependencies: ["Payment", "FuzzSupport"], path: "Tools/Fuzz/PaymentMessages"),
        .executableTarget(name: "FuzzLink", dependencies: ["Framing", "PPP", "NetStack", "FuzzSupport"], path: "Tools/Fuzz/Link"),
        .executableTarget(name: "FuzzReaderSession", dependencies: ["Payment", "NetStack", "FuzzSupport"], path: "Tools/Fuzz/ReaderSession"),
        .executableTarget(name: "FuzzChannel", dependencies: ["Channel", "NetStack", "Proxy", "FuzzSupport"], path: "Tools/Fuzz/Channel"),
        .executableTarget(name: "FuzzStreamDecoder", dependencies: ["Framing", "FuzzSupport"], path: "Tools/Fuzz/StreamDecoder"),
        .executableTarget(name: "FuzzRemoteSerial", dependencies: ["RemoteSerial", "FuzzSupport"], path: "Tools/Fuzz/RemoteSerial"),
        .executableTarget(name: "FuzzReplay", dependencies: ["Replay", "Capture", "Framing", "FuzzSupport"], path: "Tools/Fuzz/Replay"),
        .executableTarget(
            name: "FuzzPacketParsers",
            dependencies: ["Framing", "PPP", "NetStack", "Proxy", "Capture", "FuzzSupport"],
            path: "Tools/Fuzz/PacketParsers"
        ),

        .testTarget(name: "FramingTests", dependencies: ["Framing", "CCarrylessMultiply", "CVectorScan", "NetStack"]),
        .testTarget(name: "PPPTests", dependencies: ["PPP", "Framing", "NetStack"]),
        .testTarget(name: "NetStackTests", dependencies: ["NetStack"]),
        .testTarget(name: "ProxyTests", dependencies: ["Proxy", "NetStack"]),
        .testTarget(name: "RemoteSerialTests", dependencies: ["RemoteSerial", "NetStack"]),
        .testTarget(name: "SimulationTests", dependencies: ["PPP", "NetStack", "Framing", "Crypto"]),
        .testTarget(name: "ReplayTests", dependencies: ["Replay", "Capture", "Framing", "PPP", "Wire", "TestSupport"],
                    exclude: ["ReplayManifest.txt", "Fixtures"]),
        .testTarget(name: "CaptureTests", dependencies: ["Capture", "Framing", "PPP", "NetStack", "Crypto", "TestSupport"]),
        // Host-side helpers (loopback servers and clients) shared by the channel's tests.
        .target(name: "TestSupport", path: "Tests/TestSupport"),
        .target(name: "ChannelTestSupport", dependencies: ["Channel", "NetStack", "Crypto"], path: "Tests/ChannelTestSupport"),
        .testTarget(name: "ChannelTests", dependencies: ["Channel", "CSystem", "NetStack", "Proxy", "PPP", "Crypto", "Simulation", "ChannelTestSupport", "TestSupport"]),
        .testTarget(name: "PaymentTests", dependencies: ["Payment", "PaymentKit", "Simulation", "Crypto", "NetStack", "TestSupport"]),
        // The payment layer end to end: terminal simulator on a pty, our PPP link and stack, the
        // channel's bridge and SOCKS proxy, the gateway server, the host SDK.
        .testTarget(name: "PaymentFlowTests", dependencies: ["PaymentKit", "Payment", "Simulation", "Channel", "NetStack", "Crypto", "ChannelTestSupport", "TestSupport"]),
        .testTarget(name: "CLITests", dependencies: ["PPPBridgeCLI", "Service", "Capture", "Channel", "Payment", "Simulation", "ChannelTestSupport", "TestSupport"]),
        // Real peers: Debian's pppd in a QEMU VM (Tools/vmpeer) against the built `pppbridge`.
        .testTarget(name: "InteropTests", dependencies: ["pppbridge", "Crypto", "Channel", "NetStack", "Simulation", "ChannelTestSupport", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
