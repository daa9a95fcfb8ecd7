import CMoESwift

/// One weight matrix on the device in the format it was given in — never widened: its
/// codes (or dense values), scales and biases, each the caller's bytes copied once or,
/// for a mapped tensor, read in place from the mapping wrapped without a copy and bound
/// at the part's offset; and the `moe_weight_desc` that tells a kernel how to read a row
/// (Metal/moe_formats.h).
struct MetalWeight {
    /// A buffer and the offset of the part in it (`setBuffer(_:offset:index:)`).
    struct Part {
        let buffer: any MTLBuffer
        let offset: Int
    }

    let codes: Part
    let scales: Part?
    let biases: Part?
    /// A per-expert tensor's table (moe_expert_parts, one entry per expert: where its
    /// tensor lies in the three buffers); nil for a stacked one.
    let experts: (any MTLBuffer)?
    let format: WeightFormat
    var desc: moe_weight_desc

    /// The alignment a part must have at its offset for the kernels' loads: float4 rows of
    /// float32, 8-byte vectors of half / bfloat / packed codes, scalar scales and biases.
    static func alignment(_ format: WeightFormat, part: Int) -> Int {
        switch (format, part) {
        case (.dense(.float32), 0): return 16
        case (_, 0): return 8
        case (.quantized(.mxfp4, _), _): return 1
        case (.quantized(_, let scaleType), _): return scaleType.size
        default: return 16
        }
    }

    /// The parts of `data` read in place from its mapping (true) or copied (false).
    static func inPlace(_ data: WeightData) -> [Bool] {
        let parts = data.parts
        guard let memory = data.memory else { return parts.map { _ in false } }
        return parts.enumerated().map { i, bytes in
            bytes.baseAddress.map { memory.offset(of: $0) % alignment(data.format, part: i) == 0 } ?? false
        }
    }

    /// The experts of a per-expert tensor grouped by the memory (file) each lies in, in the
    /// order of first appearance: the spans its table refers to.
    static func spans(_ list: [WeightData]) -> [[WeightData]] {
        var groups: [(memory: WeightMemory?, tensors: [WeightData])] = []
        for tensor in list {
            if let g = groups.firstIndex(where: { $0.memory === tensor.memory }) {
                groups[g].tensors.append(tensor)
            } else {
                groups.append((tensor.memory, [tensor]))
            }
        }
        return groups.map(\.tensors)
    }

    /// Whether the kernels read a per-expert tensor where it lies, through its table: every
    /// expert's tensor mapped, at offsets the kernels can read, from at most three memories
    /// (the three buffers a matrix binds: a projection may straddle a checkpoint's shards),
    /// each memory's part within a span one buffer can wrap. Otherwise the backend stacks a
    /// copy (WeightData.stacked).
    static func readsExpertsInPlace(_ data: WeightData, maxBufferLength: Int) -> Bool {
        guard case .experts(let list) = data, !list.isEmpty else { return false }
        let groups = spans(list)
        guard groups.count <= 3 else { return false }
        for group in groups {
            guard let memory = group[0].memory, group.allSatisfy({ inPlace($0).allSatisfy { $0 } }) else { return false }
            let (start, end) = MetalMappings.span(of: group, in: memory)
            guard end - start <= maxBufferLength else { return false }
        }
        return true
    }

    /// Bytes that making this weight allocates: the copied parts (device buffers), a
    /// per-expert tensor's table, or the stacked copy of one the kernels cannot read in place.
    static func copiedBytes(_ data: WeightData, maxBufferLength: Int = .max) -> Int {
        if case .array(let a) = data { return MetalContext.bufferLength(a.count * MemoryLayout<Float>.stride) }
        if case .experts(let list) = data {
            if readsExpertsInPlace(data, maxBufferLength: maxBufferLength) {
                return MetalContext.bufferLength(list.count * MemoryLayout<moe_expert_parts>.stride)
            }
            return list.reduce(0) { $0 + $1.parts.reduce(0) { $0 + $1.count } }
        }
        return zip(data.parts, inPlace(data)).reduce(0) { $0 + ($1.1 ? 0 : MetalContext.bufferLength($1.0.count)) }
    }

