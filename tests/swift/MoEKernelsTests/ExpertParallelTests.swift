// Expert parallelism (MoEConfiguration.localExperts, moe_layer_desc's first_local_expert /
// num_local_experts): a layer holding a share of the experts returns the partial sum of
// the slots whose experts it holds, so that disjoint shares sum to the whole layer; on every
// backend, in decode and prefill (the Metal GEMV and bucketed GEMM paths), through the Swift
// API and the C ABI; and what a share refuses.
import CMoESwift
import XCTest
@testable import MoEKernels

final class ExpertParallelTests: XCTestCase {
    // Every per-expert array and every router array, so that a share that read the wrong
    // expert's bias, or the router's arrays at a local index, would show.
    let config = makeConfig(h: 96, i: 40, e: 8, k: 3) { $0.sharedIntermediateSize = 24 }
    let options = LayerOptions(routerBias: true, selectionBias: true, perExpertScale: true, gateUpBias: true,
                               downBias: true, sharedSigmoidGate: true)
    let shares = [ExpertShare(0..<3), ExpertShare(3..<4), ExpertShare(4..<8)]
    /// Interleaved: 0, 3, 6 / 1, 4, 7 / 2, 5.
    let interleaved = [ExpertShare(first: 0, count: 3, stride: 3), ExpertShare(first: 1, count: 3, stride: 3),
                       ExpertShare(first: 2, count: 2, stride: 3)]

    /// The layer holding `share`, with the shared expert only when `shared`.
    func shareLayer(_ d: LayerData, _ share: ExpertShare, shared: Bool, backend: MoEBackendKind) throws -> MoELayer {
        var c = d.config
        c.localExperts = share
        var w = d.weights().experts(share, of: c.numExperts)
        if !shared {
            c.sharedIntermediateSize = 0
            w.shared = nil
        }
        return try MoELayer(configuration: c, weights: w, backend: backend)
    }

    func testSharesSumToTheWholeLayerOnEveryBackend() throws {
        let d = LayerData.random(config, options, seed: 501)
        let h = config.hiddenSize
        for backend in MoELayer.availableBackends {
          for shares in [shares, interleaved] {
            let whole = try MoELayer(configuration: config, weights: d.weights(), backend: backend)
            let parts = try shares.enumerated().map { n, share in try shareLayer(d, share, shared: n == 0, backend: backend) }
            // 1 and 3 tokens: the decode path; 40: the bucketed GEMM path of the Metal backends.
            for tokens in [1, 3, 40] {
                let x = seededFloats(tokens * h, seed: 502 + UInt64(tokens))
                let residual = seededFloats(tokens * h, seed: 503)
                let expected = try whole.forward(x, residual: residual)
                var sum = [Double](repeating: 0, count: tokens * h)
                for (n, part) in parts.enumerated() {
                    let y = try part.forward(x, residual: n == 0 ? residual : nil)
                    for (i, v) in y.enumerated() { sum[i] += Double(v) }
                }
                assertClose(sum.map(Float.init), expected.map(Double.init), "\(backend.name), \(tokens) tokens: the shares' sum")

                // Each share alone (the others' side): its held slots only. The whole layer's
                // experts with the weights of slots it does not hold set to 0 give the same.
                let (ids, weights) = try whole.route(x)
                for (n, share) in shares.enumerated() where n > 0 {
                    let masked = zip(ids, weights).map { share.place(of: Int($0)) != nil ? $1 : 0 }
                    let alone = try whole.experts(x, ids: ids, weights: masked)
                    assertClose(try parts[n].forward(x), alone.map(Double.init),
                                "\(backend.name), \(tokens) tokens: share \(share) alone")
                    // The routed path on a share: ids of experts it does not hold add nothing.
                    assertClose(try parts[n].experts(x, ids: ids, weights: weights), alone.map(Double.init),
                                "\(backend.name), \(tokens) tokens: share \(share), routing given")
                }
                // The router is replicated: a share routes as the whole layer does.
                let routed = try parts[1].route(x)
                XCTAssertEqual(routed.ids, ids, "\(backend.name): a share's routing")
                assertBitwiseEqual(routed.weights, weights, "\(backend.name): a share's routing weights")
            }
          }
        }
    }

