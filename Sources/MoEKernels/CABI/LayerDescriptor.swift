import CMoESwift

/// `moe_layer_desc` read into the Swift API's configuration and (borrowed) weights.
struct LayerDescriptor {
    /// The options' defaults: MoEConfiguration's, which are moe_options.h's MOE_DEFAULT_*.
    static var defaults: moe_layer_desc {
        let c = MoEConfiguration(hiddenSize: 0, intermediateSize: 0, numExperts: 0, topK: 0)
        var d = moe_layer_desc()
        d.struct_size = UInt32(MemoryLayout<moe_layer_desc>.size)
        d.backend = Int32(MOE_DEFAULT_BACKEND_CODE.rawValue)
        d.scoring = c.scoring.rawValue
        d.norm_topk_prob = c.normTopKProb ? 1 : 0
        d.routed_scaling_factor = c.routedScalingFactor
        d.n_group = Int32(c.nGroup)
        d.topk_group = Int32(c.topKGroup)
        d.activation = c.activation.rawValue
        d.swiglu_alpha = c.swigluAlpha
        d.swiglu_limit = c.swigluLimit
        d.activation_quantization = c.activationQuantization.rawValue
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
        backend = try .decoded(d.backend, field: "backend")
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
        c.scoring = try .decoded(d.scoring, field: "scoring")
        c.activation = try .decoded(d.activation, field: "activation")
        c.activationQuantization = try .decoded(d.activation_quantization, field: "activation_quantization")
        c.normTopKProb = d.norm_topk_prob != 0
        c.routedScalingFactor = d.routed_scaling_factor
        c.nGroup = Int(d.n_group)
        c.topKGroup = Int(d.topk_group)
        c.swigluAlpha = d.swiglu_alpha
        c.swigluLimit = d.swiglu_limit
        c.sharedIntermediateSize = try size(d.shared_intermediate_size, "shared_intermediate_size")
        c.localExperts = try Self.share(first: d.first_local_expert, count: d.num_local_experts,
                                        stride: d.local_expert_stride, numExperts: c.numExperts)
        try c.validate()
        configuration = c
    }

    /// The share of first_local_expert, num_local_experts and local_expert_stride (nil for
    /// all experts: the three 0), checked against `numExperts` (nil: checked later).
    static func share(first: Int64, count: Int64, stride: Int64, numExperts: Int?) throws -> ExpertShare? {
        if first == 0 && count == 0 && stride <= 1 && stride >= 0 { return nil }
        let limit = Int64(Int32.max)
        let step = stride == 0 ? 1 : stride
        guard first >= 0, first <= limit, count >= 1, count <= limit, step >= 1, step <= limit,
              first + (count - 1) * step < Int64(numExperts ?? Int(limit)) else {
            throw MoEError.invalidArgument(
                "first_local_expert (\(first)), num_local_experts (\(count)) and local_expert_stride (\(stride)) must "
                + "name one or more of the " + (numExperts.map { "num_experts (\($0))" } ?? "layer's") + " experts")
        }
        return ExpertShare(first: Int(first), count: Int(count), stride: Int(step))
    }

    /// The caller's memory limit (nil for 0: the system's).
    var memoryLimit: Int? {
        get throws {
            guard raw.memory_limit >= 0 else {
                throw MoEError.invalidArgument("memory_limit must be >= 0 bytes (0: no limit), got \(raw.memory_limit)")
            }
            return raw.memory_limit == 0 ? nil : Int(raw.memory_limit)
        }
    }

