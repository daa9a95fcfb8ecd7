import CMoECPU
import XCTest

/// moe_cpu_gemm_nt against a Double reference on the shapes that exercise every edge of
/// its register blocks: rows and columns that are not multiples of the block, k that is
/// not a multiple of the vector width, leading dimensions larger than the rows.
final class SmallGemmTests: XCTestCase {
    func testAgainstDoubleReference() throws {
        try XCTSkipIf(moe_cpu_gemm_nt_available() == 0, "no AVX2/AVX-512 on this CPU: BLAS serves every size")
        var rng = SplitMix64(seed: 77)
        for (m, n, k) in [(1, 1, 1), (1, 9, 17), (1, 256, 2048), (2, 3, 5), (3, 5, 15), (4, 4, 16),
                          (5, 7, 33), (7, 13, 100), (16, 256, 768), (33, 19, 129), (95, 6, 8)] {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2)
            let a = (0..<m * lda).map { _ in rng.uniform() }
            let b = (0..<n * ldb).map { _ in rng.uniform() }
            var c = [Float](repeating: .nan, count: m * ldc)
            moe_cpu_gemm_nt(Int64(m), Int64(n), Int64(k), a, Int64(lda), b, Int64(ldb), &c, Int64(ldc))
            for i in 0..<m {
                for j in 0..<ldc {
                    let got = c[i * ldc + j]
                    if j >= n {
                        XCTAssertTrue(got.isNaN, "wrote outside the \(m)x\(n) result at (\(i), \(j))")
                        continue
                    }
                    var expected = 0.0
                    for x in 0..<k { expected += Double(a[i * lda + x]) * Double(b[j * ldb + x]) }
                    XCTAssertEqual(Double(got), expected, accuracy: 1e-5 * Double(k).squareRoot() + 1e-6,
                                   "m=\(m) n=\(n) k=\(k) at (\(i), \(j))")
                }
            }
        }
    }

    func testResultOfARowDoesNotDependOnTheOtherRows() throws {
        try XCTSkipIf(moe_cpu_gemm_nt_available() == 0, "no vector kernel on this CPU")
        var rng = SplitMix64(seed: 78)
        let (n, k) = (10, 301)
        let a = (0..<9 * k).map { _ in rng.uniform() }
        let b = (0..<n * k).map { _ in rng.uniform() }
        var all = [Float](repeating: 0, count: 9 * n)
        moe_cpu_gemm_nt(9, Int64(n), Int64(k), a, Int64(k), b, Int64(k), &all, Int64(n))
        for row in 0..<9 {
            var one = [Float](repeating: 0, count: n)
            a.withUnsafeBufferPointer { ap in
                moe_cpu_gemm_nt(1, Int64(n), Int64(k), ap.baseAddress! + row * k, Int64(k), b, Int64(k), &one, Int64(n))
            }
            XCTAssertEqual(one, Array(all[row * n..<(row + 1) * n]), "row \(row) alone differs")
        }
    }
}
