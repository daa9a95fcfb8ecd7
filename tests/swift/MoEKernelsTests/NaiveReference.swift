// A deliberately naive float64 implementation of docs/spec.md ("What one call computes"), written from
// the spec alone (it shares no code with Sources/MoEKernels): loops over tokens, slots and
// matrix rows, no BLAS, no packing, no parallelism.
import Foundation
import MoEKernels

struct NaiveReference {
    let h: Int, i: Int, e: Int, k: Int, si: Int
    let scoring: MoEScoring
    let normTopKProb: Bool
    let routedScalingFactor: Double
    let nGroup: Int, topKGroup: Int
    let activation: MoEActivation
    let alpha: Double, limit: Double

    let router: [Double]              // (E, H)
    let routerBias: [Double]?         // (E)
    let selectionBias: [Double]?      // (E)
    let perExpertScale: [Double]?     // (E)
    let gate: [Double], up: [Double]  // (E, I, H)
    let down: [Double]                // (E, H, I)
    let gateUpBias: [Double]?         // (E, 2I)
    let downBias: [Double]?           // (E, H)
    let sharedGate: [Double]?, sharedUp: [Double]?  // (Is, H)
    let sharedDown: [Double]?         // (H, Is)
    let sharedSigmoidGate: [Double]?  // (H)

    init(_ d: LayerData) {
        let c = d.config
        (h, i, e, k, si) = (c.hiddenSize, c.intermediateSize, c.numExperts, c.topK, c.sharedIntermediateSize)
        scoring = c.scoring
        normTopKProb = c.normTopKProb
        routedScalingFactor = Double(c.routedScalingFactor)
        (nGroup, topKGroup) = (c.nGroup, c.topKGroup)
        activation = c.activation
        (alpha, limit) = (Double(c.swigluAlpha), Double(c.swigluLimit))
        func f64(_ a: [Float]) -> [Double] { a.map(Double.init) }
        router = f64(d.router)
        routerBias = d.routerBias.map(f64)
        selectionBias = d.selectionBias.map(f64)
        perExpertScale = d.perExpertScale.map(f64)
        gate = f64(d.gate)
        up = f64(d.up)
        down = f64(d.down)
        gateUpBias = d.gateUpBias.map(f64)
        downBias = d.downBias.map(f64)
        sharedGate = d.sharedGate.map(f64)
        sharedUp = d.sharedUp.map(f64)
        sharedDown = d.sharedDown.map(f64)
        sharedSigmoidGate = d.sharedSigmoidGate.map(f64)
    }

    // MARK: Router

    struct TokenRouting {
        var ids: [Int]
        var weights: [Double]
        /// The smallest gap between selection (or group) scores at which a tiny
        /// perturbation would change the ids or their order; ids of a backend are only
        /// comparable to these when the margin clearly exceeds float32 rounding.
        var margin: Double
    }

    private static func sigmoid(_ v: Double) -> Double { 1 / (1 + exp(-v)) }

    /// Steps 1-2: the scores s of one token.
    func scores(_ x: [Double]) -> [Double] {
        var logits = [Double](repeating: 0, count: e)
        for r in 0..<e {
            var dot = 0.0
            for j in 0..<h { dot += x[j] * router[r * h + j] }
            logits[r] = dot + (routerBias?[r] ?? 0)
        }
        switch scoring {
        case .softmax:
            let m = logits.max()!
            let ex = logits.map { exp($0 - m) }
            let sum = ex.reduce(0, +)
            return ex.map { $0 / sum }
        case .sigmoid:
            return logits.map(Self.sigmoid)
        }
    }

    /// Step 6: the final weights of `ids` from the (unbiased) scores.
    func weights(scores s: [Double], ids: [Int]) -> [Double] {
        var w = ids.map { s[$0] }
        if normTopKProb {
            let sum = w.reduce(0, +)
            w = w.map { $0 / (sum + 1e-20) }
        }
        w = w.map { $0 * routedScalingFactor }
        if let scale = perExpertScale {
            w = zip(w, ids).map { $0 * scale[$1] }
        }
        return w
    }

    /// Steps 1-6 for one token (finite inputs only).
    func route(_ x: [Double]) -> TokenRouting {
        let s = scores(x)
        // 3. selection scores
        let c = (0..<e).map { s[$0] + (selectionBias?[$0] ?? 0) }
        func descending(_ values: [Double]) -> (Int, Int) -> Bool {
            { a, b in values[a] > values[b] || (values[a] == values[b] && a < b) }
        }
        var margin = Double.infinity
        // 4. group-limited routing
        var allowed = [Bool](repeating: true, count: e)
        if nGroup > 1 {
            let size = e / nGroup
            let groupScore = (0..<nGroup).map { g -> Double in
                let members = c[g * size..<(g + 1) * size].sorted(by: >)
                return size == 1 ? members[0] : members[0] + members[1]
            }
            let order = (0..<nGroup).sorted(by: descending(groupScore))
            let kept = Set(order.prefix(topKGroup))
            if topKGroup < nGroup {
                margin = groupScore[order[topKGroup - 1]] - groupScore[order[topKGroup]]
            }
            for x in 0..<e { allowed[x] = kept.contains(x / size) }
        }
        // 5. top-k, descending, lower index first among equals
        let candidates = (0..<e).filter { allowed[$0] }.sorted(by: descending(c))
        let ids = Array(candidates.prefix(k))
        for j in 0..<min(k, candidates.count - 1) {
            margin = min(margin, c[candidates[j]] - c[candidates[j + 1]])
        }
        return TokenRouting(ids: ids, weights: weights(scores: s, ids: ids), margin: margin)
    }

