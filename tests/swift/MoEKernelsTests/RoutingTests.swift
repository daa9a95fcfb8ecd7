// Router edge cases: exact ties, group-limited routing, NaN and infinities.
import Foundation
import XCTest
import MoEKernels

final class RoutingTests: XCTestCase {
    /// A layer whose logits are exactly the token: H = E, identity router weight.
    func identityRouter(_ c: MoEConfiguration, seed: UInt64 = 1) -> LayerData {
        precondition(c.hiddenSize == c.numExperts)
        var d = LayerData.random(c, seed: seed)
        d.router = (0..<c.numExperts * c.numExperts).map { $0 % (c.numExperts + 1) == 0 ? 1 : 0 }
        return d
    }

    /// A layer whose logits are `logits` for every token: zero router weight plus router bias.
    func constantLogits(_ logits: [Float], _ c: MoEConfiguration, selectionBias: [Float]? = nil) -> LayerData {
        var d = LayerData.random(c, seed: 2)
        d.router = [Float](repeating: 0, count: c.numExperts * c.hiddenSize)
        d.routerBias = logits
        d.selectionBias = selectionBias
        return d
    }

    func rows(_ ids: [Int32], _ k: Int) -> [[Int]] {
        stride(from: 0, to: ids.count, by: k).map { ids[$0..<$0 + k].map { Int($0) } }
    }

    // MARK: Ties

    func testExactTiesLowerIndexWins() throws {
        let c = makeConfig(h: 6, i: 3, e: 6, k: 3)
        let data = identityRouter(c)
        let x: [[Float]] = [
            [1, 1, 1, 1, 1, 1],
            [0, 2, 0, 2, 2, 0],
            [5, -1, 5, 5, -1, 9],
            [-3, -3, -3, -3, -3, -4],
            [0, 0, 0, 0, 7, 7],
            [0, -0.0, 0, 0, 0, 0],   // -0 == +0
        ]
        let expected = [[0, 1, 2], [1, 3, 4], [5, 0, 2], [0, 1, 2], [4, 5, 0], [0, 1, 2]]
        let (ids, w) = try data.layer().route(x.flatMap { $0 })
        XCTAssertEqual(rows(ids, 3), expected)
        // Equal scores give equal weights; normalised, 1/3 each.
        for t in [0, 1, 3, 5] {
            XCTAssertEqual(w[3 * t], w[3 * t + 1], "token \(t)")
            XCTAssertEqual(w[3 * t + 1], w[3 * t + 2], "token \(t)")
            XCTAssertEqual(w[3 * t], 1.0 / 3, accuracy: 1e-6, "token \(t)")
        }
        // The reference agrees on these ties.
        let ref = NaiveReference(data)
        XCTAssertEqual(x.map { ref.route($0.map(Double.init)).ids }, expected)
    }

    /// Ties in the selection scores only (sigmoid of 0 = 0.5 for all, plus a selection
    /// bias); the weights stay the unbiased 0.5, normalised and scaled.
    func testSelectionBiasTiesAndWeights() throws {
        for norm in [true, false] {
            let c = makeConfig(h: 3, i: 2, e: 5, k: 4) {
                $0.scoring = .sigmoid
                $0.normTopKProb = norm
                $0.routedScalingFactor = 2
            }
            let d = constantLogits([0, 0, 0, 0, 0], c, selectionBias: [0.25, 0.5, 0.5, 0.25, 0.5])
            let (ids, w) = try d.layer().route([0.5, -1, 2, 0, 0, 0])
            XCTAssertEqual(rows(ids, 4), [[1, 2, 4, 0], [1, 2, 4, 0]])
            XCTAssertEqual(w, [Float](repeating: norm ? 0.5 : 1, count: 8))
        }
    }

    // MARK: Groups

