import CMoESwift

// The options' codes and names are moe_options.h's rows: each Swift case maps to its
// imported constant, and the names come from the same table (options.c). Swift lists the
// cases itself so that every `switch` over them stays exhaustive; OptionTableTests checks
// that the cases and the rows are the same set.

/// The name of row `code` of a table of moe_options.h.
func optionName(_ table: moe_option_table, _ code: Int32) -> String {
    moe_option_name(table, code).map { String(cString: $0) } ?? "<\(code)>"
}

/// An option whose cases are the rows of a table of moe_options.h: `rawValue` is the
/// row's code (each case returns its imported constant), `init(rawValue:)` finds the case.
public protocol MoEOptionRow: CaseIterable, Hashable, Sendable, RawRepresentable where RawValue == Int32 {}

extension MoEOptionRow {
    public init?(rawValue: Int32) {
        guard let c = Self.allCases.first(where: { $0.rawValue == rawValue }) else { return nil }
        self = c
    }

    /// The row whose code is `code`, or the one error every reader of a code gives:
    /// "<prefix><field> <code> is not a moe_<cEnum> value" (`cEnum`: the C enum's name
    /// after `moe_`, when it is not the field's).
    static func decoded(_ code: Int32, field: String, cEnum: String? = nil, prefix: String = "") throws -> Self {
        guard let row = Self(rawValue: code) else {
            throw MoEError.invalidArgument("\(prefix)\(field) \(code) is not a moe_\(cEnum ?? field) value")
        }
        return row
    }
}

/// How router scores are made from the logits.
public enum MoEScoring: MoEOptionRow, CustomStringConvertible {
    case softmax
    case sigmoid

    public var rawValue: Int32 {
        switch self {
        case .softmax: return Int32(MOE_SCORING_SOFTMAX.rawValue)
        case .sigmoid: return Int32(MOE_SCORING_SIGMOID.rawValue)
        }
    }
    public var description: String { optionName(MOE_OPTION_TABLE_SCORING, rawValue) }
}

/// The gated activation of every expert FFN, `a = act(g, u)`.
public enum MoEActivation: MoEOptionRow, CustomStringConvertible {
    /// `silu(g) * u` (SwiGLU: Mixtral, Qwen, DeepSeek, OLMoE).
    case silu
    /// `gelu_tanh(g) * u` (GeGLU: Gemma).
    case geluTanh
    /// gpt-oss: `min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, ±limit) + 1)`.
    case swigluOAI
    /// `gelu(g) * u` with the exact GELU, `g * (1 + erf(g / √2)) / 2`.
    case gelu
    /// `max(g, 0) * u` (ReGLU).
    case relu
    /// `silu(min(g, limit)) * clip(u, ±limit)`: SwiGLU with a clamp (DeepSeek-V4).
    case swigluClamped

    public var rawValue: Int32 {
        switch self {
        case .silu: return Int32(MOE_ACTIVATION_SILU.rawValue)
        case .geluTanh: return Int32(MOE_ACTIVATION_GELU_TANH.rawValue)
        case .swigluOAI: return Int32(MOE_ACTIVATION_SWIGLU_OAI.rawValue)
        case .gelu: return Int32(MOE_ACTIVATION_GELU.rawValue)
        case .relu: return Int32(MOE_ACTIVATION_RELU.rawValue)
        case .swigluClamped: return Int32(MOE_ACTIVATION_SWIGLU_CLAMPED.rawValue)
        }
    }
    /// The activation a Hugging Face config's `hidden_act` names, if any.
    public init?(hiddenAct: String) {
        self.init(rawValue: moe_activation_of_hidden_act(hiddenAct))
    }
    /// Every `hidden_act` value that some activation accepts.
    static var hiddenActNames: [String] {
        String(cString: moe_hidden_act_names()).split(separator: " ").map(String.init)
    }
    public var description: String { optionName(MOE_OPTION_TABLE_ACTIVATION, rawValue) }
}