    func testASharesOutputIsRefusedWhereTheWholeSumIsNeeded() throws {
        let d = LayerData.random(config, options, seed: 510)
        let part = try shareLayer(d, ExpertShare(2..<5), shared: false, backend: .cpu)
        let h = config.hiddenSize
        let x = seededFloats(2 * h, seed: 511), norm = [Float](repeating: 1, count: h)
        var normed = [Float](repeating: 0, count: 2 * h), y = normed
        try norm.withUnsafeBufferPointer { w in
            try normed.withUnsafeMutableBufferPointer { out in
                let options = MoEForwardOptions(nextNorm: RMSNorm(weight: w.baseAddress!, eps: 1e-6),
                                                normedOutput: out.baseAddress!)
                XCTAssertThrowsError(try part.forward(x, tokens: 2, options: options, into: &y)) { error in
                    XCTAssertTrue("\(error)".contains("holds experts 2..<5 of 8") && "\(error)".contains("the next norm"),
                                  "\(error)")
                }
            }
        }
        XCTAssertThrowsError(try MoELayer.runLayers([part], x, tokens: 2, into: &y)) { error in
            XCTAssertTrue("\(error)".contains("a stack"), "\(error)")
        }
        // Both sides of the range rule, and weights that hold all E experts for a share.
        for bad in [ExpertShare(first: -1, count: 3), ExpertShare(6..<9), ExpertShare(3..<3),
                    ExpertShare(first: 1, count: 3, stride: 4), ExpertShare(first: 1, count: 2, stride: 0)] {
            var c = config
            c.localExperts = bad
            XCTAssertThrowsError(try c.validate(), "\(bad)") { error in
                XCTAssertTrue("\(error)".contains("local experts"), "\(error)")
            }
        }
        var c = config
        c.localExperts = ExpertShare(0..<8)
        XCTAssertNoThrow(try c.validate())
        c.localExperts = ExpertShare(first: 1, count: 2, stride: 6)
        XCTAssertNoThrow(try c.validate())
        c.localExperts = ExpertShare(4..<8)
        XCTAssertThrowsError(try MoELayer(configuration: c, weights: d.weights(), backend: .cpu)) { error in
            XCTAssertTrue("\(error)".contains("gate_proj"), "\(error)")
        }
    }

    /// Encoded into the app's command buffer (the Metal backends): a share's partial sum, the
    /// same bits as its forward, in decode and prefill; the next norm refused before anything
    /// is recorded.
    func testAShareEncodesItsPartialSum() throws {
        let kind = MetalBackendTests.kind
        guard MoELayer.availableBackends.contains(kind) else { throw XCTSkip("the \(kind.name) backend is not available") }
        let app = try EncodeApp()
        let d = LayerData.random(config, options, seed: 530)
        let part = try shareLayer(d, interleaved[1], shared: true, backend: kind)
        let h = config.hiddenSize
        for tokens in [2, 40] {
            let x = seededFloats(tokens * h, seed: 531 + UInt64(tokens))
            let expected = try part.forward(x)
            let (xb, yb) = (try app.buffer(x), try app.buffer(bytes: tokens * h * 4))
            let commandBuffer = try XCTUnwrap(app.queue.makeCommandBuffer())
            try part.encodeForward(MoEMetalArray(xb), tokens: tokens, into: MoEMetalArray(yb), commandBuffer: commandBuffer)
            commandBuffer.commit()
            commandBuffer.waitUntilCompleted()
            assertBitwiseEqual(app.floats(yb, count: tokens * h), expected, "\(tokens) tokens encoded")
        }
        let norm = [Float](repeating: 1, count: h)
        try norm.withUnsafeBufferPointer { w in
            let (xb, yb, nb) = (try app.buffer(bytes: h * 4), try app.buffer(bytes: h * 4), try app.buffer(bytes: h * 4))
            let commandBuffer = try XCTUnwrap(app.queue.makeCommandBuffer())
            let options = MoEEncodeOptions(nextNorm: RMSNorm(weight: w.baseAddress!, eps: 1e-6), normedOutput: MoEMetalArray(nb))
            XCTAssertThrowsError(try part.encodeForward(MoEMetalArray(xb), tokens: 1, options: options,
                                                        into: MoEMetalArray(yb), commandBuffer: commandBuffer)) { error in
                XCTAssertTrue("\(error)".contains("the next norm"), "\(error)")
            }
        }
    }

