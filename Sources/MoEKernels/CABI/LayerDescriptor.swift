import CMoESwift

/// `moe_layer_desc` read into the Swift API's configuration and (borrowed) weights.
struct LayerDescriptor {
    static var defaults: moe_layer_desc {
        var d = moe_layer_desc()
        d.struct_size = UInt32(MemoryLayout<moe_layer_desc>.size)
        d.backend = Int32(truncatingIfNeeded: MOE_BACKEND_AUTO.rawValue)
        d.scoring = Int32(truncatingIfNeeded: MOE_SCORING_SOFTMAX.rawValue)
        d.norm_topk_prob = 1
        d.routed_scaling_factor = 1
        d.n_group = 1
        d.topk_group = 1
        d.activation = Int32(truncatingIfNeeded: MOE_ACTIVATION_SILU.rawValue)
        d.swiglu_alpha = 1.702
        d.swiglu_limit = 7
        return d
    }

    /// Fields that even the first version of the struct has: a caller's struct_size below
    /// this is not a moe_layer_desc at all.
    static let minimumSize = MemoryLayout<moe_layer_desc>.offset(of: \moe_layer_desc.shared_sigmoid_gate)!
        + MemoryLayout<UnsafePointer<Float>?>.size

    let raw: moe_layer_desc
    let configuration: MoEConfiguration
    let backend: MoEBackendKind

    /// Reads the first `struct_size` bytes over the defaults, so older callers' shorter
    /// structs get defaults for the fields they do not know.
    static func read(_ pointer: UnsafePointer<moe_layer_desc>) throws -> LayerDescriptor {
        let size = Int(pointer.pointee.struct_size)
        guard size >= minimumSize else {
            throw MoEError.invalidArgument(
                "desc.struct_size is \(size); call moe_layer_desc_init() before filling the descriptor")
        }
        var d = defaults
        withUnsafeMutableBytes(of: &d) { dst in
            dst.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: Swift.min(size, dst.count)))
        }
        return try LayerDescriptor(d)
    }

    private init(_ d: moe_layer_desc) throws {
        raw = d
        guard let backend = MoEBackendKind(rawValue: d.backend) else {
            throw MoEError.invalidArgument("backend \(d.backend) is not a moe_backend value")
        }
        self.backend = backend
        func size(_ value: Int64, _ name: String) throws -> Int {
            guard value >= Int64(Int32.min) && value <= Int64(Int32.max) else {
                throw MoEError.invalidArgument("\(name) = \(value) is out of range")
            }
            return Int(value)
        }
        var c = MoEConfiguration(hiddenSize: try size(d.hidden_size, "hidden_size"),
                                 intermediateSize: try size(d.intermediate_size, "intermediate_size"),
                                 numExperts: try size(d.num_experts, "num_experts"),
                                 topK: try size(d.top_k, "top_k"))
        guard let scoring = MoEScoring(rawValue: d.scoring) else {
            throw MoEError.invalidArgument("scoring \(d.scoring) is not a moe_scoring value")
        }
        guard let activation = MoEActivation(rawValue: d.activation) else {
            throw MoEError.invalidArgument("activation \(d.activation) is not a moe_activation value")
        }
        c.scoring = scoring
        c.activation = activation
        c.normTopKProb = d.norm_topk_prob != 0
        c.routedScalingFactor = d.routed_scaling_factor
        c.nGroup = Int(d.n_group)
        c.topKGroup = Int(d.topk_group)
        c.swigluAlpha = d.swiglu_alpha
        c.swigluLimit = d.swiglu_limit
        c.sharedIntermediateSize = try size(d.shared_intermediate_size, "shared_intermediate_size")
        try c.validate()
        configuration = c
    }

    /// The arrays as borrowed weights of the sizes the configuration implies; the caller's
    /// memory is only read during moe_layer_create.
    func weights() throws -> MoEWeights {
        let d = raw, c = configuration
        let (e, h, i, si) = (c.numExperts, c.hiddenSize, c.intermediateSize, c.sharedIntermediateSize)
        func optional(_ p: UnsafePointer<Float>?, _ count: Int) -> WeightData? {
            p.map { .borrowed(UnsafeBufferPointer(start: $0, count: count)) }
        }
        func required(_ p: UnsafePointer<Float>?, _ count: Int, _ name: String) throws -> WeightData {
            guard let data = optional(p, count) else { throw MoEError.invalidArgument("\(name) is NULL") }
            return data
        }
        let gateUp: GateUpWeights
        switch (d.gate_proj, d.up_proj, d.gate_up_proj) {
        case (let g?, let u?, nil):
            gateUp = .separate(gate: .borrowed(.init(start: g, count: e * i * h)),
                               up: .borrowed(.init(start: u, count: e * i * h)))
        case (nil, nil, let gu?):
            gateUp = .fused(.borrowed(.init(start: gu, count: e * 2 * i * h)))
        default:
            throw MoEError.invalidArgument("give either gate_proj and up_proj, or gate_up_proj alone")
        }
        var shared: SharedExpertWeights?
        if si > 0 {
            shared = SharedExpertWeights(
                gateProj: try required(d.shared_gate_proj, si * h, "shared_gate_proj"),
                upProj: try required(d.shared_up_proj, si * h, "shared_up_proj"),
                downProj: try required(d.shared_down_proj, h * si, "shared_down_proj"),
                sigmoidGate: optional(d.shared_sigmoid_gate, h))
        }
        return MoEWeights(router: try required(d.router_weight, e * h, "router_weight"),
                          gateUp: gateUp,
                          downProj: try required(d.down_proj, e * h * i, "down_proj"),
                          routerBias: optional(d.router_bias, e),
                          selectionBias: optional(d.selection_bias, e),
                          perExpertScale: optional(d.per_expert_scale, e),
                          gateUpBias: optional(d.gate_up_bias, e * 2 * i),
                          downBias: optional(d.down_bias, e * h),
                          shared: shared)
    }
}
