import CMoECPU

/// A weight matrix of `rows` x `cols` owned by the CPU backend, in the format it was given
/// (float32, float16, bfloat16 or quantized): copied once at creation, never widened.
final class WeightMatrix: @unchecked Sendable {
    let format: WeightFormat
    let rows: Int
    let cols: Int
    private let data: AlignedBuffer<UInt8>
    private let scales: AlignedBuffer<UInt8>?
    private let biases: AlignedBuffer<UInt8>?
    /// The kernels' view of this matrix (pointers into the buffers above).
    private(set) var matrix: moe_cpu_matrix

    /// Rows per dequantized tile in prefill: the tile (float32) stays in L2 for all the
    /// activation rows that multiply it.
    static let tileBytes = 256 << 10
    /// Up to this many activation rows the product dequantizes in registers (every weight
    /// byte read once); above it a tile is dequantized into cache and fed to the GEMM.
    static let registerRowLimit = 4

    /// A copy of `source`, a tensor of `rows` rows of `cols` elements.
    init(copying source: WeightData, rows: Int, cols: Int, what: String) throws {
        format = source.format
        self.rows = rows
        self.cols = cols
        let rowBytes = format.rowBytes(cols: cols), scaleBytes = format.scaleRowBytes(cols: cols)
        data = try AlignedBuffer(count: rows * rowBytes, what: what)
        scales = scaleBytes > 0 ? try AlignedBuffer(count: rows * scaleBytes, what: "\(what) scales") : nil
        biases = format.hasBiases ? try AlignedBuffer(count: rows * scaleBytes, what: "\(what) biases") : nil
        matrix = format.cpuMatrix(cols: cols)
        let splitNibbles = format.bits == 4
        source.withMatrix(cols: cols) { src in
            let codes = src.data.assumingMemoryBound(to: UInt8.self)
            if splitNibbles {
                moe_cpu_split_nibbles(codes, data.pointer, Int64(rows * rowBytes))
            } else {
                data.pointer.update(from: codes, count: rows * rowBytes)
            }
            if let scales { scales.pointer.update(from: src.scales.assumingMemoryBound(to: UInt8.self), count: rows * scaleBytes) }
            if let biases { biases.pointer.update(from: src.biases.assumingMemoryBound(to: UInt8.self), count: rows * scaleBytes) }
        }
        matrix.split_nibbles = splitNibbles ? 1 : 0
        matrix.data = UnsafeRawPointer(data.pointer)
        matrix.scales = scales.map { UnsafeRawPointer($0.pointer) }
        matrix.biases = biases.map { UnsafeRawPointer($0.pointer) }
    }

    /// Bytes held (codes, scales and biases).
    var bytes: Int { data.count + (scales?.count ?? 0) + (biases?.count ?? 0) }

    /// Float32 rows for BLAS, if that is this matrix's format.
    private func floatRows(_ row0: Int) -> UnsafePointer<Float> {
        UnsafeRawPointer(data.pointer).assumingMemoryBound(to: Float.self) + row0 * cols
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
