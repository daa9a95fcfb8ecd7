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
    /// Why layer `i` is a dense MLP layer, or nil if it is an MoE layer.
    let denseReason: (ConfigReader, Int) -> String?

    static let supportedTypes = ["deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "mixtral",
                                 "olmoe", "qwen2_moe", "qwen3_moe"]

    static func named(_ modelType: String) throws -> ModelFamily {
        switch modelType {
        case "mixtral":
            var f = ModelFamily(configure: { c in try c.base(experts: "num_local_experts", intermediate: "intermediate_size") },
                                denseReason: { _, _ in nil })
            f.blockNames = ["block_sparse_moe", "mlp"]
            return f
        case "qwen2_moe", "qwen3_moe":
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "num_experts", intermediate: "moe_intermediate_size")
                    m.normTopKProb = try c.bool("norm_topk_prob", default: false)
                    if modelType == "qwen2_moe" {
                        m.sharedIntermediateSize = try c.int("shared_expert_intermediate_size", default: 0)
                    }
                    return m
                },
                denseReason: { c, i in
                    if let only = c.raw["mlp_only_layers"]?.array?.compactMap(\.int), only.contains(i) {
                        return "it is in mlp_only_layers \(only)"
                    }
                    let step = (try? c.int("decoder_sparse_step", default: 1)) ?? 1
                    if step > 1 && (i + 1) % step != 0 { return "(layer + 1) is not a multiple of decoder_sparse_step = \(step)" }
                    return nil
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
                denseReason: { _, _ in nil })
        case "deepseek_v2", "deepseek_v3", "glm4_moe":
            var f = ModelFamily(
                configure: { c in
                    var m = try c.base(experts: "n_routed_experts", intermediate: "moe_intermediate_size")
                    let v2 = modelType == "deepseek_v2"
                    m.scoring = try c.scoring(default: v2 ? .softmax : .sigmoid)
                    m.normTopKProb = try c.bool("norm_topk_prob", default: !v2)
                    m.routedScalingFactor = Float(try c.double("routed_scaling_factor", default: 1))
                    m.nGroup = try c.int("n_group", default: 1)
                    m.topKGroup = try c.int("topk_group", default: 1)
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
                    if let n = try c.optionalInt("n_shared_experts"), n > 0 { m.sharedIntermediateSize = n * m.intermediateSize }
                    return m
                },
                denseReason: { c, i in
                    let firstK = (try? c.int("first_k_dense_replace", default: 0)) ?? 0
                    if i < firstK { return "it is below first_k_dense_replace = \(firstK)" }
                    let freq = (try? c.int("moe_layer_freq", default: 1)) ?? 1
                    if freq > 1 && i % freq != 0 { return "it is not a multiple of moe_layer_freq = \(freq)" }
                    return nil
                })
            f.sharedExpert = "shared_experts"
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
                denseReason: { _, _ in nil })
            f.router = "router"
            f.gptOSS = true
            return f
        default:
            throw MoEError.invalidArgument(
                "model_type \"\(modelType)\" is not supported; supported: \(supportedTypes.joined(separator: ", "))")
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
        guard let count = try aliases.lazy.compactMap({ try self.optionalInt($0) }).first else {
            throw MoEError.invalidArgument("\(path) has no \"\(experts)\"")
        }
        var m = MoEConfiguration(hiddenSize: try int("hidden_size"), intermediateSize: try int(intermediate),
                                 numExperts: count, topK: try int("num_experts_per_tok"))
        switch raw["hidden_act"]?.string ?? "silu" {
        case "silu", "swish": m.activation = .silu
        case "gelu_pytorch_tanh", "gelu_tanh": m.activation = .geluTanh
        case let other: throw MoEError.invalidArgument("\(path): hidden_act \"\(other)\" is not supported (silu, gelu_pytorch_tanh)")
        }
        return m
    }
}