    /// Selection scores (sigmoid(0) + selection bias, all exact in float32):
    /// groups of 2: [0.875, 0], [0.5, 0.5], [0.625, 0.25], [0.125, 0.125]
    /// group scores (sum of the two largest): 0.875, 1.0, 0.875, 0.25
    /// topk_group = 2 keeps group 1 and, of the tied groups 0 and 2, group 0.
    /// A max-per-group score would keep groups 0 and 2 instead; no groups would pick 0, 4.
    func testGroupLimitedRoutingUsesSumOfTwoLargest() throws {
        let bias: [Float] = [0.375, -0.5, 0, 0, 0.125, -0.25, -0.375, -0.375]
        for (k, expected) in [(1, [0]), (2, [0, 2]), (3, [0, 2, 3]), (4, [0, 2, 3, 1])] {
            let c = makeConfig(h: 4, i: 2, e: 8, k: k) {
                $0.scoring = .sigmoid
                $0.nGroup = 4
                $0.topKGroup = 2
                $0.routedScalingFactor = 3
            }
            let d = constantLogits([Float](repeating: 0, count: 8), c, selectionBias: bias)
            let (ids, w) = try d.layer().route([1, 2, 3, 4])
            XCTAssertEqual(ids.map { Int($0) }, expected, "k = \(k)")
            for v in w { XCTAssertEqual(v, 3.0 / Float(k), accuracy: 1e-6, "k = \(k)") }
            XCTAssertEqual(NaiveReference(d).route([1, 2, 3, 4]).ids, expected, "reference, k = \(k)")
        }
        // Without groups: the global top 2.
        let c = makeConfig(h: 4, i: 2, e: 8, k: 2) { $0.scoring = .sigmoid }
        let (ids, _) = try constantLogits([Float](repeating: 0, count: 8), c, selectionBias: bias).layer().route([0, 0, 0, 0])
        XCTAssertEqual(ids, [0, 4])
    }

    /// One expert per group: a group's score is its only c.
    func testGroupsOfOneExpert() throws {
        let c = makeConfig(h: 4, i: 2, e: 4, k: 2) {
            $0.scoring = .sigmoid
            $0.nGroup = 4
            $0.topKGroup = 2
        }
        let d = constantLogits([0, 0, 0, 0], c, selectionBias: [-0.25, 0.25, 0, 0.25])
        let (ids, _) = try d.layer().route([0, 0, 0, 0])
        XCTAssertEqual(ids, [1, 3])
    }

    /// Random data: group-limited ids against the reference (where no near-tie), and
    /// topk_group == n_group equals ungrouped routing.
    func testGroupLimitedRoutingAgainstReference() throws {
        var compared = 0, total = 0
        for (n, (e, nGroup, topKGroup, k)) in [(8, 2, 1, 2), (12, 4, 2, 3), (16, 8, 3, 5), (16, 4, 4, 4)].enumerated() {
            let c = makeConfig(h: 7, i: 2, e: e, k: k) {
                $0.scoring = n % 2 == 0 ? .sigmoid : .softmax
                $0.nGroup = nGroup
                $0.topKGroup = topKGroup
            }
            var o = LayerOptions()
            o.selectionBias = true
            let data = LayerData.random(c, o, seed: 40 + UInt64(n))
            let x = seededFloats(30 * 7, seed: 50 + UInt64(n), scale: 2)
            let (ids, _) = try data.layer().route(x)
            assertValidIds(ids, k: k, e: e, "groups \(nGroup)/\(topKGroup)")
            for (t, r) in NaiveReference(data).route(x, tokens: 30).enumerated() {
                total += 1
                guard r.margin >= 1e-5 else { continue }
                compared += 1
                XCTAssertEqual(rows(ids, k)[t], r.ids, "E=\(e) groups \(nGroup)/\(topKGroup) token \(t)")
                // No chosen expert outside the kept groups.
                let size = e / nGroup
                XCTAssertLessThanOrEqual(Set(r.ids.map { $0 / size }).count, topKGroup)
            }
            if topKGroup == nGroup {
                var ungrouped = data
                ungrouped.config.nGroup = 1
                ungrouped.config.topKGroup = 1
                XCTAssertEqual(try ungrouped.layer().route(x).ids, ids)
            }
        }
        XCTAssertGreaterThanOrEqual(compared * 10, total * 9)
    }

    // MARK: Non-finite inputs

    func testInfinitiesAndNaNOrderWithSigmoid() throws {
        // c = sigmoid(logits) = [0, 1, 0.5, NaN, 0.73]: +inf first, NaN is not among the
        // k largest (the NumPy reference orders NaN last as well).
        let c = makeConfig(h: 2, i: 2, e: 5, k: 2) { $0.scoring = .sigmoid }
        let (ids, w) = try constantLogits([-.infinity, .infinity, 0, .nan, 1], c).layer().route([0, 0])
        XCTAssertEqual(ids, [1, 4])
        let s4 = 1 / (1 + exp(-1.0))
        XCTAssertEqual(Double(w[0]), 1 / (1 + s4), accuracy: 1e-6)
        XCTAssertEqual(Double(w[1]), s4 / (1 + s4), accuracy: 1e-6)
    }

