import CMoESwift

/// Encodes one layer's stages into a compute encoder; nothing runs until the command
/// buffer is committed, and nothing here waits. Dispatches per forward:
///   decode (tokens <= MOE_DECODE_MAX_TOKENS): router logits (a mat-vec), router top-k,
///     gate/up GEMV, down GEMV, combine = 5
///   prefill: router, bucket, gate/up GEMM, down GEMM (both indirect), combine = 5
///   a shared expert adds its gate/up and down through the same kernels = +2;
///   the experts-only call (routing given, uploaded with the input) has no router and no
///   shared expert: 3 in decode, 4 in prefill;
///   8-bit activations add one `moe_quantize_q8` before the gate/up products that take
///   them (x's grid values, once for routed and shared) and one before each down product
///   that takes them (in place); a gate/up pair of which only one is quantized takes two
///   gate/up dispatches (MOE_GATE_UP_KEEP_GATE).
/// The norms of a decoder block cost no dispatch: the input norm runs in the router, the
/// next layer's norm in the combine.
struct MetalLayerEncoder {
    let backend: MetalBackend
    let encoder: any MTLComputeCommandEncoder
    let scratch: MetalScratch
    let tokens: Int
    /// The layer's input (tokens, H).
    let x: MetalBinding
    /// The routing the expert stages read: the router's (in the scratch), or the caller's.
    var ids: MetalBinding
    var routingWeights: MetalBinding
    /// False for the experts-only call (routing given): no shared expert.
    var withShared = true
    /// A memory barrier before each dispatch: a caller's concurrent encoder (MLX keeps one
    /// open per stream) orders nothing by itself, and every stage reads what the one
    /// before it wrote (the first, what the caller's kernels wrote).
    var barriers = false
    /// The input norm (its weight already in `scratch.inputNormWeight`): the router writes
    /// the normalised rows to `scratch.xNormed`, which the expert stages then read.
    var inputNorm: RMSNorm?

    init(backend: MetalBackend, encoder: any MTLComputeCommandEncoder, scratch: MetalScratch, tokens: Int, x: MetalBinding) {
        self.backend = backend
        self.encoder = encoder
        self.scratch = scratch
        self.tokens = tokens
        self.x = x
        ids = MetalBinding(scratch.ids)
        routingWeights = MetalBinding(scratch.weights)
    }

    /// What the expert stages read.
    var input: MetalBinding { inputNorm == nil ? x : MetalBinding(scratch.xNormed) }

    var context: MetalContext { backend.context }
    var configuration: MoEConfiguration { backend.configuration }
    var decode: Bool { tokens <= Int(MOE_DECODE_MAX_TOKENS) }

    // MARK: Stages

    /// The router: in decode (1 ... MOE_DECODE_MAX_TOKENS tokens) two dispatches,
    /// `moe_router_gemv`, whose logits are a matrix-vector product over
    /// ceil(rows / MOE_ROUTER_GEMV_SIMDGROUPS) threadgroups, then `moe_router_topk`, a
    /// threadgroup per token (the logits cross threadgroups only between dispatches, the
    /// one ordering MSL gives on every OS); otherwise `moe_router`, one dispatch of a
    /// threadgroup per MOE_ROUTER_MAX_TOKENS tokens, each reading the whole router
    /// weight. The same routing bit for bit.
    func route() {
        let c = configuration
        let e = c.numExperts
        let gemv = tokens >= 1 && decode
        // moe_router's tokens per threadgroup: up to MOE_ROUTER_MAX_TOKENS, with their
        // logits, scores and selection scores within 24 KiB of threadgroup memory.
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
        p.weight = backend.router.desc
        if let inputNorm {
            p.has_input_norm = 1
            p.input_norm_eps = inputNorm.eps
            p.input_norm_offset = inputNorm.offset
        }
        encoder.setComputePipelineState(gemv ? backend.pipelines.routerGemv : backend.pipelines.router)
        setParams(&p)
        set(MOE_ROUTER_BUF_X, x)
        set(backend.router, codes: MOE_ROUTER_BUF_W, scales: MOE_ROUTER_BUF_W_SCALES, biases: MOE_ROUTER_BUF_W_BIASES)
        set(MOE_ROUTER_BUF_ROUTER_BIAS, backend.routerBias)
        set(MOE_ROUTER_BUF_SELECTION_BIAS, backend.selectionBias)
        set(MOE_ROUTER_BUF_EXPERT_SCALE, backend.perExpertScale)
        set(MOE_ROUTER_BUF_SHARED_GATE, backend.sharedGate)
        set(MOE_ROUTER_BUF_IDS, scratch.ids)
        set(MOE_ROUTER_BUF_WEIGHTS, scratch.weights)
        set(MOE_ROUTER_BUF_SHARED_FACTOR, scratch.sharedFactor)
        set(MOE_ROUTER_BUF_NORM_WEIGHT, inputNorm == nil ? nil : scratch.inputNormWeight)
        set(MOE_ROUTER_BUF_X_NORMED, inputNorm == nil ? nil : scratch.xNormed)
        if gemv {
            set(MOE_ROUTER_BUF_LOGITS, scratch.routerLogits)
            let rows = e + (backend.sharedGate == nil ? 0 : 1), perThreadgroup = Int(MOE_ROUTER_GEMV_SIMDGROUPS)
            dispatch(groups: ((rows + perThreadgroup - 1) / perThreadgroup, 1), threads: MOE_ROUTER_GEMV_THREADS)
            // The bindings of the first dispatch stay; the top-k reads only some of them.
            encoder.setComputePipelineState(context.routerTopK)
            dispatch(groups: (tokens, 1), threads: MOE_SIMD_WIDTH, threadgroupMemory: roundUp16((e + 1 + 2 * e) * 4))
        } else {
            dispatch(groups: ((tokens + perGroup - 1) / perGroup, 1), threads: MOE_ROUTER_THREADS,
                     threadgroupMemory: roundUp16(perGroup * (e + 1 + 2 * e) * 4))
        }
    }

