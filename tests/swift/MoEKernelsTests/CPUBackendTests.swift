// The CPU backend against the float64 reference, for every family setting of the spec
// table, on small random shapes (odd H and I, T = 0, 1, a few, more than one work item).
import Foundation
import XCTest
@testable import MoEKernels

final class CPUBackendTests: XCTestCase {
    /// Tokens whose reference routing margin is at least this are compared id for id;
    /// float32 scores are within ~1e-6 of the float64 ones.
    static let routingMargin = 1e-5

    struct Result {
        var error = 0.0, maxRef = 0.0
        mutating func merge(_ r: (error: Double, maxRef: Double)) {
            if r.maxRef > 0, maxRef == 0 || r.error / r.maxRef > error / maxRef { (error, maxRef) = r }
        }
    }

    /// Runs `data` on the CPU backend (separate and fused gate/up) for each token count and
    /// checks outputs, routing, residual and the aliased residual against the reference.
    @discardableResult
    func check(_ name: String, _ data: LayerData, tokens counts: [Int] = [0, 1, 5, 37], seed: UInt64,
               file: StaticString = #filePath, line: UInt = #line) throws -> Result {
        let c = data.config
        let (h, k, e) = (c.hiddenSize, c.topK, c.numExperts)
        let ref = NaiveReference(data)
        let separate = try data.layer(fused: false)
        let fused = try data.layer(fused: true)
        XCTAssertEqual(separate.backendKind, .cpu, file: file, line: line)
        var rng = SplitMix64(seed: seed)
        var result = Result()
        var compared = 0, total = 0

        for t in counts {
            let what = "\(name) T=\(t)"
            let x = rng.floats(t * h, scale: 2)
            let y = try separate.forward(x)
            XCTAssertEqual(y.count, t * h, what, file: file, line: line)
            assertBitwiseEqual(try fused.forward(x), y, "\(what): fused gate_up_proj vs separate gate/up",
                               file: file, line: line)

            // Routing: valid ids, and weights as the reference computes them for those ids.
            let (ids, w) = try separate.route(x)
            XCTAssertEqual(ids.count, t * k, what, file: file, line: line)
            XCTAssertEqual(w.count, t * k, what, file: file, line: line)
            assertValidIds(ids, k: k, e: e, what, file: file, line: line)
            var refWeights = [Double]()
            for tok in 0..<t {
                let v = ref.token(x, tok)
                refWeights += ref.weights(scores: ref.scores(v), ids: ids[tok * k..<(tok + 1) * k].map { Int($0) })
            }
            assertClose(w, refWeights, "\(what): route() weights", file: file, line: line)

            // The reference's own choice, where no near-tie makes it ambiguous.
            for (tok, r) in ref.route(x, tokens: t).enumerated() {
                total += 1
                guard r.margin >= Self.routingMargin else { continue }
                compared += 1
                let got = ids[tok * k..<(tok + 1) * k].map { Int($0) }
                if got != r.ids {
                    XCTFail("\(what): token \(tok) ids \(got), reference \(r.ids) (margin \(r.margin))",
                            file: file, line: line)
                }
            }

            // Outputs, computed by the reference from the layer's own ids.
            let refY = ref.forward(x, tokens: t, forcedIds: ids)
            result.merge(assertClose(y, refY, "\(what): forward", file: file, line: line))
            if t > 0 {
                let maxRef = refY.reduce(0) { max($0, abs($1)) }
                XCTAssertGreaterThan(maxRef, 0.05, "\(what): degenerate test data", file: file, line: line)
            }

            // Residual: added last, so y + r exactly; also against the reference.
            let r = rng.floats(t * h, scale: 2)
            let yr = try separate.forward(x, residual: r)
            assertBitwiseEqual(yr, zip(y, r).map { $0 + $1 }, "\(what): residual is added last",
                               file: file, line: line)
            result.merge(assertClose(yr, ref.forward(x, tokens: t, residual: r, forcedIds: ids),
                                     "\(what): forward with residual", file: file, line: line))

            // Residual aliasing the output buffer through the pointer API.
            if t > 0 {
                var buffer = r
                try x.withUnsafeBufferPointer { xp in
                    try buffer.withUnsafeMutableBufferPointer { bp in
                        let out = bp.baseAddress!
                        try fused.forward(xp.baseAddress!, tokens: t, residual: UnsafePointer(out), into: out)
                    }
                }
                assertBitwiseEqual(buffer, yr, "\(what): residual aliasing the output", file: file, line: line)
            }
        }
        // The id comparison must not have been skipped for most tokens.
        XCTAssertGreaterThanOrEqual(compared * 10, total * 9,
                                    "\(name): only \(compared) of \(total) tokens had unambiguous routing",
                                    file: file, line: line)
        return result
    }

