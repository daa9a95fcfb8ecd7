// Issue 13 through the C header: moe_layer_forward_ex (a decoder's post-attention block,
// the input norm and the next layer's norm fused into the layer) and moe_run_layers_ex,
// on cpu and, where it runs, softmetal, against NaiveReference.
import CMoESwift
import XCTest
@testable import MoEKernels

/// The RMSNorm of the spec in float64, row by row.
func naiveRMSNorm(_ v: [Double], h: Int, weight: [Float], eps: Float, offset: Float) -> [Double] {
    var out = v
    for t in 0..<v.count / h {
        let row = v[t * h..<(t + 1) * h]
        let inverse = 1 / (row.reduce(0) { $0 + $1 * $1 } / Double(h) + Double(eps)).squareRoot()
        for j in 0..<h { out[t * h + j] = v[t * h + j] * inverse * (Double(offset) + Double(weight[j])) }
    }
    return out
}

final class FusedNormTests: XCTestCase {
    let config = makeConfig(h: 40, i: 24, e: 8, k: 3) {
        $0.sharedIntermediateSize = 16
        $0.scoring = .sigmoid
        $0.nGroup = 4
        $0.topKGroup = 2
    }
    var data: LayerData {
        var o = LayerOptions()
        (o.routerBias, o.sharedSigmoidGate) = (true, true)
        return LayerData.random(config, o, seed: 7)
    }

    var backends: [moe_backend] {
        MoELayer.availableBackends.contains(.softMetal) ? [MOE_BACKEND_CPU, MOE_BACKEND_SOFTMETAL] : [MOE_BACKEND_CPU]
    }

    /// `moe_layer_forward_ex` with arrays: returns (status, h, normed).
    func forwardEx(_ layer: OpaquePointer?, _ x: [Float], tokens: Int, residualIsInput: Bool,
                   inputNorm: (weight: [Float], eps: Float, offset: Float)?,
                   nextNorm: (weight: [Float], eps: Float, offset: Float)?,
                   edit: (inout moe_forward_desc) -> Void = { _ in }) -> (moe_status, [Float], [Float]) {
        let h = config.hiddenSize
        var y = [Float](repeating: .nan, count: tokens * h)
        var normed = [Float](repeating: .nan, count: tokens * h)
        let inW = inputNorm?.weight ?? [], nextW = nextNorm?.weight ?? []
        let status = x.withUnsafeBufferPointer { xp in
            y.withUnsafeMutableBufferPointer { yp in
                normed.withUnsafeMutableBufferPointer { np in
                    inW.withUnsafeBufferPointer { iw in
                        nextW.withUnsafeBufferPointer { nw in
                            var d = moe_forward_desc()
                            CMoESwift.moe_forward_desc_init(&d)
                            d.x = xp.baseAddress
                            d.num_tokens = Int64(tokens)
                            d.y = yp.baseAddress
                            d.residual_is_input = residualIsInput ? 1 : 0
                            if let n = inputNorm { d.input_norm = moe_rms_norm(weight: iw.baseAddress, eps: n.eps, offset: n.offset) }
                            if let n = nextNorm {
                                d.next_norm = moe_rms_norm(weight: nw.baseAddress, eps: n.eps, offset: n.offset)
                                d.normed = np.baseAddress
                            }
                            edit(&d)
                            return CMoESwift.moe_layer_forward_ex(layer, &d)
                        }
                    }
                }
            }
        }
        return (status, y, normed)
    }

    func testBlockMatchesReference() {
        let d = data, ref = NaiveReference(d), h = config.hiddenSize
        for backend in backends {
            let desc = CDescriptor(d, backend: backend)
            let layer = desc.create()
            defer { CMoESwift.moe_layer_destroy(layer) }
            for tokens in [1, 5, 40] {
                for offset: Float in [0, 1] {
                    let what = "backend \(backend.rawValue), T=\(tokens), offset \(offset)"
                    let x = seededFloats(tokens * h, seed: UInt64(tokens), scale: 3)
                    let inW = seededFloats(h, seed: 100, scale: 0.3).map { $0 + 1 - offset }
                    let nextW = seededFloats(h, seed: 101, scale: 0.3).map { $0 + 1 - offset }
                    let (status, y, normed) = forwardEx(layer, x, tokens: tokens, residualIsInput: true,
                                                        inputNorm: (inW, 1e-6, offset), nextNorm: (nextW, 1e-5, offset))
                    XCTAssertEqual(status, MOE_OK, lastError())
                    if backend == MOE_BACKEND_SOFTMETAL {
                        var stats = moe_stats()
                        stats.struct_size = UInt32(MemoryLayout<moe_stats>.size)
                        XCTAssertEqual(CMoESwift.moe_last_stats(&stats), MOE_OK)
                        XCTAssertEqual(stats.dispatches, 5 + 2, "\(what): the budget is unchanged")
                    }
                    // The layer runs on the normalised rows; its own routing of them.
                    let xn = naiveRMSNorm(x.map(Double.init), h: h, weight: inW, eps: 1e-6, offset: offset).map(Float.init)
                    let (_, ids, _) = cRoute(layer, xn, tokens: tokens, k: config.topK)
                    let expectedH = zip(ref.forward(xn, tokens: tokens, forcedIds: ids), x).map { $0 + Double($1) }
                    assertClose(y, expectedH, "\(what): h")
                    assertClose(normed, naiveRMSNorm(expectedH, h: h, weight: nextW, eps: 1e-5, offset: offset),
                                "\(what): normed")
                }
            }
        }
    }

