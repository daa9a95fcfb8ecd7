import CMoECPU

/// The CPU backend: BLAS for float32 matrix products, format kernels (CMoECPU) for the
/// others, Dispatch over fixed work items.
final class CPUBackend: MoEBackend, @unchecked Sendable {
    let kind = MoEBackendKind.cpu
    let configuration: MoEConfiguration
    let router: WeightMatrix                        // (E, H)
    let routerBias: AlignedBuffer<Float>?
    let selectionBias: AlignedBuffer<Float>?
    let perExpertScale: AlignedBuffer<Float>?
    let experts: PackedFFN                          // the routed experts held (all E, or a share)
    let shared: PackedFFN?                          // one FFN of width Is
    let sharedGate: AlignedBuffer<Float>?           // (H)
    let scratch = ScratchPool()
    /// Dequantized weight tiles of prefill work items (one per running item).
    let tiles = ScratchPool()

    /// Bytes the weights' copies take: every matrix part not read in place from its
    /// mapping (see `WeightMatrix.inPlace` for `repack`), and the vectors (read as float32).
    static func copiedBytes(_ c: MoEConfiguration, _ w: MoEWeights, repack: Bool = true) -> Int {
        let vectors = [w.routerBias, w.selectionBias, w.perExpertScale, w.gateUpBias, w.downBias, w.shared?.sigmoidGate]
        return w.matrices.reduce(0) { $0 + WeightMatrix.copiedBytes($1, repack: repack) }
            + vectors.reduce(0) { $0 + ($1?.count ?? 0) * MemoryLayout<Float>.stride }
    }

    /// Mapped 4-bit weights are repacked for the fast kernels when the copies fit; when
    /// they do not, the generic kernels read them in place, so that a mapped layer larger
    /// than memory still loads.
    init(configuration c: MoEConfiguration, weights w: MoEWeights, memoryLimit: Int? = nil) throws {
        let repack = MemoryBudget.fits(Self.copiedBytes(c, w, repack: true), limit: memoryLimit)
        try MemoryBudget.check(needed: Self.copiedBytes(c, w, repack: repack), limit: memoryLimit,
                               what: "this layer on the cpu backend")
        _ = MatrixProduct.configured
        configuration = c
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        router = try WeightMatrix(w.router, rows: e, cols: h, repack: repack, what: "router_weight")
        routerBias = try w.routerBias.map { try AlignedBuffer(copying: $0, what: "router_bias") }
        selectionBias = try w.selectionBias.map { try AlignedBuffer(copying: $0, what: "selection_bias") }
        perExpertScale = try w.perExpertScale.map { try AlignedBuffer(copying: $0, what: "per_expert_scale") }
        experts = try PackedFFN(count: c.heldExperts.count, hidden: h, inner: i, gateUp: w.gateUp, down: w.downProj,
                                gateUpBias: w.gateUpBias, downBias: w.downBias, repack: repack, what: "expert")
        if let s = w.shared {
            shared = try PackedFFN(count: 1, hidden: h, inner: c.sharedIntermediateSize,
                                   gateUp: .separate(gate: s.gateProj, up: s.upProj), down: s.downProj,
                                   gateUpBias: nil, downBias: nil, repack: repack, what: "shared expert")
            sharedGate = try s.sigmoidGate.map { try AlignedBuffer(copying: $0, what: "shared_expert.sigmoid_gate") }
        } else {
            shared = nil
            sharedGate = nil
        }
    }

    func makePass(input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?) throws -> any MoEPass {
        // Workers asleep since an earlier call (a model runs attention between MoE layers)
        // wake while this thread routes the tokens, not when the first parallel stage
        // starts, so that the wake-up overlaps the routing instead of adding to the call.
        moe_cpu_pool_prepare()
        return try CPUPass(backend: self, input: input, tokens: tokens, inputNorm: inputNorm)
    }

    var tokenRouter: TokenRouter {
        let c = configuration
        return TokenRouter(numExperts: c.numExperts, topK: c.topK, scoring: c.scoring,
                           normTopKProb: c.normTopKProb, routedScalingFactor: c.routedScalingFactor,
                           nGroup: c.nGroup, topKGroup: c.topKGroup,
                           selectionBias: selectionBias.map { UnsafePointer($0.pointer) },
                           perExpertScale: perExpertScale.map { UnsafePointer($0.pointer) })
    }
}
