import CMoECPU

/// A weight matrix of `rows` x `cols` of the CPU backend, in the format it was given
/// (float32, float16, bfloat16 or quantized): copied once at creation, never widened, or
/// read in place from a mapped tensor's memory where the kernels read the stored layout.
final class WeightMatrix: @unchecked Sendable {
    let format: WeightFormat
    let rows: Int
    let cols: Int
    /// The copies (nil for a part read in place).
    private let data: AlignedBuffer<UInt8>?
    private let scales: AlignedBuffer<UInt8>?
    private let biases: AlignedBuffer<UInt8>?
    /// What the parts read in place lie in, held while this matrix lives.
    private let memory: WeightMemory?
    /// The kernels' view of this matrix (pointers into the buffers above, or the mapping).
    private(set) var matrix: moe_cpu_matrix
    /// A per-expert tensor (WeightData.experts): one matrix per expert, each where its
    /// tensor lies (or copied by its own rules), reached by the rows' expert. nil: stacked.
    private let experts: [WeightMatrix]?

    /// Rows per dequantized tile in prefill: the tile (float32) stays in L2 for all the
    /// activation rows that multiply it.
    static let tileBytes = 256 << 10
    /// Up to this many activation rows the product dequantizes in registers (every weight
    /// byte read once); above it a tile is dequantized into cache and fed to the GEMM.
    static let registerRowLimit = 4

    /// Which of codes, scales and biases of `source` are read in place: all of a mapped
    /// tensor, except 4-bit tensors when `repack` (their own kernels read the codes
    /// repacked by moe_cpu_split_nibbles; the scales are copied too rather than holding the
    /// whole file mapped for an eighth of the tensor; without `repack` the generic affine
    /// kernels read them as stored, more slowly), and float32 rows not on a float boundary
    /// (BLAS reads them). The kernels' scalar loads go through memcpy, so other parts may
    /// sit at any offset.
    static func inPlace(_ source: WeightData, repack: Bool = true) -> [Bool] {
        guard let memory = source.memory, let codes = source.parts.first?.baseAddress else { return [false, false, false] }
        switch source.format {
        case .quantized(let q, _) where q.bits == 4 && repack: return [false, false, false]
        case .dense(.float32): return [memory.offset(of: codes) % MemoryLayout<Float>.alignment == 0, true, true]
        default: return [true, true, true]
        }
    }

    /// Bytes that making this matrix allocates (its copied parts).
    static func copiedBytes(_ source: WeightData, repack: Bool = true) -> Int {
        if case .array(let a) = source { return a.count * MemoryLayout<Float>.stride }
        if case .experts(let list) = source { return list.reduce(0) { $0 + copiedBytes($1, repack: repack) } }
        return zip(source.parts, inPlace(source, repack: repack)).reduce(0) { $0 + ($1.1 ? 0 : $1.0.count) }
    }

    /// `source`, a tensor of `rows` rows of `cols` elements, copied or read in place.
    init(_ source: WeightData, rows: Int, cols: Int, repack: Bool = true, what: String) throws {
        format = source.format
        self.rows = rows
        self.cols = cols
        if case .experts(let list) = source {
            let each = rows / Swift.max(list.count, 1)
            let made = try list.enumerated().map { e, tensor in
                try WeightMatrix(tensor, rows: each, cols: cols, repack: repack, what: "\(what) (expert \(e))")
            }
            experts = made
            (data, scales, biases, memory) = (nil, nil, nil, nil)
            matrix = made.first?.matrix ?? format.cpuMatrix(cols: cols)
            return
        }
        experts = nil
        let rowBytes = format.rowBytes(cols: cols), scaleBytes = format.scaleRowBytes(cols: cols)
        let inPlace = Self.inPlace(source, repack: repack)
        memory = inPlace.contains(true) ? source.memory : nil
        data = inPlace[0] ? nil : try AlignedBuffer(count: rows * rowBytes, what: what)
        scales = scaleBytes > 0 && !inPlace[1] ? try AlignedBuffer(count: rows * scaleBytes, what: "\(what) scales") : nil
        biases = format.hasBiases && !inPlace[2] ? try AlignedBuffer(count: rows * scaleBytes, what: "\(what) biases") : nil
        matrix = format.cpuMatrix(cols: cols)
        let splitNibbles = format.bits == 4 && !inPlace[0]
        matrix = source.withMatrix(cols: cols) { src in
            var m = src
            if let data {
                let codes = src.data.assumingMemoryBound(to: UInt8.self)
                if splitNibbles {
                    moe_cpu_split_nibbles(codes, data.pointer, Int64(rows * rowBytes))
                } else {
                    data.pointer.update(from: codes, count: rows * rowBytes)
                }
                m.data = UnsafeRawPointer(data.pointer)
            }
            if let scales {
                scales.pointer.update(from: src.scales.assumingMemoryBound(to: UInt8.self), count: rows * scaleBytes)
                m.scales = UnsafeRawPointer(scales.pointer)
            }
            if let biases {
                biases.pointer.update(from: src.biases.assumingMemoryBound(to: UInt8.self), count: rows * scaleBytes)
                m.biases = UnsafeRawPointer(biases.pointer)
            }
            return m
        }
        matrix.split_nibbles = splitNibbles ? 1 : 0
    }

