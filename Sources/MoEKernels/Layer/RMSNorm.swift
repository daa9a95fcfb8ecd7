/// An RMSNorm as a decoder applies it around the MoE block, per token row `v` of H floats:
/// `v * (1 / sqrt(mean(v²) + eps)) * (offset + weight)`, float32 accumulation.
/// `offset` is 0 for Llama/Qwen-style norms and 1 for Gemma's `(1 + weight)`.
/// The weight is the caller's memory, read during the call only.
public struct RMSNorm {
    public var weight: UnsafePointer<Float>   // (H)
    public var eps: Float
    public var offset: Float

    public init(weight: UnsafePointer<Float>, eps: Float, offset: Float = 0) {
        self.weight = weight
        self.eps = eps
        self.offset = offset
    }

    func validate(_ name: String) throws {
        guard eps.isFinite && eps > 0 else {
            throw MoEError.invalidArgument("\(name) eps must be positive and finite, got \(eps)")
        }
        guard offset.isFinite else {
            throw MoEError.invalidArgument("\(name) offset must be finite, got \(offset)")
        }
    }

    /// `Σ v[i]²` in 16 lanes (a single chain of additions is latency-bound), then the
    /// lanes and the tail; a fixed order, so the same on every core count.
    static func sumOfSquares(_ v: UnsafePointer<Float>, count: Int) -> Float {
        var lanes = SIMD16<Float>()
        var i = 0
        while i + 16 <= count {
            let s = UnsafeRawPointer(v + i).loadUnaligned(as: SIMD16<Float>.self)
            lanes += s * s  // not addProduct: without an FMA target that is 16 calls of fmaf
            i += 16
        }
        var sum = lanes.sum()
        while i < count {
            sum += v[i] * v[i]
            i += 1
        }
        return sum
    }

    /// `1 / sqrt(mean(v²) + eps)` of one row.
    static func inverseRMS(sumOfSquares: Float, count: Int, eps: Float) -> Float {
        1 / (sumOfSquares / Float(count) + eps).squareRoot()
    }

    /// `out[i] = v[i] * inverse * (offset + weight[i])`; `out` may be `v`. In explicit
    /// vectors: the compiler cannot rule out that `out` overlaps `weight`.
    func apply(_ v: UnsafePointer<Float>, inverse: Float, count: Int, into out: UnsafeMutablePointer<Float>) {
        let scale = SIMD16<Float>(repeating: inverse), shift = SIMD16<Float>(repeating: offset)
        var i = 0
        while i + 16 <= count {
            let a = UnsafeRawPointer(v + i).loadUnaligned(as: SIMD16<Float>.self)
            let w = UnsafeRawPointer(weight + i).loadUnaligned(as: SIMD16<Float>.self)
            UnsafeMutableRawPointer(out + i).storeBytes(of: a * scale * (shift + w), as: SIMD16<Float>.self)
            i += 16
        }
        while i < count {
            out[i] = v[i] * inverse * (offset + weight[i])
            i += 1
        }
    }
}

/// What is added to the layer's output.
public enum MoEResidual {
    case none
    /// (tokens, H) floats; may alias the output.
    case buffer(UnsafePointer<Float>)
    /// The layer's own input, before `inputNorm`: a decoder's post-attention block.
    case input
}

/// A decoder's whole post-attention block around the layer:
/// `h = residual + moe(inputNorm(x))`, and with `nextNorm`, `normed = nextNorm(h)`.
public struct MoEForwardOptions {
    /// Normalise the input first (the block's post_attention_layernorm).
    public var inputNorm: RMSNorm?
    public var residual: MoEResidual
    /// The next layer's input norm of `h`, written to `normedOutput` (tokens, H), which must
    /// not overlap the input or the output. Without a residual, `h = moe(x)`.
    public var nextNorm: RMSNorm?
    public var normedOutput: UnsafeMutablePointer<Float>?

    public init(inputNorm: RMSNorm? = nil, residual: MoEResidual = .none,
                nextNorm: RMSNorm? = nil, normedOutput: UnsafeMutablePointer<Float>? = nil) {
        self.inputNorm = inputNorm
        self.residual = residual
        self.nextNorm = nextNorm
        self.normedOutput = normedOutput
    }

    func validate() throws {
        try inputNorm?.validate("input_norm")
        try nextNorm?.validate("next_norm")
        if nextNorm != nil && normedOutput == nil {
            throw MoEError.invalidArgument("next_norm needs an output for the normed rows (normed is NULL)")
        }
    }

    func residualPointer(input: UnsafePointer<Float>) -> UnsafePointer<Float>? {
        switch residual {
        case .none: return nil
        case .buffer(let r): return r
        case .input: return input
        }
    }

    /// The next norm with the buffer it writes, as the passes take it.
    var next: NextNorm? { nextNorm.map { NextNorm(norm: $0, output: normedOutput!) } }
}

/// The next layer's norm of the combined rows and where it goes.
struct NextNorm {
    let norm: RMSNorm
    let output: UnsafeMutablePointer<Float>
}