    /// The plain call through the new descriptor is moe_layer_forward, bit for bit.
    func testNoOptionsIsThePlainForward() {
        let d = data, h = config.hiddenSize
        let desc = CDescriptor(d)
        let layer = desc.create()
        defer { CMoESwift.moe_layer_destroy(layer) }
        let x = seededFloats(5 * h, seed: 3)
        let (status, y, _) = forwardEx(layer, x, tokens: 5, residualIsInput: false, inputNorm: nil, nextNorm: nil)
        XCTAssertEqual(status, MOE_OK)
        assertBitwiseEqual(y, cForward(layer, x, tokens: 5, h: h).1, "forward_ex vs forward")
        let (_, yr, _) = forwardEx(layer, x, tokens: 5, residualIsInput: true, inputNorm: nil, nextNorm: nil)
        assertBitwiseEqual(yr, cForward(layer, x, tokens: 5, residual: x, h: h).1, "residual_is_input vs residual = x")
    }

    func testRunLayersWithInputNorms() {
        let h = config.hiddenSize, tokens = 6
        for backend in backends {
            let descs = (0..<3).map { CDescriptor(LayerData.random(config, LayerOptions(), seed: 50 + UInt64($0)), backend: backend) }
            let layers = descs.map { $0.create() }
            defer { layers.forEach { CMoESwift.moe_layer_destroy($0) } }
            let weights = (0..<3).map { seededFloats(h, seed: 60 + UInt64($0), scale: 0.2) }
            let x = seededFloats(tokens * h, seed: 9, scale: 2)
            var y = [Float](repeating: .nan, count: tokens * h)
            let status = weights[0].withUnsafeBufferPointer { w0 in
                weights[1].withUnsafeBufferPointer { w1 in
                    weights[2].withUnsafeBufferPointer { w2 in
                        let norms = [w0, w1, w2].map { moe_rms_norm(weight: $0.baseAddress, eps: 1e-6, offset: 1) }
                        return CMoESwift.moe_run_layers_ex(layers, 3, x, Int64(tokens), &y, norms)
                    }
                }
            }
            XCTAssertEqual(status, MOE_OK, lastError())
            // The same stack as separate calls of the block.
            var expected = x
            for (layer, w) in zip(layers, weights) {
                let (s, next, _) = forwardEx(layer, expected, tokens: tokens, residualIsInput: true,
                                             inputNorm: (w, 1e-6, 1), nextNorm: nil)
                XCTAssertEqual(s, MOE_OK)
                expected = next
            }
            let maxRef = expected.reduce(0) { max($0, abs($1)) }
            for (a, b) in zip(y, expected) {
                XCTAssertLessThanOrEqual(abs(a - b), 1e-5 * maxRef + 1e-6, "backend \(backend.rawValue)")
            }
            if backend == MOE_BACKEND_CPU { assertBitwiseEqual(y, expected, "cpu: the same code path") }
        }
    }

    func testBadDescriptors() {
        let h = config.hiddenSize
        let desc = CDescriptor(data)
        let layer = desc.create()
        defer { CMoESwift.moe_layer_destroy(layer) }
        let x = seededFloats(2 * h, seed: 1), w = [Float](repeating: 1, count: h)
        func expect(_ word: String, file: StaticString = #filePath, line: UInt = #line, _ status: moe_status) {
            XCTAssertEqual(status, MOE_ERROR_INVALID_ARGUMENT, file: file, line: line)
            XCTAssertTrue(words(lastError()).contains(word), "\"\(lastError())\" does not name \(word)", file: file, line: line)
        }
        expect("struct_size", forwardEx(layer, x, tokens: 2, residualIsInput: false, inputNorm: nil, nextNorm: nil) {
            $0.struct_size = 8
        }.0)
        for eps: Float in [0, -1, .nan, .infinity] {
            expect("input_norm", forwardEx(layer, x, tokens: 2, residualIsInput: true, inputNorm: (w, eps, 0), nextNorm: nil).0)
            expect("next_norm", forwardEx(layer, x, tokens: 2, residualIsInput: true, inputNorm: nil, nextNorm: (w, eps, 0)).0)
        }
        expect("input_norm", forwardEx(layer, [], tokens: 0, residualIsInput: true, inputNorm: (w, 0, 0), nextNorm: nil).0)
        expect("offset", forwardEx(layer, x, tokens: 2, residualIsInput: false, inputNorm: (w, 1e-6, .nan), nextNorm: nil).0)
        expect("normed", forwardEx(layer, x, tokens: 2, residualIsInput: false, inputNorm: nil, nextNorm: (w, 1e-6, 0)) {
            $0.normed = nil
        }.0)
        expect("normed", forwardEx(layer, x, tokens: 2, residualIsInput: false, inputNorm: nil, nextNorm: (w, 1e-6, 0)) {
            $0.next_norm.weight = nil
        }.0)
        x.withUnsafeBufferPointer { xp in
            expect("residual_is_input", forwardEx(layer, x, tokens: 2, residualIsInput: true, inputNorm: nil, nextNorm: nil) {
                $0.residual = xp.baseAddress
            }.0)
        }
        expect("x", forwardEx(layer, x, tokens: 2, residualIsInput: false, inputNorm: nil, nextNorm: nil) { $0.x = nil }.0)
        expect("desc", CMoESwift.moe_layer_forward_ex(layer, nil))
        var y = [Float](repeating: 0, count: 2 * h)
        var norms = [moe_rms_norm(weight: nil, eps: 1e-6, offset: 0)]
        expect("input_norms", CMoESwift.moe_run_layers_ex([layer], 1, x, 2, &y, &norms))
        w.withUnsafeBufferPointer { wp in
            norms[0] = moe_rms_norm(weight: wp.baseAddress, eps: 0, offset: 0)
            expect("input_norms", CMoESwift.moe_run_layers_ex([layer], 1, x, 2, &y, &norms))
        }
    }
}
