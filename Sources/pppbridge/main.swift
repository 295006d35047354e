import Foundation
import PPPBridgeCLI

let tool = CommandLineTool(
    standardOutput: { print($0) },
    standardError: { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }
)
exit(tool.run(Array(CommandLine.arguments.dropFirst())))