/// The activations that enter a quantized-format weight product (moe_options.h,
/// MOE_ACTIVATION_QUANTIZATION_ROWS): float32 as they are, or 8-bit in blocks of
/// `MOE_Q8_ACTIVATION_BLOCK` as ggml's dot products take them. Dense weights and the router
/// always take float32.
public enum MoEActivationQuantization: MoEOptionRow, CustomStringConvertible {
    /// float32 activations: the exact product of the weights' values.
    case none
    /// Per block of 32 elements of a row: `d = max|x| / 127`, `x ≈ d * round(x / d)`.
    case q8

    public var rawValue: Int32 {
        switch self {
        case .none: return Int32(MOE_ACTIVATION_QUANTIZATION_NONE.rawValue)
        case .q8: return Int32(MOE_ACTIVATION_QUANTIZATION_Q8.rawValue)
        }
    }
    public var description: String { optionName(MOE_OPTION_TABLE_ACTIVATION_QUANTIZATION, rawValue) }

    /// Whether a product with weights in `format` takes 8-bit activations: the rule both
    /// backends follow (and the reference's `_quantized`): only under `.q8`, and only for
    /// quantized formats; dense weights and the router take the activations as they are.
    func quantizes(_ format: WeightFormat) -> Bool { self == .q8 && format.isQuantized }
}

/// Where a layer runs.
public enum MoEBackendKind: MoEOptionRow {
    /// The best backend available in this process.
    case auto
    /// BLAS (Accelerate / OpenBLAS) and Dispatch on the CPU.
    case cpu
    /// An Apple GPU through Metal.
    case metal
    /// The Metal backend on the software Metal device (Linux).
    case softMetal

    public var rawValue: Int32 {
        switch self {
        case .auto: return Int32(MOE_BACKEND_AUTO.rawValue)
        case .cpu: return Int32(MOE_BACKEND_CPU.rawValue)
        case .metal: return Int32(MOE_BACKEND_METAL.rawValue)
        case .softMetal: return Int32(MOE_BACKEND_SOFTMETAL.rawValue)
        }
    }
    public var name: String { optionName(MOE_OPTION_TABLE_BACKEND, rawValue) }
}

/// The routed experts a layer holds (expert parallelism): ids `first`, `first + stride`, ...,
/// `count` of them, the per-expert weights in that order. A contiguous share has stride 1;
/// an interleaved one (rank r of N: r, r + N, ...) spreads group-limited routing's groups of
/// consecutive experts over the ranks.
public struct ExpertShare: Sendable, Equatable, CustomStringConvertible {
    public var first: Int
    public var count: Int
    public var stride: Int

    public init(first: Int, count: Int, stride: Int = 1) {
        (self.first, self.count, self.stride) = (first, count, stride)
    }

    public init(_ range: Range<Int>) { self.init(first: range.lowerBound, count: range.count) }

    /// The ids, in the weights' order.
    public var ids: StrideTo<Int> { Swift.stride(from: first, to: first + count * stride, by: stride) }

    /// The place of expert `id` among those held, or nil when it is not held.
    @inline(__always)
    func place(of id: Int) -> Int? {
        let d = id - first
        guard d >= 0, d % stride == 0, d / stride < count else { return nil }
        return d / stride
    }

    public var description: String {
        stride == 1 ? "\(first)..<\(first + count)" : "\(first), \(first + stride), ... \(first + (count - 1) * stride)"
    }
}

