import CMoECPU
#if canImport(Darwin)
import Darwin
#else
import Glibc
#endif

/// One forward on the CPU. Each stage runs when called, split into work items whose
/// boundaries depend only on the shapes, so the result is the same on any number of cores.
final class CPUPass: MoEPass {
    /// Tokens per router work item.
    static let routerChunk = 16
    /// The fewest experts' rows in each half of a decode call's split router product.
    static let routerHalfRows = 4
    /// Output columns per down-projection work item.
    static let downBlock = 256
    /// Marks the shared expert in a work item.
    static let sharedExpert = -1

    private let backend: CPUBackend
    private let arena: ScratchArena
    /// What the stages read: the caller's input, or its normalised copy with an input norm.
    private let x: UnsafePointer<Float>
    /// With an input norm: the caller's rows, and `x` as the (tokens, H) rows `route` writes.
    private let inputNorm: (norm: RMSNorm, source: UnsafePointer<Float>, normed: UnsafeMutablePointer<Float>)?
    private let tokens: Int
    private let (h, e, k, inner): (Int, Int, Int, Int)
    /// The experts held (`MoEConfiguration.heldExperts`): pair ids outside them are absent.
    private let share: ExpertShare
    private let held: Int

    // Routing: (tokens, E) logits turned into scores in place; (tokens, k) ids and weights.
    private let logits: UnsafeMutablePointer<Float>
    private let routeScratch: UnsafeMutablePointer<Float>
    private let ids: UnsafeMutablePointer<Int32>
    private let weights: UnsafeMutablePointer<Float>
    private let sharedFactor: UnsafeMutablePointer<Float>   // (tokens)

    // Grouping: pair p = t * k + j; rows are the pairs sorted by held expert (stable in p),
    // indexed by the held expert's place (id - firstHeld).
    private let expertStart: UnsafeMutablePointer<Int>     // (held + 1) row offsets
    private let rowPair: UnsafeMutablePointer<Int32>       // row -> pair
    private let pairRow: UnsafeMutablePointer<Int32>       // pair -> row; -1: an expert not held
    /// (rows, H) input row of each pair whose expert has more than one (an expert with one
    /// reads its token's row in place); empty when both gate and up take 8-bit activations.
    private let gathered: UnsafeMutablePointer<Float>
    private let gathersFloats: Bool
    private let gateUpOut: UnsafeMutablePointer<Float>     // (rows, 2I)
    private let activated: UnsafeMutablePointer<Float>     // (rows, I)
    private let downOut: UnsafeMutablePointer<Float>       // (rows, H), weighted

    // 8-bit activations (MoEActivationQuantization.q8): which products take them; x
    // (tokens, H) quantized once per token, copied to the gathered rows (rows, H) for the
    // experts' gate and up (as the float32 rows are); each row of `activated` (rows, I)
    // and `sharedActivated` (tokens, Is) quantized once for down, its grid values in place.
    private let q8Experts: (gate: Bool, up: Bool, down: Bool)
    private let q8Shared: (gate: Bool, up: Bool, down: Bool)
    private let xQ8: Q8Rows?
    private let gatheredQ8: Q8Rows?
    private let activatedQ8: Q8Rows?
    private let sharedActivatedQ8: Q8Rows?
    /// Whether `route` has quantized x (with the routing given it does not run).
    private var xQuantized = false

    // Shared expert on all tokens.
    private let sharedGateUp: UnsafeMutablePointer<Float>  // (tokens, 2Is)
    private let sharedActivated: UnsafeMutablePointer<Float> // (tokens, Is)
    private let sharedOut: UnsafeMutablePointer<Float>     // (tokens, H), gated

    /// False when the routing was given (setRouting): the routed experts alone.
    private var withShared: Bool
    /// The experts that have rows, in order, then the shared expert if it runs: the work
    /// items are their blocks (`gateUpItem`, `downItem`), counted, not listed.
    private let busyExperts: UnsafeMutablePointer<Int32>  // (E + 1)
    private var busyCount = 0
    private var routedCount = 0

