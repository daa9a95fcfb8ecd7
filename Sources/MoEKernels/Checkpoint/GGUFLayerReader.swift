import CMoESwift

/// Finds one MoE layer's tensors in GGUF files by llama.cpp's names (`blk.{i}.` +
/// `ffn_gate_inp`, `ffn_{gate,up,down}_exps` or `ffn_gate_up_exps`, `ffn_*_shexp`,
/// `ffn_gate_inp_shexp`, `exp_probs_b`, gpt-oss's `.bias` tensors) and describes them as
/// `MoEWeights`, borrowed from the mappings in their stored ggml type. ggml's dimensions
/// are innermost first, so `ffn_gate_exps` (ne = [H, I, E]) is the layer's (E, I, H) as it
/// lies, and llama.cpp's converter permutes no FFN weight: nothing is transposed here.
final class GGUFLayerReader {
    let checkpoint: GGUFCheckpoint
    let c: MoEConfiguration
    let prefix: String
    let map: Bool
    /// Joined bias rows; freed with the reader.
    private var temporaries: [UnsafeMutableRawBufferPointer] = []

    init(_ checkpoint: GGUFCheckpoint, layer: Int, configuration: MoEConfiguration, map: Bool) {
        self.checkpoint = checkpoint
        self.map = map
        c = configuration
        prefix = "blk.\(layer)."
    }

    deinit {
        for t in temporaries { t.deallocate() }
    }

    private func tensor(_ name: String) -> GGUFTensor? { checkpoint.tensor(prefix + name) }

    /// A tensor llama.cpp's loader requires of this layer (created without
    /// TENSOR_NOT_REQUIRED): its absence is the file's error, named as llama.cpp would.
    private func require(_ name: String) throws -> GGUFTensor {
        guard let t = tensor(name) else {
            throw MoEError.invalidArgument("no tensor \(prefix + name) in \(checkpoint.display): llama.cpp's "
                                           + "\(checkpoint.architecture) loader requires it of every MoE layer")
        }
        return t
    }

    /// llama.cpp's `check_tensor_dims`: the file's ne and the expected ne are compared over
    /// all of ggml's GGML_MAX_DIMS dimensions, an absent dimension being 1. So trailing unit
    /// dimensions of ne (leading ones of the row-major shape) do not count: the converter
    /// writes Qwen2-MoE's shared-expert gate, a (1, H) Linear in transformers, as ne [H, 1]
    /// where the loader asks for [H]. The bytes are the same either way (ggml tensors here
    /// are contiguous), so only the comparison changes.
    static func sameDimensions(_ ne: [Int], _ shape: [Int]) -> Bool {
        let want = Array(shape.reversed())
        let count = Swift.max(ne.count, want.count, GGUFFile.maxDims)
        return (0..<count).allSatisfy { d in (d < ne.count ? ne[d] : 1) == (d < want.count ? want[d] : 1) }
    }

    private func check(_ t: GGUFTensor, _ shape: [Int]) throws {
        guard Self.sameDimensions(t.ne, shape) else {
            throw MoEError.invalidArgument(
                "\(t.name) has shape \(t.shapeDescription) (ggml ne \(t.ne)); the \(checkpoint.architecture) metadata implies ("
                + shape.map(String.init).joined(separator: ", ") + ") (dimensions of 1 aside, as llama.cpp compares them)")
        }
    }

    /// The layer's format of `t`'s ggml type, or an error naming the tensor and the type.
    private static func format(_ t: GGUFTensor) throws -> WeightFormat {
        guard let format = WeightFormat(ggmlType: Int32(t.type.number)) else {
            let readable = GGUFTensorType.all.values.filter { WeightFormat(ggmlType: Int32($0.number)) != nil }
                .sorted { $0.number < $1.number }.map(\.name).joined(separator: ", ")
            throw MoEError.invalidArgument("\(t.name) in \(t.file) is of ggml type \(t.type.name), which this layer does "
                                           + "not read (it reads \(readable))")
        }
        return format
    }

    /// `bytes` in `t`'s type, checked against `shape`.
    private static func weight(_ bytes: UnsafeRawBufferPointer, of t: GGUFTensor, name: String, shape: [Int]) throws -> WeightData {
        let data: WeightData
        switch try format(t) {
        case .dense(let type): data = .dense(bytes, type)
        case .quantized(.ggml(let type), _): data = .quantized(QuantizedWeightData(ggml: type, blocks: bytes))
        case .quantized: throw MoEError.internalError("a ggml type mapped to a format that is not ggml's")
        }
        try data.validate(name, shape: shape)
        return data
    }

    /// `name` as a weight matrix of logical shape `shape`, in its stored type.
    private func matrix(_ name: String, _ shape: [Int]) throws -> WeightData {
        let t = try require(name)
        try check(t, shape)
        let data = try Self.weight(t.bytes, of: t, name: t.name, shape: shape)
        return map ? .mapped(data, in: t.memory) : data
    }

