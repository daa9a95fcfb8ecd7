/// How one Hugging Face `model_type` names its MoE options (config.json) and tensors.
/// Facts checked against transformers' modeling/configuration files and mlx-lm's models.
struct ModelFamily {
    /// Module of the MoE block under `model.layers.{i}.`, first match wins (Mixtral's
    /// checkpoints say block_sparse_moe; transformers 5 saves it as mlp).
    var blockNames = ["mlp"]
    /// The router's module inside the block.
    var router = "gate"
    /// The shared expert's module inside the block, and its sigmoid gate's (Qwen2-MoE).
    var sharedExpert: String?
    var sharedGate: String?
    /// gpt-oss: gate_up (E, H, 2I) interleaved, router and expert biases, swiglu_oai.
    var gptOSS = false

    /// The configuration of every MoE layer of the checkpoint, from config.json.
    let configure: (ConfigReader) throws -> MoEConfiguration
    /// Reads config.json's dense-layer settings once (throwing on bad ones) and returns
    /// why layer `i` is a dense MLP layer, or nil if it is an MoE layer.
    let denseLayers: (ConfigReader) throws -> (Int) -> String?

    static let supportedTypes = ["deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "granitemoe", "mixtral",
                                 "olmoe", "qwen2_moe", "qwen3_moe"]

    static func named(_ modelType: String) throws -> ModelFamily {
        switch modelType {
        case "mixtral":
            var f = ModelFamily(configure: { c in try c.base(experts: "num_local_experts", intermediate: "intermediate_size") },
                                denseLayers: { _ in { _ in nil } })
            f.blockNames = ["block_sparse_moe", "mlp"]
            return f
        case "qwen2_moe", "qwen3_moe":
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "num_experts", intermediate: "moe_intermediate_size")
                    m.normTopKProb = try c.bool("norm_topk_prob", default: false)
                    if modelType == "qwen2_moe" {
                        m.sharedIntermediateSize = try c.int("shared_expert_intermediate_size", default: 5632,
                                                             in: 0...Int(Int32.max))
                    }
                    return m
                },
                denseLayers: { c in
                    let only = Set(try c.intList("mlp_only_layers"))
                    let step = try c.int("decoder_sparse_step", default: 1, in: 1...Int(Int32.max))
                    return { i in
                        if only.contains(i) { return "it is in mlp_only_layers \(only.sorted())" }
                        if step > 1 && (i + 1) % step != 0 {
                            return "(layer + 1) is not a multiple of decoder_sparse_step = \(step)"
                        }
                        return nil
                    }
                })
            if modelType == "qwen2_moe" {
                f.sharedExpert = "shared_expert"
                f.sharedGate = "shared_expert_gate"
            }
            return f
        case "olmoe":
            return ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "num_experts", intermediate: "intermediate_size")
                    m.normTopKProb = try c.bool("norm_topk_prob", default: false)
                    return m
                },
                denseLayers: { _ in { _ in nil } })
        case "deepseek_v2", "deepseek_v3", "glm4_moe":
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "n_routed_experts", intermediate: "moe_intermediate_size")
                    let v2 = modelType == "deepseek_v2"
                    let d = DeepSeekDefaults(modelType)
                    m.scoring = try c.scoring(default: v2 ? .softmax : .sigmoid)
                    m.normTopKProb = try c.bool("norm_topk_prob", default: !v2)
                    m.routedScalingFactor = Float(try c.double("routed_scaling_factor", default: d.routedScalingFactor))
                    m.nGroup = try c.int("n_group", default: d.nGroup)
                    m.topKGroup = try c.int("topk_group", default: d.topKGroup)
                    // DeepSeek-V2's group_limited_greedy scores a group by its best expert;
                    // this library scores it by its two best (DeepSeek-V3's noaux_tc).
                    let method = c.raw["topk_method"]?.string ?? (v2 ? "greedy" : "noaux_tc")
                    if method == "greedy" {
                        (m.nGroup, m.topKGroup) = (1, 1)
                    } else if method == "group_limited_greedy" && m.nGroup > 1 {
                        throw MoEError.invalidArgument(
                            "topk_method \"group_limited_greedy\" with n_group = \(m.nGroup) scores each group by its best "
                            + "expert; this library implements only the two-best group score of \"noaux_tc\" (DeepSeek-V3)")
                    }
                    let shared = try c.int("n_shared_experts", default: d.sharedExperts, in: 0...Int(Int32.max))
                    let (width, overflow) = shared.multipliedReportingOverflow(by: m.intermediateSize)
                    guard !overflow && width <= Int(Int32.max) else {
                        throw MoEError.invalidArgument("\(c.path): \"n_shared_experts\" (\(shared)) times "
                                                       + "\"moe_intermediate_size\" (\(m.intermediateSize)) is too large")
                    }
                    m.sharedIntermediateSize = width
                    return m
                },
                denseLayers: { c in
                    let firstK = try c.int("first_k_dense_replace", default: DeepSeekDefaults(modelType).firstDense,
                                           in: 0...Int(Int32.max))
                    let freq = try c.int("moe_layer_freq", default: 1, in: 1...Int(Int32.max))
                    return { i in
                        if i < firstK { return "it is below first_k_dense_replace = \(firstK)" }
                        if freq > 1 && i % freq != 0 { return "it is not a multiple of moe_layer_freq = \(freq)" }
                        return nil
                    }
                })
            f.sharedExpert = "shared_experts"
            return f
        case "granitemoe":
            // Granite's router takes the softmax of the k best logits: the softmax over all,
            // renormalised. Its decoder scales the block's output by residual_multiplier
            // before the residual add; the block itself, which this layer is, does not.
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "num_local_experts", intermediate: "intermediate_size")
                    m.normTopKProb = true
                    return m
                },
                denseLayers: { _ in { _ in nil } })
            f.blockNames = ["block_sparse_moe"]
            f.router = "router.layer"
            return f
        case "gpt_oss":
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "num_local_experts", intermediate: "intermediate_size")
                    // Softmax over the k best logits = softmax over all, renormalised.
                    m.normTopKProb = true
                    m.activation = .swigluOAI
                    m.swigluLimit = Float(try c.double("swiglu_limit", default: 7))
                    return m
                },
                denseLayers: { _ in { _ in nil } })
            f.router = "router"
            f.gptOSS = true
            return f
        default:
            throw MoEError.invalidArgument(
                "model_type \"\(modelType)\" is not supported; supported: \(supportedTypes.joined(separator: ", "))")
        }
    }
}

