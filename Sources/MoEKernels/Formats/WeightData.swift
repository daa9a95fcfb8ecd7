#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CMoECPU

/// A quantized weight tensor, in memory the caller keeps alive until the layer's
/// initializer returns. For a logical (rows, cols) tensor in MLX's layout: `weight` holds
/// rows x cols x bits / 8 bytes of packed codes (uint32 words), `scales` one entry per
/// group of `groupSize` elements of a row, `biases` (affine only) likewise. In ggml's
/// blocks: `weight` holds rows x cols / blockElements blocks as ggml stores them, and
/// `scales` is empty (the scales are in the blocks).
public struct QuantizedWeightData: @unchecked Sendable {
    public var quantization: Quantization
    public var weight: UnsafeRawBufferPointer
    public var scales: UnsafeRawBufferPointer
    public var biases: UnsafeRawBufferPointer?
    /// Element type of affine scales and biases; ignored for mxfp4 (E8M0 bytes).
    public var scaleType: ScalarType

    public init(_ quantization: Quantization, weight: UnsafeRawBufferPointer, scales: UnsafeRawBufferPointer,
                biases: UnsafeRawBufferPointer? = nil, scaleType: ScalarType = .float32) {
        self.quantization = quantization
        self.weight = weight
        self.scales = scales
        self.biases = biases
        self.scaleType = scaleType
    }

    /// ggml's blocks of `type` (e.g. a GGUF tensor's bytes), rows one after another.
    public init(ggml type: GGMLType, blocks: UnsafeRawBufferPointer) {
        self.init(.ggml(type), weight: blocks, scales: UnsafeRawBufferPointer(start: nil, count: 0))
    }
}

/// One weight tensor handed to a layer, in the format the checkpoint stores it:
/// float32 owned (`[Float]`) or borrowed, dense float16 / bfloat16 / float32 bytes, or
/// quantized. Borrowed memory must stay alive until the layer's initializer returns;
/// layers copy what they keep, in the same format, and hold no reference to it — except
/// for `.mapped`, whose memory a layer reads in place wherever its kernels can read the
/// stored layout as it is, holding the `WeightMemory` for as long as the layer lives.
public enum WeightData: @unchecked Sendable {
    case array([Float])
    case borrowed(UnsafeBufferPointer<Float>)
    /// Dense elements of `ScalarType` (e.g. a bf16 tensor of a safetensors file).
    case dense(UnsafeRawBufferPointer, ScalarType)
    case quantized(QuantizedWeightData)
    /// A `.borrowed`, `.dense` or `.quantized` tensor whose bytes all lie in `memory`, to be
    /// read in place (the Metal backends wrap the memory without a copy and bind each part
    /// at its offset; the CPU reads in place every layout its kernels take as stored).
    indirect case mapped(WeightData, in: WeightMemory)
    /// A tensor of experts stored one tensor per expert (most bf16 originals: Qwen3-MoE,
    /// Mixtral, DeepSeek, OLMoE), each (rows, cols) of the same format, wherever each lies:
    /// the backends reach expert e's rows through a per-expert table (CPU: one matrix per
    /// expert; Metal: byte offsets into one wrapped buffer) instead of stacking copies, and
    /// stack a copy only where they cannot (WeightData.stacked).
    indirect case experts([WeightData])

    /// The tensor itself, without the memory it may be mapped from.
    public var unmapped: WeightData {
        if case .mapped(let inner, _) = self { return inner }
        return self
    }

    /// The memory the tensor is read from in place, if it is mapped (not for `.experts`,
    /// whose tensors each have their own: `memories`).
    public var memory: WeightMemory? {
        if case .mapped(_, let memory) = self { return memory }
        return nil
    }

    /// Every memory the tensor's bytes are read from in place.
    var memories: [WeightMemory] {
        switch self {
        case .mapped(_, let memory): return [memory]
        case .experts(let list): return list.flatMap(\.memories)
        default: return []
        }
    }

