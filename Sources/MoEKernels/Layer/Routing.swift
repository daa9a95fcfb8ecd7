#if canImport(Darwin)
import Darwin
#else
import Glibc
#endif

/// The router of docs/spec.md ("What one call computes") for one token, in float32: scores, selection bias,
/// group-limited top-k, weights. Backends that route on the CPU share this code; the
/// Metal kernels implement the same steps in MSL.
struct TokenRouter {
    let numExperts: Int
    let topK: Int
    let scoring: MoEScoring
    let normTopKProb: Bool
    let routedScalingFactor: Float
    let nGroup: Int
    let topKGroup: Int
    let selectionBias: UnsafePointer<Float>?
    let perExpertScale: UnsafePointer<Float>?

    /// Floats of scratch that `route` needs.
    var scratchCount: Int { 2 * numExperts + 2 * nGroup }

    /// `logits` (E, bias included) becomes the scores; writes `ids` and `weights` (k each).
    func route(logits scores: UnsafeMutablePointer<Float>, scratch: UnsafeMutablePointer<Float>,
               ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) {
        let e = numExperts
        switch scoring {
        case .softmax:
            var maxLogit = -Float.infinity
            for i in 0..<e where scores[i] > maxLogit { maxLogit = scores[i] }
            var sum: Float = 0
            for i in 0..<e {
                scores[i] = expf(scores[i] - maxLogit)
                sum += scores[i]
            }
            let inverse = 1 / sum
            for i in 0..<e { scores[i] *= inverse }
        case .sigmoid:
            for i in 0..<e { scores[i] = 1 / (1 + expf(-scores[i])) }
        }

        // Selection scores c: the selection bias changes which experts win, not their weights.
        let choice: UnsafeMutablePointer<Float>
        if let bias = selectionBias {
            choice = scratch
            for i in 0..<e { choice[i] = scores[i] + bias[i] }
        } else {
            choice = scores
        }

        // Group-limited routing: the experts of dropped groups are marked taken before
        // top-k, so they cannot be chosen.
        let taken = scratch + e            // 0 or 1 per expert
        let groupScore = scratch + 2 * e
        let groupKept = groupScore + nGroup
        for i in 0..<e { taken[i] = 0 }
        if nGroup > 1 {
            let size = e / nGroup
            for g in 0..<nGroup {
                let range = g * size..<(g + 1) * size
                let first = best(choice, in: range, excluding: -1)
                groupScore[g] = size == 1 ? choice[first]
                                          : choice[first] + choice[best(choice, in: range, excluding: first)]
                groupKept[g] = 0
            }
            for _ in 0..<topKGroup {
                var winner = -1
                for g in 0..<nGroup where groupKept[g] == 0 {
                    if winner < 0 || beats(groupScore[g], groupScore[winner]) { winner = g }
                }
                groupKept[winner] = 1
            }
            for i in 0..<e where groupKept[i / size] == 0 { taken[i] = 1 }
        }

        var sum: Float = 0
        for j in 0..<topK {
            var winner = -1
            for i in 0..<e where taken[i] == 0 {
                if winner < 0 || beats(choice[i], choice[winner]) { winner = i }
            }
            taken[winner] = 1
            ids[j] = Int32(winner)
            weights[j] = scores[winner]
            sum += scores[winner]
        }
        for j in 0..<topK {
            if normTopKProb { weights[j] /= sum + 1e-20 }
            weights[j] *= routedScalingFactor
            if let perExpert = perExpertScale { weights[j] *= perExpert[Int(ids[j])] }
        }
    }

    /// The total order of selection: larger wins, NaN loses to every number, and among
    /// equal values the earlier index (callers scan in ascending order) is kept.
    @inline(__always)
    private func beats(_ a: Float, _ b: Float) -> Bool {
        b.isNaN ? !a.isNaN : a > b
    }

    private func best(_ values: UnsafeMutablePointer<Float>, in range: Range<Int>, excluding: Int) -> Int {
        var winner = -1
        for i in range where i != excluding {
            if winner < 0 || beats(values[i], values[winner]) { winner = i }
        }
        return winner
    }
}