/// What transformers' configuration classes of the DeepSeek-style families assume for a
/// key that config.json leaves out (a config that omits one must route as transformers
/// would, not by this library's taste).
private struct DeepSeekDefaults {
    var routedScalingFactor = 1.0, nGroup = 1, topKGroup = 1, sharedExperts = 1, firstDense = 0

    init(_ modelType: String) {
        switch modelType {
        case "deepseek_v2": sharedExperts = 2
        case "deepseek_v3": (routedScalingFactor, nGroup, topKGroup, firstDense) = (2.5, 8, 4, 3)
        default: firstDense = 1  // glm4_moe
        }
    }
}

/// Typed reads of config.json with errors that name the key.
struct ConfigReader {
    let raw: JSON
    let path: String

    private func bad(_ key: String, _ want: String) -> MoEError {
        .invalidArgument("\(path): \"\(key)\" must be \(want)")
    }

    func optionalInt(_ key: String) throws -> Int? {
        guard let v = raw[key], !v.isNull else { return nil }
        guard let n = v.int else { throw bad(key, "an integer") }
        return n
    }

    func int(_ key: String, default value: Int? = nil) throws -> Int {
        if let n = try optionalInt(key) { return n }
        guard let value else { throw MoEError.invalidArgument("\(path) has no \"\(key)\"") }
        return value
    }

    /// An integer in `range` (sizes and counts: the layer's own checks come later, but a
    /// file's number must not reach arithmetic that overflows before they do).
    func int(_ key: String, default value: Int? = nil, in range: ClosedRange<Int>) throws -> Int {
        let n = try int(key, default: value)
        guard range.contains(n) else {
            throw bad(key, "an integer in \(range.lowerBound)...\(range.upperBound), got \(n)")
        }
        return n
    }

    /// A list of integers (null or absent: empty).
    func intList(_ key: String) throws -> [Int] {
        guard let v = raw[key], !v.isNull else { return [] }
        guard let items = v.array, items.allSatisfy({ $0.int != nil }) else { throw bad(key, "a list of integers") }
        return items.compactMap(\.int)
    }

    func double(_ key: String, default value: Double) throws -> Double {
        guard let v = raw[key], !v.isNull else { return value }
        guard let n = v.double else { throw bad(key, "a number") }
        return n
    }

    func bool(_ key: String, default value: Bool) throws -> Bool {
        guard let v = raw[key], !v.isNull else { return value }
        guard let b = v.bool else { throw bad(key, "true or false") }
        return b
    }

    func scoring(default value: MoEScoring) throws -> MoEScoring {
        switch raw["scoring_func"]?.string {
        case nil: return value
        case "softmax": return .softmax
        case "sigmoid": return .sigmoid
        case let other?: throw MoEError.invalidArgument("\(path): scoring_func \"\(other)\" is not softmax or sigmoid")
        }
    }

    /// The options every family has: sizes, top-k, the activation. The expert count goes by
    /// other names too: transformers 5 writes `num_local_experts` for the Qwen MoE models,
    /// whose earlier configs (and mlx-lm's) say `num_experts`.
    func base(experts: String, intermediate: String) throws -> MoEConfiguration {
        let aliases = [experts, "num_local_experts", "num_experts", "n_routed_experts"]
        guard let key = aliases.first(where: { raw[$0].map { !$0.isNull } ?? false }) else {
            throw MoEError.invalidArgument("\(path) has no \"\(experts)\"")
        }
        let size = 1...Int(Int32.max)
        var m = MoEConfiguration(hiddenSize: try int("hidden_size", in: size), intermediateSize: try int(intermediate, in: size),
                                 numExperts: try int(key, in: size), topK: try int("num_experts_per_tok", in: size))
        let hiddenAct = raw["hidden_act"]?.string ?? "silu"
        guard let activation = MoEActivation(hiddenAct: hiddenAct) else {
            throw MoEError.invalidArgument("\(path): hidden_act \"\(hiddenAct)\" is not supported "
                                           + "(\(MoEActivation.hiddenActNames.joined(separator: ", ")))")
        }
        m.activation = activation
        return m
    }
}
