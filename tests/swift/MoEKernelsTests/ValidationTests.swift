// Every bad configuration or weight array throws MoEError.invalidArgument naming the field.
import XCTest
import MoEKernels

final class ValidationTests: XCTestCase {
    let good = makeConfig(h: 6, i: 4, e: 8, k: 2)

    func testValidConfigurationPasses() throws {
        XCTAssertNoThrow(try good.validate())
        XCTAssertNoThrow(try LayerData.random(good, seed: 1).layer())
        // Boundaries that are allowed.
        XCTAssertNoThrow(try makeConfig(h: 1, i: 1, e: 1, k: 1).validate())
        XCTAssertNoThrow(try makeConfig(h: 6, i: 4, e: 8, k: 8).validate())
        XCTAssertNoThrow(try makeConfig(h: 6, i: 4, e: 8, k: 4) { $0.nGroup = 4; $0.topKGroup = 2 }.validate())
        XCTAssertNoThrow(try makeConfig(h: 6, i: 4, e: 8, k: 8) { $0.nGroup = 8; $0.topKGroup = 8 }.validate())
    }

    func testBadConfigurations() {
        let cases: [(String, (inout MoEConfiguration) -> Void)] = [
            ("hidden_size", { $0.hiddenSize = 0 }),
            ("hidden_size", { $0.hiddenSize = -5 }),
            ("hidden_size", { $0.hiddenSize = Int(Int32.max) + 1 }),
            ("intermediate_size", { $0.intermediateSize = 0 }),
            ("intermediate_size", { $0.intermediateSize = -1 }),
            ("num_experts", { $0.numExperts = 0 }),
            ("num_experts", { $0.numExperts = -8 }),
            ("top_k", { $0.topK = 0 }),
            ("top_k", { $0.topK = -1 }),
            ("top_k", { $0.topK = 9 }),
            ("shared_intermediate_size", { $0.sharedIntermediateSize = -1 }),
            ("n_group", { $0.nGroup = 0 }),
            ("n_group", { $0.nGroup = -2 }),
            ("n_group", { $0.nGroup = 3 }),          // does not divide 8
            ("n_group", { $0.nGroup = 16 }),         // does not divide 8
            ("topk_group", { $0.nGroup = 4; $0.topKGroup = 0 }),
            ("topk_group", { $0.nGroup = 4; $0.topKGroup = 5 }),
            ("topk_group", { $0.nGroup = 4; $0.topKGroup = -1 }),
            ("topk_group", { $0.nGroup = 4; $0.topKGroup = 1; $0.topK = 3 }),  // 1 group of 2 < k
            ("topk_group", { $0.nGroup = 8; $0.topKGroup = 2; $0.topK = 3 }),  // 2 groups of 1 < k
            ("routed_scaling_factor", { $0.routedScalingFactor = .nan }),
            ("routed_scaling_factor", { $0.routedScalingFactor = .infinity }),
            ("swiglu_alpha", { $0.swigluAlpha = .nan }),
            ("swiglu_limit", { $0.swigluLimit = 0 }),
            ("swiglu_limit", { $0.swigluLimit = -1 }),
            ("swiglu_limit", { $0.swigluLimit = .infinity }),
        ]
        for (field, edit) in cases {
            var c = good
            edit(&c)
            assertInvalidArgument(mentioning: field) { try c.validate() }
            // The layer validates too (with otherwise matching weights where possible).
            let weights = LayerData.random(good, seed: 2).weights()
            assertInvalidArgument(mentioning: field) { _ = try MoELayer(configuration: c, weights: weights, backend: .cpu) }
        }
    }

