import CMoECPU
import CMoESwift

/// One Mixture-of-Experts feed-forward layer: router, top-k, expert FFNs, weighted combine,
/// shared expert and residual, in one call (docs/spec.md, "What one call computes").
///
/// The weights are copied at creation, except those given as `WeightData.mapped`, which
/// are read in place where the backend's kernels read their stored layout (the layer then
/// holds their memory). `forward` and `route` may be called from several threads at once
/// and give the same results as sequential calls.
public final class MoELayer: @unchecked Sendable {
    public let configuration: MoEConfiguration
    let backend: any MoEBackend
    /// The memories the weights were given in (files mapped by a checkpoint loader, the
    /// caller's memory), checked at each call (`checkCall`). Weak: the backend holds those
    /// it reads in place; one it copied everything from is let go, and needs no check.
    private let weightMemories: [Weak<WeightMemory>]

    /// The backend this layer runs on (never `.auto`).
    public var backendKind: MoEBackendKind { backend.kind }

    /// Throws `MoEError.outOfMemory`, naming the bytes, before allocating anything when the
    /// weights' copies exceed what the system has available (MemAvailable, the cgroup's
    /// limit) or `memoryLimit` bytes.
    public init(configuration: MoEConfiguration, weights: MoEWeights,
                backend requested: MoEBackendKind = .auto, memoryLimit: Int? = nil) throws {
        try configuration.validate()
        try weights.validate(for: configuration)
        if let memoryLimit, memoryLimit < 0 {
            throw MoEError.invalidArgument("memory_limit must be >= 0 bytes, got \(memoryLimit)")
        }
        self.configuration = configuration
        weightMemories = weights.memories.map(Weak.init)
        CallStats.begin(requested, tokens: 0, layers: 1)
        self.backend = try BackendRegistry.make(requested, configuration: configuration, weights: weights,
                                                memoryLimit: memoryLimit)
        moe_internal_stats().pointee.backend = backend.kind.rawValue
    }

    /// The backends that can be created in this process, best first.
    public static var availableBackends: [MoEBackendKind] { BackendRegistry.available }

    /// The instruction set of the CPU backend's own kernels in this process: "avx512gfni",
    /// "avx512vnni", "avx512", "avx2" or "portable" — the best the CPU has, or lower if the
    /// environment variable MOE_CPU_ISA asks for it (read once, at the first use of the CPU
    /// kernels).
    public static var cpuInstructionSet: StaticString {
        switch moe_cpu_isa_level() {
        case MOE_CPU_ISA_AVX512_GFNI: return "avx512gfni"
        case MOE_CPU_ISA_AVX512_VNNI: return "avx512vnni"
        case MOE_CPU_ISA_AVX512: return "avx512"
        case MOE_CPU_ISA_AVX2: return "avx2"
        default: return "portable"
        }
    }

    // MARK: Pointer API (what the C ABI calls)

