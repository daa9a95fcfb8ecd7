import CMoECPU

/// Rows of 8-bit activations (MoEActivationQuantization.q8) in a pass's scratch: the codes,
/// each block's scale and sum (what the integer products read) and the grid values (what
/// the float products read where no integer kernel serves: prefill, other formats).
struct Q8Rows {
    let cols: Int
    let codes: UnsafeMutablePointer<Int8>
    let scales: UnsafeMutablePointer<Float>
    let sums: UnsafeMutablePointer<Float>
    let grid: UnsafeMutablePointer<Float>

    /// Blocks of MOE_Q8_ACTIVATION_BLOCK elements in a row of `cols` (the last may be shorter).
    private static func blocks(cols: Int) -> Int {
        let block = Int(MOE_Q8_ACTIVATION_BLOCK)
        return (cols + block - 1) / block
    }
    private var blocks: Int { Self.blocks(cols: cols) }

    /// The scratch arrays of `rows` rows (without the grid when the caller gives it).
    static func arrays(rows: Int, cols: Int, grid: Bool = true) -> [(count: Int, stride: Int)] {
        let blocks = rows * Self.blocks(cols: cols)
        return [(rows * cols, 1), (blocks, 4), (blocks, 4), (grid ? rows * cols : 0, 4)]
    }

    /// Taken from `arena` in the order of `arrays`; `grid` given: the rows hold their grid
    /// values there (in place of the float32 rows they are made from).
    init(arena: ScratchArena, rows: Int, cols: Int, grid: UnsafeMutablePointer<Float>? = nil) {
        self.cols = cols
        let blocks = rows * Self.blocks(cols: cols)
        codes = arena.take(Int8.self, rows * cols)
        scales = arena.take(Float.self, blocks)
        sums = arena.take(Float.self, blocks)
        self.grid = grid ?? arena.take(Float.self, rows * cols)
    }

    /// Row `row` from the float32 row `x` (which may be its own grid row).
    func quantize(row: Int, from x: UnsafePointer<Float>) {
        quantize(row: row, from: x, columns: 0, count: cols)
    }

    /// Columns `[start, start + count)` of row `row` from the float32 values at `x` (which may
    /// be their own grid values): the blocks `quantize(row:from:)` makes of them, so `start`
    /// is a multiple of the block and `count` too, unless it reaches the row's end.
    func quantize(row: Int, from x: UnsafePointer<Float>, columns start: Int, count: Int) {
        let block = Int(MOE_Q8_ACTIVATION_BLOCK)
        precondition(start % block == 0 && (count % block == 0 || start + count == cols))
        moe_cpu_q8_quantize(x, Int64(count), codes + row * cols + start, scales + row * blocks + start / block,
                            sums + row * blocks + start / block, grid + row * cols + start)
    }

    /// Row `row` of `source` (same cols) copied into row `to`.
    func copy(row: Int, of source: Q8Rows, to: Int) {
        (codes + to * cols).update(from: source.codes + row * cols, count: cols)
        (scales + to * blocks).update(from: source.scales + row * blocks, count: blocks)
        (sums + to * blocks).update(from: source.sums + row * blocks, count: blocks)
        (grid + to * cols).update(from: source.grid + row * cols, count: cols)
    }

    /// The kernels' view of the rows from `row` on.
    func rows(from row: Int) -> moe_cpu_q8_rows {
        moe_cpu_q8_rows(codes: codes + row * cols, scales: scales + row * blocks, sums: sums + row * blocks,
                        stride: Int64(cols))
    }
}

extension WeightMatrix {
    /// `multiply` with 8-bit activations `q` (rows from `first`): integer products for the
    /// few rows of decode where this format has them, else the float product of the grid
    /// values (the same meaning).
    func multiply(m: Int, rows row0: Int, count n: Int, q: Q8Rows, first: Int,
                  c: UnsafeMutablePointer<Float>, ldc: Int, tile: UnsafeMutablePointer<Float>?) {
        if n > 0, let (expert, row) = expertRows(row0, n) {
            return expert.multiply(m: m, rows: row, count: n, q: q, first: first, c: c, ldc: ldc, tile: tile)
        }
        if m <= Self.registerRowLimit && n > 0 {
            var a = q.rows(from: first)
            let done = withUnsafePointer(to: matrix) { w in
                moe_cpu_matmul_q8(Int64(m), Int64(n), &a, w, Int64(row0), c, Int64(ldc))
            }
            if done != 0 { return }
        }
        multiply(m: m, rows: row0, count: n, a: q.grid + first * q.cols, lda: q.cols, c: c, ldc: ldc, tile: tile)
    }
}