    init(backend: CPUBackend, input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?) throws {
        let c = backend.configuration
        self.backend = backend
        self.tokens = tokens
        withShared = backend.shared != nil
        (h, e, k, inner) = (c.hiddenSize, c.numExperts, c.topK, c.intermediateSize)
        (share, held) = (c.heldExperts, c.heldExperts.count)
        let rows = tokens * k
        let si = c.sharedIntermediateSize
        let chunks = (tokens + Self.routerChunk - 1) / Self.routerChunk
        let router = backend.tokenRouter
        let f = MemoryLayout<Float>.stride
        q8Experts = backend.experts.quantizesActivations(c.activationQuantization)
        q8Shared = backend.shared?.quantizesActivations(c.activationQuantization) ?? (false, false, false)
        let expertsX = q8Experts.gate || q8Experts.up
        gathersFloats = !(q8Experts.gate && q8Experts.up)
        let anyX = expertsX || q8Shared.gate || q8Shared.up
        let q8Arrays = (anyX ? Q8Rows.arrays(rows: tokens, cols: h) : [])
            + (expertsX ? Q8Rows.arrays(rows: rows, cols: h) : [])
            + (q8Experts.down ? Q8Rows.arrays(rows: rows, cols: inner, grid: false) : [])
            + (q8Shared.down ? Q8Rows.arrays(rows: tokens, cols: si, grid: false) : [])
        let bytes = ScratchArena.bytes(for: q8Arrays + [
            (tokens * e, f), (chunks * router.scratchCount, f), (rows, 4), (rows, f), (tokens, f),
            (held + 1, MemoryLayout<Int>.stride), (rows, 4), (rows, 4), (held + 1, 4),
            (gathersFloats ? rows * h : 0, f), (rows * 2 * inner, f), (rows * inner, f), (rows * h, f),
            (tokens * 2 * si, f), (tokens * si, f), (tokens * h, f), (inputNorm == nil ? 0 : tokens * h, f),
        ])
        arena = try backend.scratch.checkOut(bytes: bytes)
        arena.reset()
        logits = arena.take(Float.self, tokens * e)
        routeScratch = arena.take(Float.self, chunks * router.scratchCount)
        ids = arena.take(Int32.self, rows)
        weights = arena.take(Float.self, rows)
        sharedFactor = arena.take(Float.self, tokens)
        expertStart = arena.take(Int.self, held + 1)
        rowPair = arena.take(Int32.self, rows)
        pairRow = arena.take(Int32.self, rows)
        busyExperts = arena.take(Int32.self, held + 1)
        gathered = arena.take(Float.self, gathersFloats ? rows * h : 0)
        gateUpOut = arena.take(Float.self, rows * 2 * inner)
        activated = arena.take(Float.self, rows * inner)
        downOut = arena.take(Float.self, rows * h)
        sharedGateUp = arena.take(Float.self, tokens * 2 * si)
        sharedActivated = arena.take(Float.self, tokens * si)
        sharedOut = arena.take(Float.self, tokens * h)
        xQ8 = anyX ? Q8Rows(arena: arena, rows: tokens, cols: h) : nil
        gatheredQ8 = expertsX ? Q8Rows(arena: arena, rows: rows, cols: h) : nil
        activatedQ8 = q8Experts.down ? Q8Rows(arena: arena, rows: rows, cols: inner, grid: activated) : nil
        sharedActivatedQ8 = q8Shared.down ? Q8Rows(arena: arena, rows: tokens, cols: si, grid: sharedActivated) : nil
        if let inputNorm {
            let normed = arena.take(Float.self, tokens * h)
            self.inputNorm = (inputNorm, input, normed)
            x = UnsafePointer(normed)
        } else {
            self.inputNorm = nil
            x = input
        }
    }

