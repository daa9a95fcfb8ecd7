// moe_layer_forward_routed / MoELayer.experts: the routed experts with the routing given,
// through the C header's declarations and the Swift API.
import CMoESwift
import XCTest
@testable import MoEKernels

final class RoutedForwardTests: XCTestCase {
    let config = makeConfig(h: 24, i: 16, e: 6, k: 2) { $0.sharedIntermediateSize = 8 }

    func testGivenRoutingMatchesTheReferenceWithoutSharedExpert() throws {
        let d = LayerData.random(config, seed: 70)
        let tokens = 5, h = config.hiddenSize, k = config.topK
        let x = seededFloats(tokens * h, seed: 71)
        let ids: [Int32] = [0, 5, 3, 3, 1, 2, 4, 0, 2, 5]   // a repeated expert in one token too
        let weights = seededFloats(tokens * k, seed: 72, scale: 1)

        var noShared = d
        (noShared.sharedGate, noShared.sharedUp, noShared.sharedDown) = (nil, nil, nil)
        noShared.config.sharedIntermediateSize = 0
        let reference = NaiveReference(noShared)
        var expected = [Double](repeating: 0, count: tokens * h)
        for t in 0..<tokens {
            let v = reference.token(x, t)
            for j in 0..<k {
                let y = reference.expert(Int(ids[t * k + j]), v)
                for c in 0..<h { expected[t * h + c] += Double(weights[t * k + j]) * y[c] }
            }
        }
        let layer = try d.layer()
        assertClose(try layer.experts(x, ids: ids, weights: weights), expected, "Swift API")

        let cd = CDescriptor(d)
        let handle = cd.create()
        defer { CMoESwift.moe_layer_destroy(handle) }
        var y = [Float](repeating: .nan, count: tokens * h)
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, Int64(tokens), ids, weights, &y), MOE_OK, lastError())
        assertBitwiseEqual(y, try layer.experts(x, ids: ids, weights: weights), "C ABI = Swift API")
    }

    func testInvalidIdsAndPointersAreErrors() throws {
        let cd = CDescriptor(LayerData.random(config, seed: 73))
        let handle = cd.create()
        defer { CMoESwift.moe_layer_destroy(handle) }
        let h = config.hiddenSize
        let x = [Float](repeating: 1, count: 2 * h), weights = [Float](repeating: 1, count: 4)
        var y = [Float](repeating: 0, count: 2 * h)
        for bad: Int32 in [6, -1, .max, .min] {
            let ids: [Int32] = [0, 1, bad, 2]
            XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, 2, ids, weights, &y), MOE_ERROR_INVALID_ARGUMENT)
            XCTAssertTrue(lastError().contains("ids[1, 0] = \(bad)"), lastError())
        }
        let ids: [Int32] = [0, 1, 2, 3]
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, 2, nil, weights, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, 2, ids, nil, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, 2, ids, weights, nil), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertTrue(lastError().contains("y is NULL"), lastError())
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, x, -1, ids, weights, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(nil, x, 2, ids, weights, &y), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertEqual(CMoESwift.moe_layer_forward_routed(handle, nil, 0, nil, nil, nil), MOE_OK, "no tokens: nothing read")
    }
}
