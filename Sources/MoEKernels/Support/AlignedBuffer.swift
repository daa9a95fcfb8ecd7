#if canImport(Darwin)
import Darwin
#else
import Glibc
#endif

/// Uninitialised, 64-byte aligned storage for `count` elements of a trivial type.
/// Allocation failure is an error rather than a trap: a Python process must survive an
/// over-large layer.
final class AlignedBuffer<Element>: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<Element>
    let count: Int
    static var hugePageSize: Int { 2 << 20 }
    static var hugePageThreshold: Int { 4 << 20 }

    init(count: Int, what: @autoclosure () -> String) throws {
        precondition(count >= 0)
        let (bytes, overflow) = max(count, 1).multipliedReportingOverflow(by: MemoryLayout<Element>.stride)
        var raw: UnsafeMutableRawPointer?
        // Large buffers (weights, big scratch) start on a 2 MiB boundary and ask for
        // transparent huge pages, as NumPy does: streaming weights through 4 KiB pages
        // costs a TLB miss per page.
        let huge = bytes >= Self.hugePageThreshold
        if overflow || posix_memalign(&raw, huge ? Self.hugePageSize : 64, bytes) != 0 || raw == nil {
            throw MoEError.outOfMemory("cannot allocate \(count) elements for \(what())")
        }
        #if os(Linux)
        if huge { _ = madvise(raw, bytes, MADV_HUGEPAGE) }
        #endif
        pointer = raw!.bindMemory(to: Element.self, capacity: max(count, 1))
        self.count = count
    }

    /// A copy of `source`; `what` names it in the error.
    convenience init(copying source: UnsafeBufferPointer<Element>, what: @autoclosure () -> String) throws {
        try self.init(count: source.count, what: what())
        if let base = source.baseAddress { pointer.update(from: base, count: source.count) }
    }

    deinit { free(pointer) }
}

extension AlignedBuffer where Element == Float {
    convenience init(copying data: WeightData, what: @autoclosure () -> String) throws {
        let name = what()
        try self.init(count: data.count, what: name)
        data.withUnsafeBufferPointer { if let base = $0.baseAddress { pointer.update(from: base, count: $0.count) } }
    }
}
