/// Values keyed by file descriptor, in an array indexed by the descriptor's number: the kernel
/// hands out the lowest free numbers, so the array stays about as long as the most descriptors
/// open at once, and a lookup (one per event, on every loop turn) is an index, not a hash.
struct DescriptorTable<Value> {
    private var slots: [Value?] = []
    private(set) var count = 0

    subscript(fd: FileDescriptor) -> Value? {
        get {
            let i = Int(fd.rawValue)
            return i >= 0 && i < slots.count ? slots[i] : nil
        }
        set {
            let i = Int(fd.rawValue)
            guard i >= 0 else { return }
            if i >= slots.count {
                guard newValue != nil else { return }
                slots.append(contentsOf: repeatElement(nil, count: i + 1 - slots.count))
            }
            if slots[i] == nil && newValue != nil { count += 1 }
            if slots[i] != nil && newValue == nil { count -= 1 }
            slots[i] = newValue
        }
    }

    /// Removes the value for `fd` and returns it (nil when there was none).
    @discardableResult
    mutating func removeValue(forKey fd: FileDescriptor) -> Value? {
        let old = self[fd]
        if old != nil { self[fd] = nil }
        return old
    }

    /// Changes the value for `fd` in place, when there is one.
    mutating func modify(_ fd: FileDescriptor, _ body: (inout Value) -> Void) {
        let i = Int(fd.rawValue)
        guard i >= 0, i < slots.count, slots[i] != nil else { return }
        body(&slots[i]!)
    }
}
