import CMoESwift

/// The Metal backend: the weights live in device buffers in their given formats (dense
/// f32 / f16 / bf16 or quantized: never widened), uploaded once at creation or, when
/// mapped, read in place from the mapping wrapped without a copy; a forward is recorded
/// into a command buffer (MetalPass) — the caller's (the encode API) or one of our own that
/// `forward` commits and waits for — with scratch from a pool. The same code is the "metal" backend on Apple GPUs and the "softmetal"
/// backend on SoftMetal (Linux).
final class MetalBackend: MoEBackend, @unchecked Sendable {
    let kind: MoEBackendKind
    let context: MetalContext
    let configuration: MoEConfiguration

    let router: MetalWeight                   // (E, H)
    let routerBias: (any MTLBuffer)?          // (E)
    let selectionBias: (any MTLBuffer)?       // (E)
    let perExpertScale: (any MTLBuffer)?      // (E)
    let gate: MetalWeight                     // (E, I, H), or rows [0, I) of each expert of (E, 2I, H)
    let up: MetalWeight                       // (E, I, H), or rows [I, 2I) of the same buffers
    let gateUpBias: (any MTLBuffer)?          // (E, 2I)
    let down: MetalWeight                     // (E, H, I)
    let downBias: (any MTLBuffer)?            // (E, H)
    let shared: (gate: MetalWeight, up: MetalWeight, down: MetalWeight)?   // (Is, H), (Is, H), (H, Is)
    let sharedGate: (any MTLBuffer)?          // (H)
    let pipelines: Pipelines
    let q8: Q8Inputs
    let pool = MetalScratchPool()
    /// The byte ranges of mapped memory that the layer's bytesNoCopy buffers wrap (MetalMappings).
    let mappedRanges: [Range<Int>]

    /// The products whose input is 8-bit activations' grid values (moe_options.h,
    /// MOE_ACTIVATION_QUANTIZATION_Q8), by MoEActivationQuantization.quantizes (the router
    /// takes x as it is).
    struct Q8Inputs {
        var gate = false, up = false, down = false
        var sharedGate = false, sharedUp = false, sharedDown = false

        init() {}

        init(_ c: MoEConfiguration, gate: MetalWeight, up: MetalWeight, down: MetalWeight,
             shared: (gate: MetalWeight, up: MetalWeight, down: MetalWeight)?) {
            let q = c.activationQuantization
            (self.gate, self.up, self.down) = (q.quantizes(gate.format), q.quantizes(up.format), q.quantizes(down.format))
            if let shared {
                (sharedGate, sharedUp, sharedDown) = (q.quantizes(shared.gate.format), q.quantizes(shared.up.format),
                                                      q.quantizes(shared.down.format))
            }
        }

        /// Some gate/up product reads x's grid values (made once per forward, for all of
        /// them); `withShared`: counting the shared expert's (a call that runs it).
        func x(withShared: Bool = true) -> Bool { gate || up || (withShared && (sharedGate || sharedUp)) }
        var any: Bool { x() || down || sharedDown }
    }

    /// The kernel instances that read this layer's weight formats.
    struct Pipelines {
        /// The batched router, and the decode router (tokens <= MOE_DECODE_MAX_TOKENS).
        let router, routerGemv: any MTLComputePipelineState
        let routed: Experts
        let shared: Experts?
        /// The grid values of 8-bit activations, if some product takes them.
        let quantize: (any MTLComputePipelineState)?
    }

    struct Experts {
        let gateUpGemv, downGemv, gateUpGemm, downGemm: any MTLComputePipelineState

        init(_ context: MetalContext, gate: MetalWeight, up: MetalWeight, down: MetalWeight) throws {
            let gu = MetalWeight.kernelSuffix(gate: gate, up: up), d = down.kernelSuffix
            gateUpGemv = try context.pipeline(MetalKernels.gateUpGemv(gu), threads: MOE_GEMV_THREADS)
            downGemv = try context.pipeline(MetalKernels.downGemv(d), threads: MOE_GEMV_THREADS)
            gateUpGemm = try context.pipeline(MetalKernels.gateUpGemm(gu), threads: MOE_GEMM_THREADS)
            downGemm = try context.pipeline(MetalKernels.downGemm(d), threads: MOE_GEMM_THREADS)
        }
    }

    /// Bytes the weights' copies take: every matrix part not read in place from its
    /// mapping (a per-expert tensor's table, or its stacked copy where the kernels cannot
    /// read it through one), and the vectors (read as float32).
    static func copiedBytes(_ c: MoEConfiguration, _ w: MoEWeights, maxBufferLength: Int = .max) -> Int {
        let vectors = [w.routerBias, w.selectionBias, w.perExpertScale, w.gateUpBias, w.downBias, w.shared?.sigmoidGate]
        return w.matrices.reduce(0) { $0 + MetalWeight.copiedBytes($1, maxBufferLength: maxBufferLength) }
            + vectors.reduce(0) { $0 + ($1.map { MetalContext.bufferLength($0.count * MemoryLayout<Float>.stride) } ?? 0) }
    }

