// The MSL-to-C++ translation itself: lines stay in place, attributes become reflection,
// address spaces and threadgroup declarations are rewritten, vector constructors and half
// literals are mapped.
#if os(Linux)
import XCTest
@testable import SoftMetal

final class TranslatorTests: XCTestCase {
    func translate(_ source: String) throws -> MSLTranslator.Output { try MSLTranslator.translate(source) }

    /// The translated text of the MSL part (between the first #line and the generated code).
    func body(_ out: MSLTranslator.Output) -> [Substring] {
        let text = out.source.split(separator: "\n", omittingEmptySubsequences: false)
        let end = text.firstIndex { $0.hasPrefix("#line 1 \"softmetal-generated") }!
        return Array(text[1..<end])
    }

    func testEveryLineStaysWhereItWas() throws {
        let source = """
        #include <metal_stdlib>
        using namespace metal; /* a comment
        over two lines */
        kernel void k(device float* x [[buffer(0)]],
                      uint gid
                        [[thread_position_in_grid]]) {
            threadgroup float
               sh[32];
            x[gid] = sh[gid]; // done
        }
        """
        let out = try translate(source)
        let lines = body(out)
        XCTAssertEqual(lines.count, source.split(separator: "\n", omittingEmptySubsequences: false).count)
        XCTAssertTrue(lines[8].contains("x[gid] = sh[gid];"), "\(lines)")
        XCTAssertFalse(out.source.contains("a comment"))
        XCTAssertTrue(lines[0].trimmingSpaces.isEmpty, "the metal_stdlib include is dropped")
    }

    func testKernelSignatureIsRecorded() throws {
        let out = try translate("""
        struct P { uint n; };
        [[max_total_threads_per_threadgroup(256)]]
        kernel void k(device const float* a [[ buffer(0) ]], constant P& p [[buffer(3)]],
                      threadgroup float* sh [[threadgroup(1)]], ushort2 tid [[thread_position_in_threadgroup]]) {}
        kernel void other(device atomic_uint* c [[buffer(1)]]) {}
        """)
        XCTAssertEqual(out.kernels.map(\.name), ["k", "other"])
        let k = out.kernels[0]
        XCTAssertEqual(k.maxTotalThreadsPerThreadgroup, 256)
        XCTAssertEqual(k.parameters, [
            .init(kind: .buffer(0), type: "const float*", name: "a"),
            .init(kind: .buffer(3), type: "const P&", name: "p"),
            .init(kind: .threadgroup(1), type: "float*", name: "sh"),
            .init(kind: .builtin("thread_position_in_threadgroup"), type: "ushort2", name: "tid"),
        ])
        XCTAssertEqual(out.kernels[1].parameters, [.init(kind: .buffer(1), type: "atomic_uint*", name: "c")])
        XCTAssertTrue(out.source.contains("extern \"C\" __attribute__((visibility(\"default\"))) int32_t __sm_launch_k("))
        XCTAssertTrue(out.source.contains("__sm_info_other"))
    }

    func testKernelAttributeSpelling() throws {
        let out = try translate("[[kernel]] void k(device float* x [[buffer(0)]]) { x[0] = 1; }")
        XCTAssertEqual(out.kernels.map(\.name), ["k"])
        XCTAssertTrue(out.source.contains("static     void k("), out.source)
    }

