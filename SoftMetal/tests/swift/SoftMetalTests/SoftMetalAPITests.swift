// The Apple-named API of SoftMetal: buffers, libraries, encoders, command buffers, the
// compile cache and the errors, through the same calls the Metal backend makes.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

let addSource = """
#include <metal_stdlib>
using namespace metal;

struct AddParams { uint n; float scale; };

kernel void add_scaled(device const float* a [[buffer(0)]],
                       device const float* b [[buffer(1)]],
                       device float* out [[buffer(2)]],
                       constant AddParams& p [[buffer(3)]],
                       uint gid [[thread_position_in_grid]]) {
    if (gid >= p.n) return;
    out[gid] = a[gid] + p.scale * b[gid];
}

kernel void fill_ids(device uint* out [[buffer(0)]],
                     uint2 gid [[thread_position_in_grid]],
                     uint2 grid [[threads_per_grid]],
                     uint2 tptg [[threads_per_threadgroup]]) {
    out[gid.y * grid.x + gid.x] = gid.y * 1000 + gid.x + 1000000 * (tptg.x * tptg.y);
}

kernel void count_groups(device atomic_uint* counter [[buffer(0)]],
                         uint3 groups [[threadgroups_per_grid]],
                         uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 0) atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
    if (tid == 0 && groups.x == 0) atomic_fetch_add_explicit(counter, 1000u, memory_order_relaxed);
}
"""

final class SoftMetalAPITests: XCTestCase {
    var device: any MTLDevice { MTLCreateSystemDefaultDevice()! }

    func pipeline(_ source: String, _ name: String) throws -> any MTLComputePipelineState {
        let library = try device.makeLibrary(source: source, options: nil)
        let function = try XCTUnwrap(library.makeFunction(name: name))
        return try device.makeComputePipelineState(function: function)
    }

