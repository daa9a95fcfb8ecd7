// The Metal backend (on Linux: the "softmetal" backend, the same code on SoftMetal; on a
// Mac: "metal" on the GPU) against the float64 reference and the CPU backend; its
// dispatch, command-buffer, wait and allocation budgets; runLayers; the C ABI additions.
import Foundation
import XCTest
import CMoESwift
@testable import MoEKernels

final class MetalBackendTests: XCTestCase {
    #if os(Linux)
    static let kind = MoEBackendKind.softMetal
    #else
    static let kind = MoEBackendKind.metal
    #endif

    override func setUpWithError() throws {
        guard MoELayer.availableBackends.contains(Self.kind) else {
            throw XCTSkip("the \(Self.kind.name) backend is not available here")
        }
    }

    func layers(_ data: LayerData, fused: Bool = false) throws -> (metal: MoELayer, cpu: MoELayer) {
        let metal = try MoELayer(configuration: data.config, weights: data.weights(fused: fused), backend: Self.kind)
        XCTAssertEqual(metal.backendKind, Self.kind)
        return (metal, try data.layer(fused: fused))
    }

    /// Forward, residual and routing against the reference (on the layer's own ids) and
    /// the CPU backend, for decode and prefill token counts.
    func check(_ name: String, _ data: LayerData, fused: Bool = false, tokens: [Int] = [0, 1, 3, 37],
               seed: UInt64, file: StaticString = #filePath, line: UInt = #line) throws {
        let (metal, cpu) = try layers(data, fused: fused)
        let ref = NaiveReference(data)
        var rng = SplitMix64(seed: seed)
        let h = data.config.hiddenSize
        for t in tokens {
            let what = "\(name) T=\(t)"
            let x = rng.floats(t * h, scale: 2)
            let r = rng.floats(t * h)
            let (ids, w) = try metal.route(x)
            let (cpuIds, cpuW) = try cpu.route(x)
            XCTAssertEqual(ids, cpuIds, "\(what): ids vs cpu", file: file, line: line)
            assertClose(w, cpuW.map(Double.init), "\(what): weights vs cpu", file: file, line: line)
            assertClose(try metal.forward(x), ref.forward(x, tokens: t, forcedIds: ids), what, file: file, line: line)
            assertClose(try metal.forward(x, residual: r), ref.forward(x, tokens: t, residual: r, forcedIds: ids),
                        "\(what) + residual", file: file, line: line)
        }
    }

    func testMixtral() throws {
        try check("mixtral", .random(makeConfig(h: 32, i: 24, e: 8, k: 2), seed: 1), seed: 2)
    }

    func testQwen2MoESharedExpertWithGate() throws {
        let c = makeConfig(h: 33, i: 17, e: 6, k: 4) {
            $0.normTopKProb = false
            $0.sharedIntermediateSize = 20
        }
        var o = LayerOptions()
        o.sharedSigmoidGate = true
        try check("qwen2_moe", .random(c, o, seed: 3), seed: 4)
    }

    func testDeepSeekV3() throws {
        let c = makeConfig(h: 24, i: 16, e: 16, k: 4) {
            $0.scoring = .sigmoid
            $0.nGroup = 4
            $0.topKGroup = 2
            $0.routedScalingFactor = 2.5
            $0.sharedIntermediateSize = 12
        }
        var o = LayerOptions()
        o.selectionBias = true
        try check("deepseek_v3", .random(c, o, seed: 5), seed: 6)
    }

    func testGptOss() throws {
        let c = makeConfig(h: 20, i: 12, e: 8, k: 4) { $0.activation = .swigluOAI }
        var o = LayerOptions()
        o.routerBias = true
        o.gateUpBias = true
        o.downBias = true
        o.expertScale = 12
        try check("gpt_oss", .random(c, o, seed: 7), fused: true, seed: 8)
    }

    func testGemma4() throws {
        let c = makeConfig(h: 16, i: 40, e: 12, k: 3) { $0.activation = .geluTanh }
        var o = LayerOptions()
        o.perExpertScale = true
        try check("gemma4", .random(c, o, seed: 9), seed: 10)
    }

