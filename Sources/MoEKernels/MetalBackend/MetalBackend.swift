#if canImport(Metal)
import Metal
#elseif canImport(SoftMetal)
import SoftMetal
#endif
import CMoESwift

#if canImport(Metal) || canImport(SoftMetal)
/// The Metal backend: the weights live in device buffers, uploaded once at creation; a
/// forward is one command buffer with one compute encoder and one wait (MetalPass), its
/// buffers come from a pool. The same code is the "metal" backend on Apple GPUs and the
/// "softmetal" backend on SoftMetal (Linux).
final class MetalBackend: MoEBackend, @unchecked Sendable {
    let kind: MoEBackendKind
    let context: MetalContext
    let configuration: MoEConfiguration

    let router: any MTLBuffer                 // (E, H)
    let routerBias: (any MTLBuffer)?          // (E)
    let selectionBias: (any MTLBuffer)?       // (E)
    let perExpertScale: (any MTLBuffer)?      // (E)
    let gateUp: any MTLBuffer                 // (E, 2I, H): gate rows, then up rows
    let gateUpBias: (any MTLBuffer)?          // (E, 2I)
    let down: any MTLBuffer                   // (E, H, I)
    let downBias: (any MTLBuffer)?            // (E, H)
    let sharedGateUp: (any MTLBuffer)?        // (2Is, H)
    let sharedDown: (any MTLBuffer)?          // (H, Is)
    let sharedGate: (any MTLBuffer)?          // (H)
    let pool = MetalBufferPool()

    init(configuration c: MoEConfiguration, weights w: MoEWeights) throws {
        let context = try MetalContext.shared()
        kind = MetalContext.kind
        guard c.numExperts <= Int(MOE_MAX_EXPERTS) else {
            throw MoEError.invalidArgument(
                "the \(MetalContext.kind.name) backend supports at most \(MOE_MAX_EXPERTS) experts, got \(c.numExperts)")
        }
        self.context = context
        configuration = c
        let (e, h, i) = (c.numExperts, c.hiddenSize, c.intermediateSize)

        func upload(_ parts: [(data: WeightData, offset: Int, count: Int)], total: Int, what: String) throws -> any MTLBuffer {
            let buffer = try context.makeBuffer(floats: total, what: what)
            let base = buffer.contents().assumingMemoryBound(to: Float.self)
            for part in parts {
                part.data.withUnsafeBufferPointer { src in
                    (base + part.offset).update(from: src.baseAddress!, count: part.count)
                }
            }
            return buffer
        }
        func upload(_ data: WeightData, what: String) throws -> any MTLBuffer {
            try upload([(data, 0, data.count)], total: data.count, what: what)
        }
        func uploadOptional(_ data: WeightData?, what: String) throws -> (any MTLBuffer)? {
            try data.map { try upload($0, what: what) }
        }

        router = try upload(w.router, what: "router_weight")
        routerBias = try uploadOptional(w.routerBias, what: "router_bias")
        selectionBias = try uploadOptional(w.selectionBias, what: "selection_bias")
        perExpertScale = try uploadOptional(w.perExpertScale, what: "per_expert_scale")
        switch w.gateUp {
        case .fused(let fused):
            gateUp = try upload(fused, what: "gate_up_proj")
        case .separate(let gate, let up):
            // Per expert: its I gate rows, then its I up rows.
            var parts: [(data: WeightData, offset: Int, count: Int)] = []
            let block = i * h
            gateUp = try gate.withUnsafeBufferPointer { g in
                try up.withUnsafeBufferPointer { u in
                    for x in 0..<e {
                        parts.append((.borrowed(UnsafeBufferPointer(rebasing: g[x * block..<(x + 1) * block])), 2 * x * block, block))
                        parts.append((.borrowed(UnsafeBufferPointer(rebasing: u[x * block..<(x + 1) * block])), (2 * x + 1) * block, block))
                    }
                    return try upload(parts, total: 2 * e * block, what: "gate_proj and up_proj")
                }
            }
        }
        gateUpBias = try uploadOptional(w.gateUpBias, what: "gate_up_bias")
        down = try upload(w.downProj, what: "down_proj")
        downBias = try uploadOptional(w.downBias, what: "down_bias")
        if let s = w.shared {
            let block = c.sharedIntermediateSize * h
            sharedGateUp = try upload([(s.gateProj, 0, block), (s.upProj, block, block)], total: 2 * block,
                                      what: "shared_expert gate_proj and up_proj")
            sharedDown = try upload(s.downProj, what: "shared_expert down_proj")
            sharedGate = try uploadOptional(s.sigmoidGate, what: "shared_expert sigmoid_gate")
        } else {
            sharedGateUp = nil
            sharedDown = nil
            sharedGate = nil
        }
    }

    func makePass(input: UnsafePointer<Float>, tokens: Int) throws -> any MoEPass {
        try MetalPass(backend: self, input: input, tokens: tokens)
    }

    /// A scratch set for `tokens` tokens from the pool (allocating only when none fits).
    func checkOutScratch(tokens: Int) throws -> MetalScratch {
        try pool.checkOut(tokens: tokens) { capacity in
            try MetalScratch(context: context, configuration: configuration, capacity: capacity)
        }
    }
}
#endif

#if canImport(Metal) || canImport(SoftMetal)
extension MetalBackend {
    /// `x_{i+1} = x_i + layer_i(x_i)` for every layer in one command buffer and one encoder,
    /// with one wait at the end. x lives in one device buffer, updated in place by each
    /// layer's combine (its residual is x itself).
    static func runLayers(_ layers: [MetalBackend], _ input: UnsafePointer<Float>, tokens: Int,
                          into output: UnsafeMutablePointer<Float>) throws {
        let context = layers[0].context
        var scratches: [MetalScratch] = []
        defer { for (layer, scratch) in zip(layers, scratches) { layer.pool.checkIn(scratch) } }
        for layer in layers { scratches.append(try layer.checkOutScratch(tokens: tokens)) }
        let count = tokens * layers[0].configuration.hiddenSize
        let x = scratches[0].x
        x.contents().copyMemory(from: input, byteCount: count * MemoryLayout<Float>.stride)
        guard let commandBuffer = context.queue.makeCommandBuffer(),
              let encoder = commandBuffer.makeComputeCommandEncoder() else {
            throw MoEError.internalError("the \(MetalContext.kind.name) backend could not create a command buffer")
        }
        for (layer, scratch) in zip(layers, scratches) {
            let stages = MetalLayerEncoder(backend: layer, encoder: encoder, scratch: scratch, tokens: tokens, x: x)
            stages.route()
            stages.groupPairsByExpert()
            stages.gateUp()
            stages.down()
            stages.combine(residual: x, output: x)
        }
        try MetalPass.run(commandBuffer, encoder: encoder, kind: MetalContext.kind)
        output.update(from: x.contents().assumingMemoryBound(to: Float.self), count: count)
    }
}
#endif