    /// Uploads `data`, a tensor of experts of `rowsPerExpert` rows of `cols` elements each
    /// (any value for a single matrix), or binds it in place where it is mapped (`mappings`
    /// wraps each memory once per layer).
    init(_ data: WeightData, rowsPerExpert: Int, cols: Int, context: MetalContext, mappings: MetalMappings,
         what: String) throws {
        if case .experts(let list) = data {
            try self.init(experts: list, rowsPerExpert: rowsPerExpert, cols: cols, context: context, mappings: mappings,
                          what: what)
        } else {
            try self.init(stacked: data, rowsPerExpert: rowsPerExpert, cols: cols, context: context, mappings: mappings,
                          what: what)
        }
    }

    /// A tensor in one piece (every case but `.experts`).
    private init(stacked data: WeightData, rowsPerExpert: Int, cols: Int, context: MetalContext, mappings: MetalMappings,
                 what: String) throws {
        experts = nil
        let names = ["", " (scales)", " (biases)"]
        let quantized: Bool
        if case .quantized = data.format { quantized = true } else { quantized = false }
        let inPlace = Self.inPlace(data)
        let parts = try data.parts.enumerated().map { i, bytes -> Part in
            let part = what + (quantized && i == 0 ? " (codes)" : names[i])
            if inPlace[i], let memory = data.memory, bytes.baseAddress != nil {
                return try mappings.part(bytes, of: memory, context: context, what: part)
            }
            let buffer = try context.makeBuffer(bytes: bytes.count, what: part)
            if let base = bytes.baseAddress { buffer.contents().copyMemory(from: base, byteCount: bytes.count) }
            return Part(buffer: buffer, offset: 0)
        }
        if case .array(let a) = data {
            codes = try a.withUnsafeBytes { raw in
                let buffer = try context.makeBuffer(bytes: raw.count, what: what)
                if let base = raw.baseAddress { buffer.contents().copyMemory(from: base, byteCount: raw.count) }
                return Part(buffer: buffer, offset: 0)
            }
        } else {
            codes = parts[0]
        }
        scales = parts.count > 1 ? parts[1] : nil
        biases = parts.count > 2 ? parts[2] : nil
        format = data.format
        desc = Self.describe(format, rowsPerExpert: rowsPerExpert, cols: cols)
    }

    /// A per-expert tensor the kernels read where it lies (readsExpertsInPlace): the one
    /// buffer of its planned span bound for codes, scales and biases, and the table of each
    /// expert's offsets in it.
    private init(experts list: [WeightData], rowsPerExpert: Int, cols: Int, context: MetalContext,
                 mappings: MetalMappings, what: String) throws {
        let groups = Self.spans(list)
        let wrapped = try groups.map { try mappings.span(of: $0, context: context, what: what) }
        let table = try context.makeBuffer(bytes: list.count * MemoryLayout<moe_expert_parts>.stride,
                                           what: "\(what) (per-expert table)")
        let entries = table.contents().bindMemory(to: moe_expert_parts.self, capacity: list.count)
        for (e, tensor) in list.enumerated() {
            let span = groups.firstIndex { $0[0].memory === tensor.memory }!
            let (memory, start) = (tensor.memory!, wrapped[span].1)
            let offsets = tensor.parts.map { UInt64(memory.offset(of: $0.baseAddress!) - start) }
            func split(_ k: Int) -> (UInt32, UInt32) {
                k < offsets.count ? (UInt32(truncatingIfNeeded: offsets[k]), UInt32(truncatingIfNeeded: offsets[k] >> 32)) : (0, 0)
            }
            var entry = moe_expert_parts()
            (entry.codes_lo, entry.codes_hi) = split(0)
            (entry.scales_lo, entry.scales_hi) = split(1)
            (entry.biases_lo, entry.biases_hi) = split(2)
            entry.span = UInt32(span)
            entries[e] = entry
        }
        // Span k is bound as the codes (0), scales (1) or biases (2) buffer; the kernels read
        // all three parts of an expert from its span (moe_row).
        let bound = wrapped.map { Part(buffer: $0.0, offset: 0) }
        codes = bound[0]
        scales = bound.count > 1 ? bound[1] : bound[0]
        biases = bound.count > 2 ? bound[2] : bound[0]
        experts = table
        format = list[0].format
        desc = Self.describe(format, rowsPerExpert: rowsPerExpert, cols: cols)
        desc.per_expert = 1
    }