    /// Prefill only: the pairs bucketed by expert, for both GEMMs.
    func groupPairsByExpert() {
        if decode { return }
        let c = configuration
        var p = moe_bucket_params()
        p.pairs = UInt32(tokens * c.topK)
        p.experts = UInt32(c.heldExperts.count)
        p.expert_base = UInt32(c.heldExperts.first)
        p.expert_stride = UInt32(c.heldExperts.stride)
        p.gate_up_column_tiles = UInt32(columnTiles(c.intermediateSize, MOE_GEMM_GATE_UP_BN))
        p.down_column_tiles = UInt32(columnTiles(c.hiddenSize, MOE_GEMM_DOWN_BN))
        encoder.setComputePipelineState(context.bucket)
        setParams(&p)
        set(MOE_BUCKET_BUF_IDS, ids)
        set(MOE_BUCKET_BUF_OFFSETS, scratch.offsets)
        set(MOE_BUCKET_BUF_ROWS, scratch.rows)
        set(MOE_BUCKET_BUF_TILES, scratch.tiles)
        set(MOE_BUCKET_BUF_DISPATCH_ARGS, scratch.dispatchArgs)
        dispatch(groups: (1, 1), threads: MOE_BUCKET_THREADS, threadgroupMemory: roundUp16(24 * c.heldExperts.count))
    }

