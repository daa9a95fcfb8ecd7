// SoftMetal's checks seen through the Metal API: a failing dispatch fails its command
// buffer with a SoftMetalError (status .error), later commands do not run, and the device
// keeps working afterwards. The SoftMetal-only switches live on SoftMetalComputeCommandEncoder.
#if os(Linux)
import XCTest
@testable import SoftMetal

let checksSource = """
#include <metal_stdlib>
using namespace metal;

kernel void copy_shifted(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         constant int& shift [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
    y[gid] = x[int(gid) + shift];
}

kernel void half_barrier(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid % 2 == 1) threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // odd threads pass two barriers, even ones one
}

kernel void neighbour_without_barrier(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                                      uint n [[threads_per_threadgroup]]) {
    threadgroup float sh[256];
    sh[tid] = float(tid);
    y[tid] = sh[(tid + 1) % n];
}

kernel void deep_stack(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]], uint tid [[thread_index_in_threadgroup]]) {
    float big[40000];
    for (uint i = 0; i < n; i++) big[i] = float(i + tid);
    y[tid] = big[n - 1];
}

kernel void group_sums(device const uint* x [[buffer(0)]], device uint* y [[buffer(1)]],
                       uint group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    threadgroup uint partial[2];
    uint s = simd_sum(x[group * 64 + tid]);
    if (lane == 0) partial[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) y[group] = partial[0] + partial[1];
}

kernel void fill_index(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    y[gid] = float(gid);
}

// Planted: the barrier between simdgroup 0 zeroing `partial` and the others storing their
// sums into it is missing (ggml's mat-vec reduction has this shape).
kernel void zero_then_store_without_barrier(device const uint* x [[buffer(0)]], device uint* y [[buffer(1)]],
                                            uint tid [[thread_index_in_threadgroup]],
                                            uint lane [[thread_index_in_simdgroup]],
                                            uint sg [[simdgroup_index_in_threadgroup]]) {
    threadgroup uint partial[32];
    if (sg == 0) partial[lane] = 0;
    uint s = simd_sum(x[tid]);
    if (lane == 0) partial[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        uint total = 0;
        for (uint i = 0; i < 32; i++) total += partial[i];
        y[0] = total;
    }
}

// Stores 1s at y[i]: with i = 0xFFFFFFFF, 64 GiB - 16 bytes past y, as far as a uint index of
// a 16-byte type reaches.
kernel void store_at(device float4* y [[buffer(0)]], constant uint& i [[buffer(1)]]) {
    y[i] = float4(1.0f);
}

// Threadgroup 1 reads what threadgroup 0 wrote in the same dispatch: nothing orders the two.
kernel void read_other_group(device float* y [[buffer(0)]], uint group [[threadgroup_position_in_grid]]) {
    if (group == 0) y[0] = 1.0f;
    if (group == 1) y[1] = y[0];
}
"""

final class SoftMetalChecksTests: XCTestCase {
    let device = MTLCreateSystemDefaultDevice()!
    lazy var library: any MTLLibrary = try! device.makeLibrary(source: checksSource, options: nil)
    lazy var queue: any MTLCommandQueue = device.makeCommandQueue()!

    func pipeline(_ name: String) throws -> any MTLComputePipelineState {
        try device.makeComputePipelineState(function: XCTUnwrap(library.makeFunction(name: name)))
    }

    /// Encodes one dispatch per element of `dispatches` (each sets its own buffers), commits and waits.
    func run(_ name: String, groups: Int, threads: Int, configure: ((SoftMetalComputeCommandEncoder) -> Void)? = nil,
             _ dispatches: [(any MTLComputeCommandEncoder) -> Void]) throws -> any MTLCommandBuffer {
        let p = try pipeline(name)
        let cb = try XCTUnwrap(queue.makeCommandBuffer())
        let enc = try XCTUnwrap(cb.makeComputeCommandEncoder())
        configure?(enc as! SoftMetalComputeCommandEncoder)
        enc.setComputePipelineState(p)
        for d in dispatches {
            d(enc)
            enc.dispatchThreadgroups(MTLSize(width: groups, height: 1, depth: 1),
                                     threadsPerThreadgroup: MTLSize(width: threads, height: 1, depth: 1))
        }
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        return cb
    }

