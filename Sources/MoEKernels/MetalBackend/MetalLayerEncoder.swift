#if canImport(Metal)
import Metal
#elseif canImport(SoftMetal)
import SoftMetal
#endif
import CMoESwift

#if canImport(Metal) || canImport(SoftMetal)
/// Encodes one layer's stages into a compute encoder; nothing runs until the command
/// buffer is committed, and nothing here waits. Dispatches per forward:
///   decode (tokens <= MOE_DECODE_MAX_TOKENS): router, gate/up GEMV, down GEMV, combine = 4
///   prefill: router, bucket, gate/up GEMM, down GEMM (both indirect), combine = 5
///   a shared expert adds its gate/up and down through the same kernels = +2.
struct MetalLayerEncoder {
    let backend: MetalBackend
    let encoder: any MTLComputeCommandEncoder
    let scratch: MetalScratch
    let tokens: Int
    /// The layer's input (tokens, H).
    let x: any MTLBuffer

    var context: MetalContext { backend.context }
    var configuration: MoEConfiguration { backend.configuration }
    var decode: Bool { tokens <= Int(MOE_DECODE_MAX_TOKENS) }

    // MARK: Stages

    func route() {
        let c = configuration
        let e = c.numExperts
        // Tokens per threadgroup: up to MOE_ROUTER_MAX_TOKENS, with their logits, scores and
        // selection scores within 24 KiB of threadgroup memory.
        let perGroup = Swift.max(1, Swift.min(tokens, Int(MOE_ROUTER_MAX_TOKENS), 6144 / (3 * e + 1)))
        var p = moe_router_params()
        p.tokens = UInt32(tokens)
        p.hidden = UInt32(c.hiddenSize)
        p.experts = UInt32(e)
        p.top_k = UInt32(c.topK)
        p.scoring = UInt32(c.scoring.rawValue)
        p.norm_topk_prob = c.normTopKProb ? 1 : 0
        p.routed_scaling_factor = c.routedScalingFactor
        p.n_group = UInt32(c.nGroup)
        p.topk_group = UInt32(c.topKGroup)
        p.has_router_bias = backend.routerBias == nil ? 0 : 1
        p.has_selection_bias = backend.selectionBias == nil ? 0 : 1
        p.has_per_expert_scale = backend.perExpertScale == nil ? 0 : 1
        p.has_shared_gate = backend.sharedGate == nil ? 0 : 1
        p.tokens_per_group = UInt32(perGroup)
        p.logit_stride = UInt32(e + 1)
        encoder.setComputePipelineState(context.router)
        setParams(&p)
        bind([x, backend.router, backend.routerBias, backend.selectionBias, backend.perExpertScale,
              backend.sharedGate, scratch.ids, scratch.weights, scratch.sharedFactor], from: 1)
        encoder.setThreadgroupMemoryLength(roundUp16(perGroup * (e + 1 + 2 * e) * 4), index: 0)
        dispatch(groups: ((tokens + perGroup - 1) / perGroup, 1), threads: MOE_ROUTER_THREADS)
    }

    /// Prefill only: the pairs bucketed by expert, for both GEMMs.
    func groupPairsByExpert() {
        if decode { return }
        let c = configuration
        var p = moe_bucket_params()
        p.pairs = UInt32(tokens * c.topK)
        p.experts = UInt32(c.numExperts)
        p.gate_up_column_tiles = UInt32(columnTiles(c.intermediateSize))
        p.down_column_tiles = UInt32(columnTiles(c.hiddenSize))
        encoder.setComputePipelineState(context.bucket)
        setParams(&p)
        bind([scratch.ids, scratch.offsets, scratch.rows, scratch.tiles, scratch.dispatchArgs], from: 1)
        encoder.setThreadgroupMemoryLength(roundUp16(24 * c.numExperts), index: 0)
        dispatch(groups: (1, 1), threads: MOE_BUCKET_THREADS)
    }

    func gateUp() {
        let c = configuration
        var p = ffnParams(shared: false, inner: c.intermediateSize)
        p.has_bias = backend.gateUpBias == nil ? 0 : 1
        if decode {
            encoder.setComputePipelineState(context.gateUpGemv)
            setParams(&p)
            bind([x, backend.gateUp, backend.gateUpBias, scratch.act, scratch.ids], from: 1)
            dispatch(groups: (rowGroups(c.intermediateSize), tokens * c.topK), threads: MOE_GEMV_THREADS)
        } else {
            encoder.setComputePipelineState(context.gateUpGemm)
            setParams(&p)
            bind([x, backend.gateUp, backend.gateUpBias, scratch.act, scratch.rows, scratch.tiles, scratch.offsets], from: 1)
            dispatchIndirect(offset: 0, threads: MOE_GEMM_THREADS)
        }
        if let weights = backend.sharedGateUp, let act = scratch.sharedAct {
            var s = ffnParams(shared: true, inner: c.sharedIntermediateSize)
            encoder.setComputePipelineState(decode ? context.gateUpGemv : context.gateUpGemm)
            setParams(&s)
            bind([x, weights, nil, act, nil, nil, nil], from: 1)
            dispatch(groups: decode ? (rowGroups(c.sharedIntermediateSize), 1) : sharedTiles(c.sharedIntermediateSize),
                     threads: decode ? MOE_GEMV_THREADS : MOE_GEMM_THREADS)
        }
    }

