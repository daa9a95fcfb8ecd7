import CMoECPU

/// Finds one MoE layer's tensors in a checkpoint and describes them as `MoEWeights`,
/// borrowed from the mapping where the stored layout is the library's (as
/// `WeightData.mapped` with `map`, so that the layer reads them there in place). Layouts, tried in
/// this order under the block `model.layers.{i}.{mlp}`:
///   mlx-lm      `switch_mlp.{gate,up,down}_proj.{weight,scales,biases}` (gpt-oss: `experts.` and `.bias`)
///   gpt-oss     `experts.gate_up_proj` (E, H, 2I) gate/up interleaved, `down_proj` (E, I, H),
///               or `..._blocks` / `..._scales` (MXFP4, rows already out-by-in), `*_bias`
///   fused 3-D   `experts.gate_up_proj` (E, 2I, H), `experts.down_proj` (E, H, I) (transformers 5),
///               Granite's `input_linear` (E, 2I, H), `output_linear` (E, H, I)
///   per expert  `experts.{e}.{gate,up,down}_proj.weight` or Mixtral's `w1`/`w3`/`w2`
final class LayerReader {
    let checkpoint: SafeTensorsCheckpoint
    let c: MoEConfiguration
    let prefix: String
    /// Where the block may be (`prefix` is the first of these that has a router).
    private let blocks: [String]
    /// Copies made in the stored format; freed with the reader.
    private var temporaries: [UnsafeMutableRawBufferPointer] = []
    /// Whether tensors borrowed from the files are handed over as mapped (read in place).
    let map: Bool
    init(_ checkpoint: SafeTensorsCheckpoint, layer: Int, configuration: MoEConfiguration, map: Bool = true) {
        self.checkpoint = checkpoint
        self.map = map
        c = configuration
        let family = checkpoint.family
        blocks = family.blockNames.map { "model.layers.\(layer).\($0)" }
        prefix = blocks.first { checkpoint.tensor("\($0).\(family.router).weight") != nil } ?? blocks[0]
    }

    deinit {
        for t in temporaries { t.deallocate() }
    }

    private func temporary(_ bytes: Int) -> UnsafeMutableRawBufferPointer {
        let t = UnsafeMutableRawBufferPointer.allocate(byteCount: Swift.max(bytes, 1), alignment: 64)
        temporaries.append(t)
        return t
    }

    private func tensor(_ name: String) -> StoredTensor? { checkpoint.tensor(prefix + "." + name) }

    private func require(_ name: String) throws -> StoredTensor {
        guard let t = tensor(name) else { throw checkpoint.missing([prefix + "." + name], "layer weights") }
        return t
    }

    // MARK: Matrices and vectors

    /// `module.weight` of logical shape `shape`, quantized when `module.scales` exists
    /// (mlx-lm's layout, with the bits, group size and mode of config.json's
    /// "quantization" for that module). Checked against `shape` and the format before
    /// anything reads it: callers may copy or dequantize it right away.
    private func matrix(_ module: String, _ shape: [Int]) throws -> WeightData {
        let weight = try require(module + ".weight")
        guard let scales = tensor(module + ".scales") else {
            try check(weight, shape)
            return try dense(weight)
        }
        let q = try quantization(of: prefix + "." + module)
        guard weight.dtype == "U32" || weight.dtype == "I32" else {
            throw MoEError.invalidArgument("\(weight.name): a quantized weight must be packed U32 words, got \(weight.dtype)")
        }
        let scaleType: ScalarType
        if q == .mxfp4 {
            guard scales.dtype == "U8" else {
                throw MoEError.invalidArgument("\(scales.name): mxfp4 scales must be U8 (E8M0), got \(scales.dtype)")
            }
            scaleType = .float32
        } else {
            guard let t = scales.scalarType else {
                throw MoEError.invalidArgument("\(scales.name): affine scales must be F32, F16 or BF16, got \(scales.dtype)")
            }
            scaleType = t
        }
        let biases = tensor(module + ".biases")
        if let biases, biases.dtype != scales.dtype {
            throw MoEError.invalidArgument("\(biases.name) must have the dtype of \(scales.name) (\(scales.dtype)), got \(biases.dtype)")
        }
        let data = WeightData.quantized(QuantizedWeightData(q, weight: weight.bytes, scales: scales.bytes,
                                                            biases: biases?.bytes, scaleType: scaleType))
        try data.validate(prefix + "." + module, shape: shape)
        // Parts in different shards stay borrowed (copied by the layer): one memory per tensor.
        let sameFile = scales.memory === weight.memory && (biases == nil || biases!.memory === weight.memory)
        return sameFile ? mapped(data, weight) : data
    }