    func floats(_ values: [Float]) -> any MTLBuffer {
        values.withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: $0.count, options: .storageModeShared)! }
    }

    func read<T>(_ buffer: any MTLBuffer, as: T.Type, count: Int) -> [T] {
        Array(UnsafeBufferPointer(start: buffer.contents().assumingMemoryBound(to: T.self), count: count))
    }

    func testBuffersAreZeroedWritableAndGuarded() throws {
        let b = try XCTUnwrap(device.makeBuffer(length: 100, options: []))
        XCTAssertEqual(b.length, 100)
        XCTAssertEqual(read(b, as: UInt8.self, count: 100), [UInt8](repeating: 0, count: 100))
        b.contents().storeBytes(of: 7, toByteOffset: 99, as: UInt8.self)
        XCTAssertEqual(read(b, as: UInt8.self, count: 100)[99], 7)
        XCTAssertTrue((b as! SoftMetalBuffer).softMetalIsGuarded)
        let c = floats([1, 2, 3])
        XCTAssertEqual(read(c, as: Float.self, count: 3), [1, 2, 3])
        XCTAssertEqual(Int(bitPattern: c.contents()) % 4, 0)
    }

    /// An impossible size is refused at once (nil, as Metal does), like malloc: it used to
    /// be reserved lazily and grow until the OOM killer ended the process.
    func testAnImpossibleBufferIsNil() throws {
        let policy = (try? String(contentsOfFile: "/proc/sys/vm/overcommit_memory", encoding: .utf8)) ?? "0"
        try XCTSkipIf(policy.hasPrefix("1"), "vm.overcommit_memory = 1: the kernel grants any size")
        XCTAssertNil(device.makeBuffer(length: 1 << 44, options: []))   // 16 TiB
        XCTAssertNotNil(device.makeBuffer(length: 1 << 20, options: []))
    }

    func testBytesNoCopyNeedsPageAlignmentAndIsNotGuarded() throws {
        let page = 16384  // Apple silicon's page, whatever this machine's is
        var raw: UnsafeMutableRawPointer?
        XCTAssertEqual(posix_memalign(&raw, page, page), 0)
        let memory = try XCTUnwrap(raw)
        final class Flag: @unchecked Sendable { var freed = false }
        let flag = Flag()
        do {
            let b = try XCTUnwrap(device.makeBuffer(bytesNoCopy: memory, length: page, options: [],
                                                    deallocator: { p, _ in free(p); flag.freed = true }))
            XCTAssertEqual(b.contents(), memory)
            XCTAssertFalse((b as! SoftMetalBuffer).softMetalIsGuarded)
        }
        XCTAssertTrue(flag.freed)
        XCTAssertNil(device.makeBuffer(bytesNoCopy: UnsafeMutableRawPointer(bitPattern: page + 8)!, length: page))
        XCTAssertNil(device.makeBuffer(bytesNoCopy: UnsafeMutableRawPointer(bitPattern: 4096)!, length: 4096),
                     "4 KiB-aligned memory is not enough for Metal on Apple silicon")
    }

    func testEmptyBuffersAreNilAsOnMetal() {
        XCTAssertNil(device.makeBuffer(length: 0, options: []))
        var byte: UInt8 = 1
        XCTAssertNil(device.makeBuffer(bytes: &byte, length: 0, options: []))
    }

    func testFirstKernelWithSetBytesAndOffsets() throws {
        let p = try pipeline(addSource, "add_scaled")
        XCTAssertEqual(p.threadExecutionWidth, 32)
        XCTAssertEqual(p.maxTotalThreadsPerThreadgroup, 1024)
        let n = 70
        let a = floats((0..<n + 2).map { Float($0) })
        let b = floats((0..<n).map { Float($0) * 10 })
        let out = try XCTUnwrap(device.makeBuffer(length: n * 4, options: .storageModeShared))
        var params: (UInt32, Float) = (UInt32(n), 0.5)
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(a, offset: 8, index: 0)  // a[2...]
        enc.setBuffer(b, offset: 0, index: 1)
        enc.setBuffer(out, offset: 0, index: 2)
        enc.setBytes(&params, length: MemoryLayout.size(ofValue: params), index: 3)
        enc.dispatchThreadgroups(MTLSize(width: 3, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 32, height: 1, depth: 1))
        enc.endEncoding()
        XCTAssertEqual(cb.status, .notEnqueued)
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertEqual(cb.status, .completed)
        XCTAssertNil(cb.error)
        XCTAssertEqual(read(out, as: Float.self, count: n), (0..<n).map { Float($0 + 2) + 0.5 * Float($0) * 10 })
    }

    func testStatisticsCountDispatchesAndThreads() throws {
        let p = try pipeline(addSource, "count_groups")
        let before = SoftMetalOptions.statistics
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(device.makeBuffer(length: 4), offset: 0, index: 0)
        enc.dispatchThreadgroups(MTLSize(width: 3, height: 2, depth: 1), threadsPerThreadgroup: MTLSize(width: 16, height: 1, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        let after = SoftMetalOptions.statistics
        XCTAssertGreaterThanOrEqual(after.dispatches - before.dispatches, 1)
        XCTAssertGreaterThanOrEqual(after.threadgroups - before.threadgroups, 6)
        XCTAssertGreaterThanOrEqual(after.threads - before.threads, 96)
        XCTAssertGreaterThan(after.seconds, before.seconds)
    }

    func testCompletedHandlersRunAfterCompletionInTheOrderAdded() throws {
        let p = try pipeline(addSource, "count_groups")
        let counter = try XCTUnwrap(device.makeBuffer(length: 4))
        let queue = try XCTUnwrap(device.makeCommandQueue())
        final class Seen: @unchecked Sendable {
            var statuses: [MTLCommandBufferStatus] = []
            var calls: [String] = []
        }
        let seen = Seen()
        var buffers: [any MTLCommandBuffer] = []
        for _ in 0..<3 {
            let cb = try XCTUnwrap(queue.makeCommandBuffer())
            let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
            enc.setComputePipelineState(p)
            enc.setBuffer(counter, offset: 0, index: 0)
            enc.dispatchThreadgroups(MTLSize(width: 5, height: 2, depth: 3), threadsPerThreadgroup: MTLSize(width: 4, height: 1, depth: 1))
            enc.endEncoding()
            let n = buffers.count
            cb.addCompletedHandler { cb in seen.statuses.append(cb.status) }
            // Each handler sees its command buffer's work done (30 threadgroups each).
            for k in 0..<2 {
                cb.addCompletedHandler { _ in seen.calls.append("\(n).\(k): \(counter.contents().load(as: UInt32.self))") }
            }
            cb.commit()
            buffers.append(cb)
        }
        buffers.last!.waitUntilCompleted()
        XCTAssertEqual(seen.statuses, [.completed, .completed, .completed])
        XCTAssertEqual(seen.calls, ["0.0: 30", "0.1: 30", "1.0: 60", "1.1: 60", "2.0: 90", "2.1: 90"])
        XCTAssertEqual(read(counter, as: UInt32.self, count: 1), [90])
    }

    /// Two dependent dispatches (b = a + a, then c = b + b) in one encoder.
    func chain(_ dispatchType: MTLDispatchType, barrier: Bool) throws -> [Float] {
        let p = try pipeline(addSource, "add_scaled")
        let a = floats([1, 2, 3]), b = floats([0, 0, 0]), c = floats([0, 0, 0])
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder(dispatchType: dispatchType))
        XCTAssertEqual(enc.dispatchType, dispatchType)
        var params: (UInt32, Float) = (3, 1)
        enc.setComputePipelineState(p)
        enc.setBytes(&params, length: 8, index: 3)
        for (input, output) in [(a, b), (b, c)] {
            enc.setBuffer(input, offset: 0, index: 0)
            enc.setBuffer(input, offset: 0, index: 1)
            enc.setBuffer(output, offset: 0, index: 2)
            enc.dispatchThreads(MTLSize(width: 3, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 3, height: 1, depth: 1))
            if barrier { enc.memoryBarrier(scope: .buffers) }
        }
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertNil(cb.error)
        return read(c, as: Float.self, count: 3)
    }

    func testConcurrentEncoderOrdersDispatchesOnlyAtMemoryBarriers() throws {
        XCTAssertEqual(try chain(.serial, barrier: false), [4, 8, 12])
        XCTAssertEqual(try chain(.serial, barrier: true), [4, 8, 12])
        XCTAssertEqual(try chain(.concurrent, barrier: true), [4, 8, 12])
        // Without a barrier the second dispatch may start first (SoftMetal: does) and read b unwritten.
        XCTAssertEqual(try chain(.concurrent, barrier: false), [0, 0, 0])
        let queue = try XCTUnwrap(device.makeCommandQueue())
        XCTAssertEqual(try XCTUnwrap(queue.makeCommandBuffer()?.makeComputeCommandEncoder()).dispatchType, .serial)
    }

    func testDispatchThreadsHasPartialEdgeThreadgroups() throws {
        let p = try pipeline(addSource, "fill_ids")
        let (w, h) = (37, 5)
        let out = try XCTUnwrap(device.makeBuffer(length: w * h * 4 + 64))
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(out, offset: 0, index: 0)
        enc.dispatchThreads(MTLSize(width: w, height: h, depth: 1), threadsPerThreadgroup: MTLSize(width: 16, height: 2, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertNil(cb.error)
        let got = read(out, as: UInt32.self, count: w * h + 16)
        for y in 0..<h {
            for x in 0..<w {
                let tw = x < 32 ? 16 : w - 32  // edge threadgroups are partial
                let th = y < 4 ? 2 : h - 4
                XCTAssertEqual(got[y * w + x], UInt32(y * 1000 + x + 1_000_000 * tw * th), "(\(x), \(y))")
            }
        }
        XCTAssertEqual(got[w * h..<w * h + 16].reduce(0, +), 0, "no thread outside the grid ran")
    }

    func testIndirectDispatchReadsThreadgroupCountsWhenItRuns() throws {
        let p = try pipeline(addSource, "count_groups")
        let counter = try XCTUnwrap(device.makeBuffer(length: 4))
        let args = try XCTUnwrap(device.makeBuffer(length: 64))
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(counter, offset: 0, index: 0)
        enc.dispatchThreadgroups(indirectBuffer: args, indirectBufferOffset: 16, threadsPerThreadgroup: MTLSize(width: 8, height: 1, depth: 1))
        enc.endEncoding()
        // Written after encoding, before commit: the dispatch reads it when it runs.
        var arguments = MTLDispatchThreadgroupsIndirectArguments(threadgroupsPerGrid: (3, 2, 2))
        (args.contents() + 16).copyMemory(from: &arguments, byteCount: 12)
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertNil(cb.error)
        XCTAssertEqual(read(counter, as: UInt32.self, count: 1), [12])
    }

    func testUnboundBufferFailsTheCommandBufferNamingTheIndex() throws {
        let p = try pipeline(addSource, "add_scaled")
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(floats([1]), offset: 0, index: 0)
        enc.dispatchThreadgroups(MTLSize(width: 1, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 1, height: 1, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertEqual(cb.status, .error)
        let error = try XCTUnwrap(cb.error as? SoftMetalError)
        guard case .invalidUsage(let message) = error else { return XCTFail("\(error)") }
        XCTAssertTrue(message.contains("buffer(1)"), message)
        XCTAssertTrue(message.contains("add_scaled"), message)
    }

    func testTooManyThreadsPerThreadgroupIsAnError() throws {
        let p = try pipeline(addSource, "count_groups")
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        enc.setComputePipelineState(p)
        enc.setBuffer(device.makeBuffer(length: 4), offset: 0, index: 0)
        enc.dispatchThreadgroups(MTLSize(width: 1, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 64, height: 32, depth: 1))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertEqual(cb.status, .error)
        XCTAssertTrue("\(cb.error!)".contains("maxTotalThreadsPerThreadgroup"))
    }

    func testCompileErrorCarriesTheCompilerMessageAndTheMSLLine() throws {
        let source = "#include <metal_stdlib>\nusing namespace metal;\nkernel void broken(device float* x [[buffer(0)]]) {\n    x[0] = undefined_name;\n}\n"
        XCTAssertThrowsError(try device.makeLibrary(source: source, options: nil)) { error in
            guard case SoftMetalError.compile(let message) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(message.contains("source.metal:4"), message)
            XCTAssertTrue(message.contains("undefined_name"), message)
            XCTAssertTrue(message.contains("MSL line 4: x[0] = undefined_name;"), message)
        }
    }

    func testKernelParameterWithoutAttributeIsACompileError() throws {
        // A value parameter without an attribute is an error; a device/constant pointer or
        // reference without one takes the first free buffer index, as with Apple's compiler.
        let source = "kernel void k(device float* x, float s) { x[0] = s; }"
        XCTAssertThrowsError(try device.makeLibrary(source: source, options: nil)) { error in
            XCTAssertTrue("\(error)".contains("has no attribute"), "\(error)")
        }
        let implicit = "kernel void k(device float* y [[buffer(0)]], device float* x, constant float& s) { x[0] = s; y[0] = 2; }"
        let library = try device.makeLibrary(source: implicit, options: nil) as! SoftMetalLibrary
        let info = try device.makeComputePipelineState(function: library.makeFunction(name: "k")!) as! SoftMetalComputePipelineState
        XCTAssertEqual(info.kernel.params.filter { $0.kind == 1 }.map(\.index), [0, 1, 2])
    }

    func testCompiledObjectsAreCachedOnDiskByHash() throws {
        let dir = "/tmp/softmetal-cache-test-\(getpid())-\(UInt32.random(in: 0..<UInt32.max))"
        setenv("SOFTMETAL_CACHE_DIR", dir, 1)
        defer { unsetenv("SOFTMETAL_CACHE_DIR") }
        let source = addSource + "\nconstant int unique_\(UInt32.random(in: 0..<UInt32.max)) = 1;\n"
        let before = SoftMetalOptions.compileCounts
        _ = try device.makeLibrary(source: source, options: nil)
        let after = SoftMetalOptions.compileCounts
        XCTAssertEqual(after.compilations, before.compilations + 1)
        KernelCompiler.shared.forgetLoadedLibraries()
        _ = try device.makeLibrary(source: source, options: nil)
        let again = SoftMetalOptions.compileCounts
        XCTAssertEqual(again.compilations, after.compilations, "the second makeLibrary must not compile")
        XCTAssertEqual(again.cacheHits, after.cacheHits + 1)
        let listing = try SMFile.listDirectory(dir)
        // Beside the library: the library of no kernels the sandbox compares it with.
        XCTAssertEqual(listing.filter { $0.hasSuffix(".so") && !$0.hasSuffix(".baseline.so") }.count, 1, "\(listing)")
        XCTAssertTrue(listing.allSatisfy { !$0.hasSuffix(".tmp") }, "\(listing)")
    }

    func testLibraryListsItsKernels() throws {
        let library = try device.makeLibrary(source: addSource, options: MTLCompileOptions())
        XCTAssertEqual(Set(library.functionNames), ["add_scaled", "fill_ids", "count_groups"])
        XCTAssertNil(library.makeFunction(name: "nope"))
        XCTAssertEqual(library.makeFunction(name: "fill_ids")?.name, "fill_ids")
    }

    func testFiberSwitchIsCheap() throws {
        let library = try device.makeLibrary(source: addSource, options: nil)
        let ns = try SoftMetalOptions.measureFiberSwitchNanoseconds(in: library, iterations: 200_000)
        XCTAssertLessThan(ns, 200, "one fiber switch took \(ns) ns")
    }
}
#endif
