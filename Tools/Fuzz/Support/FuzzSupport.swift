// What every fuzz target needs around its LLVMFuzzerTestOneInput: the libFuzzer driver when
// built with -sanitize=fuzzer (-DFUZZING), and a replayer of input files otherwise.
#if FUZZING
/// libFuzzer's driver (LLVM ≥ 11), called from the entry point SwiftPM links executables with.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

public func runFuzzer(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?,
                      _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, callback)
}
#else
import Foundation

/// Feeds each file named on the command line to `callback` (crash reproducers, seeds).
public func replay(_ callback: (UnsafePointer<UInt8>?, Int) -> CInt) {
    for path in CommandLine.arguments.dropFirst() {
        let bytes = [UInt8](FileManager.default.contents(atPath: path) ?? Data())
        _ = bytes.withUnsafeBufferPointer { callback($0.baseAddress, $0.count) }
        print("ok \(path)")
    }
}
#endif