    // The arena goes back to the pool only when the pass is released, after the caller
    // has read the results (readRouting comes after finish).
    deinit { backend.scratch.checkIn(arena) }

    func route() {
        let (x, h, e, k, tokens) = (self.x, self.h, self.e, self.k, self.tokens)
        let (logits, ids, weights, sharedFactor) = (self.logits, self.ids, self.weights, self.sharedFactor)
        let router = backend.tokenRouter
        let routerWeight = backend.router
        let bias = backend.routerBias?.pointer
        let gate = backend.sharedGate?.pointer
        let chunk = Self.routerChunk
        let scratchCount = router.scratchCount
        let routeScratch = self.routeScratch
        let inputNorm = self.inputNorm
        let xQ8 = self.xQ8
        xQuantized = xQ8 != nil
        // The input norm where the rows are read anyway: the chunk's normalised rows stay
        // in cache for the router product, and every later stage reads them.
        func prepare(_ t0: Int, _ t1: Int) {
            if let (norm, source, normed) = inputNorm {
                for t in t0..<t1 {
                    let v = source + t * h
                    let sum = RMSNorm.sumOfSquares(v, count: h)
                    norm.apply(v, inverse: RMSNorm.inverseRMS(sumOfSquares: sum, count: h, eps: norm.eps),
                               count: h, into: normed + t * h)
                }
            }
            if let xQ8 {
                for t in t0..<t1 { xQ8.quantize(row: t, from: x + t * h) }
            }
        }
        func select(_ c: Int, _ t0: Int, _ t1: Int) {
            for t in t0..<t1 {
                let row = logits + t * e
                if let bias { for i in 0..<e { row[i] += bias[i] } }
                router.route(logits: row, scratch: routeScratch + c * scratchCount,
                             ids: ids + t * k, weights: weights + t * k)
                if let gate {
                    var dot: Float = 0
                    for i in 0..<h { dot += x[t * h + i] * gate[i] }
                    sharedFactor[t] = 1 / (1 + expf(-dot))
                } else {
                    sharedFactor[t] = 1
                }
            }
        }
        // Decode: one chunk of tokens, whose router product (the whole router read from
        // memory) would keep one core busy while the others wait. Its rows are split in
        // two halves instead; the row kernels compute each logit alone, so the logits are
        // the same as from one product.
        if tokens <= WeightMatrix.registerRowLimit && e >= 2 * Self.routerHalfRows {
            prepare(0, tokens)
            let half = e / 2
            parallelFor(2) { part in
                let r0 = part * half, n = part == 0 ? half : e - half
                routerWeight.multiply(m: tokens, rows: r0, count: n, a: x, lda: h, c: logits + r0, ldc: e, tile: nil)
            }
            select(0, 0, tokens)
            return
        }
        parallelFor((tokens + chunk - 1) / chunk) { c in
            let t0 = c * chunk, t1 = Swift.min(tokens, t0 + chunk)
            prepare(t0, t1)
            routerWeight.multiply(m: t1 - t0, rows: 0, count: e, a: x + t0 * h, lda: h,
                                  c: logits + t0 * e, ldc: e, tile: nil)
            select(c, t0, t1)
        }
    }

    func setRouting(ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>) {
        self.ids.update(from: ids, count: tokens * k)
        self.weights.update(from: weights, count: tokens * k)
        withShared = false
    }

    /// The place of pair p's expert among those held, or nil when the layer does not hold it.
    @inline(__always)
    private func heldPlace(_ p: Int) -> Int? { share.place(of: Int(ids[p])) }

