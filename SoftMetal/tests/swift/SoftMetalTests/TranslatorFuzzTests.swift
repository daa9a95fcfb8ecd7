// The translator is total: any source, however broken, gives an Output or a thrown
// compile error, never a trap. A typo used to end the process (issue 11: `kernel void
// f(([[)(]])c)` sliced an inverted range). Mutations of real kernels, deterministic;
// MOE_FUZZ_EXAMPLES and MOE_FUZZ_SEED give longer and other runs by hand.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

final class TranslatorFuzzTests: XCTestCase {
    static let seeds = [
        """
        #include <metal_stdlib>
        using namespace metal;
        template <typename T, int N>
        [[kernel, max_total_threads_per_threadgroup(64)]] void scale(device const T* a [[buffer(0)]],
            device float* out [[buffer(1)]], constant uint& n [[buffer(2)]],
            threadgroup float* tg [[threadgroup(0)]], uint i [[thread_position_in_grid]],
            uint lane [[thread_index_in_simdgroup]]) {
            threadgroup float local[2 * N];
            if (i < n) { local[lane % (2 * N)] = float(a[i]); out[i] = simd_sum(local[0]) * N; }
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        template [[host_name("scale_f")]] [[kernel]] decltype(scale<float, 4>) scale<float, 4>;
        constant bool has_bias [[function_constant(0)]];
        kernel void add(device float4* x [[buffer(0)]], device const float* b [[buffer(1), function_constant(has_bias)]],
                        uint2 g [[threadgroup_position_in_grid]]) { x[g.x] = float4(x[g.x].xy, 1.0h, has_bias ? b[0] : 0); }
        """,
    ]
    static let tokens = ["[[", "]]", "(", ")", "<", ">", "{", "}", ";", ",", "template", "kernel", "void",
                         "[[host_name(\"x\")]]", "decltype", "device", "threadgroup", "constant", "::", "#", "\"",
                         "'", "/*", "*/", "//", "\n", "[[buffer(", "0", "-1", "9999999999999999999", "\\", "&", "*"]

    func testAnyMutationTranslatesOrThrows() {
        let count = Int(ProcessInfo.processInfo.environment["MOE_FUZZ_EXAMPLES"] ?? "") ?? 1500
        var state = UInt64(ProcessInfo.processInfo.environment["MOE_FUZZ_SEED"] ?? "") ?? 0x9E3779B97F4A7C15
        func next(_ n: Int) -> Int {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Int((state >> 33) % UInt64(n))
        }
        var thrown = 0
        for _ in 0..<count {
            var text = Array(Self.seeds[0].utf8)
            for _ in 0...next(6) {
                let at = next(text.count + 1)
                switch next(3) {
                case 0: text.insert(contentsOf: Array(Self.tokens[next(Self.tokens.count)].utf8), at: at)
                case 1: text.removeSubrange(at..<Swift.min(text.count, at + 1 + next(8)))
                default: text = Array(text[at...]) + Array(text[..<at])
                }
            }
            do { _ = try MSLTranslator.translate(String(decoding: text, as: UTF8.self)) } catch { thrown += 1 }
        }
        XCTAssertGreaterThan(thrown, 0, "the mutations should break some sources")
        // issue 11's typos
        for broken in ["]]kernel void k()", "kernel void f(([[)(]])c)", "[[max_total_threads_per_threadgroup)(]]",
                       "kernel void k(device float* a [[buffer(", "template <", "kernel void (", ""] {
            _ = try? MSLTranslator.translate(broken + " {}")  // may pass on to clang, must not trap
        }
    }
}
#endif
