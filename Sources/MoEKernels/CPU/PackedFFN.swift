/// The weights of `count` gated FFNs of one width, laid out for the CPU passes.
///
/// Gate and up rows are interleaved in blocks of `blockWidth` outputs: block `b` of an
/// expert holds its gate rows `[c0, c0 + w)` followed by its up rows `[c0, c0 + w)`, so a
/// single GEMM per block yields both halves and the activation runs right after it, while
/// the block's outputs are still in cache. Down weights keep the checkpoint's (H, I) layout.
final class PackedFFN: @unchecked Sendable {
    static let blockWidth = 128

    let count: Int
    let hidden: Int
    let inner: Int
    let gateUp: AlignedBuffer<Float>        // (count, 2 * inner, hidden), blocked
    let gateUpBias: AlignedBuffer<Float>?   // (count, 2 * inner), blocked the same way
    let down: AlignedBuffer<Float>          // (count, hidden, inner)
    let downBias: AlignedBuffer<Float>?     // (count, hidden)

    var blocksPerExpert: Int { (inner + Self.blockWidth - 1) / Self.blockWidth }

    /// Columns `[start, start + width)` of the activation that block `block` produces.
    @inline(__always)
    func blockColumns(_ block: Int) -> (start: Int, width: Int) {
        let start = block * Self.blockWidth
        return (start, Swift.min(Self.blockWidth, inner - start))
    }

    /// `gate` and `up` point at expert 0's first gate and up row; each expert's rows start
    /// `expertStride` floats after the previous expert's (likewise for the biases).
    init(count: Int, hidden: Int, inner: Int,
         gate: UnsafePointer<Float>, up: UnsafePointer<Float>, expertStride: Int,
         gateBias: UnsafePointer<Float>?, upBias: UnsafePointer<Float>?, biasStride: Int,
         down: UnsafeBufferPointer<Float>, downBias: UnsafeBufferPointer<Float>?, what: String) throws {
        self.count = count
        self.hidden = hidden
        self.inner = inner
        gateUp = try AlignedBuffer(count: count * 2 * inner * hidden, what: "\(what) gate/up weights")
        self.down = try AlignedBuffer(copying: down, what: "\(what) down weights")
        if gateBias != nil && upBias != nil {
            gateUpBias = try AlignedBuffer(count: count * 2 * inner, what: "\(what) gate/up bias")
        } else {
            gateUpBias = nil
        }
        self.downBias = try downBias.map { try AlignedBuffer(copying: $0, what: "\(what) down bias") }

        let blocks = blocksPerExpert
        for e in 0..<count {
            for b in 0..<blocks {
                let (c0, w) = blockColumns(b)
                let dst = gateUp.pointer + e * 2 * inner * hidden + 2 * c0 * hidden
                dst.update(from: gate + e * expertStride + c0 * hidden, count: w * hidden)
                (dst + w * hidden).update(from: up + e * expertStride + c0 * hidden, count: w * hidden)
                if let packed = gateUpBias, let gateBias, let upBias {
                    let bias = packed.pointer + e * 2 * inner + 2 * c0
                    bias.update(from: gateBias + e * biasStride + c0, count: w)
                    (bias + w).update(from: upBias + e * biasStride + c0, count: w)
                }
            }
        }
    }

    /// Block `block` of expert `expert`: (2 * width, hidden) weights and 2 * width biases.
    @inline(__always)
    func gateUpBlock(expert: Int, block: Int) -> (weights: UnsafePointer<Float>, bias: UnsafePointer<Float>?) {
        let c0 = block * Self.blockWidth
        let weights = gateUp.pointer + expert * 2 * inner * hidden + 2 * c0 * hidden
        let bias = gateUpBias.map { UnsafePointer($0.pointer + expert * 2 * inner + 2 * c0) }
        return (UnsafePointer(weights), bias)
    }
}
