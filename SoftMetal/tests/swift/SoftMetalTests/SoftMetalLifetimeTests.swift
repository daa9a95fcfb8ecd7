// What a command buffer keeps alive, and how long a buffer may be: a command buffer made
// with makeCommandBuffer() holds what its commands use until it completes; one made with
// makeCommandBufferWithUnretainedReferences() holds nothing, and an object the app releases
// before it completes is reported (a GPU would read freed memory), while the memory itself
// outlives the commands, so the host's memory is never touched. makeBuffer past the
// device's maxBufferLength is nil, as on Metal.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

final class SoftMetalLifetimeTests: XCTestCase {
    var device: any MTLDevice { MTLCreateSystemDefaultDevice()! }

    /// Records `out = a + scale·b` over 4 floats into a new encoder of `commandBuffer`, and ends it.
    func encodeAdd(_ commandBuffer: any MTLCommandBuffer, _ pipeline: any MTLComputePipelineState,
                   a: any MTLBuffer, b: any MTLBuffer, out: any MTLBuffer, scale: Float) throws {
        let encoder = try XCTUnwrap(commandBuffer.makeComputeCommandEncoder())
        encoder.setComputePipelineState(pipeline)
        for (i, buffer) in [a, b, out].enumerated() { encoder.setBuffer(buffer, offset: 0, index: i) }
        var params: (UInt32, Float) = (4, scale)
        encoder.setBytes(&params, length: 8, index: 3)
        encoder.dispatchThreads(MTLSize(width: 4, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 4, height: 1, depth: 1))
        encoder.endEncoding()
    }

    func addPipeline() throws -> any MTLComputePipelineState {
        let library = try device.makeLibrary(source: addSource, options: nil)
        return try device.makeComputePipelineState(function: try XCTUnwrap(library.makeFunction(name: "add_scaled")))
    }