    func testAddressSpacesAndThreadgroupVariables() throws {
        let out = try translate("""
        constant float table[2] = {1.0f, 2.0f};
        inline float f(thread float& a, threadgroup float* b, device const float* c) { return a + b[0] + c[0]; }
        kernel void k(device float* x [[buffer(0)]]) {
            threadgroup float tile[8][9];
            threadgroup atomic_uint counter;
            threadgroup float* p = (threadgroup float*)tile;
        }
        """)
        let text = out.source
        XCTAssertTrue(text.contains("const __sm_constant float table[2]"), text)
        XCTAssertTrue(text.contains("inline float f(       float& a, __sm_threadgroup float* b, __sm_device const float* c)"), text)
        XCTAssertTrue(text.contains("__sm_threadgroup float (&tile)[8][9] = *(__sm_threadgroup float (*)[8][9])(::metal::__sm::tg_var(0, sizeof(float [8][9]), alignof(float)))"), text)
        XCTAssertTrue(text.contains("__sm_threadgroup atomic_uint& counter = *(__sm_threadgroup atomic_uint*)(::metal::__sm::tg_var(1, sizeof(atomic_uint), alignof(atomic_uint)))"), text)
        XCTAssertTrue(text.contains("__sm_threadgroup float* p = (__sm_threadgroup float*)tile;"), text)
        XCTAssertFalse(body(out).joined().split(whereSeparator: { !$0.isLetter && $0 != "_" }).contains("device"))
    }

    func testVectorConstructorsAndHalfLiterals() throws {
        let out = try translate("""
        kernel void k(device float4* x [[buffer(0)]]) {
            float4 a = float4(x[0].xy, 1.0f, 2.0f);
            half h = 1.5h + 2h;
            float2 b = metal::float2(3);
            float4 c = x[1].xyzw;
            float f = 1e-5f + 0x1fu;
        }
        """)
        let text = out.source
        XCTAssertTrue(text.contains("float4 a = ::metal::__sm::vmake<::metal::float4>(x[0].xy, 1.0f, 2.0f);"), text)
        XCTAssertTrue(text.contains("half h = ((half)(1.5)) + ((half)(2));"), text)
        XCTAssertTrue(text.contains("float2 b = ::metal::__sm::vmake<::metal::float2>(3);"), text)
        XCTAssertTrue(text.contains("float4 c = x[1].xyzw;"), text)
        XCTAssertTrue(text.contains("float f = 1e-5f + 0x1fu;"), text)
    }

    func testAThreadgroupVariablesInitializerIsDropped() throws {
        // Metal does not promise to run it (README): the variable starts poisoned like any other.
        let out = try translate("kernel void k(device float* x [[buffer(0)]]) {\n  threadgroup float a[4] = {0,\n 1};\n  threadgroup float s = 2.0f; x[0] = a[1] + s;\n}")
        let lines = out.source.components(separatedBy: "\n")
        let at = try XCTUnwrap(lines.firstIndex { $0.contains("(&a)[4] = *(__sm_threadgroup float (*)[4])(::metal::__sm::tg_var(") })
        XCTAssertFalse(lines[at].contains("{0") || lines[at + 1].contains("1}"), out.source)
        XCTAssertTrue(lines[at + 2].contains("float& s = *(__sm_threadgroup float*)(::metal::__sm::tg_var(")
                      && !lines[at + 2].contains("2.0f") && lines[at + 2].contains("x[0] = a[1] + s;"), out.source)
    }

    func testUnsupportedConstructsAreClearErrors() throws {
        XCTAssertThrowsError(try translate("kernel void k(device float* x [[buffer(0)]], float4 v [[stage_in]]) {}")) {
            XCTAssertTrue("\($0)".contains("[[stage_in]] is not supported"), "\($0)")
        }
        XCTAssertThrowsError(try translate("kernel void k(device float* x [[buffer(0)]]) {\n threadgroup float a[4], b[4];\n}")) {
            XCTAssertTrue("\($0)".contains("source.metal:2") && "\($0)".contains("one threadgroup variable per statement"), "\($0)")
        }
        XCTAssertThrowsError(try translate("kernel void k(device float* xs[2] [[buffer(0)]]) {}")) {
            XCTAssertTrue("\($0)".contains("arrays of buffers"), "\($0)")
        }
        XCTAssertThrowsError(try translate("kernel void k(device float* x [[buffer(31)]]) {}")) {
            XCTAssertTrue("\($0)".contains("indices 0...30"), "\($0)")
        }
    }