    /// Ties, NaN, infinities and huge values in x, logits and selection bias, for every
    /// router variant: the GPU router picks exactly the CPU router's ids.
    func testRouterMatchesTheCPURouterOnNonFiniteInputsAndTies() throws {
        var rng = SplitMix64(seed: 77)
        let specials: [Float] = [.nan, .infinity, -.infinity, 3e38, -3e38, 0, 1, 1]
        func sprinkle(_ values: [Float], _ p: Int) -> [Float] {
            values.map { rng.below(100) < p ? specials[rng.below(specials.count)] : $0 }
        }
        for scoring in [MoEScoring.softmax, .sigmoid] {
            for (nGroup, topKGroup) in [(1, 1), (4, 2), (8, 3)] {
                for k in [1, 3, 6] where topKGroup * (8 / nGroup) >= k {
                    let c = makeConfig(h: 8, i: 3, e: 8, k: k) {
                        $0.scoring = scoring
                        $0.nGroup = nGroup
                        $0.topKGroup = topKGroup
                    }
                    var d = LayerData.random(c, seed: 3)
                    d.router = (0..<64).map { $0 % 9 == 0 ? 1 : 0 }  // logits = x
                    d.selectionBias = sprinkle(rng.floats(8, scale: 0.1), 30)
                    let (metal, cpu) = try layers(d)
                    let x = sprinkle(rng.floats(8 * 9).map { ($0 * 4).rounded() / 4 }, 25)  // many exact ties
                    let what = "\(scoring) groups \(nGroup)/\(topKGroup) k=\(k)"
                    let (ids, w) = try metal.route(x)
                    let (cpuIds, cpuW) = try cpu.route(x)
                    XCTAssertEqual(ids, cpuIds, what)
                    for (a, b) in zip(w, cpuW) where !(a.isNaN && b.isNaN) && a != b {
                        XCTAssertEqual(a, b, accuracy: 1e-6 * max(1, abs(b)), what)
                    }
                }
            }
        }
    }

    // MARK: Budgets

    func forwardStats(_ layer: MoELayer, tokens: Int) throws -> MoECallStats {
        _ = try layer.forward(seededFloats(tokens * layer.configuration.hiddenSize, seed: UInt64(tokens)))
        return MoECallStats.last
    }

    /// Every affine width through the format kernels (4 and 8 bits have their own
    /// instances, the others run `any`), and the weights stay quantized on the device: the
    /// bytes allocated at creation are the packed bytes, never float32.
    /// ggml's blocks read by their own instances (Q8_0 gate, Q4_0 down) and, for the up
    /// matrix in Q4_0 beside a Q8_0 gate, by `any`; decode and prefill against the
    /// reference on the blocks' values and the CPU backend; the device holds the blocks.
    func testGGMLBlocks() throws {
        let config = makeConfig(h: 64, i: 64, e: 6, k: 2)
        var d = LayerData.random(config, seed: 90)
        let gate = PackedGGML(d.gate, q8: true, log2Scale: -9)
        let up = PackedGGML(d.up, q8: false, log2Scale: -4)
        let down = PackedGGML(d.down, q8: false, log2Scale: -5)
        (d.gate, d.up, d.down) = (gate.values, up.values, down.values)
        let q8 = GGMLType(name: "q8_0")!, q4 = GGMLType(name: "q4_0")!
        try gate.bytes.withUnsafeBytes { g in
            try up.bytes.withUnsafeBytes { u in
                try down.bytes.withUnsafeBytes { dn in
                    for mixed in [false, true] {
                        var w = d.weights()
                        w.gateUp = .separate(gate: .quantized(QuantizedWeightData(ggml: q8, blocks: g)),
                                             up: mixed ? .quantized(QuantizedWeightData(ggml: q4, blocks: u))
                                                       : WeightData(d.up))
                        w.downProj = .quantized(QuantizedWeightData(ggml: q4, blocks: dn))
                        let metal = try MoELayer(configuration: config, weights: w, backend: Self.kind)
                        let upBytes = mixed ? u.count : 4 * d.up.count
                        XCTAssertEqual(MoECallStats.last.allocatedBytes,
                                       [4 * d.router.count, g.count, upBytes, dn.count].map { ($0 + 15) / 16 * 16 }.reduce(0, +),
                                       "blocks are uploaded as they are")
                        let cpu = try MoELayer(configuration: config, weights: w, backend: .cpu)
                        let h = config.hiddenSize, x = seededFloats(37 * h, seed: 91)
                        for tokens in [1, 3, 37] {
                            let xs = Array(x[0..<tokens * h])
                            let (ids, _) = try metal.route(xs)
                            XCTAssertEqual(ids, try cpu.route(xs).ids)
                            let what = "q8_0 gate, \(mixed ? "q4_0" : "f32") up, q4_0 down, \(tokens) tokens"
                            assertClose(try metal.forward(xs), NaiveReference(d).forward(xs, tokens: tokens, forcedIds: ids), what)
                        }
                    }
                }
            }
        }
    }