    /// The tensor in one stacked piece: `.experts` copied into memory of its own, which the
    /// result owns (a WeightMemory, read in place as a mapped tensor is); anything else as
    /// it is. For backends (and parts of them) that cannot read a per-expert table.
    func stacked(what: String) throws -> WeightData {
        guard case .experts(let list) = self, let first = list.first else { return self }
        let sizes = first.parts.map(\.count)
        for (e, expert) in list.enumerated() where expert.format != first.format || expert.parts.map(\.count) != sizes {
            throw MoEError.invalidArgument("\(what): expert \(e)'s tensor differs from expert 0's in format or size")
        }
        // Each part of all experts, one after another.
        return try Self.owned(like: first.unmapped, partBytes: sizes.map { $0 * list.count },
                              purpose: "to stack the \(list.count) experts of \(what)",
                              unsupported: "\(what): per-expert tensors must be borrowed, dense or quantized bytes") { k, out in
            for (e, expert) in list.enumerated() {
                (out + e * sizes[k]).copyMemory(from: expert.parts[k].baseAddress!, byteCount: sizes[k])
            }
        }
    }

    /// A tensor of `template`'s kind (dense of its type, or quantized as it is) over bytes of
    /// its own: part k (codes, then scales and biases where `template` has them) is
    /// `partBytes[k]` bytes that `fill(k, destination)` writes, each part on a 64-byte
    /// boundary of one page-aligned allocation, which a WeightMemory frees with the last
    /// layer reading it (the result is mapped from it). For the copies the backends or a
    /// share need: stacked experts, a part's columns.
    private static func owned(like template: WeightData, partBytes: [Int], purpose: String, unsupported: String,
                              fill: (Int, UnsafeMutableRawPointer) -> Void) throws -> WeightData {
        switch template {
        case .dense, .borrowed, .quantized: break
        default: throw MoEError.invalidArgument(unsupported)
        }
        let starts = partBytes.indices.map { k in partBytes[..<k].reduce(0) { $0 + ($1 + 63) / 64 * 64 } }
        let total = (starts.last ?? 0) + (partBytes.last ?? 0)
        let page = WeightMemory.pageSize
        let length = Swift.max(page, (total + page - 1) / page * page)
        var raw: UnsafeMutableRawPointer?
        guard posix_memalign(&raw, page, length) == 0, let base = raw else {
            throw MoEError.outOfMemory("cannot allocate \(length) bytes \(purpose)")
        }
        CallStats.allocation(bytes: length)
        let address = Int(bitPattern: base)
        let memory = try WeightMemory(base: base, length: length, release: { free(UnsafeMutableRawPointer(bitPattern: address)) })
        func part(_ k: Int) -> UnsafeRawBufferPointer {
            fill(k, base + starts[k])
            return UnsafeRawBufferPointer(start: base + starts[k], count: partBytes[k])
        }
        switch template {
        case .dense(_, let type): return .mapped(.dense(part(0), type), in: memory)
        case .quantized(let q):
            let scales = q.quantization.hasSeparateScales ? part(1) : UnsafeRawBufferPointer(start: nil, count: 0)
            let biases = q.biases == nil ? nil : part(partBytes.count - 1)
            return .mapped(.quantized(QuantizedWeightData(q.quantization, weight: part(0), scales: scales, biases: biases,
                                                          scaleType: q.scaleType)), in: memory)
        default: return .mapped(.dense(part(0), .float32), in: memory)  // .borrowed
        }
    }

    /// The experts `share` of a tensor that stacks `total` experts along its first dimension
    /// (every part's bytes are `total` equal pieces, one per expert): views of the same
    /// bytes, nothing copied, nothing read — one view for a contiguous share, one per
    /// expert (`.experts`, which the backends reach through a per-expert table) otherwise.
    func experts(_ share: ExpertShare, of total: Int) -> WeightData {
        if case .experts(let list) = self { return .experts(share.ids.map { list[$0] }) }
        if share.stride == 1 { return experts(share.first..<share.first + share.count, of: total) }
        if case .array(let a) = self {  // owned floats: the share's rows, gathered
            let per = a.count / total
            return .array(share.ids.flatMap { a[$0 * per..<($0 + 1) * per] })
        }
        return .experts(share.ids.map { experts($0..<$0 + 1, of: total) })
    }