    func testKernelTemplatesAndTheirInstantiations() throws {
        let out = try translate("""
        template <typename T, int BITS = 4>
        [[kernel]] void qmv(device const T* w [[buffer(0)]], constant uint& n [[buffer(1)]],
                            uint tid [[thread_position_in_grid]]) {}
        template [[host_name("qmv_" "f16_4")]] [[kernel]] void qmv<half, 4>(device const half* w [[buffer(0)]],
            constant uint& n [[buffer(1)]], uint tid [[thread_position_in_grid]]);
        template [[host_name("qmv.bf16")]] [[kernel]] decltype(qmv<bfloat, 8>) qmv<bfloat, 8>;
        """)
        XCTAssertEqual(out.kernels.map(\.name), ["qmv_f16_4", "qmv.bf16"], "the template itself is no kernel")
        XCTAssertEqual(out.kernels.map(\.callee), ["qmv<half, 4>", "qmv<bfloat, 8>"])
        XCTAssertEqual(out.kernels[1].parameters, [
            .init(kind: .buffer(0), type: "const bfloat*", name: "w"),
            .init(kind: .buffer(1), type: "const uint&", name: "n"),
            .init(kind: .builtin("thread_position_in_grid"), type: "uint", name: "tid"),
        ])
        XCTAssertEqual(out.kernels[1].instantiatedAt, .init(file: "source.metal", line: 6))
        XCTAssertEqual(out.kernels[1].symbol, "x716d762e62663136", "a host name that is not an identifier is hex-encoded")
        let lines = body(out)
        XCTAssertTrue(lines[1].hasPrefix("static     void qmv("), "\(lines)")
        XCTAssertTrue(lines[3].trimmingSpaces.isEmpty && lines[5].trimmingSpaces.isEmpty, "instantiations are blanked: \(lines)")
        XCTAssertTrue(out.source.contains("using __sm_fn_qmv_f16_4 = decltype(&qmv<half, 4>);"), out.source)
        XCTAssertTrue(out.source.contains("::metal::__sm::buf_arg<::metal::__sm::param_t<0, __sm_fn_qmv_f16_4>>"), out.source)
    }

    func testLineMarkersLocateErrors() throws {
        XCTAssertThrowsError(try translate("#line 40 \"q.h\"\n\n[[kernel, vertex]] void f() {}\n")) {
            XCTAssertTrue("\($0)".contains("q.h:41: error: the kernel attribute [[vertex]]"), "\($0)")
        }
        XCTAssertEqual(MSLTranslator.templateParameterNames("typename T, int BITS = (4 > 2), typename... Ts"), ["T", "BITS", "Ts"])
        XCTAssertEqual(MSLTranslator.substitute("const device T*", names: ["T"], values: ["half"]), "const device half*")
        XCTAssertEqual(MSLTranslator.concatenatedStringLiterals(#""a" "b\"c""#), #"ab"c"#)
    }

    /// What Apple's compiler rejects is rejected here too, with the MSL line.
    func testDoubleAndPointersWithoutAddressSpaceAreErrors() {
        XCTAssertThrowsError(try translate("kernel void k(device float* a [[buffer(0)]]) {\n double d = 1; a[0] = d; }")) {
            XCTAssertTrue("\($0)".contains("MSL has no `double`"), "\($0)")
        }
        XCTAssertThrowsError(try translate("kernel void k(float* a [[buffer(0)]]) { a[0] = 1; }")) {
            XCTAssertTrue("\($0)".contains("needs an address space"), "\($0)")
        }
        XCTAssertNoThrow(try translate("kernel void k(device float* a [[buffer(0)]], constant uint& n [[buffer(1)]],"
                                       + " threadgroup float* t [[threadgroup(0)]]) { a[0] = n; }"))
    }

    func testHashDependsOnEveryPart() {
        XCTAssertEqual(Hash128.of(["a", "b"]), Hash128.of(["a", "b"]))
        XCTAssertNotEqual(Hash128.of(["ab", "c"]), Hash128.of(["a", "bc"]))
        XCTAssertEqual(Hash128.of([""]).count, 32)
        XCTAssertNotEqual(Hash128.of(["x"]), Hash128.of(["y"]))
    }
}
#endif
