/// The weights of `count` gated FFNs of one width, in the formats they were given.
///
/// Gate and up rows stay where the checkpoint put them: separate (E, I, H) tensors, or
/// one fused (E, 2I, H) tensor read at two row offsets, so any format is kept as it is
/// (two tensors may even differ in format). A gate/up work item multiplies a block of
/// `blockWidth` gate rows and the matching up rows, then applies the activation while
/// the block's outputs are still in cache. Down weights are (count * H, I) rows.
final class PackedFFN: @unchecked Sendable {
    /// A multiple of MOE_Q8_ACTIVATION_BLOCK: an item quantizes its own activation columns.
    static let blockWidth = 128

    /// Row `base + expert * stride + column` of `matrix` is that expert's output column.
    struct Rows {
        let matrix: WeightMatrix
        let base: Int
        let stride: Int

        func row(expert: Int, column: Int) -> Int { base + expert * stride + column }
    }

    let count: Int
    let hidden: Int
    let inner: Int
    let gate: Rows
    let up: Rows
    let down: WeightMatrix                  // (count * hidden, inner)
    let gateUpBias: AlignedBuffer<Float>?   // (count, 2 * inner): gate biases, then up biases
    let downBias: AlignedBuffer<Float>?     // (count, hidden)

    var blocksPerExpert: Int { (inner + Self.blockWidth - 1) / Self.blockWidth }

    /// Which of the gate, up and down products take 8-bit activations under `q`
    /// (MoEActivationQuantization.quantizes).
    func quantizesActivations(_ q: MoEActivationQuantization) -> (gate: Bool, up: Bool, down: Bool) {
        (q.quantizes(gate.matrix.format), q.quantizes(up.matrix.format), q.quantizes(down.format))
    }

    /// Floats of dequantization scratch that one work item may need.
    var tileCount: Int { Swift.max(gate.matrix.tileCount, up.matrix.tileCount, down.tileCount) }

    /// Columns `[start, start + width)` of the activation that block `block` produces.
    @inline(__always)
    func blockColumns(_ block: Int) -> (start: Int, width: Int) {
        let start = block * Self.blockWidth
        return (start, Swift.min(Self.blockWidth, inner - start))
    }

    init(count: Int, hidden: Int, inner: Int, gateUp: GateUpWeights, down: WeightData,
         gateUpBias: WeightData?, downBias: WeightData?, repack: Bool = true, what: String) throws {
        self.count = count
        self.hidden = hidden
        self.inner = inner
        switch gateUp {
        case .separate(let g, let u):
            gate = Rows(matrix: try WeightMatrix(g, rows: count * inner, cols: hidden, repack: repack, what: "\(what) gate_proj"),
                        base: 0, stride: inner)
            up = Rows(matrix: try WeightMatrix(u, rows: count * inner, cols: hidden, repack: repack, what: "\(what) up_proj"),
                      base: 0, stride: inner)
        case .fused(let gu):
            let fused = try WeightMatrix(gu, rows: count * 2 * inner, cols: hidden, repack: repack,
                                         what: "\(what) gate_up_proj")
            gate = Rows(matrix: fused, base: 0, stride: 2 * inner)
            up = Rows(matrix: fused, base: inner, stride: 2 * inner)
        }
        self.down = try WeightMatrix(down, rows: count * hidden, cols: inner, repack: repack, what: "\(what) down_proj")
        self.gateUpBias = try gateUpBias.map { try AlignedBuffer(copying: $0, what: "\(what) gate/up bias") }
        self.downBias = try downBias.map { try AlignedBuffer(copying: $0, what: "\(what) down bias") }
    }
}