    /// `data`, borrowed from `t`'s file, as mapped from it when the reader maps.
    private func mapped(_ data: WeightData, _ t: StoredTensor) -> WeightData {
        map ? .mapped(data, in: t.memory) : data
    }

    /// config.json's "quantization": {"group_size", "bits", "mode"?, "<module path>": {...} or false}.
    private func quantization(of module: String) throws -> Quantization {
        let config = checkpoint.config
        guard let q = (config.raw["quantization"] ?? config.raw["quantization_config"])?.object else {
            throw MoEError.invalidArgument("\(module).scales exists but \(config.path) has no \"quantization\"")
        }
        // A module's own entry replaces the file-wide settings whole, as mlx-lm hands it to
        // MLX's to_quantized: keys it leaves out take that function's defaults (mode "affine",
        // 4 bits in groups of 64), not the file-wide ones (a router at 8 bits in a file of
        // MXFP4 experts is affine).
        var settings = q
        if let specific = q[module]?.object {
            settings = ["mode": .string("affine"), "bits": .number(4), "group_size": .number(64)]
            settings.merge(specific) { $1 }
        }
        let mode = settings["mode"]?.string ?? "affine"
        switch mode {
        case "mxfp4": return .mxfp4
        case "affine":
            guard let bits = settings["bits"]?.int, let groupSize = settings["group_size"]?.int else {
                throw MoEError.invalidArgument("\(config.path): \"quantization\" needs integer bits and group_size for \(module)")
            }
            return .affine(bits: bits, groupSize: groupSize)
        default:
            throw MoEError.invalidArgument("\(module): quantization mode \"\(mode)\" is not supported (affine, mxfp4)")
        }
    }

    private func dense(_ t: StoredTensor) throws -> WeightData {
        guard let type = t.scalarType else {
            throw MoEError.invalidArgument("\(t.name): a dense weight must be F32, F16 or BF16, got \(t.dtype)")
        }
        return mapped(.dense(t.bytes, type), t)
    }

    private func optionalDense(_ name: String, _ shape: [Int]) throws -> WeightData? {
        guard let t = tensor(name) else { return nil }
        try check(t, shape)
        return try dense(t)
    }

    private func check(_ t: StoredTensor, _ shape: [Int]) throws {
        guard t.shape == shape else {
            throw MoEError.invalidArgument("\(t.name) has shape \(t.shapeDescription), config.json implies "
                                           + "(" + shape.map(String.init).joined(separator: ", ") + ")")
        }
    }

    // MARK: The layer

    func weights() throws -> MoEWeights {
        let family = checkpoint.family
        guard tensor(family.router + ".weight") != nil else {
            throw checkpoint.missing(blocks.map { "\($0).\(family.router).weight" }, "router")
        }
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        let router = { try self.matrix(family.router, [e, h]) }
        var w: MoEWeights
        if let stacked = ["switch_mlp", "experts"].first(where: { tensor("\($0).gate_proj.weight") != nil }) {
            w = MoEWeights(router: try router(),
                           gateUp: .separate(gate: try matrix(stacked + ".gate_proj", [e, i, h]),
                                             up: try matrix(stacked + ".up_proj", [e, i, h])),
                           downProj: try matrix(stacked + ".down_proj", [e, h, i]))
            if let g = tensor(stacked + ".gate_proj.bias") {
                w.gateUpBias = try joinRows(g, try require(stacked + ".up_proj.bias"))
            }
            w.downBias = try optionalDense(stacked + ".down_proj.bias", [e, h])
        } else if family.gptOSS {
            w = try gptOSSExperts(router: router())
        } else if let names = [("experts.gate_up_proj", "experts.down_proj"),
                               ("input_linear.weight", "output_linear.weight")].first(where: { tensor($0.0) != nil }),
                  let gateUp = tensor(names.0) {
            let down = try require(names.1)
            try check(gateUp, [e, 2 * i, h])
            try check(down, [e, h, i])
            w = MoEWeights(router: try router(), gateUp: .fused(try dense(gateUp)), downProj: try dense(down))
        } else if let names = [("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")]
                    .first(where: { tensor("experts.0.\($0.0).weight") != nil }) {
            w = MoEWeights(router: try router(),
                           gateUp: .separate(gate: try experts(names.0, [i, h]), up: try experts(names.1, [i, h])),
                           downProj: try experts(names.2, [h, i]))
        } else {
            throw checkpoint.missing(["switch_mlp.gate_proj.weight", "experts.gate_up_proj", "input_linear.weight",
                                      "experts.0.gate_proj.weight", "experts.0.w1.weight"].map { prefix + "." + $0 },
                                     "expert weights")
        }
        w.routerBias = try optionalDense(family.router + ".bias", [e])
        w.selectionBias = try optionalDense(family.router + ".e_score_correction_bias", [e])
        if c.hasSharedExpert, let shared = family.sharedExpert {
            let si = c.sharedIntermediateSize
            var s = SharedExpertWeights(gateProj: try matrix(shared + ".gate_proj", [si, h]),
                                        upProj: try matrix(shared + ".up_proj", [si, h]),
                                        downProj: try matrix(shared + ".down_proj", [h, si]))
            // (1, H); mlx-lm may have quantized it: read as float32, it is one vector.
            s.sigmoidGate = try family.sharedGate.map { .array(try matrix($0, [1, h]).floats()) }
            w.shared = s
        }
        // A share of the experts: views of their bytes (the rest is never read).
        return c.holdsShare ? w.experts(c.heldExperts, of: e) : w
    }

