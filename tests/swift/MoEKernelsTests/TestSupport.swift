// Shared helpers of the suite: a seeded PRNG, random layers as plain arrays, and the
// tolerance check of docs/spec.md ("What one call computes").
import Foundation
import XCTest
import MoEKernels

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, seedable, identical on every platform.
struct SplitMix64 {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), 24 random bits.
    mutating func uniform() -> Float {
        Float(next() >> 40) / Float(1 << 23) - 1
    }

    /// Uniform in [0, n).
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }

    mutating func floats(_ count: Int, scale: Float = 1, offset: Float = 0) -> [Float] {
        (0..<count).map { _ in offset + scale * uniform() }
    }
}

func seededFloats(_ count: Int, seed: UInt64, scale: Float = 1) -> [Float] {
    var rng = SplitMix64(seed: seed)
    return rng.floats(count, scale: scale)
}

/// Which optional arrays a random layer gets, and how large its values are.
struct LayerOptions {
    var routerBias = false
    var selectionBias = false
    var perExpertScale = false
    var gateUpBias = false
    var downBias = false
    /// Qwen2-MoE's `shared_expert_gate`; only used when the configuration has a shared expert.
    var sharedSigmoidGate = false
    /// Router weights are uniform in ±routerScale/sqrt(H).
    var routerScale: Float = 3
    /// Gate/up weights are uniform in ±expertScale/sqrt(H) (large values exercise the
    /// swiglu_oai clamps).
    var expertScale: Float = 3
    /// Down weights are uniform in ±downScale/sqrt(I) (outputs of order 1).
    var downScale: Float = 3
}

/// Every array of one layer in the checkpoint layout, gate and up kept separate; the
/// fused `gate_up_proj` is derived from them.
struct LayerData {
    var config: MoEConfiguration
    var router: [Float]               // (E, H)
    var routerBias: [Float]?          // (E)
    var selectionBias: [Float]?       // (E)
    var perExpertScale: [Float]?      // (E)
    var gate: [Float]                 // (E, I, H)
    var up: [Float]                   // (E, I, H)
    var down: [Float]                 // (E, H, I)
    var gateUpBias: [Float]?          // (E, 2I)
    var downBias: [Float]?            // (E, H)
    var sharedGate: [Float]?          // (Is, H)
    var sharedUp: [Float]?            // (Is, H)
    var sharedDown: [Float]?          // (H, Is)
    var sharedSigmoidGate: [Float]?   // (H)

    static func random(_ c: MoEConfiguration, _ o: LayerOptions = LayerOptions(), seed: UInt64) -> LayerData {
        var rng = SplitMix64(seed: seed)
        let (h, i, e, si) = (c.hiddenSize, c.intermediateSize, c.numExperts, c.sharedIntermediateSize)
        let inH = 1 / Float(h).squareRoot(), inI = 1 / Float(i).squareRoot()
        var d = LayerData(
            config: c,
            router: rng.floats(e * h, scale: o.routerScale * inH),
            gate: rng.floats(e * i * h, scale: o.expertScale * inH),
            up: rng.floats(e * i * h, scale: o.expertScale * inH),
            down: rng.floats(e * h * i, scale: o.downScale * inI))
        if o.routerBias { d.routerBias = rng.floats(e, scale: 0.5) }
        if o.selectionBias { d.selectionBias = rng.floats(e, scale: 0.1) }
        if o.perExpertScale { d.perExpertScale = rng.floats(e, scale: 0.5, offset: 1) }
        if o.gateUpBias { d.gateUpBias = rng.floats(e * 2 * i, scale: 0.5) }
        if o.downBias { d.downBias = rng.floats(e * h, scale: 0.5) }
        if si > 0 {
            let inS = 1 / Float(si).squareRoot()
            d.sharedGate = rng.floats(si * h, scale: o.expertScale * inH)
            d.sharedUp = rng.floats(si * h, scale: o.expertScale * inH)
            d.sharedDown = rng.floats(h * si, scale: o.downScale * inS)
            if o.sharedSigmoidGate { d.sharedSigmoidGate = rng.floats(h, scale: 2 * inH) }
        }
        return d
    }

    init(config: MoEConfiguration, router: [Float], gate: [Float], up: [Float], down: [Float]) {
        self.config = config
        self.router = router
        self.gate = gate
        self.up = up
        self.down = down
    }