    /// `w`'s per-expert tensors that the kernels cannot read through a table (spread over
    /// several memories, at offsets they cannot read, or wider than one buffer) stacked into
    /// copies; the others as they are.
    static func readable(_ w: MoEWeights, maxBufferLength: Int) throws -> MoEWeights {
        func readable(_ data: WeightData, _ what: String) throws -> WeightData {
            guard case .experts = data, !MetalWeight.readsExpertsInPlace(data, maxBufferLength: maxBufferLength) else {
                return data
            }
            return try data.stacked(what: what)
        }
        var out = w
        switch w.gateUp {
        case .separate(let g, let u): out.gateUp = .separate(gate: try readable(g, "gate_proj"), up: try readable(u, "up_proj"))
        case .fused(let gu): out.gateUp = .fused(try readable(gu, "gate_up_proj"))
        }
        out.downProj = try readable(w.downProj, "down_proj")
        return out
    }

    init(configuration c: MoEConfiguration, weights given: MoEWeights, memoryLimit: Int? = nil) throws {
        let context = try MetalContext.shared()
        let maxBufferLength = context.device.maxBufferLength
        try MemoryBudget.check(needed: Self.copiedBytes(c, given, maxBufferLength: maxBufferLength), limit: memoryLimit,
                               what: "this layer on the \(metalDeviceKind.name) backend")
        let w = try Self.readable(given, maxBufferLength: maxBufferLength)
        kind = metalDeviceKind
        guard c.numExperts <= Int(MOE_MAX_EXPERTS) else {
            throw MoEError.invalidArgument(
                "the \(metalDeviceKind.name) backend supports at most \(MOE_MAX_EXPERTS) experts, got \(c.numExperts)")
        }
        self.context = context
        configuration = c
        let (e, i) = (c.numExperts, c.intermediateSize)

        let mappings = MetalMappings(w.matrices, maxBufferLength: maxBufferLength)
        func matrix(_ data: WeightData, rows: Int, cols: Int, what: String) throws -> MetalWeight {
            try MetalWeight(data, rowsPerExpert: rows, cols: cols, context: context, mappings: mappings, what: what)
        }
        // Vectors (biases, scales, the shared gate) are small: read as float32.
        func vector(_ data: WeightData?, what: String) throws -> (any MTLBuffer)? {
            try data.map { data in
                try data.withUnsafeBufferPointer { values in
                    let buffer = try context.makeBuffer(floats: values.count, what: what)
                    buffer.contents().copyMemory(from: values.baseAddress!, byteCount: values.count * MemoryLayout<Float>.stride)
                    return buffer
                }
            }
        }

        router = try matrix(w.router, rows: e, cols: c.hiddenSize, what: "router_weight")
        routerBias = try vector(w.routerBias, what: "router_bias")
        selectionBias = try vector(w.selectionBias, what: "selection_bias")
        perExpertScale = try vector(w.perExpertScale, what: "per_expert_scale")
        switch w.gateUp {
        case .fused(let fused):
            gate = try matrix(fused, rows: 2 * i, cols: c.hiddenSize, what: "gate_up_proj")
            up = gate.offset(by: i)
        case .separate(let g, let u):
            gate = try matrix(g, rows: i, cols: c.hiddenSize, what: "gate_proj")
            up = try matrix(u, rows: i, cols: c.hiddenSize, what: "up_proj")
        }
        gateUpBias = try vector(w.gateUpBias, what: "gate_up_bias")
        down = try matrix(w.downProj, rows: c.hiddenSize, cols: i, what: "down_proj")
        downBias = try vector(w.downBias, what: "down_bias")
        if let s = w.shared {
            let si = c.sharedIntermediateSize
            shared = (try matrix(s.gateProj, rows: si, cols: c.hiddenSize, what: "shared_expert gate_proj"),
                      try matrix(s.upProj, rows: si, cols: c.hiddenSize, what: "shared_expert up_proj"),
                      try matrix(s.downProj, rows: c.hiddenSize, cols: si, what: "shared_expert down_proj"))
            sharedGate = try vector(s.sigmoidGate, what: "shared_expert sigmoid_gate")
        } else {
            shared = nil
            sharedGate = nil
        }

        mappedRanges = mappings.wrappedRanges
        q8 = Q8Inputs(c, gate: gate, up: up, down: down, shared: shared)
        pipelines = Pipelines(router: try context.pipeline(MetalKernels.router(router.kernelSuffix), threads: MOE_ROUTER_THREADS),
                              routerGemv: try context.pipeline(MetalKernels.routerGemv(router.kernelSuffix),
                                                               threads: MOE_ROUTER_GEMV_THREADS),
                              routed: try Experts(context, gate: gate, up: up, down: down),
                              shared: try shared.map { try Experts(context, gate: $0.gate, up: $0.up, down: $0.down) },
                              quantize: q8.any ? try context.pipeline(MetalKernels.quantizeQ8, threads: MOE_CONVERT_THREADS)
                                               : nil)
    }

    func makePass(input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?) throws -> any MoEPass {
        try MetalPass(backend: self, input: input, tokens: tokens, inputNorm: inputNorm)
    }

    func makeStackSession(input: UnsafePointer<Float>, tokens: Int, hiddenSize: Int,
                          output: UnsafeMutablePointer<Float>) throws -> any MoEStackSession {
        try MetalStackSession(self, input: input, tokens: tokens, output: output)
    }

    /// A scratch set for `tokens` tokens from the pool (allocating only when none fits).
    func checkOutScratch(tokens: Int) throws -> MetalScratch {
        try pool.checkOut(tokens: tokens) { capacity in
            try MetalScratch(context: context, configuration: configuration, capacity: capacity, quantizedX: q8.x())
        }
    }
}