    func message(_ cb: any MTLCommandBuffer) -> String { (cb.error as? SoftMetalError)?.message ?? "\(String(describing: cb.error))" }

    /// The guard space reaches as far as a 32-bit index of 16-byte elements: a store there
    /// faults and is reported, instead of landing in the host's memory.
    func testAStoreAtTheLargestUIntIndexIsReported() throws {
        let y = try XCTUnwrap(device.makeBuffer(length: 4096))
        XCTAssertEqual((y as! SoftMetalBuffer).softMetalGuardBytes, 1 << 36)
        for index: UInt32 in [256, 1 << 18, 1 << 26, 0x8000_0000, 0xFFFF_FFFF] {
            var i = index
            let cb = try run("store_at", groups: 1, threads: 1, [
                { $0.setBuffer(y, offset: 0, index: 0); $0.setBytes(&i, length: 4, index: 1) },
            ])
            guard case .outOfBounds(let m)? = cb.error as? SoftMetalError else { return XCTFail(message(cb)) }
            XCTAssertTrue(m.contains("store_at") && m.contains("buffer(0) at byte offset \(Int(index) * 16)"), m)
        }
    }

    func testOutOfBoundsFailsTheCommandBufferAndLaterCommandsDoNotRun() throws {
        let x = device.makeBuffer(length: 64 * 4)!
        let y = device.makeBuffer(length: 64 * 4)!
        let z = device.makeBuffer(length: 64 * 4)!
        var shift: Int32 = 1
        var noShift: Int32 = 0
        let sevens = z.contents().assumingMemoryBound(to: Float.self)
        for i in 0..<64 { sevens[i] = 7 }
        let cb = try run("copy_shifted", groups: 2, threads: 32, [
            { $0.setBuffer(x, offset: 0, index: 0); $0.setBuffer(y, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2) },
            { $0.setBuffer(z, offset: 0, index: 0); $0.setBytes(&noShift, length: 4, index: 2) },  // would copy 7s into y
        ])
        XCTAssertEqual(cb.status, .error)
        guard case .outOfBounds(let m)? = cb.error as? SoftMetalError else { return XCTFail("\(String(describing: cb.error))") }
        XCTAssertTrue(m.contains("copy_shifted") && m.contains("buffer(0) at byte offset 256"), m)
        // The second dispatch (which would have read z into y) did not run.
        let yValues = UnsafeBufferPointer(start: y.contents().assumingMemoryBound(to: Float.self), count: 64)
        XCTAssertFalse(yValues.contains(7), "a dispatch after the failing one ran")

        // The device still works afterwards.
        shift = 0
        let ok = try run("copy_shifted", groups: 2, threads: 32, [
            { $0.setBuffer(x, offset: 0, index: 0); $0.setBuffer(y, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2) },
        ])
        XCTAssertEqual(ok.status, .completed, message(ok))
    }

    func testUnderflowBeforeABufferAtAnOffsetIsReportedRelativeToTheBinding() throws {
        let x = device.makeBuffer(length: 64 * 4)!
        let y = device.makeBuffer(length: 64 * 4)!
        var shift: Int32 = 0
        let cb = try run("copy_shifted", groups: 1, threads: 16, [
            { $0.setBuffer(x, offset: 0, index: 0); $0.setBuffer(y, offset: 200, index: 1); $0.setBytes(&shift, length: 4, index: 2) },
        ])
        XCTAssertEqual(cb.status, .error)
        XCTAssertTrue(message(cb).contains("buffer(1) at byte offset 56 (56 bytes are bound from offset 200)"), message(cb))
    }