    // MARK: Families of the spec table

    func testMixtral() throws {
        let c = makeConfig(h: 13, i: 7, e: 8, k: 2)
        let r = try check("Mixtral", .random(c, seed: 1), seed: 101)
        report("Mixtral", error: r.error, maxRef: r.maxRef)
    }

    func testQwen2MoEWithSigmoidGatedSharedExpert() throws {
        let c = makeConfig(h: 11, i: 5, e: 8, k: 4) {
            $0.normTopKProb = false
            $0.sharedIntermediateSize = 9
        }
        var o = LayerOptions()
        o.sharedSigmoidGate = true
        let r = try check("Qwen2-MoE", .random(c, o, seed: 2), seed: 102)
        report("Qwen2-MoE", error: r.error, maxRef: r.maxRef)
    }

    func testQwen3MoE() throws {
        var worst = Result()
        for norm in [true, false] {
            let c = makeConfig(h: 15, i: 7, e: 16, k: 4) { $0.normTopKProb = norm }
            worst.merge(try check("Qwen3-MoE norm=\(norm)", .random(c, seed: norm ? 3 : 33), seed: 103).pair)
        }
        report("Qwen3-MoE", error: worst.error, maxRef: worst.maxRef)
    }

    func testOLMoE() throws {
        let c = makeConfig(h: 9, i: 5, e: 16, k: 4) { $0.normTopKProb = false }
        let r = try check("OLMoE", .random(c, seed: 4), seed: 104)
        report("OLMoE", error: r.error, maxRef: r.maxRef)
    }

    func testDeepSeekV3() throws {
        let c = makeConfig(h: 17, i: 5, e: 16, k: 4) {
            $0.scoring = .sigmoid
            $0.normTopKProb = true
            $0.nGroup = 4
            $0.topKGroup = 2
            $0.routedScalingFactor = 2.5
            $0.sharedIntermediateSize = 10   // ungated: factor 1
        }
        var o = LayerOptions()
        o.selectionBias = true
        let data = LayerData.random(c, o, seed: 5)
        XCTAssertNil(data.sharedSigmoidGate)
        let r = try check("DeepSeek-V3", data, seed: 105)
        report("DeepSeek-V3", error: r.error, maxRef: r.maxRef)
    }

    func testGptOss() throws {
        var worst = Result()
        // Default alpha/limit, then other values, to check they are honoured.
        for (alpha, limit) in [(Float(1.702), Float(7)), (1.25, 3)] {
            let c = makeConfig(h: 13, i: 7, e: 8, k: 4) {
                $0.activation = .swigluOAI
                $0.swigluAlpha = alpha
                $0.swigluLimit = limit
            }
            var o = LayerOptions()
            o.routerBias = true
            o.gateUpBias = true
            o.downBias = true
            o.expertScale = 15   // pre-activations of several units: the clamps are hit
            let data = LayerData.random(c, o, seed: 6)
            // Make sure both clamps are exercised by the data.
            let ref = NaiveReference(data)
            var rng = SplitMix64(seed: 106)
            var (gClamped, uClamped) = (0, 0)
            for _ in 0..<20 {
                let v = rng.floats(c.hiddenSize, scale: 2).map(Double.init)
                for x in 0..<c.numExperts {
                    let (g, u) = ref.preActivations(x, v)
                    gClamped += g.filter { $0 > Double(limit) }.count
                    uClamped += u.filter { abs($0) > Double(limit) }.count
                }
            }
            XCTAssertGreaterThan(gClamped, 0, "no gate value above the limit")
            XCTAssertGreaterThan(uClamped, 0, "no up value outside ±limit")
            worst.merge(try check("gpt-oss alpha=\(alpha) limit=\(limit)", data, seed: 106).pair)
            // gpt-oss routes with a softmax over the k chosen logits: the same weights.
            let x = seededFloats(9 * c.hiddenSize, seed: 206, scale: 2)
            let (ids, w) = try data.layer(fused: true).route(x)
            for t in 0..<9 {
                let logits = (0..<c.topK).map { j -> Double in
                    let e = Int(ids[t * c.topK + j])
                    var dot = Double(data.routerBias![e])
                    for n in 0..<c.hiddenSize { dot += Double(data.router[e * c.hiddenSize + n]) * Double(x[t * c.hiddenSize + n]) }
                    return dot
                }
                let m = logits.max()!, sum = logits.reduce(0) { $0 + exp($1 - m) }
                for j in 0..<c.topK {
                    XCTAssertEqual(Double(w[t * c.topK + j]), exp(logits[j] - m) / sum, accuracy: 1e-6)
                }
            }
        }
        report("gpt-oss", error: worst.error, maxRef: worst.maxRef)
    }