    func groupPairsByExpert() {
        let pairs = tokens * k
        for i in 0...held { expertStart[i] = 0 }
        for p in 0..<pairs { if let place = heldPlace(p) { expertStart[place + 1] += 1 } }
        for i in 0..<held { expertStart[i + 1] += expertStart[i] }
        let rows = expertStart[held]
        // Counting sort, stable in the pair index; expertStart[i] is advanced past
        // expert i's rows here and restored afterwards.
        for p in 0..<pairs {
            guard let expert = heldPlace(p) else {
                pairRow[p] = -1
                continue
            }
            let row = expertStart[expert]
            expertStart[expert] += 1
            rowPair[row] = Int32(p)
            pairRow[p] = Int32(row)
        }
        for i in stride(from: held, to: 0, by: -1) { expertStart[i] = expertStart[i - 1] }
        expertStart[0] = 0

        let (x, h, k, gathered, rowPair) = (self.x, self.h, self.k, self.gathered, self.rowPair)
        let (xQ8, gatheredQ8, gathersFloats) = (self.xQ8, self.gatheredQ8, self.gathersFloats)
        if let xQ8, !xQuantized {
            parallelFor(tokens) { t in xQ8.quantize(row: t, from: x + t * h) }
            xQuantized = true
        }
        let chunk = 64
        parallelFor((rows + chunk - 1) / chunk) { c in
            for row in c * chunk..<Swift.min(rows, (c + 1) * chunk) {
                let pair = Int(rowPair[row])
                if readsInPlace(heldPlace(pair)!) { continue }
                let token = pair / k
                if gathersFloats { (gathered + row * h).update(from: x + token * h, count: h) }
                if let gatheredQ8, let xQ8 { gatheredQ8.copy(row: token, of: xQ8, to: row) }
            }
        }

        busyCount = 0
        for expert in 0..<held where expertStart[expert + 1] > expertStart[expert] {
            busyExperts[busyCount] = Int32(expert)
            busyCount += 1
        }
        routedCount = busyCount
        if withShared && backend.shared != nil {
            busyExperts[busyCount] = Int32(Self.sharedExpert)
            busyCount += 1
        }
    }

    /// Whether `expert`'s gate and up read their one row's token row in place (x and its
    /// 8-bit codes), nothing gathered for it: every expert of a one-token call.
    private func readsInPlace(_ expert: Int) -> Bool { expertStart[expert + 1] - expertStart[expert] == 1 }

    /// Gate/up work items: `blocksPerExpert` of each busy expert's FFN.
    private var gateUpItemCount: Int {
        routedCount * backend.experts.blocksPerExpert + (busyCount - routedCount) * (backend.shared?.blocksPerExpert ?? 0)
    }

    /// Gate/up work item n: each routed expert's blocks, then the shared expert's.
    private func gateUpItem(_ n: Int) -> (expert: Int, block: Int) {
        let blocks = backend.experts.blocksPerExpert
        if n < routedCount * blocks { return (Int(busyExperts[n / blocks]), n % blocks) }
        return (Self.sharedExpert, n - routedCount * blocks)
    }

    private var downBlocks: Int { (h + Self.downBlock - 1) / Self.downBlock }

    /// Down work item n: each busy expert's blocks of output columns.
    private func downItem(_ n: Int) -> (expert: Int, block: Int) {
        (Int(busyExperts[n / downBlocks]), n % downBlocks)
    }

    /// Runs `body` with dequantization scratch for one work item of `ffn` that multiplies
    /// `rows` activation rows (nil for float32 weights, for rows the product dequantizes in
    /// registers anyway, which is every decode item, or if it cannot be allocated).
    private func withTile(_ ffn: PackedFFN, rows: Int, _ body: (UnsafeMutablePointer<Float>?) -> Void) {
        let count = rows > WeightMatrix.registerRowLimit ? ffn.tileCount : 0
        let bytes = ScratchArena.bytes(for: [(count, MemoryLayout<Float>.stride)])
        guard count > 0, let arena = try? backend.tiles.checkOut(bytes: bytes) else {
            body(nil)
            return
        }
        arena.reset()
        body(arena.take(Float.self, count))
        backend.tiles.checkIn(arena)
    }

