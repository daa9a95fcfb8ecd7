// SoftMetal's sandbox from Swift: the ELF reader on real and broken files, the text checks'
// blind spots that must stay blind (asm in a string is not assembly), a pipeline that
// outlives its library, and the compile time limit of the compile options. The refusals
// themselves are tested case by case in tests/python/test_softmetal_sandbox.py.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

final class SoftMetalSandboxTests: XCTestCase {
    var device: any MTLDevice { MTLCreateSystemDefaultDevice()! }

    func testACompiledLibraryImportsOnlyAllowedNamesAndHasNoExtraInitialisers() throws {
        let library = try KernelCompiler.shared.load(translated: "static float f(float x) { return metal::exp(x) + metal::sin(x); }\n")
        let facts = try MSLSandbox.readELF(library.path)
        XCTAssertFalse(facts.undefined.isEmpty)
        XCTAssertTrue(facts.ifuncs.isEmpty, "\(facts.ifuncs)")
        XCTAssertLessThanOrEqual(facts.initArray, 1)
        XCTAssertFalse(facts.undefined.contains("system"))
    }

    func testTheELFReaderRefusesBrokenFilesWithoutCrashing() throws {
        let library = try KernelCompiler.shared.load(translated: "static int g(int x) { return x + 1; }\n")
        let bytes = try XCTUnwrap(SMFile.readBytes(library.path))
        XCTAssertNoThrow(try MSLSandbox.parseELF(bytes))
        for cut in [0, 16, 63, 64, 200, bytes.count / 2, bytes.count - 1] {
            XCTAssertThrowsError(try MSLSandbox.parseELF(Array(bytes.prefix(cut))), "cut at \(cut)")
        }
        var corrupt = bytes
        for k in 0x28..<0x30 { corrupt[k] = 0xFF }  // section headers far past the end
        XCTAssertThrowsError(try MSLSandbox.parseELF(corrupt))
    }

    func testTheTextChecksLookAtTokensNotStrings() throws {
        let fine = """
        #line 1 "source.metal"
        constant char* s = "asm(\\"syscall\\") __attribute__((constructor))";
        constant char* r = R"x(asm volatile("nop"))x";
        static float plasma(float asmx) { return asmx; }
        [[maybe_unused]] static int q = 1;
        #pragma unroll
        """
        XCTAssertNoThrow(try MSLSandbox.checkTranslated(fine))
        XCTAssertThrowsError(try MSLSandbox.checkTranslated("#line 7 \"source.metal\"\nstatic void f() { asm(\"nop\"); }\n")) { e in
            XCTAssertTrue("\(e)".contains("MSL line 7"), "\(e)")
        }
    }

    func testTheDirectiveScannerSeesThroughCommentsAndContinuations() {
        let text = "// #include \"/etc/passwd\"\n/* #embed \"x\" */\n# /* c */ embed \"y\"\n#inc\\\nlude </z>\n"
        let found = MSLSandbox.directives(text)
        XCTAssertEqual(found.map(\.name), ["embed", "include"])
        XCTAssertEqual(found.map(\.line), [3, 4])
        XCTAssertEqual(found.last?.operand, "</z>")
    }

    func testAPipelineOutlivesItsLibrary() throws {
        let source = addSource + "\nconstant int sandbox_unique_\(UInt32.random(in: 0..<UInt32.max)) = 1;\n"
        var library: (any MTLLibrary)? = try device.makeLibrary(source: source, options: nil)
        let pipeline = try device.makeComputePipelineState(function: library!.makeFunction(name: "fill_ids")!)
        library = nil  // the shared object stays open while the pipeline lives
        let out = device.makeBuffer(length: 16 * 4, options: .storageModeShared)!
        let cb = device.makeCommandQueue()!.makeCommandBuffer()!
        let enc = cb.makeComputeCommandEncoder()!
        enc.setComputePipelineState(pipeline)
        enc.setBuffer(out, offset: 0, index: 0)
        enc.dispatchThreads(MTLSize(width: 16, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 16, height: 1, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertNil(cb.error)
        XCTAssertEqual(out.contents().load(fromByteOffset: 4 * 3, as: UInt32.self), 3 + 16_000_000)
    }

    func testTheCompileOptionsTimeLimitStopsClang() throws {
        let slow = """
        template <int N, int M> struct A { static constexpr int v = (A<N - 1, M>::v + A<N, M - 1>::v) & 1023; };
        template <int M> struct A<0, M> { static constexpr int v = M; };
        template <int N> struct A<N, 0> { static constexpr int v = N; };
        kernel void k(device int* a [[buffer(0)]]) { a[0] = A<299, 299>::v; }
        """
        let options = SoftMetalCompileOptions()
        options.softMetalCompileTimeout = 0.5
        func now() -> Double {
            var t = timespec()
            clock_gettime(CLOCK_MONOTONIC, &t)
            return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9
        }
        let start = now()
        XCTAssertThrowsError(try device.makeLibrary(source: slow, options: options)) { e in
            XCTAssertTrue("\(e)".contains("did not finish within 0.5 s"), "\(e)")
        }
        XCTAssertLessThan(now() - start, 2.5)
    }
}
#endif
