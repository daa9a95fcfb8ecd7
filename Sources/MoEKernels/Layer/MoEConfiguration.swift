/// How router scores are made from the logits.
public enum MoEScoring: Int32, Sendable {
    case softmax = 0
    case sigmoid = 1
}

/// The gated activation of every expert FFN, `a = act(g, u)`.
public enum MoEActivation: Int32, Sendable {
    /// `silu(g) * u` (SwiGLU: Mixtral, Qwen, DeepSeek, OLMoE).
    case silu = 0
    /// `gelu_tanh(g) * u` (GeGLU: Gemma).
    case geluTanh = 1
    /// gpt-oss: `min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, ±limit) + 1)`.
    case swigluOAI = 2
}

/// Where a layer runs.
public enum MoEBackendKind: Int32, Sendable, CaseIterable {
    /// The best backend available in this process.
    case auto = 0
    /// BLAS (Accelerate / OpenBLAS) and Dispatch on the CPU.
    case cpu = 1
    /// An Apple GPU through Metal.
    case metal = 2
    /// The Metal backend on the software Metal device (Linux).
    case softMetal = 3

    public var name: String {
        switch self {
        case .auto: return "auto"
        case .cpu: return "cpu"
        case .metal: return "metal"
        case .softMetal: return "softmetal"
        }
    }
}

/// Every option of one MoE layer (see docs/spec.md, "What one call computes"); checked once by `validate()`.
public struct MoEConfiguration: Sendable, Equatable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numExperts: Int
    public var topK: Int

    public var scoring: MoEScoring = .softmax
    /// Divide the k weights by their sum (+1e-20).
    public var normTopKProb: Bool = true
    public var routedScalingFactor: Float = 1
    /// Group-limited routing: experts form `nGroup` groups, only `topKGroup` groups stay.
    public var nGroup: Int = 1
    public var topKGroup: Int = 1

    public var activation: MoEActivation = .silu
    public var swigluAlpha: Float = 1.702
    public var swigluLimit: Float = 7.0

    /// Width of the shared expert; 0 when the layer has none.
    public var sharedIntermediateSize: Int = 0

    public init(hiddenSize: Int, intermediateSize: Int, numExperts: Int, topK: Int) {
        self.hiddenSize = hiddenSize
        self.intermediateSize = intermediateSize
        self.numExperts = numExperts
        self.topK = topK
    }

    public var hasSharedExpert: Bool { sharedIntermediateSize > 0 }
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
