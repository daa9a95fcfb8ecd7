// One layer used from several threads at once gives the sequential results bit for bit.
import Dispatch
import XCTest
import MoEKernels

final class DeterminismTests: XCTestCase {
    func testConcurrentForwardsEqualSequentialBitForBit() throws {
        let c = makeConfig(h: 37, i: 19, e: 8, k: 3) {
            $0.sharedIntermediateSize = 11
            $0.scoring = .sigmoid
            $0.nGroup = 4
            $0.topKGroup = 3
        }
        var o = LayerOptions()
        o.selectionBias = true
        o.gateUpBias = true
        o.downBias = true
        o.sharedSigmoidGate = true
        let layer = try LayerData.random(c, o, seed: 21).layer()
        let h = c.hiddenSize, k = c.topK

        // Different token counts, so concurrent calls need scratch arenas of different sizes.
        let counts = [1, 3, 17, 40, 5, 64]
        var rng = SplitMix64(seed: 22)
        let inputs = counts.map { rng.floats($0 * h, scale: 2) }
        let residuals = counts.map { rng.floats($0 * h) }
        let sequential = try zip(inputs, residuals).map { try layer.forward($0, residual: $1) }
        let sequentialRoutes = try inputs.map { try layer.route($0) }

        let iterations = 4 * counts.count
        for round in 0..<2 {   // the second round reuses the pooled arenas
            // Each iteration writes only its own preallocated buffers.
            let outputs = (0..<iterations).map { UnsafeMutableBufferPointer<Float>.allocate(capacity: counts[$0 % counts.count] * h) }
            let ids = (0..<iterations).map { UnsafeMutableBufferPointer<Int32>.allocate(capacity: counts[$0 % counts.count] * k) }
            let weights = (0..<iterations).map { UnsafeMutableBufferPointer<Float>.allocate(capacity: counts[$0 % counts.count] * k) }
            let failures = UnsafeMutableBufferPointer<Bool>.allocate(capacity: iterations)
            failures.initialize(repeating: false)
            defer {
                (outputs + weights).forEach { $0.deallocate() }
                ids.forEach { $0.deallocate() }
                failures.deallocate()
            }
            DispatchQueue.concurrentPerform(iterations: iterations) { n in
                let m = n % counts.count
                do {
                    try inputs[m].withUnsafeBufferPointer { x in
                        try residuals[m].withUnsafeBufferPointer { r in
                            try layer.forward(x.baseAddress!, tokens: counts[m], residual: r.baseAddress!,
                                              into: outputs[n].baseAddress!)
                        }
                        try layer.route(x.baseAddress!, tokens: counts[m], ids: ids[n].baseAddress!,
                                        weights: weights[n].baseAddress!)
                    }
                } catch {
                    failures[n] = true
                }
            }
            for n in 0..<iterations {
                let m = n % counts.count
                XCTAssertFalse(failures[n], "iteration \(n) threw")
                assertBitwiseEqual(Array(outputs[n]), sequential[m], "round \(round), iteration \(n), T = \(counts[m])")
                XCTAssertEqual(Array(ids[n]), sequentialRoutes[m].ids, "round \(round), iteration \(n)")
                assertBitwiseEqual(Array(weights[n]), sequentialRoutes[m].weights, "round \(round), iteration \(n)")
            }
        }
        // And once more sequentially, after the pool has been used concurrently.
        assertBitwiseEqual(try layer.forward(inputs[3], residual: residuals[3]), sequential[3], "after")
    }

    /// Two layers built from the same arrays give identical outputs, and a repeated forward
    /// gives the same output (no state carried between calls).
    func testRepeatedAndRebuiltLayersAgree() throws {
        let c = makeConfig(h: 21, i: 9, e: 6, k: 2) { $0.sharedIntermediateSize = 4 }
        let data = LayerData.random(c, seed: 23)
        let a = try data.layer(), b = try data.layer()
        let x = seededFloats(21 * 33, seed: 24, scale: 2)
        let y = try a.forward(x)
        assertBitwiseEqual(try a.forward(x), y, "repeat")
        assertBitwiseEqual(try b.forward(x), y, "rebuilt")
        // A token's output does not depend on the other tokens in the batch.
        let single = try a.forward(Array(x[5 * 21..<6 * 21]))
        let ref = NaiveReference(data).forward(Array(x[5 * 21..<6 * 21]), tokens: 1)
        assertClose(single, ref, "token 5 alone")
        assertClose(Array(y[5 * 21..<6 * 21]), ref, "token 5 in the batch")
    }
}