    /// The `moe_weight_desc` of a tensor of `format` (stacked).
    private static func describe(_ format: WeightFormat, rowsPerExpert: Int, cols: Int) -> moe_weight_desc {
        var desc = moe_weight_desc()
        desc.rows_per_expert = UInt32(rowsPerExpert)
        desc.format = format.code.rawValue
        switch format {
        case .dense(let t):
            desc.bits = UInt32(8 * t.size)
        case .quantized(.ggml, _):
            // The loader knows its blocks' layout; the row length in bytes is all it needs.
            desc.row_bytes = UInt32(format.rowBytes(cols: cols))
        case .quantized(let q, let scaleType):
            desc.bits = UInt32(q.bits)
            desc.group_shift = UInt32(q.groupSize.trailingZeroBitCount)
            desc.scale_type = UInt32(scaleType.rawValue)
        }
        return desc
    }

    /// The same buffers, read from row `rowOffset` of each expert (the up half of a fused
    /// gate_up tensor).
    func offset(by rowOffset: Int) -> MetalWeight {
        var w = self
        w.desc.row_offset = UInt32(rowOffset)
        return w
    }

    /// The host-name suffix of the kernel instances that read this format: its row of
    /// MOE_SPECIALISATION_ROWS (moe_options.h).
    var kernelSuffix: String {
        String(cString: moe_specialisation_suffix(moe_specialisation_of(Int32(desc.format), Int32(format.bits))))
    }

    /// The suffix of kernels that read gate and up with one loader: theirs if they agree
    /// (group size and scale type are per dispatch, so need not), else `any`.
    static func kernelSuffix(gate: MetalWeight, up: MetalWeight) -> String {
        gate.kernelSuffix == up.kernelSuffix ? gate.kernelSuffix : "any"
    }
}

/// The bytesNoCopy buffers through which one layer reads its mapped weights in place. Per
/// memory (a mapped file), only the page span of this layer's own tensors is wrapped, never
/// the whole file — a 48-layer file would otherwise be wrapped whole 48 times — in pieces no
/// longer than the device's maxBufferLength (Apple guarantees 256 MB; Apple silicon Macs
/// give about half of their memory), each holding whole tensors, as llama.cpp maps a model
/// file in views within that limit. Each buffer holds its memory alive (its deallocator
/// keeps a reference).
final class MetalMappings {
    /// A page-aligned byte range of a memory, wrapped once when a part first needs it.
    private final class Piece {
        let start: Int, end: Int
        var buffer: (any MTLBuffer)?
        init(start: Int, end: Int) { (self.start, self.end) = (start, end) }
    }
    private var pieces: [ObjectIdentifier: [Piece]] = [:]
    /// Per-expert tensors read through a table: each the one piece of its whole span.
    private var spans: [ObjectIdentifier: [Piece]] = [:]
    /// Ranges closer than this share a piece: a few norm or attention tensors between two of
    /// the layer's cost less as address space than as one more buffer.
    static let mergeGap = 2 << 20

    /// Plans the pieces of every part of `weights` that is read in place (MetalWeight.inPlace).
    init(_ weights: [WeightData], maxBufferLength: Int) {
        let page = WeightMemory.pageSize
        let limit = Swift.max(page, maxBufferLength / page * page)
        var ranges: [ObjectIdentifier: [(start: Int, end: Int)]] = [:]
        for data in weights {
            if case .experts(let list) = data {
                for group in MetalWeight.spans(list) {
                    guard let memory = group[0].memory else { continue }
                    let (start, end) = Self.span(of: group, in: memory)
                    spans[ObjectIdentifier(memory), default: []].append(Piece(start: start, end: end))
                }
                continue
            }
            guard let memory = data.memory else { continue }
            for (bytes, inPlace) in zip(data.parts, MetalWeight.inPlace(data)) where inPlace {
                guard let base = bytes.baseAddress else { continue }
                let offset = memory.offset(of: base)
                ranges[ObjectIdentifier(memory), default: []].append(
                    (offset / page * page, (offset + bytes.count + page - 1) / page * page))
            }
        }
        for (memory, spans) in ranges {
            var planned: [Piece] = []
            var (start, end) = (-1, -1)
            for span in spans.sorted(by: { $0.start < $1.start }) {
                if start >= 0 && span.start <= end + Self.mergeGap && Swift.max(end, span.end) - start <= limit {
                    end = Swift.max(end, span.end)
                    continue
                }
                if start >= 0 { planned.append(Piece(start: start, end: end)) }
                (start, end) = span
            }
            if start >= 0 { planned.append(Piece(start: start, end: end)) }
            pieces[memory] = planned
        }
    }

