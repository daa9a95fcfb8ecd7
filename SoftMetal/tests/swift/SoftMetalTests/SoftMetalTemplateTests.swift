// The MSL that real kernel code is written in: templated kernels with explicit
// [[host_name]] instantiations (also made by macros, also `decltype(f<T>) f<T>;` as MLX
// writes them), the preprocessor with includes and defines, combined kernel attributes,
// and readable errors for what is not supported.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

let templateSource = """
#include <metal_stdlib>
using namespace metal;

// out[i] = x[i] * SCALE + sizeof(T): which instance ran shows in the numbers.
template <typename T, int SCALE>
[[kernel]] void scale_add(device const T* x [[buffer(0)]],
                          device float* out [[buffer(1)]],
                          constant uint& n [[buffer(2)]],
                          uint gid [[thread_position_in_grid]]) {
    if (gid >= n) return;
    out[gid] = float(x[gid]) * SCALE + float(sizeof(T));
}

template [[host_name("scale_add_f32")]] [[kernel]] void scale_add<float, 2>(
    device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
    constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]);
template [[host_name("scale_add_f16")]] kernel void scale_add<half, 3>(
    device const half* x [[buffer(0)]], device float* out [[buffer(1)]],
    constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]);
template [[host_name("scale_add_bf16")]] [[kernel]] decltype(scale_add<bfloat, 4>) scale_add<bfloat, 4>;

// The `kernel void` spelling, instantiated by a macro in MLX's decltype form.
template <typename T>
kernel void negate(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                   uint gid [[thread_position_in_grid]]) {
    y[gid] = -x[gid];
}
#define instantiate_negate(tname, T) \\
  template [[host_name("negate_" #tname)]] [[kernel]] decltype(negate<T>) negate<T>;
instantiate_negate(float32, float)
instantiate_negate(float16, half)
instantiate_negate(int32, int)
"""

final class SoftMetalTemplateTests: XCTestCase {
    var device: any MTLDevice { MTLCreateSystemDefaultDevice()! }

