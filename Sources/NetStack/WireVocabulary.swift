// The stack speaks the wire's vocabulary (addresses, instants, header views, checksums, VJ):
// a program that imports the stack has it too.
@_exported import Wire