    /// `(E, 2I, H)`: expert e's gate rows, then its up rows.
    var fusedGateUp: [Float] {
        let (h, i, e) = (config.hiddenSize, config.intermediateSize, config.numExperts)
        var out = [Float]()
        out.reserveCapacity(e * 2 * i * h)
        for x in 0..<e {
            out += gate[x * i * h..<(x + 1) * i * h]
            out += up[x * i * h..<(x + 1) * i * h]
        }
        return out
    }

    func weights(fused: Bool = false) -> MoEWeights {
        var shared: SharedExpertWeights?
        if let g = sharedGate, let u = sharedUp, let dn = sharedDown {
            shared = SharedExpertWeights(gateProj: WeightData(g), upProj: WeightData(u), downProj: WeightData(dn),
                                         sigmoidGate: sharedSigmoidGate.map(WeightData.init))
        }
        return MoEWeights(router: WeightData(router),
                          gateUp: fused ? .fused(WeightData(fusedGateUp))
                                        : .separate(gate: WeightData(gate), up: WeightData(up)),
                          downProj: WeightData(down),
                          routerBias: routerBias.map(WeightData.init),
                          selectionBias: selectionBias.map(WeightData.init),
                          perExpertScale: perExpertScale.map(WeightData.init),
                          gateUpBias: gateUpBias.map(WeightData.init),
                          downBias: downBias.map(WeightData.init),
                          shared: shared)
    }

    func layer(fused: Bool = false) throws -> MoELayer {
        try MoELayer(configuration: config, weights: weights(fused: fused), backend: .cpu)
    }
}

func makeConfig(h: Int, i: Int, e: Int, k: Int, _ edit: (inout MoEConfiguration) -> Void = { _ in }) -> MoEConfiguration {
    var c = MoEConfiguration(hiddenSize: h, intermediateSize: i, numExperts: e, topK: k)
    edit(&c)
    return c
}

/// The spec's tolerance, `|y - ref| <= 1e-4 * max|ref| + 1e-5` elementwise (max over the
/// whole reference array). Returns the worst `|y - ref|` and `max|ref|`.
@discardableResult
func assertClose(_ y: [Float], _ ref: [Double], _ what: @autoclosure () -> String,
                 file: StaticString = #filePath, line: UInt = #line) -> (error: Double, maxRef: Double) {
    XCTAssertEqual(y.count, ref.count, "\(what()): element count", file: file, line: line)
    let maxRef = ref.reduce(0) { max($0, abs($1)) }
    let bound = 1e-4 * maxRef + 1e-5
    var worst = 0.0, worstIndex = -1
    for (n, (a, b)) in zip(y, ref).enumerated() {
        let d = abs(Double(a) - b)
        if !(d <= worst) { worst = d.isNaN ? .infinity : d; worstIndex = n }
    }
    if !(worst <= bound) {
        XCTFail("\(what()): |y - ref| = \(worst) at \(worstIndex) (y = \(y[worstIndex]), ref = \(ref[worstIndex])) "
                + "exceeds \(bound) (max|ref| = \(maxRef))", file: file, line: line)
    }
    return (worst, maxRef)
}

/// Bitwise equality of float arrays (NaN payloads included).
func assertBitwiseEqual(_ a: [Float], _ b: [Float], _ what: @autoclosure () -> String,
                        file: StaticString = #filePath, line: UInt = #line) {
    XCTAssertEqual(a.count, b.count, "\(what()): element count", file: file, line: line)
    if let n = zip(a, b).enumerated().first(where: { $0.element.0.bitPattern != $0.element.1.bitPattern })?.offset {
        XCTFail("\(what()): element \(n) differs: \(a[n]) vs \(b[n])", file: file, line: line)
    }
}

/// Every token's k ids are in 0..<E and distinct.
func assertValidIds(_ ids: [Int32], k: Int, e: Int, _ what: @autoclosure () -> String,
                    file: StaticString = #filePath, line: UInt = #line) {
    XCTAssertEqual(ids.count % k, 0, file: file, line: line)
    for t in 0..<ids.count / k {
        let row = ids[t * k..<(t + 1) * k]
        if !row.allSatisfy({ $0 >= 0 && Int($0) < e }) || Set(row).count != k {
            XCTFail("\(what()): token \(t) has invalid ids \(Array(row)) for E = \(e)", file: file, line: line)
            return
        }
    }
}

/// Worst error per family, reported at the end of each family test (grep "[moe-ref]").
func report(_ family: String, error: Double, maxRef: Double) {
    let relative = maxRef > 0 ? error / maxRef : 0
    print("[moe-ref] \(family): worst |y - ref| = \(String(format: "%.3e", error)), "
          + "max|ref| = \(String(format: "%.3f", maxRef)), relative \(String(format: "%.3e", relative))")
}