    /// The experts `range` (see `experts(_:of:)` above): one view.
    func experts(_ range: Range<Int>, of total: Int) -> WeightData {
        func slice(_ raw: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
            let per = raw.count / total
            return UnsafeRawBufferPointer(rebasing: raw[range.lowerBound * per..<range.upperBound * per])
        }
        switch self {
        case .array(let a):
            let per = a.count / total
            return .array(Array(a[range.lowerBound * per..<range.upperBound * per]))
        case .borrowed(let b):
            let per = b.count / total
            return .borrowed(UnsafeBufferPointer(rebasing: b[range.lowerBound * per..<range.upperBound * per]))
        case .dense(let raw, let type): return .dense(slice(raw), type)
        case .quantized(var q):
            q.weight = slice(q.weight)
            if q.quantization.hasSeparateScales { q.scales = slice(q.scales) }
            q.biases = q.biases.map(slice)
            return .quantized(q)
        case .mapped(let inner, let memory): return .mapped(inner.experts(range, of: total), in: memory)
        case .experts(let list): return .experts(Array(list[range]))
        }
    }

    /// Columns `range` of a matrix of `cols` columns, cut at whole quantization groups (or
    /// ggml blocks), copied in its format into memory of its own (a WeightMemory, read in
    /// place like a mapped tensor): a tensor-parallel part of a shared expert's down
    /// projection. Each part's row (codes, scales, biases) is cut at the same fraction.
    func columns(_ range: Range<Int>, of cols: Int, what: String) throws -> WeightData {
        let unit: Int
        if case .quantized(let q, _) = format { unit = q.groupSize } else { unit = 1 }
        guard range.lowerBound % unit == 0, range.count % unit == 0, range.upperBound <= cols, !range.isEmpty else {
            throw MoEError.invalidArgument("\(what): columns \(range) of \(cols) do not fall on whole groups of \(unit)")
        }
        if case .array(let a) = self {
            let rows = a.count / cols
            return .array((0..<rows).flatMap { r in a[r * cols + range.lowerBound..<r * cols + range.upperBound] })
        }
        let inner = unmapped, rows = count / cols
        let parts = inner.parts
        // Each row of each part cut at the same fraction (whole groups: whole bytes).
        let cut = parts.map { (start: $0.count / rows * range.lowerBound / cols, length: $0.count / rows * range.count / cols) }
        return try Self.owned(like: inner, partBytes: cut.map { $0.length * rows },
                              purpose: "for columns \(range) of \(what)",
                              unsupported: "\(what): per-expert tensors have no columns to cut") { k, out in
            let rowBytes = parts[k].count / rows
            for r in 0..<rows {
                (out + r * cut[k].length).copyMemory(from: parts[k].baseAddress! + r * rowBytes + cut[k].start,
                                                     byteCount: cut[k].length)
            }
        }
    }

    /// Its bytes: codes (or dense values), then scales and biases where the format has them.
    var parts: [UnsafeRawBufferPointer] {
        switch self {
        case .array: return []
        case .borrowed(let b): return [UnsafeRawBufferPointer(b)]
        case .dense(let raw, _): return [raw]
        case .quantized(let q):
            return [q.weight] + (q.quantization.hasSeparateScales ? [q.scales] : []) + (q.biases.map { [$0] } ?? [])
        case .mapped(let inner, _): return inner.parts
        case .experts: return []  // not one piece: each expert's own parts, or `stacked`
        }
    }

    public init(_ array: [Float]) { self = .array(array) }