    func gateUp() {
        let act = GatedActivation(kind: backend.configuration.activation,
                                  alpha: backend.configuration.swigluAlpha,
                                  limit: backend.configuration.swigluLimit)
        parallelFor(gateUpItemCount) { n in
            let (expert, block) = gateUpItem(n)
            let ffn: PackedFFN, rows: Int, input: UnsafePointer<Float>, out: UnsafeMutablePointer<Float>,
                activated: UnsafeMutablePointer<Float>, index: Int
            // The rows' 8-bit activations (from row `q8First`) and which products take them;
            // `first`: the rows' first row of the outputs.
            let q8: Q8Rows?, first: Int, q8First: Int, q8Gate: Bool, q8Up: Bool
            if expert == Self.sharedExpert {
                ffn = backend.shared!
                (rows, input, out, activated, index) = (tokens, x, sharedGateUp, sharedActivated, 0)
                (q8, first, q8First, q8Gate, q8Up) = (xQ8, 0, 0, q8Shared.gate, q8Shared.up)
            } else {
                ffn = backend.experts
                first = expertStart[expert]
                rows = expertStart[expert + 1] - first
                (q8Gate, q8Up) = (q8Experts.gate, q8Experts.up)
                if readsInPlace(expert) {
                    let token = Int(rowPair[first]) / k
                    (input, q8, q8First) = (x + token * h, xQ8, token)
                } else {
                    (input, q8, q8First) = (UnsafePointer(gathered + first * h), gatheredQ8, first)
                }
                out = gateUpOut + first * 2 * inner
                activated = self.activated + first * inner
                index = expert
            }
            let width = ffn.inner
            let (c0, w) = ffn.blockColumns(block)
            // Block outputs: (rows, 2w) at column 2 * c0 of each row: gate, then up.
            withTile(ffn, rows: rows) { tile in
                func product(_ part: PackedFFN.Rows, _ quantized: Bool, column: Int) {
                    let row0 = part.row(expert: index, column: c0)
                    if quantized, let q8 {
                        part.matrix.multiply(m: rows, rows: row0, count: w, q: q8, first: q8First,
                                             c: out + column, ldc: 2 * width, tile: tile)
                    } else {
                        part.matrix.multiply(m: rows, rows: row0, count: w, a: input, lda: h,
                                             c: out + column, ldc: 2 * width, tile: tile)
                    }
                }
                product(ffn.gate, q8Gate, column: 2 * c0)
                product(ffn.up, q8Up, column: 2 * c0 + w)
            }
            let bias = ffn.gateUpBias.map { UnsafePointer($0.pointer + index * 2 * width + c0) }
            // With 8-bit activations for down, the block's columns are quantized here while
            // they are in cache (whole activation blocks: blockWidth is a multiple of them).
            let downQ8 = expert == Self.sharedExpert ? sharedActivatedQ8 : activatedQ8
            for r in 0..<rows {
                let gu = out + r * 2 * width + 2 * c0
                let a = activated + r * width + c0
                if let bias {
                    for i in 0..<w { a[i] = act(gu[i] + bias[i], gu[w + i] + bias[width + i]) }
                } else {
                    for i in 0..<w { a[i] = act(gu[i], gu[w + i]) }
                }
                downQ8?.quantize(row: first + r, from: a, columns: c0, count: w)
            }
        }
    }