    func testBarrierDivergenceIsAnErrorNotAHang() throws {
        let y = device.makeBuffer(length: 64 * 4)!
        let cb = try run("half_barrier", groups: 3, threads: 64, [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertEqual(cb.status, .error)
        guard case .barrierDivergence(let m)? = cb.error as? SoftMetalError else { return XCTFail(message(cb)) }
        XCTAssertTrue(m.contains("half_barrier") && m.contains("threadgroup_barrier at line"), m)
    }

    func testRaceCheckIsRequestedOnTheSoftMetalEncoder() throws {
        let y = device.makeBuffer(length: 256 * 4)!
        let silent = try run("neighbour_without_barrier", groups: 1, threads: 128, [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertEqual(silent.status, .completed, "without the race check the bug passes unnoticed")
        let checked = try run("neighbour_without_barrier", groups: 1, threads: 128, configure: { $0.softMetalCheckRaces = true },
                              [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertEqual(checked.status, .error)
        guard case .race(let m)? = checked.error as? SoftMetalError else { return XCTFail(message(checked)) }
        XCTAssertTrue(m.contains("neighbour_without_barrier: data race on") && m.contains("with no threadgroup_barrier between them"), m)
        let reordered = try run("neighbour_without_barrier", groups: 1, threads: 128, configure: { $0.softMetalCheckOrder = true },
                                [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertEqual(reordered.status, .error)
        guard case .race(let o)? = reordered.error as? SoftMetalError else { return XCTFail(message(reordered)) }
        XCTAssertTrue(o.contains("depends on execution order") && o.contains("buffer(0)"), o)
    }

    func testRunAheadScheduleIsRequestedOnTheSoftMetalEncoder() throws {
        let x = device.makeBuffer(length: 64 * 4)!, y = device.makeBuffer(length: 4)!
        let xs = x.contents().bindMemory(to: UInt32.self, capacity: 64)
        for i in 0..<64 { xs[i] = UInt32(i) }
        let bind: (any MTLComputeCommandEncoder) -> Void = {
            $0.setBuffer(x, offset: 0, index: 0)
            $0.setBuffer(y, offset: 0, index: 1)
        }
        let total = y.contents().bindMemory(to: UInt32.self, capacity: 1)
        // Round robin: simdgroup 0 zeroes before simdgroup 1 gets past its simd_sum.
        XCTAssertEqual(try run("zero_then_store_without_barrier", groups: 1, threads: 64, [bind]).status, .completed)
        XCTAssertEqual(total.pointee, 2016)
        let reverse = try run("zero_then_store_without_barrier", groups: 1, threads: 64,
                              configure: { $0.softMetalSchedule = .runAheadReverse }, [bind])
        XCTAssertEqual(reverse.status, .completed)
        XCTAssertEqual(total.pointee, 496, "simdgroup 1 ran ahead and simdgroup 0 zeroed its sum")
        let both = try run("zero_then_store_without_barrier", groups: 1, threads: 64,
                           configure: { $0.softMetalSchedule = .runAhead }, [bind])
        guard case .race(let m)? = both.error as? SoftMetalError else { return XCTFail(message(both)) }
        XCTAssertTrue(m.contains("forward order and one in reverse order") && m.contains("buffer(1) at byte offset 0"), m)
        XCTAssertGreaterThan(SoftMetalOptions.statistics.runAheadCheckedDispatches, 0)
        XCTAssertEqual(SoftMetalSchedule(environment: "run-ahead"), .runAhead)
        XCTAssertNil(SoftMetalSchedule(environment: "sometimes"))
    }

    func testMemoryCheckIsRequestedOnTheSoftMetalEncoder() throws {
        // A read 4 MB before the data: outside the guard pages' reach, caught by the memory check.
        let x = device.makeBuffer(length: 64 * 4)!, y = device.makeBuffer(length: 64 * 4)!
        var shift: Int32 = -1_000_000
        let cb = try run("copy_shifted", groups: 1, threads: 1, configure: { $0.softMetalCheckMemory = true }, [{
            $0.setBuffer(x, offset: 0, index: 0)
            $0.setBuffer(y, offset: 0, index: 1)
            $0.setBytes(&shift, length: 4, index: 2)
        }])
        guard case .outOfBounds(let m)? = cb.error as? SoftMetalError else { return XCTFail(message(cb)) }
        XCTAssertTrue(m.contains("out-of-bounds read of 4 bytes") && m.contains("outside every bound buffer") && m.contains("MSL line 6"), m)
        // The missing barrier, by shadow memory: both lines, whatever the output.
        let racy = try run("neighbour_without_barrier", groups: 1, threads: 128, configure: { $0.softMetalCheckMemory = true },
                           [{ $0.setBuffer(y, offset: 0, index: 0) }])
        guard case .uninitializedRead(let r)? = racy.error as? SoftMetalError else { return XCTFail(message(racy)) }
        XCTAssertTrue(r.contains("neighbour_without_barrier") && r.contains("MSL line 19"), r)
        XCTAssertGreaterThan(SoftMetalOptions.statistics.memoryCheckedDispatches, 0)
    }

    func testAllChecksAndStaleReadsAreRequestedOnTheSoftMetalEncoder() throws {
        let y = device.makeBuffer(length: 16)!
        let values = y.contents().bindMemory(to: Float.self, capacity: 4)
        values[0] = 7
        let cb = try run("read_other_group", groups: 2, threads: 1, configure: { $0.softMetalCheckAll() },
                         [{ $0.setBuffer(y, offset: 0, index: 0) }])
        guard case .race(let m)? = cb.error as? SoftMetalError else { return XCTFail(message(cb)) }
        XCTAssertTrue(m.contains("thread 0 of threadgroup (1, 0, 0) reads it") && m.contains("not ordered by a threadgroup_barrier"), m)
        values[0] = 7
        let stale = try run("read_other_group", groups: 2, threads: 1, configure: { $0.softMetalStaleReads = true },
                            [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertNil(stale.error)
        XCTAssertEqual(values[1], 7)  // what y[0] held when the dispatch began
        XCTAssertEqual(values[0], 1)  // the store landed
    }

    func testMemoryCheckFindsReadsOfBufferBytesNeverWritten() throws {
        let checked: (SoftMetalComputeCommandEncoder) -> Void = { $0.softMetalCheckMemory = true }
        var shift: Int32 = 0
        // Planted: a kernel reads a scratch buffer nobody wrote (makeBuffer(length:), whose
        // contents() the host never took).
        let scratch = device.makeBuffer(length: 64 * 4)!, y = device.makeBuffer(length: 64 * 4)!
        let cb = try run("copy_shifted", groups: 2, threads: 32, configure: checked, [{
            $0.setBuffer(scratch, offset: 0, index: 0); $0.setBuffer(y, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2)
        }])
        guard case .uninitializedRead(let m)? = cb.error as? SoftMetalError else { return XCTFail(message(cb)) }
        XCTAssertTrue(m.contains("read of buffer(0) at byte offset 0") && m.contains("never written") && m.contains("MSL line 6"), m)
        // The host's pointer counts as a write (what it did through it cannot be seen).
        _ = scratch.contents()
        XCTAssertEqual(try run("copy_shifted", groups: 2, threads: 32, configure: checked, [{
            $0.setBuffer(scratch, offset: 0, index: 0); $0.setBuffer(y, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2)
        }]).status, .completed)

        // Planted: an off-by-one read into the unwritten tail of a pool's buffer (rounded up
        // to 128 floats), which an earlier dispatch filled for 64 floats only; the bounds
        // check cannot see it (the byte is inside the buffer).
        let pooled = device.makeBuffer(length: 128 * 4)!
        let out = device.makeBuffer(length: 128 * 4)!
        let fill = try run("fill_index", groups: 2, threads: 32, configure: checked, [{ $0.setBuffer(pooled, offset: 0, index: 0) }])
        XCTAssertEqual(fill.status, .completed, message(fill))
        shift = 0
        XCTAssertEqual(try run("copy_shifted", groups: 2, threads: 32, configure: checked, [{
            $0.setBuffer(pooled, offset: 0, index: 0); $0.setBuffer(out, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2)
        }]).status, .completed, "bytes an earlier checked dispatch wrote are initialised")
        shift = 1
        let offByOne = try run("copy_shifted", groups: 2, threads: 32, configure: checked, [{
            $0.setBuffer(pooled, offset: 0, index: 0); $0.setBuffer(out, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2)
        }])
        guard case .uninitializedRead(let t)? = offByOne.error as? SoftMetalError else { return XCTFail(message(offByOne)) }
        XCTAssertTrue(t.contains("read of buffer(0) at byte offset 256") && t.contains("thread 31 of threadgroup (1, 0, 0)"), t)
        // Without the memory check the same dispatch passes (the tail is zeros).
        XCTAssertEqual(try run("copy_shifted", groups: 2, threads: 32, [{
            $0.setBuffer(pooled, offset: 0, index: 0); $0.setBuffer(out, offset: 0, index: 1); $0.setBytes(&shift, length: 4, index: 2)
        }]).status, .completed)
    }

    func testPoisonedThreadgroupMemoryShowsUnwrittenReads() throws {
        let y = device.makeBuffer(length: 256 * 4)!
        _ = try run("neighbour_without_barrier", groups: 1, threads: 64, [{ $0.setBuffer(y, offset: 0, index: 0) }])
        let poisoned = UnsafeBufferPointer(start: y.contents().assumingMemoryBound(to: Float.self), count: 64)
        XCTAssertTrue(poisoned[0].isNaN, "thread 0 read slot 1 before thread 1 wrote it: poison")
        _ = try run("neighbour_without_barrier", groups: 1, threads: 64, configure: { $0.softMetalPoisonThreadgroupMemory = false },
                    [{ $0.setBuffer(y, offset: 0, index: 0) }])
        XCTAssertEqual(UnsafeBufferPointer(start: y.contents().assumingMemoryBound(to: Float.self), count: 64)[0], 0)
    }

    func testStackOverflowInAGPUThreadIsReported() throws {
        let y = device.makeBuffer(length: 64 * 4)!
        var n: UInt32 = 40000
        let cb = try run("deep_stack", groups: 1, threads: 4, [{ $0.setBuffer(y, offset: 0, index: 0); $0.setBytes(&n, length: 4, index: 1) }])
        XCTAssertEqual(cb.status, .error)
        XCTAssertTrue(message(cb).contains("stack overflow"), message(cb))
    }

    func testManyThreadgroupsOverAllCoresAndTwoQueuesAtOnce() throws {
        let groups = 500
        var x = [UInt32](repeating: 0, count: groups * 64)
        for i in x.indices { x[i] = UInt32(i % 1000) }
        let xb = x.withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: $0.count)! }
        let p = try pipeline("group_sums")
        var buffers: [(any MTLCommandBuffer, any MTLBuffer)] = []
        for _ in 0..<2 {
            let q = device.makeCommandQueue()!
            let y = device.makeBuffer(length: groups * 4)!
            let cb = q.makeCommandBuffer()!
            let enc = cb.makeComputeCommandEncoder()!
            enc.setComputePipelineState(p)
            enc.setBuffer(xb, offset: 0, index: 0)
            enc.setBuffer(y, offset: 0, index: 1)
            enc.dispatchThreadgroups(MTLSize(width: groups, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 64, height: 1, depth: 1))
            enc.endEncoding()
            cb.commit()
            buffers.append((cb, y))
        }
        for (cb, y) in buffers {
            cb.waitUntilCompleted()
            XCTAssertEqual(cb.status, .completed, message(cb))
            let got = UnsafeBufferPointer(start: y.contents().assumingMemoryBound(to: UInt32.self), count: groups)
            for g in 0..<groups { XCTAssertEqual(got[g], x[g * 64..<(g + 1) * 64].reduce(0, +), "group \(g)") }
        }
    }
}
#endif