    /// The E per-expert tensors of `projection`, each read where it lies (the backends reach
    /// them through a per-expert table, or stack a copy where they cannot).
    private func experts(_ projection: String, _ shape: [Int]) throws -> WeightData {
        // Appended one by one, not `map`ped: map reserves num_experts entries up front, and
        // config.json's num_experts is the file's to say (2^31 - 1 asks for 100 GB); here the
        // array grows only with the tensors the files hold.
        var parts: [WeightData] = []
        for e in 0..<c.numExperts {
            guard tensor("experts.\(e).\(projection).weight") != nil else {
                throw checkpoint.missing([prefix + ".experts.\(e).\(projection).weight"], "expert \(e)")
            }
            parts.append(try matrix("experts.\(e).\(projection)", shape))
        }
        for (e, part) in parts.enumerated() where part.format != parts[0].format {
            throw MoEError.invalidArgument("\(prefix).experts.\(e).\(projection) is \(part.format), expert 0's is "
                                           + "\(parts[0].format): the experts of one projection must share a format")
        }
        return .experts(parts)
    }

    /// (E, I) gate bias and (E, I) up bias as one (E, 2I) tensor, in their dtype.
    private func joinRows(_ gate: StoredTensor, _ up: StoredTensor) throws -> WeightData {
        let (e, i) = (c.numExperts, c.intermediateSize)
        try check(gate, [e, i])
        try check(up, [e, i])
        guard let type = gate.scalarType, up.dtype == gate.dtype else {
            throw MoEError.invalidArgument("\(gate.name) and \(up.name) must be F32, F16 or BF16 alike")
        }
        let out = temporary(2 * e * i * type.size)
        Self.joinRows(gate.bytes, up.bytes, rows: e, rowBytes: i * type.size, into: out)
        return .dense(UnsafeRawBufferPointer(out), type)
    }

    /// Row x of `gate` then row x of `up`, for each of `rows` rows of `rowBytes`, into `out`.
    static func joinRows(_ gate: UnsafeRawBufferPointer, _ up: UnsafeRawBufferPointer, rows: Int, rowBytes row: Int,
                         into out: UnsafeMutableRawBufferPointer) {
        for x in 0..<rows {
            out.baseAddress!.advanced(by: 2 * x * row).copyMemory(from: gate.baseAddress! + x * row, byteCount: row)
            out.baseAddress!.advanced(by: (2 * x + 1) * row).copyMemory(from: up.baseAddress! + x * row, byteCount: row)
        }
    }

    // MARK: gpt-oss