    func testGemma4() throws {
        let c = makeConfig(h: 13, i: 9, e: 8, k: 2) { $0.activation = .geluTanh }
        var o = LayerOptions()
        o.perExpertScale = true
        let r = try check("Gemma-4", .random(c, o, seed: 7), seed: 107)
        report("Gemma-4", error: r.error, maxRef: r.maxRef)
    }

    // MARK: Shapes

    /// I > 128 and Is > 128 (several gate/up blocks, with biases packed per block),
    /// H > 256 (several down blocks), T = 40 (several router and gather work items).
    func testSeveralWorkItemsPerStage() throws {
        let c = makeConfig(h: 259, i: 131, e: 4, k: 2) { $0.sharedIntermediateSize = 130 }
        var o = LayerOptions()
        o.gateUpBias = true
        o.downBias = true
        o.sharedSigmoidGate = true
        o.routerScale = 8
        let r = try check("large blocks", .random(c, o, seed: 8), tokens: [40], seed: 108)
        report("large blocks (H=259, I=131, Is=130)", error: r.error, maxRef: r.maxRef)
    }

    func testOneExpert() throws {
        for shared in [0, 3] {
            let c = makeConfig(h: 7, i: 3, e: 1, k: 1) { $0.sharedIntermediateSize = shared }
            try check("E=1 shared=\(shared)", .random(c, seed: 9), tokens: [0, 1, 6], seed: 109)
            // One expert, normalised: the weight is exactly s / (s + 1e-20) = 1.
            let (ids, w) = try LayerData.random(c, seed: 9).layer().route(seededFloats(3 * 7, seed: 1))
            XCTAssertEqual(ids, [0, 0, 0])
            XCTAssertEqual(w, [1, 1, 1])
        }
    }

    func testTopKEqualsNumExperts() throws {
        let softmax = makeConfig(h: 9, i: 3, e: 5, k: 5) { $0.normTopKProb = false }
        try check("k=E softmax", .random(softmax, seed: 10), tokens: [1, 7], seed: 110)
        // Unnormalised softmax weights over all experts sum to 1.
        let (ids, w) = try LayerData.random(softmax, seed: 10).layer().route(seededFloats(9, seed: 2))
        XCTAssertEqual(Set(ids), Set(0..<5))
        XCTAssertEqual(w.reduce(0, +), 1, accuracy: 1e-6)

        let grouped = makeConfig(h: 9, i: 3, e: 6, k: 6) {
            $0.scoring = .sigmoid
            $0.nGroup = 3
            $0.topKGroup = 3
            $0.routedScalingFactor = 1.5
        }
        var o = LayerOptions()
        o.selectionBias = true
        try check("k=E sigmoid groups", .random(grouped, o, seed: 11), tokens: [1, 7], seed: 111)
    }

    func testEmptyInput() throws {
        let c = makeConfig(h: 5, i: 3, e: 4, k: 2) { $0.sharedIntermediateSize = 2 }
        let layer = try LayerData.random(c, seed: 12).layer()
        XCTAssertEqual(try layer.forward([]), [])
        XCTAssertEqual(try layer.forward([], residual: []), [])
        let (ids, w) = try layer.route([])
        XCTAssertEqual(ids, [])
        XCTAssertEqual(w, [])
        // Pointer API: T = 0 writes nothing.
        var y: [Float] = [42]
        var i32: [Int32] = [42]
        let x: [Float] = [1]
        try x.withUnsafeBufferPointer { xp in
            try y.withUnsafeMutableBufferPointer { yp in
                try layer.forward(xp.baseAddress!, tokens: 0, into: yp.baseAddress!)
                try i32.withUnsafeMutableBufferPointer { ip in
                    try layer.route(xp.baseAddress!, tokens: 0, ids: ip.baseAddress!, weights: yp.baseAddress!)
                }
            }
        }
        XCTAssertEqual(y, [42])
        XCTAssertEqual(i32, [42])
    }

