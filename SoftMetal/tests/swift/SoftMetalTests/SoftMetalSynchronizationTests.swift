// Hazard tracking, fences and events: two passes (encoders) that use an untracked buffer,
// one writing it, must be ordered by a fence, an event or a tracked buffer; SoftMetal fails
// the command buffer at the pair nothing orders (a GPU would run them at once), and runs it
// when something does — both sides of each rule, in one command buffer and across two.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

final class SoftMetalSynchronizationTests: XCTestCase {
    var device: any MTLDevice { MTLCreateSystemDefaultDevice()! }
    lazy var queue: any MTLCommandQueue = device.makeCommandQueue()!
    lazy var pipeline: any MTLComputePipelineState = {
        let library = try! device.makeLibrary(source: addSource, options: nil)
        return try! device.makeComputePipelineState(function: library.makeFunction(name: "add_scaled")!)
    }()

    func buffer(_ value: Float, _ options: MTLResourceOptions, _ label: String) -> any MTLBuffer {
        let b = [Float](repeating: value, count: 4).withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: 16, options: options)! }
        b.label = label
        return b
    }

    /// One pass `out = a + b`, with the fences it waits for before and updates after.
    func pass(_ commandBuffer: any MTLCommandBuffer, _ a: any MTLBuffer, _ b: any MTLBuffer, _ out: any MTLBuffer,
              wait: (any MTLFence)? = nil, update: (any MTLFence)? = nil) throws {
        let encoder = try XCTUnwrap(commandBuffer.makeComputeCommandEncoder())
        if let wait { encoder.waitForFence(wait) }
        encoder.setComputePipelineState(pipeline)
        for (i, buffer) in [a, b, out].enumerated() { encoder.setBuffer(buffer, offset: 0, index: i) }
        var params: (UInt32, Float) = (4, 1)
        encoder.setBytes(&params, length: 8, index: 3)
        encoder.dispatchThreads(MTLSize(width: 4, height: 1, depth: 1), threadsPerThreadgroup: MTLSize(width: 4, height: 1, depth: 1))
        if let update { encoder.updateFence(update) }
        encoder.endEncoding()
    }

    func value(_ b: any MTLBuffer) -> Float { b.contents().assumingMemoryBound(to: Float.self)[0] }

    func run(_ commandBuffer: any MTLCommandBuffer) -> SoftMetalError? {
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        if commandBuffer.status == .completed { return nil }
        return commandBuffer.error as? SoftMetalError
    }

    /// `mid = 1 + 2` then `out = mid + 2` in two passes of one command buffer, `mid` made
    /// with `options`; `between` orders them (or not).
    func twoPasses(_ options: MTLResourceOptions,
                   between: (any MTLCommandBuffer, any MTLBuffer, any MTLBuffer, any MTLBuffer, any MTLBuffer) throws -> Void)
        throws -> (error: SoftMetalError?, out: Float) {
        let one = buffer(1, [], "one"), two = buffer(2, [], "two"), mid = buffer(0, options, "mid"), out = buffer(0, [], "out")
        let commandBuffer = try XCTUnwrap(queue.makeCommandBuffer())
        try between(commandBuffer, one, two, mid, out)
        return (run(commandBuffer), value(out))
    }

    func testUnorderedPassesOnAnUntrackedBufferAreARace() throws {
        let (error, out) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, one, two, mid)
            try pass(cb, mid, two, out)
        }
        guard case .race(let m)? = error else { return XCTFail("\(String(describing: error))") }
        XCTAssertTrue(m.hasPrefix("encoder 2 of command buffer #"), m)
        XCTAssertTrue(m.contains("(kernels add_scaled) and the earlier encoder 1"), m)
        XCTAssertTrue(m.contains("untracked buffer(0) ('mid') of the later pass, the earlier pass writing it"), m)
        XCTAssertEqual(out, 0, "nothing ran")
    }

    func testAFenceOrdersThePasses() throws {
        let fence = try XCTUnwrap(device.makeFence())
        let (error, out) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, one, two, mid, update: fence)
            try pass(cb, mid, two, out, wait: fence)
        }
        XCTAssertNil(error)
        XCTAssertEqual(out, 5)
        // The fence waited for before the other pass updates it orders nothing.
        let (reversed, _) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, one, two, mid)
            try pass(cb, mid, two, out, wait: fence, update: fence)
        }
        guard case .race? = reversed else { return XCTFail("\(String(describing: reversed))") }
    }

    func testAnEventOrdersThePasses() throws {
        let event = try XCTUnwrap(device.makeEvent())
        let (error, out) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, one, two, mid)
            cb.encodeSignalEvent(event, value: 1)
            cb.encodeWaitForEvent(event, value: 1)
            try pass(cb, mid, two, out)
        }
        XCTAssertNil(error)
        XCTAssertEqual(out, 5)
        // A wait for a value the signal does not reach orders nothing (and here would block).
        let (low, _) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, one, two, mid)
            cb.encodeSignalEvent(event, value: 2)
            cb.encodeWaitForEvent(event, value: 3)
            try pass(cb, mid, two, out)
        }
        guard case .race? = low else { return XCTFail("\(String(describing: low))") }
    }

    func testTrackedBuffersAndSharedReadsNeedNothing() throws {
        let (tracked, out) = try twoPasses([]) { cb, one, two, mid, out in
            try pass(cb, one, two, mid)
            try pass(cb, mid, two, out)
        }
        XCTAssertNil(tracked)
        XCTAssertEqual(out, 5)
        // Both passes only read the untracked buffer.
        let (reads, _) = try twoPasses(.hazardTrackingModeUntracked) { cb, one, two, mid, out in
            try pass(cb, mid, two, one)
            try pass(cb, mid, two, out)
        }
        XCTAssertNil(reads)
        XCTAssertEqual(try XCTUnwrap(device.makeBuffer(length: 16, options: .hazardTrackingModeUntracked)).hazardTrackingMode, .untracked)
        XCTAssertEqual(try XCTUnwrap(device.makeBuffer(length: 16, options: [])).hazardTrackingMode, .tracked)
    }

    /// One encoder at a time, events between encoders: a second encoder made while one is
    /// still encoding (a host that kept its encoder open, as PyTorch MPS did before
    /// PR #164093) and an event encoded then each fail the command buffer, as Metal's
    /// validation stops the program; ended in turn, the same calls run.
    func testOneEncoderAtATimeAndEventsBetweenThem() throws {
        let one = buffer(1, [], "one"), two = buffer(2, [], "two"), out = buffer(0, [], "out")
        let event = try XCTUnwrap(device.makeEvent())
        for misuse in ["encoder", "event"] {
            let commandBuffer = try XCTUnwrap(queue.makeCommandBuffer())
            let first = try XCTUnwrap(commandBuffer.makeComputeCommandEncoder())
            if misuse == "encoder" {
                try pass(commandBuffer, one, two, out)
            } else {
                commandBuffer.encodeSignalEvent(event, value: 1)
            }
            first.endEncoding()
            guard case .invalidUsage(let m)? = run(commandBuffer) else { return XCTFail("\(misuse): no error") }
            XCTAssertTrue(m.contains("encoder 1 of command buffer #") && m.contains("is still encoding"), m)
        }
        let commandBuffer = try XCTUnwrap(queue.makeCommandBuffer())
        try XCTUnwrap(commandBuffer.makeComputeCommandEncoder()).endEncoding()
        commandBuffer.encodeSignalEvent(event, value: 1)
        try pass(commandBuffer, one, two, out)
        XCTAssertNil(run(commandBuffer))
        XCTAssertEqual(value(out), 3)
    }

    /// A command buffer still in flight (held by an event the host signals later) and the
    /// next one: unordered they race; a fence across them orders them.
    func testCommandBuffersInFlightTogetherNeedOrderToo() throws {
        for ordered in [false, true] {
            let hold = try XCTUnwrap(device.makeSharedEvent())
            let fence = try XCTUnwrap(device.makeFence())
            let one = buffer(1, [], "one"), two = buffer(2, [], "two")
            let mid = buffer(0, .hazardTrackingModeUntracked, "mid"), out = buffer(0, [], "out")
            let first = try XCTUnwrap(queue.makeCommandBuffer()), second = try XCTUnwrap(queue.makeCommandBuffer())
            first.encodeWaitForEvent(hold, value: 1)
            try pass(first, one, two, mid, update: ordered ? fence : nil)
            try pass(second, mid, two, out, wait: ordered ? fence : nil)
            first.commit()
            second.commit()
            hold.signaledValue = 1
            first.waitUntilCompleted()
            second.waitUntilCompleted()
            XCTAssertEqual(first.status, .completed, "\(String(describing: first.error))")
            if ordered {
                XCTAssertEqual(second.status, .completed, "\(String(describing: second.error))")
                XCTAssertEqual(value(out), 5)
            } else {
                guard case .race(let m)? = second.error as? SoftMetalError else {
                    return XCTFail("\(String(describing: second.error))")
                }
                XCTAssertTrue(m.contains("of command buffer #"), m)
            }
        }
        // Once the first has completed (the app waited), the second needs nothing.
        let one = buffer(1, [], "one"), two = buffer(2, [], "two")
        let mid = buffer(0, .hazardTrackingModeUntracked, "mid"), out = buffer(0, [], "out")
        let first = try XCTUnwrap(queue.makeCommandBuffer()), second = try XCTUnwrap(queue.makeCommandBuffer())
        try pass(first, one, two, mid)
        XCTAssertNil(run(first))
        try pass(second, mid, two, out)
        XCTAssertNil(run(second))
        XCTAssertEqual(value(out), 5)
    }
}
#endif
