/// The CPU backend: BLAS for every matrix product, Dispatch over fixed work items.
final class CPUBackend: MoEBackend, @unchecked Sendable {
    let kind = MoEBackendKind.cpu
    let configuration: MoEConfiguration
    let router: AlignedBuffer<Float>                // (E, H)
    let routerBias: AlignedBuffer<Float>?
    let selectionBias: AlignedBuffer<Float>?
    let perExpertScale: AlignedBuffer<Float>?
    let experts: PackedFFN                          // E routed experts
    let shared: PackedFFN?                          // one FFN of width Is
    let sharedGate: AlignedBuffer<Float>?           // (H)
    let scratch = ScratchPool()

    init(configuration c: MoEConfiguration, weights w: MoEWeights) throws {
        _ = BLAS.configured
        configuration = c
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)
        router = try AlignedBuffer(copying: w.router, what: "router_weight")
        routerBias = try w.routerBias.map { try AlignedBuffer(copying: $0, what: "router_bias") }
        selectionBias = try w.selectionBias.map { try AlignedBuffer(copying: $0, what: "selection_bias") }
        perExpertScale = try w.perExpertScale.map { try AlignedBuffer(copying: $0, what: "per_expert_scale") }

        func pack(gate: UnsafePointer<Float>, up: UnsafePointer<Float>, stride: Int) throws -> PackedFFN {
            try w.gateUpBias.withOptionalBuffer { bias in
                try w.downProj.withUnsafeBufferPointer { down in
                    try w.downBias.withOptionalBuffer { downBias in
                        try PackedFFN(count: e, hidden: h, inner: i, gate: gate, up: up, expertStride: stride,
                                      gateBias: bias?.baseAddress, upBias: bias?.baseAddress.map { $0 + i },
                                      biasStride: 2 * i, down: down, downBias: downBias, what: "expert")
                    }
                }
            }
        }
        switch w.gateUp {
        case .separate(let gate, let up):
            experts = try gate.withUnsafeBufferPointer { g in
                try up.withUnsafeBufferPointer { u in try pack(gate: g.baseAddress!, up: u.baseAddress!, stride: i * h) }
            }
        case .fused(let gateUp):
            experts = try gateUp.withUnsafeBufferPointer { gu in
                try pack(gate: gu.baseAddress!, up: gu.baseAddress! + i * h, stride: 2 * i * h)
            }
        }

        if let s = w.shared {
            let si = c.sharedIntermediateSize
            shared = try s.gateProj.withUnsafeBufferPointer { g in
                try s.upProj.withUnsafeBufferPointer { u in
                    try s.downProj.withUnsafeBufferPointer { d in
                        try PackedFFN(count: 1, hidden: h, inner: si, gate: g.baseAddress!, up: u.baseAddress!,
                                      expertStride: 0, gateBias: nil, upBias: nil, biasStride: 0,
                                      down: d, downBias: nil, what: "shared expert")
                    }
                }
            }
            sharedGate = try s.sigmoidGate.map { try AlignedBuffer(copying: $0, what: "shared_expert.sigmoid_gate") }
        } else {
            shared = nil
            sharedGate = nil
        }
    }

    func makePass(input: UnsafePointer<Float>, tokens: Int) throws -> any MoEPass {
        try CPUPass(backend: self, input: input, tokens: tokens)
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

extension Optional where Wrapped == WeightData {
    func withOptionalBuffer<R>(_ body: (UnsafeBufferPointer<Float>?) throws -> R) rethrows -> R {
        switch self {
        case .some(let data): return try data.withUnsafeBufferPointer { try body($0) }
        case .none: return try body(nil)
        }
    }
}