    /// gpt-oss's own layout: gate and up interleaved along 2I (even: gate, odd: up), dense
    /// weights stored in-by-out, MXFP4 blocks out-by-in. Each becomes the library's fused
    /// (E, 2I, H) with gate rows first, copied once in its stored format.
    private func gptOSSExperts(router: WeightData) throws -> MoEWeights {
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        var w: MoEWeights
        if let blocks = tensor("experts.gate_up_proj_blocks") {
            // Rows are whole blocks of 32 values: the copies below are sized from that.
            for (name, size) in [("hidden_size", h), ("intermediate_size", i)] where size % 32 != 0 {
                throw MoEError.invalidArgument("\(checkpoint.config.path): \(name) (\(size)) must be a multiple of 32 "
                                               + "for MXFP4 experts (\(blocks.name))")
            }
            let scales = try require("experts.gate_up_proj_scales")
            let downBlocks = try require("experts.down_proj_blocks"), downScales = try require("experts.down_proj_scales")
            for (t, shape) in [(blocks, [e, 2 * i, h / 32, 16]), (scales, [e, 2 * i, h / 32]),
                               (downBlocks, [e, h, i / 32, 16]), (downScales, [e, h, i / 32])] {
                try check(t, shape)
                guard t.dtype == "U8" else { throw MoEError.invalidArgument("\(t.name) must be U8, got \(t.dtype)") }
            }
            let gateUp = QuantizedWeightData(.mxfp4, weight: deinterleaveRows(blocks.bytes, rowBytes: h / 2),
                                             scales: deinterleaveRows(scales.bytes, rowBytes: h / 32))
            w = MoEWeights(router: router, gateUp: .fused(.quantized(gateUp)),
                           downProj: .quantized(QuantizedWeightData(.mxfp4, weight: downBlocks.bytes, scales: downScales.bytes)))
        } else {
            let gateUp = try require("experts.gate_up_proj"), down = try require("experts.down_proj")
            try check(gateUp, [e, h, 2 * i])
            try check(down, [e, i, h])
            w = MoEWeights(router: router,
                           gateUp: .fused(try transposeExperts(gateUp, deinterleave: true)),
                           downProj: try transposeExperts(down, deinterleave: false))
        }
        if let bias = tensor("experts.gate_up_proj_bias") {
            try check(bias, [e, 2 * i])
            guard let type = bias.scalarType else { throw MoEError.invalidArgument("\(bias.name) must be F32, F16 or BF16") }
            w.gateUpBias = .dense(deinterleaveRows(bias.bytes, rowBytes: type.size), type)
        }
        w.downBias = try optionalDense("experts.down_proj_bias", [e, h])
        return w
    }

    /// Rows (E, 2I) of `rowBytes` each, interleaved gate/up, as gate rows then up rows per
    /// expert: those of the experts held (the rest of the copy is never written, so its pages
    /// never become resident).
    private func deinterleaveRows(_ src: UnsafeRawBufferPointer, rowBytes: Int) -> UnsafeRawBufferPointer {
        let i = c.intermediateSize
        let out = temporary(src.count)
        for expert in c.heldExperts.ids {
            let base = expert * 2 * i * rowBytes
            for r in 0..<2 * i {
                let from = base + r * rowBytes
                let to = base + ((r % 2) * i + r / 2) * rowBytes
                (out.baseAddress! + to).copyMemory(from: src.baseAddress! + from, byteCount: rowBytes)
            }
        }
        return UnsafeRawBufferPointer(out)
    }

    /// (E, rows, cols) stored in-by-out -> (E, cols, rows) out-by-in, in the stored dtype;
    /// with `deinterleave`, output row r takes input column 2r (r < cols/2) or 2(r - cols/2) + 1.
    /// Only the experts held are written (as in `deinterleaveRows`).
    private func transposeExperts(_ t: StoredTensor, deinterleave: Bool) throws -> WeightData {
        guard let type = t.scalarType else {
            throw MoEError.invalidArgument("\(t.name): a dense weight must be F32, F16 or BF16, got \(t.dtype)")
        }
        let (rows, cols) = (t.shape[1], t.shape[2])
        let out = temporary(t.bytes.count)
        func run<T>(_: T.Type) {
            let src = t.bytes.bindMemory(to: T.self), dst = out.bindMemory(to: T.self)
            let half = cols / 2
            let tile = 64  // tiles keep both sides' cache lines in use (gpt-oss-120b's gate_up_proj: 2.1 G elements)
            for e in c.heldExperts.ids {
                let base = e * rows * cols
                for r0 in stride(from: 0, to: cols, by: tile) {
                    for k0 in stride(from: 0, to: rows, by: tile) {
                        for r in r0..<Swift.min(r0 + tile, cols) {
                            let from = deinterleave ? (r < half ? 2 * r : 2 * (r - half) + 1) : r
                            for k in k0..<Swift.min(k0 + tile, rows) { dst[base + r * rows + k] = src[base + k * cols + from] }
                        }
                    }
                }
            }
        }
        if type.size == 2 { run(UInt16.self) } else { run(UInt32.self) }
        return .dense(UnsafeRawBufferPointer(out), type)
    }
}