    public var format: WeightFormat {
        switch self {
        case .array, .borrowed: return .float32
        case .dense(_, let t): return .dense(t)
        case .quantized(let q): return .quantized(q.quantization, scaleType: q.scaleType)
        case .mapped(let inner, _): return inner.format
        case .experts(let list): return list.first?.format ?? .float32
        }
    }

    /// Logical elements (values after dequantization).
    public var count: Int {
        switch self {
        case .array(let a): return a.count
        case .borrowed(let b): return b.count
        case .dense(let raw, let t): return raw.count / t.size
        case .quantized(let q):
            if case .ggml(let t) = q.quantization { return q.weight.count / t.blockBytes * t.blockElements }
            return q.weight.count * 8 / q.quantization.bits
        case .mapped(let inner, _): return inner.count
        case .experts(let list): return list.reduce(0) { $0 + $1.count }
        }
    }

    /// Throws `MoEError.invalidArgument` naming `name` unless this holds a tensor of
    /// `shape` (out-by-in: the last dimension is the one quantization groups run along).
    func validate(_ name: String, shape: [Int]) throws {
        let elements = shape.reduce(1, *)
        let dims = "(" + shape.map(String.init).joined(separator: ", ") + ")"
        switch self {
        case .experts(let list):
            guard shape.count >= 2, list.count == shape[0] else {
                throw MoEError.invalidArgument("\(name) must have \(shape.first ?? 0) per-expert tensors (shape \(dims)), got \(list.count)")
            }
            for (e, expert) in list.enumerated() {
                if case .experts = expert { throw MoEError.invalidArgument("\(name)[\(e)]: per-expert tensors do not nest") }
                guard expert.format == list[0].format else {
                    throw MoEError.invalidArgument("\(name)[\(e)] is \(expert.format), expert 0's is \(list[0].format): "
                                                   + "the experts of one tensor share a format")
                }
                try expert.validate("\(name)[\(e)]", shape: Array(shape.dropFirst()))
            }
        case .mapped(let inner, let memory):
            switch inner {
            case .array, .mapped, .experts:
                throw MoEError.invalidArgument("\(name): only borrowed, dense or quantized bytes can be mapped")
            default:
                guard inner.parts.allSatisfy(memory.contains) else {
                    throw MoEError.invalidArgument("\(name): its bytes do not all lie in the weight memory it is mapped from")
                }
                try inner.validate(name, shape: shape)
            }
        case .array, .borrowed, .dense:
            if case .dense(let raw, let t) = self, raw.count % t.size != 0 {
                throw MoEError.invalidArgument("\(name) has \(raw.count) bytes, not a whole number of \(t) elements")
            }
            guard count == elements else {
                throw MoEError.invalidArgument("\(name) must have \(elements) elements (shape \(dims)), got \(count)")
            }
        case .quantized(let q):
            let quantization = q.quantization
            if case .ggml(let t) = quantization {
                try Self.validateBlocks(q, t, name, shape: shape)
                return
            }
            try quantization.validate(name)
            let cols = shape.last ?? 1, rows = elements / Swift.max(cols, 1)
            guard cols % quantization.groupSize == 0 else {
                throw MoEError.invalidArgument(
                    "\(name): its last dimension (\(cols)) must be a multiple of group_size \(quantization.groupSize)")
            }
            let format = self.format
            let wordsPerRow = format.rowBytes(cols: cols) / 4
            guard q.weight.count == rows * cols * quantization.bits / 8 else {
                throw MoEError.invalidArgument(
                    "\(name): the packed weight of a \(dims) tensor at \(quantization.bits) bits must have "
                    + "\(rows * wordsPerRow) uint32 words (\(wordsPerRow) per row), got \(q.weight.count / 4)")
            }
            let scaleBytes = rows * format.scaleRowBytes(cols: cols)
            guard q.scales.count == scaleBytes else {
                throw MoEError.invalidArgument(
                    "\(name): scales must have \(rows * (cols / quantization.groupSize)) entries "
                    + "(\(cols / quantization.groupSize) per row), got \(q.scales.count) bytes")
            }
            switch (quantization, q.biases) {
            case (.mxfp4, _?):
                throw MoEError.invalidArgument("\(name): mxfp4 has no biases")
            case (.affine, nil):
                throw MoEError.invalidArgument("\(name): affine quantization needs biases (one per scale)")
            case (.affine, let biases?) where biases.count != scaleBytes:
                throw MoEError.invalidArgument("\(name): biases must have the shape and dtype of scales")
            default:
                break
            }
        }
    }