    func testArrayAPIRejectsBadLengths() throws {
        let c = makeConfig(h: 5, i: 3, e: 4, k: 2)
        let layer = try LayerData.random(c, seed: 13).layer()
        assertInvalidArgument(mentioning: "x") { _ = try layer.forward([Float](repeating: 0, count: 7)) }
        assertInvalidArgument(mentioning: "x") { _ = try layer.route([Float](repeating: 0, count: 4)) }
        assertInvalidArgument(mentioning: "residual") {
            _ = try layer.forward([Float](repeating: 0, count: 10), residual: [Float](repeating: 0, count: 5))
        }
        var y = [Float](repeating: 0, count: 5)
        let x = [Float](repeating: 0, count: 5)
        assertInvalidArgument(mentioning: "num_tokens") {
            try x.withUnsafeBufferPointer { xp in
                try y.withUnsafeMutableBufferPointer { try layer.forward(xp.baseAddress!, tokens: -1, into: $0.baseAddress!) }
            }
        }
    }

    // MARK: Hand-computed values (checks the reference itself, too)

    /// H = I = 1, E = 2, k = 1, x = [1], router logits [2, -1]: expert 0 with g = 1,
    /// u = 2 (or g = 10, u = -9 for the clamps), down = 3. Values from Python's math module
    /// (swiglu_oai with alpha = float32(1.702) = 1.7020000219345093, as the layer stores it).
    func testHandComputedValues() throws {
        func data(_ edit: (inout MoEConfiguration) -> Void, gate: Float = 1, up: Float = 2) -> LayerData {
            LayerData(config: makeConfig(h: 1, i: 1, e: 2, k: 1, edit),
                      router: [2, -1], gate: [gate, 5], up: [up, 5], down: [3, 5])
        }
        let cases: [(String, LayerData, Double)] = [
            ("silu, normalised", data { _ in }, 4.38635147178003),
            ("silu, softmax weight", data { $0.normTopKProb = false }, 4.178324923167156),
            ("gelu_tanh", data { $0.activation = .geluTanh }, 5.047151943644861),
            ("swiglu_oai clamps", data({ $0.activation = .swigluOAI }, gate: 10, up: -9), -125.99915630958927),
        ]
        for (name, d, expected) in cases {
            let ref = NaiveReference(d).forward([1], tokens: 1)
            XCTAssertEqual(ref[0], expected, accuracy: 1e-12, "reference, \(name)")
            let y = try d.layer().forward([1])
            XCTAssertEqual(Double(y[0]), expected, accuracy: 1e-4 * abs(expected) + 1e-5, "layer, \(name)")
        }
    }
}

extension CPUBackendTests.Result {
    var pair: (error: Double, maxRef: Double) { (error, maxRef) }
}

func assertInvalidArgument(mentioning field: String, file: StaticString = #filePath, line: UInt = #line,
                           _ body: () throws -> Void) {
    do {
        try body()
        XCTFail("expected MoEError.invalidArgument naming \(field), nothing was thrown", file: file, line: line)
    } catch MoEError.invalidArgument(let message) {
        XCTAssertTrue(words(message).contains(field),
                      "message \"\(message)\" does not name \(field)", file: file, line: line)
    } catch {
        XCTFail("expected MoEError.invalidArgument naming \(field), got \(error)", file: file, line: line)
    }
}

/// The identifiers in a message ("shared_expert.gate_proj" gives both parts and the whole).
func words(_ message: String) -> Set<String> {
    var result = Set<String>()
    for token in message.split(whereSeparator: { !($0.isLetter || $0.isNumber || $0 == "_" || $0 == ".") }) {
        let t = token.trimmingCharacters(in: CharacterSet(charactersIn: "."))
        result.insert(t)
        for part in t.split(separator: ".") { result.insert(String(part)) }
    }
    return result
}
