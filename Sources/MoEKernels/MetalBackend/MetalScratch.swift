import CMoESwift

/// The device buffers of one forward, sized for up to `capacity` tokens.
final class MetalScratch {
    let capacity: Int
    /// (capacity, H): the input; the combine writes the output over it.
    let x: any MTLBuffer
    /// (capacity, H): the caller's residual, when there is one.
    let residual: any MTLBuffer
    /// Router outputs: (capacity * k) ids and weights, (capacity) shared-expert factors.
    let ids: any MTLBuffer
    let weights: any MTLBuffer
    let sharedFactor: any MTLBuffer
    /// The decode router's logits (capacity, E + 1), from its mat-vec to its top-k.
    let routerLogits: any MTLBuffer
    /// Buckets (prefill): (E + 1) offsets, (capacity * k) rows, tiles, indirect arguments.
    let offsets: any MTLBuffer
    let rows: any MTLBuffer
    let tiles: any MTLBuffer
    let dispatchArgs: any MTLBuffer
    /// Per pair: (capacity * k, I) activations and (capacity * k, H) weighted outputs.
    let act: any MTLBuffer
    let pairOut: any MTLBuffer
    /// Shared expert: (capacity, Is) activations and (capacity, H) gated outputs.
    let sharedAct: (any MTLBuffer)?
    let sharedOut: (any MTLBuffer)?
    /// The norms of a decoder block: their weights (H), copied in per call, the normalised
    /// input (capacity, H) that the stages read, and the next layer's normed rows (capacity, H).
    let inputNormWeight: any MTLBuffer
    let xNormed: any MTLBuffer
    let nextNormWeight: any MTLBuffer
    let normed: any MTLBuffer
    /// (capacity, H): the grid values of x's 8-bit activations, when some gate/up product
    /// takes them (the expert activations are quantized in place).
    let xQuantized: (any MTLBuffer)?

    init(context: MetalContext, configuration c: MoEConfiguration, capacity: Int, quantizedX: Bool) throws {
        self.capacity = capacity
        let (h, e, k, i) = (c.hiddenSize, c.numExperts, c.topK, c.intermediateSize)
        let pairs = capacity * k
        let bm = Int(MOE_GEMM_BM)
        func make(_ floats: Int, _ what: String) throws -> any MTLBuffer {
            try context.makeBuffer(floats: floats, what: what)
        }
        x = try make(capacity * h, "activations")
        residual = try make(capacity * h, "the residual")
        ids = try make(pairs, "expert ids")
        weights = try make(pairs, "routing weights")
        sharedFactor = try make(capacity, "shared-expert factors")
        routerLogits = try make(capacity * (e + 1), "router logits")
        offsets = try make(e + 1, "bucket offsets")
        rows = try make(pairs, "bucket rows")
        tiles = try make(2 * ((pairs + bm - 1) / bm + e), "GEMM tiles")
        dispatchArgs = try make(8, "indirect dispatch arguments")
        act = try make(pairs * i, "expert activations")
        pairOut = try make(pairs * h, "expert outputs")
        if c.hasSharedExpert {
            sharedAct = try make(capacity * c.sharedIntermediateSize, "shared-expert activations")
            sharedOut = try make(capacity * h, "shared-expert outputs")
        } else {
            sharedAct = nil
            sharedOut = nil
        }
        inputNormWeight = try make(h, "the input norm's weight")
        xNormed = try make(capacity * h, "normalised activations")
        nextNormWeight = try make(h, "the next norm's weight")
        normed = try make(capacity * h, "normed outputs")
        xQuantized = quantizedX ? try make(capacity * h, "8-bit activations") : nil
    }

    /// Copies a norm's weight (H floats) into `buffer`.
    static func upload(_ norm: RMSNorm, hidden: Int, to buffer: any MTLBuffer) {
        buffer.contents().assumingMemoryBound(to: Float.self).update(from: norm.weight, count: hidden)
    }
}

/// Scratch sets of one layer, reused across forwards: a steady-state forward allocates
/// nothing. A forward takes the smallest idle set that holds its tokens, else makes one
/// for max(4, the next power of two) tokens; concurrent forwards get distinct sets. At
/// most `maxIdle` sets are kept (the smallest go first).
final class MetalScratchPool: @unchecked Sendable {
    static let maxIdle = 4
    private let lock = Lock()
    private var idle: [MetalScratch] = []

    func checkOut(tokens: Int, make: (Int) throws -> MetalScratch) throws -> MetalScratch {
        let found: MetalScratch? = lock.withLock {
            var best: Int?
            for (n, s) in idle.enumerated() where s.capacity >= tokens {
                if best == nil || s.capacity < idle[best!].capacity { best = n }
            }
            return best.map { idle.remove(at: $0) }
        }
        if let found { return found }
        var capacity = Int(MOE_DECODE_MAX_TOKENS)
        while capacity < tokens { capacity *= 2 }
        return try make(capacity)
    }

    func checkIn(_ scratch: MetalScratch) {
        lock.withLock {
            idle.append(scratch)
            if idle.count > Self.maxIdle {
                let smallest = idle.indices.min { idle[$0].capacity < idle[$1].capacity }!
                idle.remove(at: smallest)
            }
        }
    }
}