    func down() {
        // With 8-bit activations the rows were quantized by gateUp's items (their grid values
        // in place: nothing reads the float32 rows after that).
        parallelFor(busyCount * downBlocks) { n in
            let (expert, block) = downItem(n)
            let h0 = block * Self.downBlock, bh = Swift.min(Self.downBlock, h - h0)
            let ffn: PackedFFN, rows: Int, input: UnsafePointer<Float>, out: UnsafeMutablePointer<Float>, index: Int
            let first = expert == Self.sharedExpert ? 0 : expertStart[expert]
            if expert == Self.sharedExpert {
                ffn = backend.shared!
                (rows, input, out, index) = (tokens, UnsafePointer(sharedActivated), sharedOut, 0)
            } else {
                ffn = backend.experts
                rows = expertStart[expert + 1] - first
                input = UnsafePointer(activated + first * inner)
                out = downOut + first * h
                index = expert
            }
            let width = ffn.inner
            let q8 = expert == Self.sharedExpert ? sharedActivatedQ8 : activatedQ8
            withTile(ffn, rows: rows) { tile in
                if let q8 {
                    ffn.down.multiply(m: rows, rows: index * h + h0, count: bh, q: q8, first: first,
                                      c: out + h0, ldc: h, tile: tile)
                } else {
                    ffn.down.multiply(m: rows, rows: index * h + h0, count: bh, a: input, lda: width,
                                      c: out + h0, ldc: h, tile: tile)
                }
            }
            let bias = ffn.downBias.map { $0.pointer + index * h + h0 }
            for r in 0..<rows {
                let y = out + r * h + h0
                let scale = expert == Self.sharedExpert ? sharedFactor[r] : weights[Int(rowPair[first + r])]
                if let bias {
                    for i in 0..<bh { y[i] = (y[i] + bias[i]) * scale }
                } else {
                    for i in 0..<bh { y[i] *= scale }
                }
            }
        }
    }

    func combine(residual: UnsafePointer<Float>?, output: UnsafeMutablePointer<Float>, next: NextNorm?) {
        let (h, k, downOut, pairRow) = (self.h, self.k, self.downOut, self.pairRow)
        let sharedOut: UnsafeMutablePointer<Float>? = withShared ? self.sharedOut : nil
        let chunk = 16, tokens = self.tokens
        parallelFor((tokens + chunk - 1) / chunk) { c in
            withUnsafeTemporaryAllocation(of: Float.self, capacity: Self.downBlock) { tmp in
                let acc = tmp.baseAddress!
                for t in c * chunk..<Swift.min(tokens, (c + 1) * chunk) {
                    var sumOfSquares: Float = 0
                    for h0 in stride(from: 0, to: h, by: Self.downBlock) {
                        let n = Swift.min(Self.downBlock, h - h0)
                        // Fixed order: slots 0..k-1, shared expert, residual. The residual is
                        // read before the output block is written, so they may alias. A slot
                        // whose expert the layer does not hold adds nothing.
                        let first = pairRow[t * k]
                        if first >= 0 {
                            acc.update(from: downOut + Int(first) * h + h0, count: n)
                        } else {
                            acc.update(repeating: 0, count: n)
                        }
                        for j in 1..<k {
                            let row = pairRow[t * k + j]
                            if row < 0 { continue }
                            let y = downOut + Int(row) * h + h0
                            for i in 0..<n { acc[i] += y[i] }
                        }
                        if let sharedOut {
                            let s = sharedOut + t * h + h0
                            for i in 0..<n { acc[i] += s[i] }
                        }
                        if let residual {
                            let r = residual + t * h + h0
                            for i in 0..<n { acc[i] += r[i] }
                        }
                        (output + t * h + h0).update(from: acc, count: n)
                        if next != nil { sumOfSquares += RMSNorm.sumOfSquares(acc, count: n) }
                    }
                    // The next layer's norm while the token's row is still in cache.
                    if let next {
                        let inverse = RMSNorm.inverseRMS(sumOfSquares: sumOfSquares, count: h, eps: next.norm.eps)
                        next.norm.apply(output + t * h, inverse: inverse, count: h, into: next.output + t * h)
                    }
                }
            }
        }
    }

    func readRouting(ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) {
        ids.update(from: self.ids, count: tokens * k)
        weights.update(from: self.weights, count: tokens * k)
    }

    /// Every stage has already run when it was called.
    /// The call is over (or, in a stack, this layer): the pool's workers may sleep; the
    /// next layer's pass wakes them again at once (CPUBackend.makePass).
    func finish() throws { moe_cpu_pool_rest() }
}