    func testWrongWeightCounts() {
        let c = makeConfig(h: 6, i: 4, e: 8, k: 2) { $0.sharedIntermediateSize = 3 }
        var o = LayerOptions()
        (o.routerBias, o.selectionBias, o.perExpertScale, o.gateUpBias, o.downBias, o.sharedSigmoidGate) =
            (true, true, true, true, true, true)
        let base = LayerData.random(c, o, seed: 3)
        XCTAssertNoThrow(try base.layer())
        XCTAssertNoThrow(try base.layer(fused: true))

        func drop(_ a: [Float]?) -> [Float]? { a.map { Array($0.dropLast()) } }
        func grow(_ a: [Float]?) -> [Float]? { a.map { $0 + [0] } }
        let edits: [(String, (inout LayerData) -> Void)] = [
            ("router_weight", { $0.router = drop($0.router)! }),
            ("router_bias", { $0.routerBias = grow($0.routerBias) }),
            ("selection_bias", { $0.selectionBias = drop($0.selectionBias) }),
            ("per_expert_scale", { $0.perExpertScale = grow($0.perExpertScale) }),
            ("gate_proj", { $0.gate = drop($0.gate)! }),
            ("up_proj", { $0.up = grow($0.up)! }),
            ("down_proj", { $0.down = drop($0.down)! }),
            ("gate_up_bias", { $0.gateUpBias = drop($0.gateUpBias) }),
            ("down_bias", { $0.downBias = grow($0.downBias) }),
            ("shared_expert.gate_proj", { $0.sharedGate = drop($0.sharedGate) }),
            ("shared_expert.up_proj", { $0.sharedUp = grow($0.sharedUp) }),
            ("shared_expert.down_proj", { $0.sharedDown = drop($0.sharedDown) }),
            ("shared_expert.sigmoid_gate", { $0.sharedSigmoidGate = grow($0.sharedSigmoidGate) }),
        ]
        for (field, edit) in edits {
            var d = base
            edit(&d)
            assertInvalidArgument(mentioning: field) { _ = try d.layer() }
        }
        // Fused gate_up_proj of the wrong size.
        var w = base.weights(fused: true)
        w.gateUp = .fused(WeightData(Array(base.fusedGateUp.dropLast(6))))
        assertInvalidArgument(mentioning: "gate_up_proj") { _ = try MoELayer(configuration: c, weights: w) }
        // Separate arrays of the fused size are not accepted as gate_proj either.
        w.gateUp = .separate(gate: WeightData(base.fusedGateUp), up: WeightData(base.up))
        assertInvalidArgument(mentioning: "gate_proj") { _ = try MoELayer(configuration: c, weights: w) }
    }

    func testSharedExpertMismatch() {
        // Size given, weights missing.
        let c = makeConfig(h: 6, i: 4, e: 8, k: 2) { $0.sharedIntermediateSize = 3 }
        var w = LayerData.random(c, seed: 4).weights()
        w.shared = nil
        assertInvalidArgument(mentioning: "shared_intermediate_size") { _ = try MoELayer(configuration: c, weights: w) }
        // Weights given, size 0.
        let withShared = LayerData.random(c, seed: 4).weights()
        assertInvalidArgument(mentioning: "shared_intermediate_size") {
            _ = try MoELayer(configuration: self.good, weights: withShared)
        }
        // Shared weights sized for another width.
        var other = c
        other.sharedIntermediateSize = 5
        assertInvalidArgument(mentioning: "shared_expert.gate_proj") { _ = try MoELayer(configuration: other, weights: withShared) }
    }

    func testUnavailableBackendsThrowUnavailable() throws {
        let w = LayerData.random(good, seed: 5).weights()
        XCTAssertTrue(MoELayer.availableBackends.contains(.cpu))
        XCTAssertFalse(MoELayer.availableBackends.contains(.auto))
        XCTAssertEqual(try MoELayer(configuration: good, weights: w, backend: .auto).backendKind,
                       MoELayer.availableBackends.first)
        for kind in MoEBackendKind.allCases where kind != .auto && !MoELayer.availableBackends.contains(kind) {
            XCTAssertThrowsError(try MoELayer(configuration: good, weights: w, backend: kind)) { error in
                guard case MoEError.unavailable(let message) = error else {
                    return XCTFail("\(kind): expected MoEError.unavailable, got \(error)")
                }
                XCTAssertTrue(message.contains(kind.name), message)
            }
        }
    }
}
