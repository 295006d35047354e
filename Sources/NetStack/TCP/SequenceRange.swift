import Wire

/// A run of sequence space, `start` up to but not including `end`: a SACK block, a hole, the
/// bytes a run of held segments covers.
struct SequenceRange: Sendable, Equatable {
    var start: SequenceNumber
    var end: SequenceNumber
    var length: Int { end - start }

    /// Nothing, at sequence zero: a placeholder where a range must be held.
    static let empty = SequenceRange(start: SequenceNumber(0), end: SequenceNumber(0))
}