    /// mapped_memory of the descriptor at `pointer` as a WeightMemory whose release calls
    /// mapped_release once (nil when not given, or when the caller's struct predates the
    /// field). Read before anything else is checked, so that every failure after it
    /// releases the memory (the WeightMemory's last reference goes); on a bad region
    /// mapped_release is called here, before the error.
    static func mappedMemory(_ pointer: UnsafePointer<moe_layer_desc>) throws -> WeightMemory? {
        let size = Int(pointer.pointee.struct_size)
        guard size >= MemoryLayout<moe_layer_desc>.offset(of: \moe_layer_desc.mapped_context)!
                + MemoryLayout<UnsafeMutableRawPointer?>.size else { return nil }
        let d = pointer.pointee
        struct Release: @unchecked Sendable {
            let call: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?
            let context: UnsafeMutableRawPointer?
            func callAsFunction() { call?(context) }
        }
        let release = Release(call: d.mapped_release, context: d.mapped_context)
        guard let base = d.mapped_memory else {
            if d.mapped_length != 0 || d.mapped_release != nil {
                release()
                throw MoEError.invalidArgument("mapped_memory is NULL but mapped_length or mapped_release is set")
            }
            return nil
        }
        do {
            return try WeightMemory(base: base, length: Int(d.mapped_length), release: { release() })
        } catch {
            release()
            throw error
        }
    }

    /// The arrays as borrowed weights of the sizes the configuration implies; the caller's
    /// memory is only read during moe_layer_create, except the matrices inside `memory`,
    /// which are mapped (read in place by the layer, which then holds `memory`).
    func weights(memory: WeightMemory? = nil) throws -> MoEWeights {
        let d = raw, c = configuration
        // The router's arrays cover all E experts; the experts' own, the `held` ones.
        let (e, h, i, si) = (c.numExperts, c.hiddenSize, c.intermediateSize, c.sharedIntermediateSize)
        let held = c.heldExperts.count
        func optional(_ p: UnsafePointer<Float>?, _ count: Int) -> WeightData? {
            p.map { .borrowed(UnsafeBufferPointer(start: $0, count: count)) }
        }
        /// A matrix given either as float32 or as a moe_tensor (at most one of them).
        func matrix(_ floats: UnsafePointer<Float>?, _ tensor: moe_tensor, _ shape: [Int], _ name: String) throws -> WeightData? {
            guard tensor.data != nil else { return optional(floats, shape.reduce(1, *)).map(mapped) }
            guard floats == nil else {
                throw MoEError.invalidArgument("give \(name) or \(name)_tensor, not both")
            }
            return mapped(try Self.weightData(tensor, shape: shape, name: "\(name)_tensor"))
        }
        func mapped(_ data: WeightData) -> WeightData {
            guard let memory, data.parts.allSatisfy(memory.contains) else { return data }
            return .mapped(data, in: memory)
        }
        let gateUp: GateUpWeights
        switch (try matrix(d.gate_proj, d.gate_proj_tensor, [held, i, h], "gate_proj"),
                try matrix(d.up_proj, d.up_proj_tensor, [held, i, h], "up_proj"),
                try matrix(d.gate_up_proj, d.gate_up_proj_tensor, [held, 2 * i, h], "gate_up_proj")) {
        case (let g?, let u?, nil):
            gateUp = .separate(gate: g, up: u)
        case (nil, nil, let gu?):
            gateUp = .fused(gu)
        default:
            throw MoEError.invalidArgument("give either gate_proj and up_proj, or gate_up_proj alone")
        }
        var shared: SharedExpertWeights?
        if si > 0 {
            func sharedMatrix(_ p: UnsafePointer<Float>?, _ t: moe_tensor, _ shape: [Int], _ name: String) throws -> WeightData {
                guard let data = try matrix(p, t, shape, name) else { throw MoEError.invalidArgument("\(name) is NULL") }
                return data
            }
            shared = SharedExpertWeights(
                gateProj: try sharedMatrix(d.shared_gate_proj, d.shared_gate_proj_tensor, [si, h], "shared_gate_proj"),
                upProj: try sharedMatrix(d.shared_up_proj, d.shared_up_proj_tensor, [si, h], "shared_up_proj"),
                downProj: try sharedMatrix(d.shared_down_proj, d.shared_down_proj_tensor, [h, si], "shared_down_proj"),
                sigmoidGate: optional(d.shared_sigmoid_gate, h))
        }
        guard let router = try matrix(d.router_weight, d.router_weight_tensor, [e, h], "router_weight") else {
            throw MoEError.invalidArgument("router_weight is NULL")
        }
        guard let down = try matrix(d.down_proj, d.down_proj_tensor, [held, h, i], "down_proj") else {
            throw MoEError.invalidArgument("down_proj is NULL")
        }
        return MoEWeights(router: router,
                          gateUp: gateUp,
                          downProj: down,
                          routerBias: optional(d.router_bias, e),
                          selectionBias: optional(d.selection_bias, e),
                          perExpertScale: optional(d.per_expert_scale, e),
                          gateUpBias: optional(d.gate_up_bias, held * 2 * i),
                          downBias: optional(d.down_bias, held * h),
                          shared: shared)
    }