    // MARK: Experts

    func act(_ g: Double, _ u: Double) -> Double {
        switch activation {
        case .silu:
            return g / (1 + exp(-g)) * u
        case .geluTanh:
            return 0.5 * g * (1 + tanh(0.7978845608 * (g + 0.044715 * g * g * g))) * u
        case .swigluOAI:
            let gc = min(g, limit)
            let uc = max(min(u, limit), -limit)
            return gc * Self.sigmoid(alpha * gc) * (uc + 1)
        case .gelu:
            return 0.5 * g * (1 + erf(g / 2.0.squareRoot())) * u
        case .relu:
            return max(g, 0) * u
        case .swigluClamped:
            let gc = min(g, limit)
            return gc * Self.sigmoid(gc) * max(min(u, limit), -limit)
        }
    }

    /// `g = Wg[e] x + bg[e]` and `u = Wu[e] x + bu[e]` of expert `x`.
    func preActivations(_ x: Int, _ v: [Double]) -> (g: [Double], u: [Double]) {
        var g = [Double](repeating: 0, count: i), u = g
        for r in 0..<i {
            let row = (x * i + r) * h
            for j in 0..<h {
                g[r] += gate[row + j] * v[j]
                u[r] += up[row + j] * v[j]
            }
            if let b = gateUpBias {
                g[r] += b[x * 2 * i + r]
                u[r] += b[x * 2 * i + i + r]
            }
        }
        return (g, u)
    }

    /// `y_e = Wd[e] act(Wg[e] x + bg[e], Wu[e] x + bu[e]) + bd[e]`.
    func expert(_ x: Int, _ v: [Double]) -> [Double] {
        let (g, u) = preActivations(x, v)
        let a = zip(g, u).map { act($0, $1) }
        var y = [Double](repeating: 0, count: h)
        for r in 0..<h {
            var sum = 0.0
            let row = (x * h + r) * i
            for j in 0..<i { sum += down[row + j] * a[j] }
            y[r] = sum + (downBias?[x * h + r] ?? 0)
        }
        return y
    }

    /// The shared expert's contribution `f_s(x) * shared(x)`, or nil without one.
    func shared(_ v: [Double]) -> [Double]? {
        guard si > 0, let sg = sharedGate, let su = sharedUp, let sd = sharedDown else { return nil }
        var a = [Double](repeating: 0, count: si)
        for r in 0..<si {
            var g = 0.0, u = 0.0
            for j in 0..<h {
                g += sg[r * h + j] * v[j]
                u += su[r * h + j] * v[j]
            }
            a[r] = act(g, u)
        }
        var factor = 1.0
        if let gv = sharedSigmoidGate {
            var dot = 0.0
            for j in 0..<h { dot += v[j] * gv[j] }
            factor = Self.sigmoid(dot)
        }
        var y = [Double](repeating: 0, count: h)
        for r in 0..<h {
            var sum = 0.0
            for j in 0..<si { sum += sd[r * si + j] * a[j] }
            y[r] = factor * sum
        }
        return y
    }

    // MARK: Layer

    func token(_ x: [Float], _ t: Int) -> [Double] {
        x[t * h..<(t + 1) * h].map(Double.init)
    }

    /// The routing of every token (finite inputs only).
    func route(_ x: [Float], tokens: Int) -> [TokenRouting] {
        (0..<tokens).map { route(token(x, $0)) }
    }

    /// `y[t] = sum_j w_j y_{id_j}(x[t]) + f_s shared(x[t]) (+ residual[t])`. With
    /// `forcedIds` (tokens, k), those experts are used (weights computed for them)
    /// instead of the reference's own choice.
    func forward(_ x: [Float], tokens: Int, residual: [Float]? = nil, forcedIds: [Int32]? = nil) -> [Double] {
        precondition(x.count == tokens * h)
        var out = [Double]()
        out.reserveCapacity(tokens * h)
        for t in 0..<tokens {
            let v = token(x, t)
            let ids: [Int], w: [Double]
            if let forced = forcedIds {
                ids = forced[t * k..<(t + 1) * k].map { Int($0) }
                w = weights(scores: scores(v), ids: ids)
            } else {
                let r = route(v)
                (ids, w) = (r.ids, r.weights)
            }
            var y = [Double](repeating: 0, count: h)
            for (id, weight) in zip(ids, w) {
                let ye = expert(id, v)
                for j in 0..<h { y[j] += weight * ye[j] }
            }
            if let s = shared(v) {
                for j in 0..<h { y[j] += s[j] }
            }
            if let residual {
                for j in 0..<h { y[j] += Double(residual[t * h + j]) }
            }
            out += y
        }
        return out
    }
}
