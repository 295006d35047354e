import Foundation
import Framing

/// A PPP frame read from a capture, numbered as tshark numbers the capture's records.
public struct TraceFrame: Sendable, Equatable {
    /// The record (pcap) or frame (pppd record file) number, from 1.
    public var number: Int
    public var time: CaptureTime
    public var direction: Direction?
    public var via: [String]
    public var frame: PPPFrame
    /// The carrier's word on who sent it (`CarriedFrame.sender`), where there is no direction.
    public var sender: String? = nil
}

/// A capture that is not PPP frame by frame: PPPoE discovery and the like.
public struct TraceNote: Sendable, Equatable {
    public var number: Int
    public var time: CaptureTime
    public var text: String
}

/// Everything read from one capture file.
public struct Trace: Sendable {
    public enum Format: Sendable, Equatable {
        case pcap(linkType: Int32)
        case pppdRecord
    }

    public var format: Format
    public var frames: [TraceFrame] = []
    public var notes: [TraceNote] = []
    /// Records that carried nothing PPP (ARP, other IP traffic, ...).
    public var recordsWithoutPPP = 0
    public var records = 0
    /// When the first record was taken: the origin of relative times.
    public var origin = CaptureTime(seconds: 0, microseconds: 0)
    /// PPP headers or tunnel headers that could not be read.
    public var problems: [String] = []
    /// For pppd record files: the de-framing counters of each direction.
    public var sentCounters = DecoderCounters()
    public var receivedCounters = DecoderCounters()
    /// Records whose time stamp was out of range (microseconds outside 0–999 999), read as
    /// normalised (see `CaptureTime.normalised`).
    public var recordsWithAdjustedTime = 0
    /// A pppd record file that ended inside an entry.
    public var truncatedAt: Int?

    /// Reads a pcap (via libpcap) or pppd record file, told apart by their first bytes.
    /// - Parameters:
    ///   - maximumBytes: a larger file is refused before it is read.
    ///   - maximumFrames: more PPP frames than this is an error (records and frames are counted
    ///     as they are read, so memory stays bounded by the limits, not by the file).
    public init(path: String, maximumBytes: Int = .max, maximumFrames: Int = .max) throws(CaptureError) {
        if maximumBytes < .max {
            let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue
            if let size, size > maximumBytes {
                throw CaptureError("\(path): \(size) bytes, more than the \(maximumBytes) read at most")
            }
        }
        // Read at most one byte past the limit, whatever the path is (a FIFO or a device has
        // no size to check first).
        let handle = FileHandle(forReadingAtPath: path)
        defer { try? handle?.close() }
        guard let handle, let data = maximumBytes < .max ? try? handle.read(upToCount: maximumBytes + 1) ?? Data() : try? handle.readToEnd() ?? Data() else {
            throw CaptureError("\(path): cannot read the file")
        }
        guard data.count <= maximumBytes else {
            throw CaptureError("\(path): more than the \(maximumBytes) bytes read at most")
        }
        let bytes = [UInt8](data)
        if PcapReader.looksLikePcap(bytes) {
            let reader = try PcapReader(path: path, maximumRecords: maximumFrames)
            guard LinkType(rawValue: reader.linkType) != nil else {
                let known = LinkType.allCases.map { "\($0.rawValue) (\($0.name))" }.joined(separator: ", ")
                throw CaptureError("\(path): link type \(reader.linkType) carries no PPP we read (known: \(known))")
            }
            self.init(pcap: reader)
        } else if PPPDRecord.looksLikeRecord(bytes) {
            // A line's reads can be a byte each: a frame may take many entries.
            let entries = maximumFrames < .max / 8 ? maximumFrames * 8 : .max
            let record: PPPDRecord
            do {
                record = try PPPDRecord(bytes: bytes, maximumEntries: entries)
            } catch {
                throw CaptureError("\(path): \(error.message)")
            }
            self.init(record: record, maximumFrames: maximumFrames)
        } else {
            throw CaptureError("\(path): neither a pcap file nor a pppd record file")
        }
        // A record can carry several frames (tunnels, a serial line's read): counted once read.
        guard frames.count <= maximumFrames else {
            throw CaptureError("\(path): more than \(maximumFrames) PPP frames")
        }
    }

    public init(pcap reader: PcapReader) {
        format = .pcap(linkType: reader.linkType)
        origin = reader.records.first?.time ?? origin
        for (index, record) in reader.records.enumerated() {
            records += 1
            if record.timeAdjusted { recordsWithAdjustedTime += 1 }
            let contents = Encapsulation.contents(linkType: reader.linkType, record: record.data)
            for carried in contents.frames {
                frames.append(TraceFrame(number: index + 1, time: record.time, direction: carried.direction,
                                         via: carried.via, frame: carried.frame, sender: carried.sender))
            }
            for note in contents.notes { notes.append(TraceNote(number: index + 1, time: record.time, text: note)) }
            problems += contents.problems.map { "#\(index + 1): \($0)" }
            if contents.frames.isEmpty && contents.notes.isEmpty && contents.problems.isEmpty { recordsWithoutPPP += 1 }
        }
    }

    /// De-frames both directions of a pppd record file with our stream decoder. The decoders
    /// keep every byte (receive ACCM 0) and accept any length, as pppdump does: a trace shows
    /// what was on the line, not what one side's settings would have let through.
    public init(record: PPPDRecord, maximumFrames: Int = .max) {
        format = .pppdRecord
        truncatedAt = record.truncatedAt
        origin = CaptureTime(seconds: record.startTime, microseconds: 0)
        var sent = HDLCDecoder(fcs: .fcs16, mru: 65535, receiveACCM: 0)
        var received = HDLCDecoder(fcs: .fcs16, mru: 65535, receiveACCM: 0)
        for event in record.events {
            guard case let .data(direction, bytes, tenths) = event else { continue }
            records += 1
            let time = CaptureTime(tenthsOfSeconds: tenths, since: record.startTime)
            var decoded: [PPPFrame] = []
            if direction == .sent { decoded = sent.decode(bytes) } else { decoded = received.decode(bytes) }
            for f in decoded {
                frames.append(TraceFrame(number: frames.count + 1, time: time, direction: direction, via: [], frame: f))
            }
            // One more than the limit says it was passed; the caller reports it.
            if frames.count > maximumFrames { break }
        }
        sentCounters = sent.counters
        receivedCounters = received.counters
        for (name, decoder) in [("sent", sent), ("received", received)] where decoder.isInsideFrame {
            problems.append("the \(name) data ends inside a frame that no flag closed")
        }
    }
}