    /// The C ABI: a share's per-expert arrays are pointers into the whole arrays (the
    /// weights used where they lie), the router's arrays whole.
    func testTheCABIsShareFields() throws {
        let d = LayerData.random(config, options, seed: 520)
        let (h, i, e) = (config.hiddenSize, config.intermediateSize, config.numExperts)
        let x = seededFloats(5 * h, seed: 521)
        let whole = CDescriptor(d)
        let wholeHandle = whole.create()
        defer { CMoESwift.moe_layer_destroy(wholeHandle) }
        var expected = [Float](repeating: 0, count: 5 * h)
        XCTAssertEqual(CMoESwift.moe_layer_forward(wholeHandle, x, 5, nil, &expected), MOE_OK, lastError())

        var sum = [Float](repeating: 0, count: 5 * h)
        for (n, share) in shares.enumerated() {
            let cd = CDescriptor(d)
            let first = share.first
            cd.desc.first_local_expert = Int64(first)
            cd.desc.num_local_experts = Int64(share.count)
            cd.desc.gate_proj = cd.desc.gate_proj! + first * i * h
            cd.desc.up_proj = cd.desc.up_proj! + first * i * h
            cd.desc.down_proj = cd.desc.down_proj! + first * h * i
            cd.desc.gate_up_bias = cd.desc.gate_up_bias! + first * 2 * i
            cd.desc.down_bias = cd.desc.down_bias! + first * h
            if n > 0 {
                cd.desc.shared_intermediate_size = 0
                (cd.desc.shared_gate_proj, cd.desc.shared_up_proj, cd.desc.shared_down_proj) = (nil, nil, nil)
                cd.desc.shared_sigmoid_gate = nil
            }
            let handle = cd.create()
            defer { CMoESwift.moe_layer_destroy(handle) }
            var info = moe_layer_info()
            info.struct_size = UInt32(MemoryLayout<moe_layer_info>.size)
            XCTAssertEqual(CMoESwift.moe_layer_get_info(handle, &info), MOE_OK)
            XCTAssertEqual([info.num_experts, info.first_local_expert, info.num_local_experts, info.local_expert_stride],
                           [Int64(e), Int64(first), Int64(share.count), 1])
            var y = [Float](repeating: 0, count: 5 * h)
            XCTAssertEqual(CMoESwift.moe_layer_forward(handle, x, 5, nil, &y), MOE_OK, lastError())
            for (k, v) in y.enumerated() { sum[k] += v }
        }
        assertClose(sum, expected.map(Double.init), "C ABI: the shares' sum")

        // Fields that do not name a non-empty range of the E experts.
        for (first, count, stride) in [(-1, 2, 1), (0, -1, 1), (7, 2, 1), (3, 0, 1), (0, 9, 1), (Int64.max, 1, 1),
                                       (1, 3, 4), (0, 2, -1), (0, 2, Int64.max)] as [(Int64, Int64, Int64)] {
            let cd = CDescriptor(d)
            cd.desc.first_local_expert = first
            cd.desc.num_local_experts = count
            cd.desc.local_expert_stride = stride
            var out: OpaquePointer?
            XCTAssertEqual(CMoESwift.moe_layer_create(&cd.desc, &out), MOE_ERROR_INVALID_ARGUMENT, "\(first), \(count)")
            XCTAssertNil(out)
            XCTAssertTrue(lastError().contains("local_expert_stride"), lastError())
        }
    }
}
