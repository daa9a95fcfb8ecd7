/// The dense FFN applied to every token beside the routed experts.
public struct SharedExpertWeights: Sendable {
    public var gateProj: WeightData     // (Is, H)
    public var upProj: WeightData       // (Is, H)
    public var downProj: WeightData     // (H, Is)
    /// (H): the expert's output is scaled by `sigmoid(x · sigmoidGate)` (Qwen2-MoE).
    public var sigmoidGate: WeightData?

    public init(gateProj: WeightData, upProj: WeightData, downProj: WeightData,
                sigmoidGate: WeightData? = nil) {
        self.gateProj = gateProj
        self.upProj = upProj
        self.downProj = downProj
        self.sigmoidGate = sigmoidGate
    }
}

extension SharedExpertWeights {
    /// Part `index` of `count` of a shared expert of width `width`, split along its width
    /// (tensor parallelism: gate and up rows, down columns; the sigmoid gate whole): the
    /// parts' outputs sum to the whole expert's, as the activation acts on each of the width's
    /// units alone and the gate factor scales every part alike. Nil when the width does not
    /// split into `count` parts of whole quantization groups (then one rank holds it whole).
    func part(_ index: Int, of count: Int, width: Int) throws -> (weights: SharedExpertWeights, width: Int)? {
        var unit = 1
        for m in [gateProj, upProj, downProj] {
            if case .quantized(let q, _) = m.format { unit = Swift.max(unit, q.groupSize) }
        }
        guard count >= 1, width % count == 0, (width / count) % unit == 0 else { return nil }
        let size = width / count, rows = index * size..<(index + 1) * size
        return (SharedExpertWeights(gateProj: gateProj.experts(rows, of: width), upProj: upProj.experts(rows, of: width),
                                    downProj: try downProj.columns(rows, of: width, what: "shared_expert.down_proj"),
                                    sigmoidGate: sigmoidGate), size)
    }
}

/// Gate and up projections of the routed experts, separate or fused as in the checkpoint.
public enum GateUpWeights: Sendable {
    /// `gate_proj (E, I, H)` and `up_proj (E, I, H)`.
    case separate(gate: WeightData, up: WeightData)
    /// `gate_up_proj (E, 2I, H)`: gate rows `[0, I)`, then up rows `[I, 2I)`.
    case fused(WeightData)
}

/// Every weight of one MoE layer, in the out-by-in layout of Hugging Face and MLX. The
/// matrices (router, expert and shared-expert projections) may each have their own
/// format; the vectors (biases, scales, the shared gate) are read as float32.
public struct MoEWeights: Sendable {
    public var router: WeightData                 // (E, H)
    public var routerBias: WeightData?            // (E)
    public var selectionBias: WeightData?         // (E)
    public var perExpertScale: WeightData?        // (E)
    // The experts' own arrays hold the experts the layer holds (E, or a share's count).
    public var gateUp: GateUpWeights
    public var downProj: WeightData               // (E, H, I)
    public var gateUpBias: WeightData?            // (E, 2I)
    public var downBias: WeightData?              // (E, H)
    public var shared: SharedExpertWeights?

    public init(router: WeightData, gateUp: GateUpWeights, downProj: WeightData,
                routerBias: WeightData? = nil, selectionBias: WeightData? = nil,
                perExpertScale: WeightData? = nil, gateUpBias: WeightData? = nil,
                downBias: WeightData? = nil, shared: SharedExpertWeights? = nil) {
        self.router = router
        self.routerBias = routerBias
        self.selectionBias = selectionBias
        self.perExpertScale = perExpertScale
        self.gateUp = gateUp
        self.downProj = downProj
        self.gateUpBias = gateUpBias
        self.downBias = downBias
        self.shared = shared
    }

    /// The weights of a layer holding experts `share` of the `total` these hold (expert
    /// parallelism, `MoEConfiguration.localExperts`): the experts' matrices become views of
    /// the share's experts; the router's arrays stay whole.
    func experts(_ share: ExpertShare, of total: Int) -> MoEWeights {
        var w = self
        switch gateUp {
        case .separate(let gate, let up):
            w.gateUp = .separate(gate: gate.experts(share, of: total), up: up.experts(share, of: total))
        case .fused(let gateUp):
            w.gateUp = .fused(gateUp.experts(share, of: total))
        }
        w.downProj = downProj.experts(share, of: total)
        // Vectors are one array each (read as float32): an interleaved share's rows gathered.
        func vector(_ v: WeightData?) -> WeightData? {
            guard let v else { return nil }
            return (share.stride == 1 ? v : .array(v.floats())).experts(share, of: total)
        }
        w.gateUpBias = vector(gateUpBias)
        w.downBias = vector(downBias)
        return w
    }

    /// Every weight matrix (router, expert and shared-expert projections).
    var matrices: [WeightData] {
        var m = [router]
        switch gateUp {
        case .separate(let gate, let up): m += [gate, up]
        case .fused(let gateUp): m.append(gateUp)
        }
        m.append(downProj)
        if let s = shared { m += [s.gateProj, s.upProj, s.downProj] }
        return m
    }

    /// The memories the weights are read from in place (mapped files, a caller's memory),
    /// each once.
    var memories: [WeightMemory] {
        let all = matrices + [routerBias, selectionBias, perExpertScale, gateUpBias, downBias, shared?.sigmoidGate]
            .compactMap { $0 }
        var seen: [WeightMemory] = []
        for memory in all.flatMap(\.memories) where !seen.contains(where: { $0 === memory }) { seen.append(memory) }
        return seen
    }

    /// Throws `MoEError.invalidArgument` naming the first array whose size does not fit
    /// `configuration`, or a shared expert that is present in one and absent in the other.
    public func validate(for c: MoEConfiguration) throws {
        // The router's arrays cover every expert; the experts' own, those the layer holds.
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        let held = c.heldExperts.count
        let perExpert: Set = ["gate_proj", "up_proj", "gate_up_proj", "down_proj"]
        func check(_ name: String, _ data: WeightData?, _ shape: [Int]) throws {
            if case .experts? = data, !perExpert.contains(name) {
                throw MoEError.invalidArgument("\(name): only the routed experts' projections (gate_proj, up_proj, "
                                               + "gate_up_proj, down_proj) may be given one tensor per expert")
            }
            try data?.validate(name, shape: shape)
        }
        try check("router_weight", router, [e, h])
        try check("router_bias", routerBias, [e])
        try check("selection_bias", selectionBias, [e])
        try check("per_expert_scale", perExpertScale, [e])
        switch gateUp {
        case .separate(let gate, let up):
            try check("gate_proj", gate, [held, i, h])
            try check("up_proj", up, [held, i, h])
        case .fused(let gateUp):
            try check("gate_up_proj", gateUp, [held, 2 * i, h])
        }
        try check("down_proj", downProj, [held, h, i])
        try check("gate_up_bias", gateUpBias, [held, 2 * i])
        try check("down_bias", downBias, [held, h])
        switch (shared, c.hasSharedExpert) {
        case (nil, false):
            break
        case (let s?, true):
            let si = c.sharedIntermediateSize
            try check("shared_expert.gate_proj", s.gateProj, [si, h])
            try check("shared_expert.up_proj", s.upProj, [si, h])
            try check("shared_expert.down_proj", s.downProj, [h, si])
            try check("shared_expert.sigmoid_gate", s.sigmoidGate, [h])
        case (nil, true):
            throw MoEError.invalidArgument("shared_intermediate_size > 0 but no shared expert weights were given")
        case (_?, false):
            throw MoEError.invalidArgument("shared expert weights were given but shared_intermediate_size is 0")
        }
    }
}
