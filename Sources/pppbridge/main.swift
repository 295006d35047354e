import Foundation
import PPPBridgeCLI

let tool = CommandLineTool(
    // Flushed line by line: a program reading our output through a pipe sees events as they happen.
    standardOutput: { FileHandle.standardOutput.write(Data(($0 + "\n").utf8)) },
    standardError: { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }
)
exit(tool.run(Array(CommandLine.arguments.dropFirst())))