    /// `out = a + 1·b` over 4 floats, recorded into `commandBuffer` with buffers made in a
    /// scope the app leaves before committing (`keep`: what the app still holds).
    func recordAdd(into commandBuffer: any MTLCommandBuffer, out: any MTLBuffer,
                   keep: inout [AnyObject]) throws {
        let pipeline = try addPipeline()
        let a = [Float](repeating: 1, count: 4).withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: 16, options: [])! }
        let b = [Float](repeating: 2, count: 4).withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: 16, options: [])! }
        a.label = "a"
        keep.append(pipeline)
        keep.append(b)
        try encodeAdd(commandBuffer, pipeline, a: a, b: b, out: out, scale: 1)
    }

    func result(_ out: any MTLBuffer) -> [Float] {
        Array(UnsafeBufferPointer(start: out.contents().assumingMemoryBound(to: Float.self), count: 4))
    }

    func testRetainedReferencesKeepWhatTheCommandsUse() throws {
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let commandBuffer = try XCTUnwrap(queue.makeCommandBuffer())
        XCTAssertTrue(commandBuffer.retainedReferences)
        let out = try XCTUnwrap(device.makeBuffer(length: 16, options: []))
        var keep: [AnyObject] = []
        try recordAdd(into: commandBuffer, out: out, keep: &keep)
        keep = []   // buffer `a` was never the app's past the recording; now b and the pipeline go too
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        XCTAssertEqual(commandBuffer.status, .completed, "\(String(describing: commandBuffer.error))")
        XCTAssertEqual(result(out), [3, 3, 3, 3])
    }

    func testUnretainedReferencesReportABufferReleasedBeforeCompletion() throws {
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let commandBuffer = try XCTUnwrap(queue.makeCommandBufferWithUnretainedReferences())
        XCTAssertFalse(commandBuffer.retainedReferences)
        let out = try XCTUnwrap(device.makeBuffer(length: 16, options: []))
        var keep: [AnyObject] = []
        try recordAdd(into: commandBuffer, out: out, keep: &keep)   // `a` is released on return
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        XCTAssertEqual(commandBuffer.status, .error)
        guard case .invalidUsage(let m)? = commandBuffer.error as? SoftMetalError else {
            return XCTFail("\(String(describing: commandBuffer.error))")
        }
        XCTAssertTrue(m.hasPrefix("buffer(0) ('a') of kernel add_scaled, 16 bytes, was released before the command buffer completed"), m)
        XCTAssertEqual(result(out), [0, 0, 0, 0], "the kernel did not run")
        withExtendedLifetime(keep) {}
    }

    func testUnretainedReferencesRunWhenTheAppKeepsEverything() throws {
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let commandBuffer = try XCTUnwrap(queue.makeCommandBufferWithUnretainedReferences())
        let out = try XCTUnwrap(device.makeBuffer(length: 16, options: []))
        let a = [Float](repeating: 1, count: 4).withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: 16, options: [])! }
        let b = [Float](repeating: 2, count: 4).withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: 16, options: [])! }
        let pipeline = try addPipeline()
        try encodeAdd(commandBuffer, pipeline, a: a, b: b, out: out, scale: 0.5)
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        XCTAssertEqual(commandBuffer.status, .completed, "\(String(describing: commandBuffer.error))")
        XCTAssertEqual(result(out), [2, 2, 2, 2])
        withExtendedLifetime((a, b, pipeline)) {}
    }

    /// The app's bytesNoCopy memory is handed back (its deallocator runs) only once no
    /// recorded command binds it any more, even when the buffer was released before commit.
    func testNoCopyMemoryOutlivesTheCommandsThatBindIt() throws {
        let page = 16384
        var raw: UnsafeMutableRawPointer?
        XCTAssertEqual(posix_memalign(&raw, page, page), 0)
        let memory = try XCTUnwrap(raw)
        memory.initializeMemory(as: Float.self, repeating: 5, count: page / 4)
        final class Flag: @unchecked Sendable { var freed = false }
        let flag = Flag()
        let queue = try XCTUnwrap(device.makeCommandQueue())
        let commandBuffer = try XCTUnwrap(queue.makeCommandBufferWithUnretainedReferences())
        let out = try XCTUnwrap(device.makeBuffer(length: 16, options: []))
        let pipeline = try addPipeline()
        do {
            let wrapped = try XCTUnwrap(device.makeBuffer(bytesNoCopy: memory, length: page, options: [],
                                                          deallocator: { p, _ in flag.freed = true; free(p) }))
            try encodeAdd(commandBuffer, pipeline, a: wrapped, b: wrapped, out: out, scale: 1)
        }
        XCTAssertFalse(flag.freed, "the recorded command still binds the memory")
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        XCTAssertEqual(commandBuffer.status, .error, "the release is reported")
        XCTAssertTrue(flag.freed, "once the command buffer is done, the memory goes back")
        withExtendedLifetime(pipeline) {}
    }

    func testBuffersPastMaxBufferLengthAreNil() throws {
        let saved = SoftMetalOptions.maxBufferLength
        defer { SoftMetalOptions.maxBufferLength = saved }
        XCTAssertGreaterThanOrEqual(saved, 256 << 20, "at least Apple's guaranteed 256 MB by default")
        SoftMetalOptions.maxBufferLength = 1 << 20
        XCTAssertEqual(device.maxBufferLength, 1 << 20)
        XCTAssertNotNil(device.makeBuffer(length: 1 << 20, options: []))
        XCTAssertNil(device.makeBuffer(length: (1 << 20) + 1, options: []))
        let page = 16384, length = (1 << 20) + page
        var raw: UnsafeMutableRawPointer?
        XCTAssertEqual(posix_memalign(&raw, page, length), 0)
        defer { free(raw) }
        XCTAssertNil(device.makeBuffer(bytes: raw!, length: length, options: []))
        XCTAssertNil(device.makeBuffer(bytesNoCopy: raw!, length: length, options: [], deallocator: nil))
        XCTAssertNotNil(device.makeBuffer(bytesNoCopy: raw!, length: 1 << 20, options: [], deallocator: nil))
    }
}
#endif