    /// `output = moe(input) (+ residual)` for `tokens` rows of `hiddenSize` floats.
    /// `residual` may be `output` or overlap it (a partial overlap costs a temporary).
    public func forward(_ input: UnsafePointer<Float>, tokens: Int, residual: UnsafePointer<Float>? = nil,
                        into output: UnsafeMutablePointer<Float>) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        try checkCall(tokens: tokens)
        if tokens == 0 { return }
        try runForward(input, tokens: tokens, options: MoEForwardOptions(residual: residual.map { .buffer($0) } ?? .none),
                       into: output)
    }

    /// A decoder's post-attention block in one call (`MoEForwardOptions`):
    /// `output = residual + moe(inputNorm(input))`, `options.normedOutput = nextNorm(output)`.
    /// The norms are fused into the layer's own stages (no extra pass over the activations).
    /// `output` may be `input` or the residual, or overlap them (a partial overlap costs a temporary).
    public func forward(_ input: UnsafePointer<Float>, tokens: Int, options: MoEForwardOptions,
                        into output: UnsafeMutablePointer<Float>) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        try checkCall(tokens: tokens)
        try options.validate()
        if options.nextNorm != nil { try requireWholeLayer(for: "the next norm") }
        if tokens == 0 { return }
        try runForward(input, tokens: tokens, options: options, into: output)
    }

    /// One forward through the backend's stages (statistics not reset).
    func runForward(_ input: UnsafePointer<Float>, tokens: Int, options: MoEForwardOptions,
                    into output: UnsafeMutablePointer<Float>) throws {
        let count = tokens * configuration.hiddenSize
        let residual = options.residualPointer(input: input)
        if let normed = options.normedOutput {
            for (name, other) in [("x", input), ("the residual", residual), ("the output", UnsafePointer(output))]
            where Self.overlap(UnsafePointer(normed), other, count) {
                throw MoEError.invalidArgument("the normed output must not overlap \(name)")
            }
        }
        try Self.writing(output, count: count, readingFrom: [input, residual]) { output in
            try withAutoreleasePool {
                let pass = try backend.makePass(input: input, tokens: tokens, inputNorm: options.inputNorm)
                try pass.runLayer(residual: residual, output: output, next: options.next)
                try pass.finish()
            }
        }
    }

    /// Whether `count` floats at `a` and at `b` share memory.
    static func overlap(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>?, _ count: Int) -> Bool {
        guard let b else { return false }
        let (x, y) = (UInt(bitPattern: a), UInt(bitPattern: b))
        let bytes = UInt(count * MemoryLayout<Float>.stride)
        return x < y &+ bytes && y < x &+ bytes
    }

    /// Runs `body` on `output`, or on a temporary copied to `output` at the end when
    /// `output` overlaps one of `inputs` without being it (or at all, unless `sameIsSafe`):
    /// the stages read their inputs after earlier stages have written rows of the output,
    /// so a shifted alias would read results as inputs. NumPy's ufuncs do the same.
    static func writing(_ output: UnsafeMutablePointer<Float>, count: Int, readingFrom inputs: [UnsafePointer<Float>?],
                        sameIsSafe: Bool = true, _ body: (UnsafeMutablePointer<Float>) throws -> Void) throws {
        let clash = inputs.contains { input in
            guard let input, overlap(UnsafePointer(output), input, count) else { return false }
            return !(sameIsSafe && input == UnsafePointer(output))
        }
        guard clash else { return try body(output) }
        let temporary = UnsafeMutablePointer<Float>.allocate(capacity: count)
        defer { temporary.deallocate() }
        try body(temporary)
        output.update(from: temporary, count: count)
    }

    /// The routed experts with the routing given (no router, no shared expert):
    /// `output[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(input[t])` over the topK slots
    /// in order. Every id must be in `0..<numExperts` (checked before anything runs); on a
    /// layer holding a share of the experts, slots whose experts it does not hold add nothing.
    public func experts(_ input: UnsafePointer<Float>, tokens: Int, ids: UnsafePointer<Int32>,
                        weights: UnsafePointer<Float>, into output: UnsafeMutablePointer<Float>) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        try checkCall(tokens: tokens)
        let e = Int32(configuration.numExperts)
        for n in 0..<tokens * configuration.topK where ids[n] < 0 || ids[n] >= e {
            let k = configuration.topK
            throw MoEError.invalidArgument(
                "ids[\(n / k), \(n % k)] = \(ids[n]) is not an expert id (0..<\(e))")
        }
        if tokens == 0 { return }
        try Self.writing(output, count: tokens * configuration.hiddenSize, readingFrom: [input], sameIsSafe: false) { output in
            try withAutoreleasePool {
                let pass = try backend.makePass(input: input, tokens: tokens, inputNorm: nil)
                try pass.runLayer(given: (ids, weights), residual: nil, output: output, next: nil)
                try pass.finish()
            }
        }
    }

    /// The router alone: `ids` and `weights` receive (tokens, topK) values each.
    public func route(_ input: UnsafePointer<Float>, tokens: Int,
                      ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        try checkCall(tokens: tokens)
        if tokens == 0 { return }
        try withAutoreleasePool {
            let pass = try backend.makePass(input: input, tokens: tokens, inputNorm: nil)
            pass.route()
            try pass.finish()
            pass.readRouting(ids: ids, weights: weights)
        }
    }

    // MARK: Array API

    /// `moe(input) (+ residual)`; `input` holds whole rows of `hiddenSize` floats.
    public func forward(_ input: [Float], residual: [Float]? = nil) throws -> [Float] {
        let tokens = try rows(in: input, name: "x")
        if let residual, residual.count != input.count {
            throw MoEError.invalidArgument("residual must have \(input.count) elements like x, got \(residual.count)")
        }
        var output = [Float](repeating: 0, count: input.count)
        try input.withUnsafeBufferPointer { x in
            try output.withUnsafeMutableBufferPointer { y in
                if let residual {
                    try residual.withUnsafeBufferPointer { r in
                        try forward(x.baseAddress!, tokens: tokens, residual: r.baseAddress!, into: y.baseAddress!)
                    }
                } else {
                    try forward(x.baseAddress!, tokens: tokens, into: y.baseAddress!)
                }
            }
        }
        return output
    }

    /// The router alone: (tokens, topK) expert ids in selection order and their weights.
    public func route(_ input: [Float]) throws -> (ids: [Int32], weights: [Float]) {
        let tokens = try rows(in: input, name: "x")
        let k = configuration.topK
        var ids = [Int32](repeating: 0, count: tokens * k)
        var weights = [Float](repeating: 0, count: tokens * k)
        try input.withUnsafeBufferPointer { x in
            try ids.withUnsafeMutableBufferPointer { i in
                try weights.withUnsafeMutableBufferPointer { w in
                    try route(x.baseAddress!, tokens: tokens, ids: i.baseAddress!, weights: w.baseAddress!)
                }
            }
        }
        return (ids, weights)
    }

    /// The routed experts with the given routing: `ids` and `weights` (tokens, topK).
    public func experts(_ input: [Float], ids: [Int32], weights: [Float]) throws -> [Float] {
        let tokens = try rows(in: input, name: "x")
        let pairs = tokens * configuration.topK
        guard ids.count == pairs, weights.count == pairs else {
            throw MoEError.invalidArgument(
                "ids and weights must have tokens x top_k = \(pairs) elements, got \(ids.count) and \(weights.count)")
        }
        var output = [Float](repeating: 0, count: input.count)
        try input.withUnsafeBufferPointer { x in
            try ids.withUnsafeBufferPointer { i in
                try weights.withUnsafeBufferPointer { w in
                    try output.withUnsafeMutableBufferPointer { y in
                        try experts(x.baseAddress!, tokens: tokens, ids: i.baseAddress!, weights: w.baseAddress!,
                                    into: y.baseAddress!)
                    }
                }
            }
        }
        return output
    }

    private func rows(in input: [Float], name: String) throws -> Int {
        let h = configuration.hiddenSize
        guard input.count % h == 0 else {
            throw MoEError.invalidArgument("\(name) must hold whole rows of hidden_size = \(h) floats, got \(input.count)")
        }
        return input.count / h
    }

    /// Refuses `what` (a next norm, a stack) on a layer holding a share of the experts: its
    /// output is a partial sum, which only the group's sum makes a layer's output.
    func requireWholeLayer(for what: String) throws {
        guard configuration.holdsShare else { return }
        let (share, e) = (configuration.heldExperts, configuration.numExperts)
        throw MoEError.invalidArgument(
            "this layer holds experts \(share) of \(e): its output is a partial sum, "
            + "so \(what) must be applied to the group's sum, not here")
    }

    /// What every call checks first: its token count, and that the files the layer reads
    /// in place still hold their bytes (a file truncated under a mapping would raise SIGBUS
    /// in the kernels: an error here instead).
    func checkCall(tokens: Int) throws {
        // Pair indices are 32-bit in every backend.
        let limit = Int(Int32.max) / (configuration.topK * 2)
        guard tokens >= 0 && tokens <= limit else {
            throw MoEError.invalidArgument("num_tokens must be in 0...\(limit), got \(tokens)")
        }
        for memory in weightMemories { try memory.object?.checkFile() }
    }
}

/// A reference that does not keep its object alive.
struct Weak<T: AnyObject> {
    weak var object: T?
    init(_ object: T) { self.object = object }
}