    func gateUp() {
        let c = configuration
        let q8 = backend.q8
        // x's grid values, once for every gate/up product (routed and shared) that takes them.
        let quantizeX = q8.x(withShared: withShared)
        let xq = quantizeX ? MetalBinding(scratch.xQuantized!) : input
        if quantizeX { quantize(input, rows: tokens, cols: c.hiddenSize, into: xq) }
        var p = ffnParams(shared: false, inner: c.intermediateSize)
        p.has_bias = backend.gateUpBias == nil ? 0 : 1
        p.w0 = backend.gate.desc
        p.w1 = backend.up.desc
        let routed = backend.pipelines.routed
        encoder.setComputePipelineState(decode ? routed.gateUpGemv : routed.gateUpGemm)
        set(backend.gate, codes: MOE_FFN_BUF_W0, scales: MOE_FFN_BUF_W0_SCALES, biases: MOE_FFN_BUF_W0_BIASES,
            experts: MOE_FFN_BUF_W0_EXPERTS)
        set(backend.up, codes: MOE_FFN_BUF_W1, scales: MOE_FFN_BUF_W1_SCALES, biases: MOE_FFN_BUF_W1_BIASES,
            experts: MOE_FFN_BUF_W1_EXPERTS)
        set(MOE_FFN_BUF_BIAS, backend.gateUpBias)
        set(MOE_FFN_BUF_OUTPUT, scratch.act)
        if decode {
            set(MOE_FFN_BUF_IDS, ids)
        } else {
            setBuckets()
        }
        dispatchGateUp(&p, gate: q8.gate ? xq : input, up: q8.up ? xq : input) {
            if decode {
                dispatch(groups: (rowGroups(c.intermediateSize), tokens * c.topK), threads: MOE_GEMV_THREADS)
            } else {
                dispatchIndirect(offset: 0, threads: MOE_GEMM_THREADS)
            }
        }
        if withShared, let weights = backend.shared, let kernels = backend.pipelines.shared, let act = scratch.sharedAct {
            var s = ffnParams(shared: true, inner: c.sharedIntermediateSize)
            s.w0 = weights.gate.desc
            s.w1 = weights.up.desc
            encoder.setComputePipelineState(decode ? kernels.gateUpGemv : kernels.gateUpGemm)
            set(weights.gate, codes: MOE_FFN_BUF_W0, scales: MOE_FFN_BUF_W0_SCALES, biases: MOE_FFN_BUF_W0_BIASES,
            experts: MOE_FFN_BUF_W0_EXPERTS)
            set(weights.up, codes: MOE_FFN_BUF_W1, scales: MOE_FFN_BUF_W1_SCALES, biases: MOE_FFN_BUF_W1_BIASES,
            experts: MOE_FFN_BUF_W1_EXPERTS)
            set(MOE_FFN_BUF_BIAS, nil)
            set(MOE_FFN_BUF_OUTPUT, act)
            // ids, rows, tiles and offsets are not read for the shared expert.
            dispatchGateUp(&s, gate: q8.sharedGate ? xq : input, up: q8.sharedUp ? xq : input) {
                dispatch(groups: decode ? (rowGroups(c.sharedIntermediateSize), 1)
                                        : sharedTiles(c.sharedIntermediateSize, MOE_GEMM_GATE_UP_BN),
                         threads: decode ? MOE_GEMV_THREADS : MOE_GEMM_THREADS)
            }
        }
    }

    /// A gate/up kernel (pipeline and weights bound) over `gate`'s and `up`'s inputs: one
    /// dispatch when they are the same rows, else two (MOE_GATE_UP_KEEP_GATE, then
    /// MOE_GATE_UP_WITH_KEPT_GATE), each with its input bound.
    private func dispatchGateUp(_ p: inout moe_ffn_params, gate: MetalBinding, up: MetalBinding, _ run: () -> Void) {
        if gate.isSame(as: up) {
            p.gate_up_pass = UInt32(MOE_GATE_UP_BOTH)
            setParams(&p)
            set(MOE_FFN_BUF_INPUT, gate)
            run()
            return
        }
        p.gate_up_pass = UInt32(MOE_GATE_UP_KEEP_GATE)
        setParams(&p)
        set(MOE_FFN_BUF_INPUT, gate)
        run()
        p.gate_up_pass = UInt32(MOE_GATE_UP_WITH_KEPT_GATE)
        setParams(&p)
        set(MOE_FFN_BUF_INPUT, up)
        run()
    }

    func down() {
        let c = configuration
        var p = ffnParams(shared: false, inner: c.intermediateSize)
        p.has_bias = backend.downBias == nil ? 0 : 1
        p.w0 = backend.down.desc
        if backend.q8.down { quantize(MetalBinding(scratch.act), rows: tokens * c.topK, cols: c.intermediateSize) }
        let routed = backend.pipelines.routed
        encoder.setComputePipelineState(decode ? routed.downGemv : routed.downGemm)
        setParams(&p)
        set(MOE_FFN_BUF_INPUT, scratch.act)
        set(backend.down, codes: MOE_FFN_BUF_W0, scales: MOE_FFN_BUF_W0_SCALES, biases: MOE_FFN_BUF_W0_BIASES,
            experts: MOE_FFN_BUF_W0_EXPERTS)
        set(MOE_FFN_BUF_BIAS, backend.downBias)
        set(MOE_FFN_BUF_OUTPUT, scratch.pairOut)
        set(MOE_FFN_BUF_ROW_WEIGHT, routingWeights)
        if decode {
            set(MOE_FFN_BUF_IDS, ids)
            dispatch(groups: (rowGroups(c.hiddenSize), tokens * c.topK), threads: MOE_GEMV_THREADS)
        } else {
            setBuckets()
            dispatchIndirect(offset: 16, threads: MOE_GEMM_THREADS)
        }
        if withShared, let weights = backend.shared, let kernels = backend.pipelines.shared,
           let act = scratch.sharedAct, let out = scratch.sharedOut {
            if backend.q8.sharedDown { quantize(MetalBinding(act), rows: tokens, cols: c.sharedIntermediateSize) }
            var s = ffnParams(shared: true, inner: c.sharedIntermediateSize)
            s.w0 = weights.down.desc
            encoder.setComputePipelineState(decode ? kernels.downGemv : kernels.downGemm)
            setParams(&s)
            set(MOE_FFN_BUF_INPUT, act)
            set(weights.down, codes: MOE_FFN_BUF_W0, scales: MOE_FFN_BUF_W0_SCALES, biases: MOE_FFN_BUF_W0_BIASES,
            experts: MOE_FFN_BUF_W0_EXPERTS)
            set(MOE_FFN_BUF_BIAS, nil)
            set(MOE_FFN_BUF_OUTPUT, out)
            set(MOE_FFN_BUF_ROW_WEIGHT, scratch.sharedFactor)
            dispatch(groups: decode ? (rowGroups(c.hiddenSize), 1) : sharedTiles(c.hiddenSize, MOE_GEMM_DOWN_BN),
                     threads: decode ? MOE_GEMV_THREADS : MOE_GEMM_THREADS)
        }
    }