    func testAffineWeightsStayQuantizedOnTheDevice() throws {
        let config = makeConfig(h: 64, i: 64, e: 6, k: 2)
        func device(_ bytes: Int) -> Int { (bytes + 15) / 16 * 16 }
        for bits in [2, 3, 4, 5, 6, 8] {
            try checkAffineLayer(config, bits: bits, seed: UInt64(70 + bits), backend: Self.kind) { _, packed in
                let bytes = packed.map { device(4 * $0.words.count) + 2 * device(4 * $0.scales.count) }
                XCTAssertEqual(MoECallStats.last.allocatedBytes, device(4 * config.numExperts * config.hiddenSize)
                               + bytes.reduce(0, +), "\(bits)-bit weights are uploaded as they are")
            }
        }
    }

    func testDispatchCommandBufferWaitAndAllocationBudgets() throws {
        for shared in [0, 8] {
            let data = LayerData.random(makeConfig(h: 16, i: 8, e: 4, k: 2) { $0.sharedIntermediateSize = shared }, seed: 11)
            let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
            XCTAssertGreaterThan(MoECallStats.last.allocations, 0, "weights are uploaded at creation")
            XCTAssertEqual(MoECallStats.last.backend, Self.kind)
            let extra = shared > 0 ? 2 : 0
            for (tokens, budget) in [(1, 5), (4, 5), (5, 5), (40, 5)] {
                let first = try forwardStats(layer, tokens: tokens)
                XCTAssertEqual(first.backend, Self.kind)
                XCTAssertEqual(first.tokens, tokens)
                XCTAssertLessThanOrEqual(first.dispatches, budget + extra, "T=\(tokens) shared=\(shared)")
                XCTAssertEqual(first.commandBuffers, 1)
                XCTAssertEqual(first.cpuWaits, 1)
                let again = try forwardStats(layer, tokens: tokens)
                XCTAssertEqual(again.allocations, 0, "T=\(tokens): a second forward of a shape allocates nothing")
                XCTAssertEqual(again.dispatches, first.dispatches)
            }
            // Smaller shapes reuse the buffers of larger ones.
            XCTAssertEqual(try forwardStats(layer, tokens: 3).allocations, 0)
            XCTAssertEqual(try forwardStats(layer, tokens: 17).allocations, 0)
            _ = try layer.route(seededFloats(16 * 6, seed: 1))
            XCTAssertEqual(MoECallStats.last.dispatches, 1, "prefill: the router is one dispatch")
            _ = try layer.route(seededFloats(16 * 2, seed: 1))
            XCTAssertEqual(MoECallStats.last.dispatches, 2, "decode: logits, then the top-k")
            XCTAssertEqual(MoECallStats.last.cpuWaits, 1)
        }
        // The CPU backend reports no device work.
        let cpu = try LayerData.random(makeConfig(h: 8, i: 4, e: 4, k: 2), seed: 12).layer()
        let stats = try forwardStats(cpu, tokens: 3)
        XCTAssertEqual(stats.backend, .cpu)
        XCTAssertEqual([stats.dispatches, stats.commandBuffers, stats.cpuWaits, stats.allocations], [0, 0, 0, 0])
    }

    // MARK: runLayers

    func testRunLayersIsOneCommandBufferAndMatchesALoop() throws {
        let h = 24
        let data = (0..<3).map { n in
            LayerData.random(makeConfig(h: h, i: 8 + n, e: 6, k: 2) { $0.sharedIntermediateSize = n == 1 ? 10 : 0 },
                             seed: 20 + UInt64(n))
        }
        let metal = try data.map { try MoELayer(configuration: $0.config, weights: $0.weights(), backend: Self.kind) }
        let cpu = try data.map { try $0.layer() }
        for tokens in [1, 3, 40] {
            let x = seededFloats(tokens * h, seed: UInt64(tokens))
            var expected = x
            for layer in cpu { expected = try layer.forward(expected, residual: expected) }
            var y = [Float](repeating: 0, count: x.count)
            try x.withUnsafeBufferPointer { xp in
                try y.withUnsafeMutableBufferPointer { yp in
                    try MoELayer.runLayers(metal, xp.baseAddress!, tokens: tokens, into: yp.baseAddress!)
                }
            }
            assertClose(y, expected.map(Double.init), "run_layers T=\(tokens)")
            let stats = MoECallStats.last
            XCTAssertEqual(stats.layers, 3)
            XCTAssertEqual(stats.commandBuffers, 1)
            XCTAssertEqual(stats.cpuWaits, 1)
            XCTAssertLessThanOrEqual(stats.dispatches, 3 * 5 + 2)
            // The CPU loop gives the same result, in place (x aliases y).
            var z = x
            try z.withUnsafeMutableBufferPointer { zp in
                try MoELayer.runLayers(cpu, UnsafePointer(zp.baseAddress!), tokens: tokens, into: zp.baseAddress!)
            }
            assertBitwiseEqual(z, expected, "cpu run_layers T=\(tokens)")
        }
        // A repeated layer gets a second scratch set; afterwards nothing is allocated.
        let x = seededFloats(5 * h, seed: 5)
        var y = x
        for _ in 0..<2 {
            try y.withUnsafeMutableBufferPointer { yp in
                try MoELayer.runLayers([metal[0], metal[0]], UnsafePointer(yp.baseAddress!), tokens: 5, into: yp.baseAddress!)
            }
        }
        XCTAssertEqual(MoECallStats.last.allocations, 0)
    }

