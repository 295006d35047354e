/// Runs `body` on `value` where it lies. The channel's objects hold the protocol cores (the
/// stack, the link) as structs in their stored properties, and calling a getter on one there
/// copies the whole struct first (a retain and a release for every buffer it holds), on every
/// turn of the loop. Through an `inout` access the getter reads it in place.
@inline(__always)
func inPlace<T, R>(_ value: inout T, _ body: (inout T) -> R) -> R {
    body(&value)
}