    /// `output = sum of slots + shared + residual`; `output` may be `residual` or `x`.
    /// With `nextNorm` (its weight already in `scratch.nextNormWeight`), also
    /// `normed = nextNorm(output)`, one threadgroup per token.
    func combine(residual: MetalBinding?, output: MetalBinding, nextNorm: RMSNorm? = nil, normed: MetalBinding) {
        let c = configuration
        var p = moe_combine_params()
        p.tokens = UInt32(tokens)
        p.hidden = UInt32(c.hiddenSize)
        p.top_k = UInt32(c.topK)
        p.has_shared = withShared && scratch.sharedOut != nil ? 1 : 0
        p.has_residual = residual == nil ? 0 : 1
        p.experts = UInt32(c.heldExperts.count)
        p.expert_base = UInt32(c.heldExperts.first)
        p.expert_stride = UInt32(c.heldExperts.stride)
        if let nextNorm {
            p.has_next_norm = 1
            p.next_norm_eps = nextNorm.eps
            p.next_norm_offset = nextNorm.offset
        }
        encoder.setComputePipelineState(context.combine)
        setParams(&p)
        set(MOE_COMBINE_BUF_PAIR_OUT, scratch.pairOut)
        set(MOE_COMBINE_BUF_SHARED_OUT, scratch.sharedOut)
        set(MOE_COMBINE_BUF_RESIDUAL, residual ?? MetalBinding(context.placeholder))
        set(MOE_COMBINE_BUF_OUTPUT, output)
        set(MOE_COMBINE_BUF_NORM_WEIGHT, nextNorm == nil ? nil : scratch.nextNormWeight)
        set(MOE_COMBINE_BUF_NORMED, nextNorm == nil ? MetalBinding(context.placeholder) : normed)
        set(MOE_COMBINE_BUF_IDS, ids)
        let threads = Int(MOE_COMBINE_THREADS)
        let columnGroups = nextNorm == nil ? (c.hiddenSize + threads - 1) / threads : 1
        dispatch(groups: (columnGroups, tokens), threads: MOE_COMBINE_THREADS)
    }

    /// `tokens` rows of H between a caller's dtype and float32 through `kernel`, one of
    /// MetalContext.activationKernel's (a load reads the dtype and writes float32, a store
    /// the other way round).
    func convert(_ kernel: any MTLComputePipelineState, from source: MetalBinding, to destination: MetalBinding) {
        convert(kernel, from: source, to: destination, rows: tokens, cols: configuration.hiddenSize)
    }

    /// `rows` rows of `cols` float32 activations replaced by their 8-bit grid values
    /// (`moe_quantize_q8`), into `destination` (nil: in place).
    private func quantize(_ source: MetalBinding, rows: Int, cols: Int, into destination: MetalBinding? = nil) {
        convert(backend.pipelines.quantize!, from: source, to: destination ?? source, rows: rows, cols: cols)
    }