    func testRunLayersErrors() throws {
        let a = try MoELayer(configuration: makeConfig(h: 8, i: 4, e: 4, k: 2), weights: LayerData.random(makeConfig(h: 8, i: 4, e: 4, k: 2), seed: 1).weights(), backend: Self.kind)
        let b = try LayerData.random(makeConfig(h: 8, i: 4, e: 4, k: 2), seed: 2).layer()
        let c = try MoELayer(configuration: makeConfig(h: 9, i: 4, e: 4, k: 2), weights: LayerData.random(makeConfig(h: 9, i: 4, e: 4, k: 2), seed: 3).weights(), backend: Self.kind)
        var buffer = [Float](repeating: 0, count: 9)
        func run(_ layers: [MoELayer]) throws {
            try buffer.withUnsafeMutableBufferPointer { p in
                try MoELayer.runLayers(layers, UnsafePointer(p.baseAddress!), tokens: 1, into: p.baseAddress!)
            }
        }
        XCTAssertThrowsError(try run([a, b])) { XCTAssertTrue("\($0)".contains("same backend"), "\($0)") }
        XCTAssertThrowsError(try run([a, c])) { XCTAssertTrue("\($0)".contains("hidden_size"), "\($0)") }
        XCTAssertThrowsError(try run([])) { XCTAssertTrue("\($0)".contains("at least one layer"), "\($0)") }
    }

    // MARK: C ABI

    func testLastStatsAndRunLayersThroughTheABI() throws {
        var desc = moe_layer_desc()
        moe_layer_desc_init(&desc)
        let data = LayerData.random(makeConfig(h: 8, i: 4, e: 4, k: 2), seed: 4)
        var handle: OpaquePointer?
        try data.router.withUnsafeBufferPointer { r in
            try data.gate.withUnsafeBufferPointer { g in
                try data.up.withUnsafeBufferPointer { u in
                    try data.down.withUnsafeBufferPointer { d in
                        desc.backend = Self.kind.rawValue
                        (desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k) = (8, 4, 4, 2)
                        (desc.router_weight, desc.gate_proj, desc.up_proj, desc.down_proj) =
                            (r.baseAddress, g.baseAddress, u.baseAddress, d.baseAddress)
                        XCTAssertEqual(moe_layer_create(&desc, &handle), MOE_OK, lastError())
                        _ = try XCTUnwrap(handle)
                    }
                }
            }
        }
        defer { moe_layer_destroy(handle) }
        var stats = moe_stats()
        XCTAssertEqual(moe_last_stats(&stats), MOE_ERROR_INVALID_ARGUMENT, "struct_size unset")
        stats.struct_size = UInt32(MemoryLayout<moe_stats>.size)
        XCTAssertEqual(moe_last_stats(nil), MOE_ERROR_INVALID_ARGUMENT)

        let x = seededFloats(16, seed: 1)
        var y = [Float](repeating: 0, count: 16)
        var handles: [OpaquePointer?] = [handle, handle]
        XCTAssertEqual(moe_run_layers(&handles, 2, x, 2, &y), MOE_OK, lastError())
        XCTAssertEqual(moe_last_stats(&stats), MOE_OK)
        XCTAssertEqual(stats.backend, Self.kind.rawValue)
        XCTAssertEqual(stats.layers, 2)
        XCTAssertEqual(stats.command_buffers, 1)
        XCTAssertEqual(stats.cpu_waits, 1)
        XCTAssertEqual(stats.dispatches, 10)

        // Old callers with a shorter struct get only the fields they know.
        var short = moe_stats()
        short.struct_size = 8
        short.tokens = -5
        XCTAssertEqual(moe_last_stats(&short), MOE_OK)
        XCTAssertEqual(short.backend, Self.kind.rawValue)
        XCTAssertEqual(short.tokens, -5)

        var bad: [OpaquePointer?] = [handle, OpaquePointer(bitPattern: 0x1230)]
        XCTAssertEqual(moe_run_layers(&bad, 2, x, 2, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertTrue(lastError().contains("layers[1]"), lastError())
        XCTAssertEqual(moe_run_layers(&handles, 0, x, 2, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(moe_run_layers(nil, 1, x, 2, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(moe_run_layers(&handles, 1, nil, 2, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(moe_run_layers(&handles, 1, x, -1, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(moe_run_layers(&handles, 1, nil, 0, nil), MOE_OK)
    }
}