/// Every option of one MoE layer (see docs/spec.md, "What one call computes"); checked once by `validate()`.
public struct MoEConfiguration: Sendable, Equatable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numExperts: Int
    public var topK: Int

    // The defaults are moe_options.h's MOE_DEFAULT_*.
    public var scoring = MoEScoring(rawValue: Int32(MOE_DEFAULT_SCORING_CODE.rawValue))!
    /// Divide the k weights by their sum (+1e-20).
    public var normTopKProb: Bool = MOE_DEFAULT_NORM_TOPK_PROB != 0
    public var routedScalingFactor: Float = MOE_DEFAULT_ROUTED_SCALING_FACTOR
    /// Group-limited routing: experts form `nGroup` groups, only `topKGroup` groups stay.
    public var nGroup = Int(MOE_DEFAULT_N_GROUP)
    public var topKGroup = Int(MOE_DEFAULT_TOPK_GROUP)

    public var activation = MoEActivation(rawValue: Int32(MOE_DEFAULT_ACTIVATION_CODE.rawValue))!
    public var swigluAlpha: Float = MOE_DEFAULT_SWIGLU_ALPHA
    public var swigluLimit: Float = MOE_DEFAULT_SWIGLU_LIMIT
    /// The activations of quantized-format weight products.
    public var activationQuantization = MoEActivationQuantization(
        rawValue: Int32(MOE_DEFAULT_ACTIVATION_QUANTIZATION_CODE.rawValue))!

    /// Width of the shared expert; 0 when the layer has none.
    public var sharedIntermediateSize: Int = 0

    /// Expert parallelism: the routed experts this layer holds, of the `numExperts` the
    /// router chooses among; nil: all of them. The per-expert weights hold
    /// `localExperts.count` experts, in the share's order. A layer holding a share routes
    /// every token as the whole layer does and returns the partial sum of the slots whose
    /// experts it holds (plus its shared expert and residual, when it has them): a group of
    /// layers holding disjoint shares, of which one has the shared expert and the residual,
    /// sums to the whole layer.
    public var localExperts: ExpertShare? = nil

    public init(hiddenSize: Int, intermediateSize: Int, numExperts: Int, topK: Int) {
        self.hiddenSize = hiddenSize
        self.intermediateSize = intermediateSize
        self.numExperts = numExperts
        self.topK = topK
    }

    public var hasSharedExpert: Bool { sharedIntermediateSize > 0 }
    /// The experts whose weights the layer holds (all unless `localExperts`).
    public var heldExperts: ExpertShare { localExperts ?? ExpertShare(0..<numExperts) }
    /// Whether the layer holds only a share of the experts (its output is a partial sum).
    public var holdsShare: Bool { heldExperts != ExpertShare(0..<numExperts) }
    var groupSize: Int { numExperts / nGroup }

    /// Throws `MoEError.invalidArgument` naming the first option that is wrong.
    public func validate() throws {
        func require(_ ok: Bool, _ message: @autoclosure () -> String) throws {
            if !ok { throw MoEError.invalidArgument(message()) }
        }
        // BLAS takes 32-bit sizes; the largest tensor must also be addressable.
        let limit = Int(Int32.max)
        for (name, value) in [("hidden_size", hiddenSize), ("intermediate_size", intermediateSize),
                              ("num_experts", numExperts)] {
            try require(value > 0, "\(name) must be positive, got \(value)")
            try require(value <= limit, "\(name) must be at most \(limit), got \(value)")
        }
        try require(topK >= 1 && topK <= numExperts,
                    "top_k must be in 1...num_experts (\(numExperts)), got \(topK)")
        if let share = localExperts {
            try require(share.first >= 0 && share.count >= 1 && share.stride >= 1
                        && share.first <= numExperts - 1 - (share.count - 1) * share.stride,
                        "the local experts (\(share)) must be one or more experts within 0..<num_experts (\(numExperts))")
        }
        try require(sharedIntermediateSize >= 0 && sharedIntermediateSize <= limit,
                    "shared_intermediate_size must be in 0...\(limit), got \(sharedIntermediateSize)")
        try require(nGroup >= 1, "n_group must be at least 1, got \(nGroup)")
        try require(numExperts % nGroup == 0,
                    "n_group (\(nGroup)) must divide num_experts (\(numExperts))")
        try require(topKGroup >= 1 && topKGroup <= nGroup,
                    "topk_group must be in 1...n_group (\(nGroup)), got \(topKGroup)")
        if nGroup > 1 {
            try require(topKGroup * groupSize >= topK,
                        "topk_group (\(topKGroup)) groups of \(groupSize) experts cannot hold top_k = \(topK) experts")
        }
        try require(routedScalingFactor.isFinite, "routed_scaling_factor must be finite")
        try require(swigluAlpha.isFinite, "swiglu_alpha must be finite")
        try require(swigluLimit.isFinite && swigluLimit > 0, "swiglu_limit must be finite and positive")
        for (name, a, b) in [("E*2I*H", numExperts, 2 * intermediateSize * hiddenSize),
                             ("Is*H", max(sharedIntermediateSize, 1), hiddenSize)] {
            let (product, overflow) = a.multipliedReportingOverflow(by: b)
            try require(!overflow && product <= Int.max / 8, "the layer is too large (\(name) overflows)")
        }
    }
}