    private func convert(_ kernel: any MTLComputePipelineState, from source: MetalBinding, to destination: MetalBinding,
                         rows: Int, cols: Int) {
        var p = moe_convert_params()
        p.tokens = UInt32(rows)
        p.hidden = UInt32(cols)
        encoder.setComputePipelineState(kernel)
        setParams(&p)
        set(MOE_CONVERT_BUF_SRC, source)
        set(MOE_CONVERT_BUF_DST, destination)
        let threads = Int(MOE_CONVERT_THREADS)
        dispatch(groups: ((cols + threads - 1) / threads, rows), threads: MOE_CONVERT_THREADS)
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
        p.experts = UInt32(c.heldExperts.count)
        p.expert_base = UInt32(c.heldExperts.first)
        p.expert_stride = UInt32(c.heldExperts.stride)
        p.activation = UInt32(c.activation.rawValue)
        p.swiglu_alpha = c.swigluAlpha
        p.swiglu_limit = c.swigluLimit
        return p
    }

    private func rowGroups(_ rows: Int) -> Int { (rows + Int(MOE_GEMV_ROWS) - 1) / Int(MOE_GEMV_ROWS) }
    /// Column tiles of a GEMM with `n` outputs, `width` per threadgroup (MOE_GEMM_*_BN).
    private func columnTiles(_ n: Int, _ width: Int32) -> Int { (n + Int(width) - 1) / Int(width) }
    private func sharedTiles(_ n: Int, _ width: Int32) -> (Int, Int) {
        ((tokens + Int(MOE_GEMM_BM) - 1) / Int(MOE_GEMM_BM), columnTiles(n, width))
    }
    private func roundUp16(_ bytes: Int) -> Int { (bytes + 15) / 16 * 16 }

    /// The parameter struct, at index 0 in every kernel (`MOE_*_BUF_PARAMS`).
    private func setParams<P>(_ params: inout P) {
        withUnsafeBytes(of: &params) { encoder.setBytes($0.baseAddress!, length: $0.count, index: 0) }
    }

    /// `buffer` at `index`; an absent one gets the placeholder (never read).
    private func set(_ index: Int32, _ buffer: (any MTLBuffer)?) {
        encoder.setBuffer(buffer ?? context.placeholder, offset: 0, index: Int(index))
    }

    /// A range of a buffer at `index`.
    private func set(_ index: Int32, _ binding: MetalBinding) {
        encoder.setBuffer(binding.buffer, offset: binding.offset, index: Int(index))
    }

    /// A weight's codes, scales and biases (the placeholder for those its format lacks),
    /// each part at its offset, and at `experts` its per-expert table (moe_expert_parts;
    /// the placeholder for a stacked weight, whose kernels do not read it).
    private func set(_ weight: MetalWeight, codes: Int32, scales: Int32, biases: Int32, experts: Int32? = nil) {
        for (index, part) in [(codes, weight.codes), (scales, weight.scales), (biases, weight.biases)] {
            encoder.setBuffer(part?.buffer ?? context.placeholder, offset: part?.offset ?? 0, index: Int(index))
        }
        if let experts { set(experts, weight.experts) }
    }

    /// Prefill: the buckets of moe_bucket for a routed GEMM.
    private func setBuckets() {
        set(MOE_FFN_BUF_ROWS, scratch.rows)
        set(MOE_FFN_BUF_TILES, scratch.tiles)
        set(MOE_FFN_BUF_OFFSETS, scratch.offsets)
    }

    private func dispatch(groups: (Int, Int), threads: Int32) {
        if barriers { encoder.memoryBarrier(scope: .buffers) }
        encoder.dispatchThreadgroups(MTLSize(width: groups.0, height: groups.1, depth: 1),
                                     threadsPerThreadgroup: MTLSize(width: Int(threads), height: 1, depth: 1))
        CallStats.dispatch()
    }

    /// A dispatch with `threadgroupMemory` bytes at threadgroup(0), reset to 0 afterwards:
    /// an encoder keeps the length for later dispatches (on Metal too), where it would
    /// count against their 32 KiB (the bucket kernel's 24 B per expert broke the GEMMs
    /// after it for E >= 790).
    private func dispatch(groups: (Int, Int), threads: Int32, threadgroupMemory: Int) {
        encoder.setThreadgroupMemoryLength(threadgroupMemory, index: 0)
        dispatch(groups: groups, threads: threads)
        encoder.setThreadgroupMemoryLength(0, index: 0)
    }

    private func dispatchIndirect(offset: Int, threads: Int32) {
        if barriers { encoder.memoryBarrier(scope: .buffers) }
        encoder.dispatchThreadgroups(indirectBuffer: scratch.dispatchArgs, indirectBufferOffset: offset,
                                     threadsPerThreadgroup: MTLSize(width: Int(threads), height: 1, depth: 1))
        CallStats.dispatch()
    }
}