    /// Sigmoid scores that underflow to 0 for every expert: the normalisation's +1e-20
    /// keeps the weights 0 instead of NaN, so the output is the shared expert + residual.
    func testZeroScoresGiveZeroWeights() throws {
        let c = makeConfig(h: 3, i: 2, e: 4, k: 2) {
            $0.scoring = .sigmoid
            $0.sharedIntermediateSize = 2
        }
        let d = constantLogits([-1000, -2000, -.infinity, -1000], c)
        let layer = try d.layer()
        let x: [Float] = [0.5, -1, 2]
        let (ids, w) = try layer.route(x)
        XCTAssertEqual(ids, [0, 1])   // every score is exactly 0: a tie, lower index first
        XCTAssertEqual(w, [0, 0])
        let r: [Float] = [1, 2, 3]
        let y = try layer.forward(x, residual: r)
        XCTAssertTrue(y.allSatisfy { $0.isFinite }, "\(y)")
        assertClose(y, NaiveReference(d).forward(x, tokens: 1, residual: r), "shared + residual only")
    }

    /// NaN, ±inf and huge values in x, in the logits (router bias) and in the selection
    /// bias, for every router variant: ids are always valid and distinct and nothing traps.
    func testNonFiniteInputsGiveValidIds() throws {
        var rng = SplitMix64(seed: 77)
        let specials: [Float] = [.nan, .infinity, -.infinity, 3e38, -3e38, 0]
        func sprinkle(_ values: [Float], _ p: Int) -> [Float] {
            values.map { rng.below(100) < p ? specials[rng.below(specials.count)] : $0 }
        }
        var cases = 0
        for scoring in [MoEScoring.softmax, .sigmoid] {
            for (nGroup, topKGroup) in [(1, 1), (4, 2), (8, 3)] {
                for k in [1, 3, 6] where topKGroup * (8 / nGroup) >= k {
                    for useSelectionBias in [false, true] {
                        let c = makeConfig(h: 8, i: 3, e: 8, k: k) {
                            $0.scoring = scoring
                            $0.nGroup = nGroup
                            $0.topKGroup = topKGroup
                            $0.sharedIntermediateSize = 2
                        }
                        // x with specials, through an identity router (0 * inf gives NaN logits too).
                        var d = identityRouter(c, seed: 3)
                        if useSelectionBias { d.selectionBias = sprinkle(rng.floats(8, scale: 0.1), 30) }
                        let layer = try d.layer()
                        for p in [10, 50, 100] {
                            let x = sprinkle(rng.floats(8 * 20, scale: 3), p)
                            let (ids, _) = try layer.route(x)
                            assertValidIds(ids, k: k, e: 8, "\(scoring) groups \(nGroup)/\(topKGroup) k \(k) p \(p)")
                            XCTAssertEqual(try layer.forward(x).count, x.count)
                            cases += 1
                        }
                        // Exact special logits via the router bias.
                        for _ in 0..<5 {
                            let logits = sprinkle(rng.floats(8, scale: 3), 60)
                            let dl = constantLogits(logits, c,
                                                    selectionBias: useSelectionBias ? sprinkle(rng.floats(8), 30) : nil)
                            let layer = try dl.layer()
                            let x = rng.floats(8 * 3)
                            let (ids, _) = try layer.route(x)
                            assertValidIds(ids, k: k, e: 8, "logits \(logits)")
                            XCTAssertEqual(try layer.forward(x).count, x.count)
                            cases += 1
                        }
                    }
                }
            }
        }
        // All-NaN and all-infinite logits.
        for v in [Float.nan, .infinity, -.infinity] {
            let c = makeConfig(h: 2, i: 2, e: 6, k: 4) { $0.nGroup = 3; $0.topKGroup = 2 }
            let (ids, _) = try constantLogits([Float](repeating: v, count: 6), c).layer().route([0, 0, 1, 1])
            assertValidIds(ids, k: 4, e: 6, "all logits \(v)")
            cases += 1
        }
        XCTAssertGreaterThan(cases, 100)
    }
}