    /// For a per-expert tensor: the expert's matrix that holds rows `row0 ..< row0 + n`
    /// (callers never cross an expert: their rows are one expert's block) and the first
    /// row's index in it.
    @inline(__always)
    func expertRows(_ row0: Int, _ n: Int) -> (WeightMatrix, Int)? {
        guard let experts else { return nil }
        let each = rows / experts.count, e = row0 / each
        precondition(row0 + n <= (e + 1) * each, "a product crossed from one expert's rows into the next's")
        return (experts[e], row0 - e * each)
    }

    /// Bytes held (codes, scales and biases), in place or copied.
    var bytes: Int { rows * (format.rowBytes(cols: cols) + format.scaleRowBytes(cols: cols) * (format.hasBiases ? 2 : 1)) }

    /// Float32 rows for BLAS, if that is this matrix's format.
    private func floatRows(_ row0: Int) -> UnsafePointer<Float> {
        matrix.data!.assumingMemoryBound(to: Float.self) + row0 * cols
    }

    /// Floats a tile needs (for `tile(for:)` callers sizing scratch).
    var tileCount: Int {
        if format == .float32 { return 0 }
        return Swift.max(1, Self.tileBytes / (4 * cols)) * cols
    }

    /// `c[i, j] = Σ_x a[i, x] · W[row0 + j, x]` for i < m, j < n. `tile` is scratch of
    /// `tileCount` floats, used when m is above `registerRowLimit`.
    func multiply(m: Int, rows row0: Int, count n: Int, a: UnsafePointer<Float>, lda: Int,
                  c: UnsafeMutablePointer<Float>, ldc: Int, tile: UnsafeMutablePointer<Float>?) {
        if m == 0 || n == 0 { return }
        if let (expert, row) = expertRows(row0, n) {
            return expert.multiply(m: m, rows: row, count: n, a: a, lda: lda, c: c, ldc: ldc, tile: tile)
        }
        // Decode rows of every format, float32 included, go through the same row kernels:
        // a product that only streams its weights (moe_cpu_matmul_formatted picks the
        // vector width that streams fastest).
        if m <= Self.registerRowLimit || (tile == nil && format != .float32) {
            withUnsafePointer(to: matrix) { w in
                moe_cpu_matmul_formatted(Int64(m), Int64(n), a, Int64(lda), w, Int64(row0), c, Int64(ldc))
            }
            return
        }
        if format == .float32 {
            MatrixProduct.gemmNT(m: m, n: n, k: cols, a: a, lda: lda, b: floatRows(row0), ldb: cols, c: c, ldc: ldc)
            return
        }
        let tileRows = tileCount / cols
        withUnsafePointer(to: matrix) { w in
            for j0 in stride(from: 0, to: n, by: tileRows) {
                let count = Swift.min(tileRows, n - j0)
                moe_cpu_dequantize_rows(w, Int64(row0 + j0), Int64(count), tile!)
                MatrixProduct.gemmNT(m: m, n: count, k: cols, a: a, lda: lda, b: tile!, ldb: cols, c: c + j0, ldc: ldc)
            }
        }
    }
}
