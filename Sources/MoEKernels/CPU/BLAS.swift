// The only file that names a BLAS: Accelerate on Apple platforms, OpenBLAS elsewhere.
#if canImport(Accelerate)
import Accelerate
#else
import COpenBLAS
#endif
import CMoECPU

/// Not named `BLAS`: Accelerate (macOS 15 SDK) has a type of that name.
enum MatrixProduct {
    /// The CPU backend parallelises over its own fixed work items with Dispatch, so BLAS
    /// must run each call on the calling thread: nested BLAS threads would oversubscribe
    /// the cores, and a thread-count-dependent split could change results. OpenBLAS's
    /// thread count is process-wide: set once, when the first CPU layer is made.
    /// Accelerate's is per thread: `singleThreadedOnThisThread()` before each call.
    static let configured: Void = {
        #if !canImport(Accelerate)
        openblas_set_num_threads(1)
        #endif
    }()

    /// Accelerate's threading model is a thread-local setting (Apple's documentation of
    /// `BLASSetThreading(_:)`: "This setting is per thread"), and products run on Dispatch's
    /// worker threads, so it is set on the calling thread before each BLAS call: a
    /// thread-local store, nothing beside a product. Both ways to set it exist from the
    /// macOS 15 / iOS 18 SDKs, which come with the Swift 6 compilers (Xcode 16); earlier SDKs
    /// and systems keep Accelerate's own choice. Elsewhere (OpenBLAS) nothing to do.
    ///
    /// On macOS, Accelerate's Swift overlay `BLAS.threadingModel` (macOS 15 only): the C
    /// function `BLASSetThreading` reaches Swift only if the Clang importer sees its
    /// declaration, which depends on the new-LAPACK headers being selected
    /// (`ACCELERATE_NEW_LAPACK`, a C macro a package can pass to the importer only with
    /// unsafe flags), and Swift's `#if` cannot test for a C declaration; the overlay is part
    /// of the Accelerate module itself. Apple offers the overlay on macOS alone, so the
    /// other Apple systems call the C function. The thinnest adapter on purpose: no Apple
    /// machine has compiled this yet (the macOS CI job builds it).
    @inline(__always)
    static func singleThreadedOnThisThread() {
        #if canImport(Accelerate) && compiler(>=6.0)
        #if os(macOS)
        if #available(macOS 15, *) {
            BLAS.threadingModel = .singleThreaded
        }
        #else
        if #available(iOS 18, tvOS 18, watchOS 11, visionOS 2, *) {
            _ = BLASSetThreading(BLAS_THREADING_SINGLE_THREADED)
        }
        #endif
        #endif
    }

    /// Below this many rows `moe_cpu_gemm_nt` beats BLAS, which packs the whole weight
    /// block for every call (CMoECPU/include/moe_cpu_kernels.h has the measurements).
    static let smallRowLimit = moe_cpu_gemm_nt_available() != 0 ? 96 : 0

    /// `c[m×n] = a[m×k] · b[n×k]ᵀ` (row-major, leading dimensions in elements).
    @inline(__always)
    static func gemmNT(m: Int, n: Int, k: Int,
                       a: UnsafePointer<Float>, lda: Int,
                       b: UnsafePointer<Float>, ldb: Int,
                       c: UnsafeMutablePointer<Float>, ldc: Int) {
        if m < smallRowLimit {
            moe_cpu_gemm_nt(Int64(m), Int64(n), Int64(k), a, Int64(lda), b, Int64(ldb), c, Int64(ldc))
            return
        }
        singleThreadedOnThisThread()
        if m == 1 {
            // A single row is a matrix-vector product; gemv streams `b` once.
            cblas_sgemv(CblasRowMajor, CblasNoTrans, Int32(n), Int32(k), 1, b, Int32(ldb), a, 1, 0, c, 1)
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Int32(m), Int32(n), Int32(k),
                        1, a, Int32(lda), b, Int32(ldb), 0, c, Int32(ldc))
        }
    }
}
