// Buffers made with makeBuffer(bytesNoCopy:...) over memory SoftMetal did not allocate (a
// file mapping, as a layer's weights are bound) and bound at an offset: the checks still
// name the binding, and a read past the memory into an inaccessible page is an error of the
// command buffer, not a crash.
#if os(Linux)
import Glibc
import XCTest
@testable import SoftMetal

extension SoftMetalChecksTests {
    /// `pages` pages of 16 KiB at a 16 KiB boundary followed by one inaccessible page, as
    /// the library maps a checkpoint file; `body` gets the accessible start.
    func withGuardedPages(_ pages: Int, _ body: (UnsafeMutableRawPointer) throws -> Void) throws {
        let page = 16384
        let span = (pages + 2) * page
        let reserved = try XCTUnwrap(mmap(nil, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
        XCTAssertNotEqual(reserved, MAP_FAILED)
        defer { munmap(reserved, span) }
        let start = UnsafeMutableRawPointer(bitPattern: (Int(bitPattern: reserved) + page - 1) / page * page)!
        XCTAssertEqual(mprotect(start, pages * page, PROT_READ | PROT_WRITE), 0)
        try body(start)
    }

    func testNoCopyBufferAtAnOffsetIsCheckedRelativeToItsBinding() throws {
        try withGuardedPages(1) { start in
            let x = try XCTUnwrap(device.makeBuffer(bytesNoCopy: start, length: 16384, options: [], deallocator: nil))
            let y = device.makeBuffer(length: 64 * 4)!
            let offset = 16384 - 32 * 4  // 32 floats bound: the dispatch reads 64
            var shift: Int32 = 0
            let bind: (any MTLComputeCommandEncoder) -> Void = {
                $0.setBuffer(x, offset: offset, index: 0)
                $0.setBuffer(y, offset: 0, index: 1)
                $0.setBytes(&shift, length: 4, index: 2)
            }
            // The memory check: the first float past the binding, named relative to it.
            let checked = try run("copy_shifted", groups: 2, threads: 32, configure: { $0.softMetalCheckMemory = true }, [bind])
            guard case .outOfBounds(let m)? = checked.error as? SoftMetalError else { return XCTFail(message(checked)) }
            XCTAssertTrue(m.contains("buffer(0) at byte offset 128") && m.contains("128 bytes are bound"), m)
            // Unchecked: the read runs into the page after the mapping and faults.
            let unchecked = try run("copy_shifted", groups: 2, threads: 32, [bind])
            XCTAssertEqual(unchecked.status, .error)
            XCTAssertTrue(message(unchecked).contains("buffer(0) at byte offset 128"), message(unchecked))
            // In bounds, both ways, it reads the caller's memory in place.
            let floats = start.bindMemory(to: Float.self, capacity: 4096)
            for i in 0..<4096 { floats[i] = Float(i) }
            let ok = try run("copy_shifted", groups: 1, threads: 32, configure: { $0.softMetalCheckMemory = true }, [bind])
            XCTAssertEqual(ok.status, .completed, message(ok))
            XCTAssertEqual(y.contents().assumingMemoryBound(to: Float.self)[31], Float(4096 - 1))
        }
    }
}
#endif