    /// A moe_tensor of logical `shape` as borrowed WeightData, its byte sizes implied by the
    /// shape and format (checked here first, so no size is computed from a bad field).
    static func weightData(_ t: moe_tensor, shape: [Int], name: String) throws -> WeightData {
        let elements = shape.reduce(1, *), cols = shape.last!
        func scalar(_ code: Int32, _ what: String) throws -> ScalarType {
            try .decoded(code, field: "\(name).\(what)", cEnum: "dtype")
        }
        let quantization: Quantization
        let scaleType: ScalarType
        switch UInt32(bitPattern: t.format) {
        case MOE_FORMAT_F32.rawValue, MOE_FORMAT_F16.rawValue, MOE_FORMAT_BF16.rawValue:
            let type = try scalar(t.format, "format")
            return .dense(UnsafeRawBufferPointer(start: t.data, count: elements * type.size), type)
        case MOE_FORMAT_AFFINE.rawValue:
            quantization = .affine(bits: Int(t.bits), groupSize: Int(t.group_size))
            scaleType = try scalar(t.scale_dtype, "scale_dtype")
        case MOE_FORMAT_MXFP4.rawValue:
            guard t.group_size == 0 || t.group_size == 32 else {
                throw MoEError.invalidArgument("\(name): mxfp4 has groups of 32, got group_size \(t.group_size)")
            }
            quantization = .mxfp4
            scaleType = .float32
        default:
            guard let type = GGMLType(format: t.format) else {
                throw MoEError.invalidArgument("\(name).format \(t.format) is not a moe_format value")
            }
            let q = Quantization.ggml(type)
            // Checked before the byte count is computed from cols (moe_swift.h: scales
            // and biases are ignored, as the scales are inside the blocks).
            guard cols % type.blockElements == 0 else {
                throw MoEError.invalidArgument(
                    "\(name): its last dimension (\(cols)) must be a multiple of \(type)'s block of \(type.blockElements) elements")
            }
            let format = WeightFormat.quantized(q, scaleType: .float32)
            return .quantized(QuantizedWeightData(
                ggml: type, blocks: UnsafeRawBufferPointer(start: t.data, count: elements / cols * format.rowBytes(cols: cols))))
        }
        try quantization.validate(name)
        guard cols % quantization.groupSize == 0 else {
            throw MoEError.invalidArgument(
                "\(name): its last dimension (\(cols)) must be a multiple of group_size \(quantization.groupSize)")
        }
        guard t.scales != nil else { throw MoEError.invalidArgument("\(name).scales is NULL") }
        let format = WeightFormat.quantized(quantization, scaleType: scaleType)
        let rows = elements / cols
        let scaleBytes = rows * format.scaleRowBytes(cols: cols)
        return .quantized(QuantizedWeightData(
            quantization,
            weight: UnsafeRawBufferPointer(start: t.data, count: rows * format.rowBytes(cols: cols)),
            scales: UnsafeRawBufferPointer(start: t.scales, count: scaleBytes),
            biases: t.biases.map { UnsafeRawBufferPointer(start: $0, count: scaleBytes) },
            scaleType: scaleType))
    }
}