    func run(_ library: any MTLLibrary, _ name: String, buffers: [any MTLBuffer], bytes: [UInt32] = [],
             threads: Int, perGroup: Int = 32) throws -> any MTLCommandBuffer {
        let function = try XCTUnwrap(library.makeFunction(name: name), name)
        let pipeline = try device.makeComputePipelineState(function: function)
        let cb = try XCTUnwrap(device.makeCommandQueue()?.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(pipeline)
        for (i, b) in buffers.enumerated() { enc.setBuffer(b, offset: 0, index: i) }
        for (i, var v) in bytes.enumerated() { enc.setBytes(&v, length: 4, index: buffers.count + i) }
        enc.dispatchThreads(MTLSize(width: threads, height: 1, depth: 1),
                            threadsPerThreadgroup: MTLSize(width: perGroup, height: 1, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        return cb
    }

    func buffer<T>(_ values: [T]) -> any MTLBuffer {
        values.withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: $0.count, options: [])! }
    }

    func read<T>(_ buffer: any MTLBuffer, _: T.Type, _ count: Int) -> [T] {
        Array(UnsafeBufferPointer(start: buffer.contents().assumingMemoryBound(to: T.self), count: count))
    }

    func compileError(_ source: String, options: MTLCompileOptions? = nil) -> String {
        do {
            _ = try device.makeLibrary(source: source, options: options)
            return "compiled"
        } catch {
            return "\(error)"
        }
    }

    /// A fresh directory under the test's temporary area.
    func temporaryDirectory() throws -> String {
        var template = Array("/tmp/softmetal-test-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        XCTAssertNotNil(made)
        return String(cString: template)
    }

    func write(_ path: String, _ text: String) throws {
        try SMFile.writeAtomically(path, text, unique: "t")
    }

    func testTemplateInstancesForFloatHalfBfloatRunUnderTheirHostNames() throws {
        let library = try device.makeLibrary(source: templateSource, options: nil)
        XCTAssertEqual(Set(library.functionNames),
                       ["scale_add_f32", "scale_add_f16", "scale_add_bf16", "negate_float32", "negate_float16", "negate_int32"])
        XCTAssertNil(library.makeFunction(name: "scale_add"), "an uninstantiated template is not a function")
        XCTAssertNil(library.makeFunction(name: "negate"))

        let x: [Float] = [1, 2, 3, 4.5, -0.25]
        let n = x.count
        let bf16 = x.map { UInt16($0.bitPattern >> 16) }  // exact: these values have 8 significant bits
        let cases: [(String, any MTLBuffer, Float, Float)] = [
            ("scale_add_f32", buffer(x), 2, 4),
            ("scale_add_f16", buffer(x.map { Float16($0) }), 3, 2),
            ("scale_add_bf16", buffer(bf16), 4, 2),
        ]
        for (name, input, scale, size) in cases {
            let out = try XCTUnwrap(device.makeBuffer(length: 4 * 32))
            let cb = try run(library, name, buffers: [input, out], bytes: [UInt32(n)], threads: n)
            XCTAssertNil(cb.error, name)
            XCTAssertEqual(read(out, Float.self, n), x.map { $0 * scale + size }, name)
        }
    }

    func testMacroMadeDecltypeInstantiationsBindByTheTemplatesAttributes() throws {
        let library = try device.makeLibrary(source: templateSource, options: nil)
        let f = buffer([Float(1.5), -2]), g = try XCTUnwrap(device.makeBuffer(length: 8))
        XCTAssertNil(try run(library, "negate_float32", buffers: [f, g], threads: 2).error)
        XCTAssertEqual(read(g, Float.self, 2), [-1.5, 2])
        let i = buffer([Int32(7), -9]), j = try XCTUnwrap(device.makeBuffer(length: 8))
        XCTAssertNil(try run(library, "negate_int32", buffers: [i, j], threads: 2).error)
        XCTAssertEqual(read(j, Int32.self, 2), [-7, 9])
        let h = buffer([Float16(0.5), 3]), k = try XCTUnwrap(device.makeBuffer(length: 4))
        XCTAssertNil(try run(library, "negate_float16", buffers: [h, k], threads: 2).error)
        XCTAssertEqual(read(k, Float16.self, 2), [-0.5, -3])
        // Reflection comes from the template's parameter list, with the instance's types.
        let kernel = try XCTUnwrap((library as? SoftMetalLibrary)?.kernels["negate_float16"])
        XCTAssertEqual(kernel.params.map(\.attribute), ["buffer(0)", "buffer(1)", "thread_position_in_grid"])
        XCTAssertEqual(kernel.params.map(\.type), ["const half*", "half*", "uint"])
        // An unbound buffer of an instance is named like any kernel's.
        let cb = try run(library, "negate_float32", buffers: [f], threads: 2)
        XCTAssertTrue("\(cb.error!)".contains("buffer(1)"), "\(cb.error!)")
    }

    func testIncludesFromIncludeDirectoriesAndRelativeToTheIncludingFile() throws {
        let root = try temporaryDirectory()
        try SMFile.makeDirectories("\(root)/inc/quant")
        // quant/affine.h includes "scale.h" next to itself: found only relative to the file.
        try write("\(root)/inc/quant/scale.h", "#pragma once\n#define SCALE_OF(bits) ((1 << (bits)) - 1)\n")
        try write("\(root)/inc/quant/affine.h", """
        #pragma once
        #include <metal_stdlib>
        #include "scale.h"
        template <int B>
        [[kernel]] void max_code(device uint* out [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
            out[gid] = SCALE_OF(B) + gid;
        }
        """)
        let source = """
        #include "quant/affine.h"
        template [[host_name("max_code_4")]] [[kernel]] decltype(max_code<4>) max_code<4>;
        template [[host_name("max_code_8")]] [[kernel]] decltype(max_code<BITS>) max_code<BITS>;
        """
        let options = SoftMetalCompileOptions()
        options.softMetalIncludeDirectories = ["\(root)/inc"]
        options.softMetalPreprocessorMacros = ["BITS": "8"]
        let library = try device.makeLibrary(source: source, options: options)
        for (name, base) in [("max_code_4", UInt32(15)), ("max_code_8", 255)] {
            let out = try XCTUnwrap(device.makeBuffer(length: 8))
            XCTAssertNil(try run(library, name, buffers: [out], threads: 2, perGroup: 2).error)
            XCTAssertEqual(read(out, UInt32.self, 2), [base, base + 1], name)
        }
        // Without the include directory: the preprocessor's message, naming the MSL line.
        let error = compileError(source)
        XCTAssertTrue(error.contains("source.metal:1") && error.contains("'quant/affine.h' file not found"), error)
    }

    func testPredefinedMacrosFollowTheLanguageVersion() throws {
        let source = """
        #include <metal_stdlib>
        #include <metal_simdgroup>
        #include <simd/simd.h>
        kernel void versions(device int* out [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
        #if defined(__METAL__) && __METAL_VERSION__ >= 300
            out[0] = __METAL_VERSION__;
        #endif
        #ifdef __HAVE_BFLOAT__
            out[1] = __HAVE_BFLOAT__;
        #else
            out[1] = -1;
        #endif
        #ifdef __METAL_MACOS__
            out[2] = 1;
        #endif
        }
        """
        for (version, expected) in [(nil, [Int32(310), 1, 0]), (MTLLanguageVersion.version3_0, [300, -1, 0]),
                                    (.version3_2, [320, 1, 0])] {
            var options: MTLCompileOptions?
            if let version {
                options = MTLCompileOptions()
                options?.languageVersion = version
            }
            let library = try device.makeLibrary(source: source, options: options)
            let out = try XCTUnwrap(device.makeBuffer(length: 12))
            XCTAssertNil(try run(library, "versions", buffers: [out], threads: 1, perGroup: 1).error)
            XCTAssertEqual(read(out, Int32.self, 3), expected, "\(String(describing: version))")
        }
    }

    /// `bfloat` is MSL 3.1: as 3.0 (macOS 13's default) Apple's compiler does not know the
    /// type, and SoftMetal refuses it too; the same source compiles as 3.1.
    func testBfloatIsRefusedBeforeMSL31() throws {
        let source = "kernel void k(device bfloat2* p [[buffer(0)]]) { p[0] = bfloat2(bfloat(1.0f)); }"
        let old = MTLCompileOptions()
        old.languageVersion = .version3_0
        XCTAssertThrowsError(try device.makeLibrary(source: source, options: old)) {
            XCTAssertTrue("\($0)".contains("unknown type name 'bfloat2_needs_MSL_3_1'"), "\($0)")
        }
        XCTAssertNoThrow(try device.makeLibrary(source: source, options: nil))
    }

    func testCombinedKernelAttributeSetsMaxTotalThreads() throws {
        let source = """
        [[kernel, max_total_threads_per_threadgroup(128)]] void capped(device uint* out [[buffer(0)]],
                                                                       uint gid [[thread_position_in_grid]]) {
            out[gid] = gid;
        }
        // A constant expression of template parameters, as MLX writes the limit.
        template <typename T, int WARPS>
        [[kernel, max_total_threads_per_threadgroup(WARPS * 32)]] void capped_t(device T* out [[buffer(0)]],
                                                                                uint gid [[thread_position_in_grid]]) {
            out[gid] = T(gid);
        }
        template [[host_name("capped_u32")]] [[kernel]] decltype(capped_t<uint, 2>) capped_t<uint, 2>;
        template [[host_name("capped_u32_32"), kernel, max_total_threads_per_threadgroup(32)]]
            decltype(capped_t<uint, 4>) capped_t<uint, 4>;
        """
        let library = try device.makeLibrary(source: source, options: nil)
        XCTAssertEqual(Set(library.functionNames), ["capped", "capped_u32", "capped_u32_32"])
        for (name, limit) in [("capped", 128), ("capped_u32", 64), ("capped_u32_32", 32)] {
            let pipeline = try device.makeComputePipelineState(function: try XCTUnwrap(library.makeFunction(name: name)))
            XCTAssertEqual(pipeline.maxTotalThreadsPerThreadgroup, limit, name)
            let out = try XCTUnwrap(device.makeBuffer(length: 4 * 256))
            XCTAssertNil(try run(library, name, buffers: [out], threads: 256, perGroup: limit).error, name)
            XCTAssertEqual(read(out, UInt32.self, 256), (0..<256).map(UInt32.init), name)
            let tooMany = try run(library, name, buffers: [out], threads: 256, perGroup: limit * 2)
            XCTAssertTrue("\(tooMany.error.map { "\($0)" } ?? "no error")".contains("exceeds maxTotalThreadsPerThreadgroup \(limit)"), name)
        }
    }

    func testUnsupportedTemplateConstructsAreReadableErrorsWithTheMSLLine() throws {
        let body = "template <typename T>\n[[kernel]] void f(device T* x [[buffer(0)]]) { x[0] = T(1); }\n"
        let cases: [(String, [String])] = [
            ("\n[[kernel, stitchable]] void g(device float* x [[buffer(0)]]) {}\n",
             ["source.metal:2", "the kernel attribute [[stitchable]] is not supported by SoftMetal"]),
            (body + "template [[kernel]] decltype(f<float>) f<float>;\n",
             ["source.metal:3", "needs [[host_name(\"...\")]]"]),
            (body + "\ntemplate [[host_name(\"h\")]] [[kernel]] decltype(g<float>) g<float>;\n",
             ["source.metal:4", "no kernel template named g"]),
            (body + "template [[host_name(\"h\")]] [[kernel]] float f<float>(device float* x);\n",
             ["source.metal:3", "cannot parse this kernel instantiation"]),
            (body + "template [[host_name(\"h\")]] [[kernel]] decltype(f<float>) f<float>;\n"
                  + "template [[host_name(\"h\")]] [[kernel]] decltype(f<int>) f<int>;\n",
             ["two kernels are named h"]),
            ("\n[[kernel, max_total_threads_per_threadgroup(N)]] void f(device float* x [[buffer(0)]]) {}\n",
             ["source.metal:2", "use of undeclared identifier 'N'"]),
            ("\n\n[[kernel, max_total_threads_per_threadgroup(2048)]] void f(device float* x [[buffer(0)]]) {}\n",
             ["source.metal:3", "the limit is 1...1024"]),
        ]
        for (source, expected) in cases {
            let error = compileError(source)
            for e in expected { XCTAssertTrue(error.contains(e), "expected `\(e)` in: \(error)") }
            XCTAssertFalse(error.contains("softmetal-generated"), error)
        }
    }

    func testErrorsInsideTemplateBodiesPointAtTheBodyAndTheInstantiation() throws {
        // Only the float instance fails (`.x` of a float): both MSL lines are named.
        let source = """
        template <typename T>
        [[kernel]] void first(device T* x [[buffer(0)]]) {
            x[0] = x[1].x;
        }
        template [[host_name("first_f4")]] [[kernel]] decltype(first<float4>) first<float4>;
        template [[host_name("first_f")]] [[kernel]] decltype(first<float>) first<float>;
        """
        let error = compileError(source)
        XCTAssertTrue(error.contains("source.metal:3"), error)
        XCTAssertTrue(error.contains("source.metal:6"), error)
        XCTAssertTrue(error.contains("MSL line 3: x[0] = x[1].x;"), error)
        XCTAssertFalse(error.contains("softmetal-generated"), error)
    }

    func testLineNumbersOfErrorsInIncludedFiles() throws {
        let root = try temporaryDirectory()
        try write("\(root)/bad.h", "// line 1\n\ninline float broken(float x) { return x +; }\n")
        try write("\(root)/attr.h", "// line 1\n[[kernel, vertex]] void v(device float* x [[buffer(0)]]) {}\n")
        let options = SoftMetalCompileOptions()
        options.softMetalIncludeDirectories = [root]
        let clangError = compileError("// main\n#include \"bad.h\"\nkernel void k(device float* x [[buffer(0)]]) { x[0] = broken(1); }\n",
                                      options: options)
        XCTAssertTrue(clangError.contains("\(root)/bad.h:3"), clangError)
        XCTAssertTrue(clangError.contains("bad.h line 3: inline float broken(float x) { return x +; }"), clangError)
        let translatorError = compileError("\n\n#include \"attr.h\"\n", options: options)
        XCTAssertTrue(translatorError.contains("\(root)/attr.h:2: error: the kernel attribute [[vertex]] is not supported"), translatorError)
    }

    func testPreprocessedTextIsTheCacheKey() throws {
        // Same MSL, different macro value: two compiled objects; same value again: a hit.
        let source = "kernel void v(device int* out [[buffer(0)]]) { out[0] = VALUE; }\n"
        var results: [Int32] = []
        for value in ["11", "12", "11"] {
            let options = SoftMetalCompileOptions()
            options.softMetalPreprocessorMacros = ["VALUE": value]
            let library = try device.makeLibrary(source: source, options: options)
            let out = try XCTUnwrap(device.makeBuffer(length: 4))
            XCTAssertNil(try run(library, "v", buffers: [out], threads: 1, perGroup: 1).error)
            results.append(read(out, Int32.self, 1)[0])
        }
        XCTAssertEqual(results, [11, 12, 11])
    }

    static let constantsSource = """
    #include <metal_stdlib>
    using namespace metal;
    constant bool has_bias [[function_constant(0)]];
    constant int scale [[function_constant(1)]];
    constant float offset [[function_constant(2)]];
    constant half hscale [[function_constant(3)]];
    constant bool scale_given = is_function_constant_defined(scale);

    template <typename T>
    [[kernel]] void affine(device const T* x [[buffer(0)]], device float* y [[buffer(1)]],
                           device const float* bias [[buffer(2), function_constant(has_bias)]],
                           uint gid [[thread_position_in_grid]]) {
        float v = float(x[gid]) * (scale_given ? scale : 1) + offset + float(hscale);
        if (has_bias) v += bias[gid];
        y[gid] = v;
    }
    template [[host_name("affine_f32")]] [[kernel]] decltype(affine<float>) affine<float>;
    """

    func runAffine(_ function: any MTLFunction, bias: [Float]?) throws -> (any MTLCommandBuffer, [Float]) {
        let pipeline = try device.makeComputePipelineState(function: function)
        let y = try XCTUnwrap(device.makeBuffer(length: 16))
        let cb = try XCTUnwrap(device.makeCommandQueue()?.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(pipeline)
        enc.setBuffer(buffer([Float(1), 2, 3, 4]), offset: 0, index: 0)
        enc.setBuffer(y, offset: 0, index: 1)
        if let bias { enc.setBuffer(buffer(bias), offset: 0, index: 2) }
        enc.dispatchThreads(MTLSize(width: 4, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 4, height: 1, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        return (cb, read(y, Float.self, 4))
    }

    func testFunctionConstantsSpecialiseAFunction() throws {
        let library = try device.makeLibrary(source: Self.constantsSource, options: nil)
        // No values: every constant undefined (false / zero), the bias parameter absent.
        let plain = try runAffine(try XCTUnwrap(library.makeFunction(name: "affine_f32")), bias: nil)
        XCTAssertNil(plain.0.error)
        XCTAssertEqual(plain.1, [1, 2, 3, 4])

        let values = MTLFunctionConstantValues()
        var yes = true, three: Int32 = 3, half: Float = 0.5, quarter = Float16(0.25)
        values.setConstantValue(&yes, type: .bool, index: 0)
        values.setConstantValue(&three, type: .int, index: 1)
        values.setConstantValue(&half, type: .float, withName: "offset")
        values.setConstantValue(&quarter, type: .half, index: 3)
        let special = try library.makeFunction(name: "affine_f32", constantValues: values)
        XCTAssertEqual(special.name, "affine_f32")
        let biased = try runAffine(special, bias: [100, 200, 300, 400])
        XCTAssertNil(biased.0.error)
        XCTAssertEqual(biased.1, [103.75, 206.75, 309.75, 412.75])
        // With has_bias true, buffer(2) is required.
        let unbound = try runAffine(special, bias: nil)
        XCTAssertTrue("\(unbound.0.error.map { "\($0)" } ?? "no error")".contains("buffer(2)"), "\(String(describing: unbound.0.error))")
        // The same values again: the compiled variant is reused.
        let before = KernelCompiler.shared.stats
        _ = try library.makeFunction(name: "affine_f32", constantValues: values)
        XCTAssertEqual(KernelCompiler.shared.stats.compilations, before.compilations)
        XCTAssertEqual(KernelCompiler.shared.stats.cacheHits, before.cacheHits)
    }

    func testFunctionConstantErrors() throws {
        let library = try device.makeLibrary(source: Self.constantsSource, options: nil)
        let values = MTLFunctionConstantValues()
        var f: Float = 2
        values.setConstantValue(&f, type: .float, index: 1)
        XCTAssertThrowsError(try library.makeFunction(name: "affine_f32", constantValues: values)) {
            XCTAssertTrue("\($0)".contains("function constant scale (index 1) is declared int"), "\($0)")
        }
        XCTAssertThrowsError(try library.makeFunction(name: "affine", constantValues: values)) {
            XCTAssertTrue("\($0)".contains("no function named affine"), "\($0)")
        }
        let error = compileError("\nconstant float3 v [[function_constant(0)]];\n")
        XCTAssertTrue(error.contains("source.metal:2") && error.contains("the type float3 is not supported"), error)
    }

    func testApplesPreprocessorMacrosOption() throws {
        // Apple's spelling: `options.preprocessorMacros = [...]` (NSNumber / NSString values there).
        let source = "kernel void m(device int* out [[buffer(0)]]) { out[0] = A; out[1] = B; out[2] = int(C * 10); }\n"
        let options = MTLCompileOptions()
        options.preprocessorMacros = ["A": 4, "B": true, "C": 1.5]
        let library = try device.makeLibrary(source: source, options: options)
        let out = try XCTUnwrap(device.makeBuffer(length: 12))
        XCTAssertNil(try run(library, "m", buffers: [out], threads: 1, perGroup: 1).error)
        XCTAssertEqual(read(out, Int32.self, 3), [4, 1, 15])
        // SoftMetal's string macros win over Apple's for the same name.
        let both = SoftMetalCompileOptions()
        both.preprocessorMacros = ["A": 4, "B": 0, "C": 0]
        both.softMetalPreprocessorMacros = ["A": "7"]
        let library2 = try device.makeLibrary(source: source, options: both)
        XCTAssertNil(try run(library2, "m", buffers: [out], threads: 1, perGroup: 1).error)
        XCTAssertEqual(read(out, Int32.self, 3), [7, 0, 0])
    }

    func testMathFloatingPointFunctionsSelectsWhatAppleHeadersSee() throws {
        // __METAL_MAYBE_FAST_MATH__ follows mathFloatingPointFunctions (Apple's default
        // .fast, also without options); fastMathEnabled sets it as Apple documents; exp is
        // precise either way.
        let source = "kernel void m(device float* out [[buffer(0)]]) { out[0] = __METAL_MAYBE_FAST_MATH__ ? 1.0f : 0.0f; out[1] = metal::exp(out[2]); }\n"
        func results(_ options: MTLCompileOptions?) throws -> [Float] {
            let library = try device.makeLibrary(source: source, options: options)
            let out = try XCTUnwrap(device.makeBuffer(length: 12))
            out.contents().storeBytes(of: Float(0.7), toByteOffset: 8, as: Float.self)
            XCTAssertNil(try run(library, "m", buffers: [out], threads: 1, perGroup: 1).error)
            return read(out, Float.self, 2)
        }
        let fast = MTLCompileOptions(), precise = MTLCompileOptions(), legacy = MTLCompileOptions()
        XCTAssertEqual(fast.mathFloatingPointFunctions, .fast)
        precise.mathMode = .safe
        precise.mathFloatingPointFunctions = .precise
        legacy.fastMathEnabled = false
        XCTAssertEqual(legacy.mathMode, .safe)
        XCTAssertEqual(legacy.mathFloatingPointFunctions, .precise)
        let (a, b, c) = (try results(fast), try results(precise), try results(legacy))
        XCTAssertEqual([a[0], b[0], c[0]], [1, 0, 0])
        XCTAssertEqual(a[1], expf(0.7))
        XCTAssertEqual([b[1], c[1]], [a[1], a[1]])
        XCTAssertEqual(try results(nil)[0], 1, "no options: Apple's defaults")
    }

    func testAnEditedHeaderIsSeenByTheNextLibrary() throws {
        // Sources without includes of their own are preprocessed once per process; a source
        // with a header must see the header's current text every time.
        let root = try temporaryDirectory()
        let options = SoftMetalCompileOptions()
        options.softMetalIncludeDirectories = [root]
        let source = "#include \"value.h\"\nkernel void v(device int* out [[buffer(0)]]) { out[0] = VALUE; }\n"
        var results: [Int32] = []
        for value in [21, 22] {
            try write("\(root)/value.h", "#define VALUE \(value)\n")
            let library = try device.makeLibrary(source: source, options: options)
            let out = try XCTUnwrap(device.makeBuffer(length: 4))
            XCTAssertNil(try run(library, "v", buffers: [out], threads: 1, perGroup: 1).error)
            results.append(read(out, Int32.self, 1)[0])
        }
        XCTAssertEqual(results, [21, 22])
    }
}
#endif