    /// The checks of `validate` for ggml's blocks.
    private static func validateBlocks(_ q: QuantizedWeightData, _ t: GGMLType, _ name: String, shape: [Int]) throws {
        let dims = "(" + shape.map(String.init).joined(separator: ", ") + ")"
        let cols = shape.last ?? 1, rows = shape.dropLast().reduce(1, *)
        guard cols % t.blockElements == 0 else {
            throw MoEError.invalidArgument(
                "\(name): its last dimension (\(cols)) must be a multiple of \(t)'s block of \(t.blockElements) elements")
        }
        let rowBytes = cols / t.blockElements * t.blockBytes
        guard q.weight.count == rows * rowBytes else {
            throw MoEError.invalidArgument(
                "\(name): a \(dims) tensor in \(t) must have \(rows * rowBytes) bytes (\(cols / t.blockElements) blocks "
                + "of \(t.blockBytes) bytes per row), got \(q.weight.count)")
        }
        guard q.scales.count == 0, q.biases == nil else {
            throw MoEError.invalidArgument("\(name): \(t) keeps its scales in its blocks; give no scales or biases")
        }
    }

    /// The tensor as a kernel matrix of rows of `cols` elements, valid inside `body`.
    func withMatrix<R>(cols: Int, _ body: (moe_cpu_matrix) throws -> R) rethrows -> R {
        var m = format.cpuMatrix(cols: cols)
        switch self {
        case .array(let a):
            return try a.withUnsafeBytes { raw in
                m.data = raw.baseAddress
                return try body(m)
            }
        case .borrowed(let b):
            m.data = UnsafeRawPointer(b.baseAddress)
            return try body(m)
        case .dense(let raw, _):
            m.data = raw.baseAddress
            return try body(m)
        case .quantized(let q):
            m.data = q.weight.baseAddress
            m.scales = q.scales.baseAddress
            m.biases = q.biases?.baseAddress
            return try body(m)
        case .mapped(let inner, _):
            return try inner.withMatrix(cols: cols, body)
        case .experts:
            preconditionFailure("per-expert tensors have one matrix per expert")
        }
    }

    /// The values as float32: exactly for dense formats, `scale * q + bias` rounded once
    /// for quantized ones. For small vectors, tests and backends without format kernels.
    public func floats() -> [Float] {
        if case .array(let a) = self { return a }
        if case .experts(let list) = self { return list.flatMap { $0.floats() } }
        let n = count
        // Rows of one quantization group each, so no row shape is needed.
        let cols: Int
        if case .quantized(let q) = unmapped { cols = q.quantization.groupSize } else { cols = Swift.max(n, 1) }
        return [Float](unsafeUninitializedCapacity: n) { out, initialized in
            withMatrix(cols: cols) { m in
                var m = m
                moe_cpu_dequantize_rows(&m, 0, Int64(n / cols), out.baseAddress!)
            }
            initialized = n
        }
    }

    /// Calls `body` with the values as float32 (converted into a temporary array unless
    /// they already are float32); the pointer is valid only inside `body`.
    public func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<Float>) throws -> R) rethrows -> R {
        switch self {
        case .array(let a): return try a.withUnsafeBufferPointer(body)
        case .borrowed(let b): return try body(b)
        case .mapped(let inner, _): return try inner.withUnsafeBufferPointer(body)
        default: return try floats().withUnsafeBufferPointer(body)
        }
    }
}