    /// The experts' `ffn_<projection>.<e>.weight` of shape `shape` (older Mixtral files,
    /// which llama.cpp still reads), each read where it lies, in their common type.
    private func experts(_ projection: String, _ shape: [Int]) throws -> WeightData {
        // Appended one by one, not `map`ped: map reserves expert_count entries up front, and
        // the file's expert_count may be anything (2^31 - 1 asked for 223 GB, found by the
        // fuzzer); here the arrays grow only with the tensors the file holds.
        var parts: [GGUFTensor] = []
        for e in 0..<c.numExperts {
            let t = try require("ffn_\(projection).\(e).weight")
            try check(t, shape)
            if let first = parts.first, t.type != first.type {
                throw MoEError.invalidArgument("\(t.name) is \(t.type.name), \(first.name) \(first.type.name): "
                                               + "the experts of one projection must share a type")
            }
            parts.append(t)
        }
        var matrices: [WeightData] = []
        for e in parts.indices { matrices.append(try matrix("ffn_\(projection).\(e).weight", shape)) }
        return .experts(matrices)
    }

    private func temporary(_ bytes: Int) -> UnsafeMutableRawBufferPointer {
        let t = UnsafeMutableRawBufferPointer.allocate(byteCount: Swift.max(bytes, 1), alignment: 64)
        temporaries.append(t)
        return t
    }

    /// A vector or small table (biases, the selection bias, a sigmoid gate), dense.
    private func vector(_ name: String, _ shape: [Int]) throws -> WeightData? {
        guard let t = tensor(name) else { return nil }
        try check(t, shape)
        guard case .dense(let type) = try Self.format(t) else {
            throw MoEError.invalidArgument("\(t.name) must be F32, F16 or BF16, got \(t.type.name)")
        }
        return .dense(t.bytes, type)
    }

    private func requiredVector(_ name: String, _ shape: [Int]) throws -> WeightData {
        guard let v = try vector(name, shape) else {
            _ = try require(name)
            throw MoEError.internalError("\(prefix + name) is absent yet was found")
        }
        return v
    }

    func weights() throws -> MoEWeights {
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        let arch = checkpoint.architectureInfo
        let gateUp: GateUpWeights
        let down: WeightData
        if tensor("ffn_gate_up_exps.weight") != nil {
            gateUp = .fused(try matrix("ffn_gate_up_exps.weight", [e, 2 * i, h]))
            down = try matrix("ffn_down_exps.weight", [e, h, i])
        } else if tensor("ffn_gate_exps.weight") == nil && tensor("ffn_gate.0.weight") != nil {
            // Each expert's tensor read where it lies: the tensors' offsets come from the
            // file and may all point at the same bytes, which costs nothing then.
            gateUp = .separate(gate: try experts("gate", [i, h]), up: try experts("up", [i, h]))
            down = try experts("down", [h, i])
        } else {
            if checkpoint.architecture == "llama" && tensor("ffn_gate_exps.weight") == nil {
                // llama.cpp's llama loader marks ffn_gate_exps TENSOR_NOT_REQUIRED: without it
                // the experts are ungated (act(up x)), which this layer does not compute.
                throw MoEError.invalidArgument("\(checkpoint.display) has no \(prefix)ffn_gate_exps.weight: llama.cpp "
                                               + "runs such llama experts ungated, which this layer does not compute "
                                               + "(it computes gated experts)")
            }
            gateUp = .separate(gate: try matrix("ffn_gate_exps.weight", [e, i, h]),
                               up: try matrix("ffn_up_exps.weight", [e, i, h]))
            down = try matrix("ffn_down_exps.weight", [e, h, i])
        }
        var w = MoEWeights(router: try matrix("ffn_gate_inp.weight", [e, h]), gateUp: gateUp, downProj: down)
        if arch.selectionBias {
            // Optional in deepseek2 (TENSOR_NOT_REQUIRED: V2 has none), required in glm4moe.
            w.selectionBias = arch.selectionBiasRequired ? try requiredVector("exp_probs_b.bias", [e])
                : try vector("exp_probs_b.bias", [e])
        }
        if arch.gptOSS {
            // llama.cpp's gpt-oss loader requires all four biases (none is TENSOR_NOT_REQUIRED):
            // a file without one is not a gpt-oss file llama.cpp runs, so it is refused by name.
            w.routerBias = try requiredVector("ffn_gate_inp.bias", [e])
            let gate = try requiredVector("ffn_gate_exps.bias", [e, i])
            let up = try requiredVector("ffn_up_exps.bias", [e, i])
            guard case .dense(let g, let type) = gate, case .dense(let u, type) = up else {
                throw MoEError.invalidArgument("\(prefix)ffn_gate_exps.bias and \(prefix)ffn_up_exps.bias must share a type")
            }
            let out = temporary(2 * e * i * type.size)
            LayerReader.joinRows(g, u, rows: e, rowBytes: i * type.size, into: out)
            w.gateUpBias = .dense(UnsafeRawBufferPointer(out), type)
            w.downBias = try requiredVector("ffn_down_exps.bias", [e, h])
        }
        if c.hasSharedExpert {
            let si = c.sharedIntermediateSize
            var s = SharedExpertWeights(gateProj: try matrix("ffn_gate_shexp.weight", [si, h]),
                                        upProj: try matrix("ffn_up_shexp.weight", [si, h]),
                                        downProj: try matrix("ffn_down_shexp.weight", [h, si]))
            if arch.shared == .gatedLength {
                s.sigmoidGate = .array(try requiredVector("ffn_gate_inp_shexp.weight", [h]).floats())
            }
            w.shared = s
        }
        // A share of the experts: views of their bytes (the rest is never read).
        return c.holdsShare ? w.experts(c.heldExperts, of: e) : w
    }
}