    /// The byte ranges of their memories that the buffers made so far wrap (one per piece a
    /// part was bound from).
    var wrappedRanges: [Range<Int>] {
        (pieces.values.flatMap { $0 } + spans.values.flatMap { $0 }).filter { $0.buffer != nil }.map { $0.start..<$0.end }
    }

    /// The page span of every part of the experts' tensors (all in `memory`).
    static func span(of list: [WeightData], in memory: WeightMemory) -> (start: Int, end: Int) {
        let page = WeightMemory.pageSize
        let offsets = list.flatMap { $0.parts.compactMap { p in p.baseAddress.map { (memory.offset(of: $0), p.count) } } }
        let start = offsets.map(\.0).min() ?? 0, end = offsets.map { $0.0 + $0.1 }.max() ?? 0
        return (start / page * page, (end + page - 1) / page * page)
    }

    /// The buffer wrapping the span of experts of a per-expert tensor that lie in one memory
    /// (planned in init), and the span's start in that memory.
    func span(of list: [WeightData], context: MetalContext, what: String) throws -> (any MTLBuffer, Int) {
        let memory = list[0].memory!
        let (start, end) = Self.span(of: list, in: memory)
        guard let piece = spans[ObjectIdentifier(memory)]?.first(where: { $0.start == start && $0.end == end }) else {
            throw MoEError.internalError("\(what): no planned mapping holds its experts' bytes \(start)..<\(end)")
        }
        return (try wrap(piece, memory, context: context, what: what), start)
    }

    /// `bytes` of `memory` (planned in init) as a buffer and an offset into it.
    func part(_ bytes: UnsafeRawBufferPointer, of memory: WeightMemory, context: MetalContext,
              what: String) throws -> MetalWeight.Part {
        let offset = memory.offset(of: bytes.baseAddress!)
        guard let piece = pieces[ObjectIdentifier(memory)]?.first(where: { $0.start <= offset && offset + bytes.count <= $0.end })
        else {
            throw MoEError.internalError("\(what): no planned mapping holds bytes \(offset)..<\(offset + bytes.count)")
        }
        let length = piece.end - piece.start, limit = context.device.maxBufferLength
        guard length <= limit else {
            throw MoEError.outOfMemory(
                "\(what) is one tensor of \(bytes.count) bytes, more than this \(metalDeviceKind.name) device's "
                + "maxBufferLength (\(limit) bytes): Metal cannot bind it as one buffer")
        }
        return MetalWeight.Part(buffer: try wrap(piece, memory, context: context, what: what), offset: offset - piece.start)
    }

    /// `piece` of `memory` as a bytesNoCopy buffer, made the first time.
    private func wrap(_ piece: Piece, _ memory: WeightMemory, context: MetalContext, what: String) throws -> any MTLBuffer {
        if let made = piece.buffer { return made }
        let length = piece.end - piece.start
        // Kernels only read weights; Metal's signature takes a mutable pointer regardless.
        guard let buffer = context.device.makeBuffer(
            bytesNoCopy: UnsafeMutableRawPointer(mutating: memory.base + piece.start), length: length,
            options: .storageModeShared, deallocator: { _, _ in withExtendedLifetime(memory) {} }) else {
            throw MoEError.outOfMemory("the \(metalDeviceKind.name) device could not wrap the \(length) mapped bytes "
                                       + "holding \(what) without a copy")
        }
        buffer.label = "mapped weights, bytes \(piece.start)..<\(piece.end)"
        piece.buffer = buffer
        return buffer
    }
}