    func down() {
        let c = configuration
        var p = ffnParams(shared: false, inner: c.intermediateSize)
        p.has_bias = backend.downBias == nil ? 0 : 1
        if decode {
            encoder.setComputePipelineState(context.downGemv)
            setParams(&p)
            bind([scratch.act, backend.down, backend.downBias, scratch.pairOut, scratch.ids, nil, nil, scratch.weights], from: 1)
            dispatch(groups: (rowGroups(c.hiddenSize), tokens * c.topK), threads: MOE_GEMV_THREADS)
        } else {
            encoder.setComputePipelineState(context.downGemm)
            setParams(&p)
            bind([scratch.act, backend.down, backend.downBias, scratch.pairOut, scratch.rows, scratch.tiles,
                  scratch.offsets, scratch.weights], from: 1)
            dispatchIndirect(offset: 16, threads: MOE_GEMM_THREADS)
        }
        if let weights = backend.sharedDown, let act = scratch.sharedAct, let out = scratch.sharedOut {
            var s = ffnParams(shared: true, inner: c.sharedIntermediateSize)
            encoder.setComputePipelineState(decode ? context.downGemv : context.downGemm)
            setParams(&s)
            bind([act, weights, nil, out, nil, nil, nil, scratch.sharedFactor], from: 1)
            dispatch(groups: decode ? (rowGroups(c.hiddenSize), 1) : sharedTiles(c.hiddenSize),
                     threads: decode ? MOE_GEMV_THREADS : MOE_GEMM_THREADS)
        }
    }

    /// `output = sum of slots + shared + residual`; `output` may be `residual` or `x`.
    func combine(residual: (any MTLBuffer)?, output: any MTLBuffer) {
        let c = configuration
        var p = moe_combine_params()
        p.tokens = UInt32(tokens)
        p.hidden = UInt32(c.hiddenSize)
        p.top_k = UInt32(c.topK)
        p.has_shared = scratch.sharedOut == nil ? 0 : 1
        p.has_residual = residual == nil ? 0 : 1
        encoder.setComputePipelineState(context.combine)
        setParams(&p)
        bind([scratch.pairOut, scratch.sharedOut, residual, output], from: 1)
        let threads = Int(MOE_COMBINE_THREADS)
        dispatch(groups: ((c.hiddenSize + threads - 1) / threads, tokens), threads: MOE_COMBINE_THREADS)
    }

    // MARK: Helpers

    private func ffnParams(shared: Bool, inner: Int) -> moe_ffn_params {
        let c = configuration
        var p = moe_ffn_params()
        p.tokens = UInt32(tokens)
        p.hidden = UInt32(c.hiddenSize)
        p.inner = UInt32(inner)
        p.top_k = shared ? 1 : UInt32(c.topK)
        p.mode = UInt32(shared ? MOE_FFN_SHARED : MOE_FFN_ROUTED)
        p.activation = UInt32(c.activation.rawValue)
        p.swiglu_alpha = c.swigluAlpha
        p.swiglu_limit = c.swigluLimit
        return p
    }

    private func rowGroups(_ rows: Int) -> Int { (rows + Int(MOE_GEMV_ROWS) - 1) / Int(MOE_GEMV_ROWS) }
    private func columnTiles(_ n: Int) -> Int { (n + Int(MOE_GEMM_BN) - 1) / Int(MOE_GEMM_BN) }
    private func sharedTiles(_ n: Int) -> (Int, Int) {
        ((tokens + Int(MOE_GEMM_BM) - 1) / Int(MOE_GEMM_BM), columnTiles(n))
    }
    private func roundUp16(_ bytes: Int) -> Int { (bytes + 15) / 16 * 16 }

    private func setParams<P>(_ params: inout P) {
        withUnsafeBytes(of: &params) { encoder.setBytes($0.baseAddress!, length: $0.count, index: 0) }
    }

    /// Buffers at consecutive indices; absent ones get the placeholder (never read).
    private func bind(_ buffers: [(any MTLBuffer)?], from first: Int) {
        for (n, buffer) in buffers.enumerated() {
            encoder.setBuffer(buffer ?? context.placeholder, offset: 0, index: first + n)
        }
    }

    private func dispatch(groups: (Int, Int), threads: Int32) {
        encoder.dispatchThreadgroups(MTLSize(width: groups.0, height: groups.1, depth: 1),
                                     threadsPerThreadgroup: MTLSize(width: Int(threads), height: 1, depth: 1))
        CallStats.dispatch()
    }

    private func dispatchIndirect(offset: Int, threads: Int32) {
        encoder.dispatchThreadgroups(indirectBuffer: scratch.dispatchArgs, indirectBufferOffset: offset,
                                     threadsPerThreadgroup: MTLSize(width: Int(threads), height: 1, depth: 1))
        CallStats.dispatch()
    }
}
#endif
