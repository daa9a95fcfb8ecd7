import CMoECPU
import Dispatch

/// The machine's read bandwidth as the CPU backend's kernels see it (moe_measure_read_bandwidth):
/// the worker threads stream a buffer on huge pages with the kernels' loads, 512- and
/// 256-bit where both exist (the faster one counts: on Zen 4 that is 256-bit). It is the
/// benchmark's bandwidth roof, measured with the same threads and loads as the products,
/// so a product "above the roof" means the roof is wrong, not the product fast.
enum ReadProbe {
    /// Slices per pass: enough that every thread gets several and none waits long at the end.
    static let slices = 64

    static func gigabytesPerSecond(bytes: Int, repeats: Int) throws -> Double {
        guard bytes >= 64 << 20 else {
            throw MoEError.invalidArgument("the read probe needs at least 64 MiB (a buffer the caches cannot hold), got \(bytes) bytes")
        }
        guard repeats >= 1 else { throw MoEError.invalidArgument("repeats must be at least 1, got \(repeats)") }
        let slice = bytes / slices / 256 * 256
        let buffer = try AlignedBuffer<UInt8>(count: slice * slices, what: "the read probe's buffer")
        buffer.pointer.initialize(repeating: 1, count: buffer.count)  // every page touched before timing
        let base = UnsafeRawPointer(buffer.pointer)
        let parts = UnsafeMutablePointer<UInt64>.allocate(capacity: slices)
        defer { parts.deallocate() }
        var best = UInt64.max
        var sink: UInt64 = 0
        // 512-bit loads only where they exist: elsewhere both widths would read 256 bits.
        let widths: [Int32] = moe_cpu_isa_level() >= MOE_CPU_ISA_AVX512 ? [512, 256] : [256]
        for _ in 0..<repeats {
            for bits in widths {
                let start = DispatchTime.now().uptimeNanoseconds
                parallelFor(slices) { i in parts[i] = moe_cpu_stream_read(base + i * slice, Int64(slice), bits) }
                best = Swift.min(best, DispatchTime.now().uptimeNanoseconds - start)
                for i in 0..<slices { sink |= parts[i] }
            }
        }
        // The reads' result is used, so no compiler may drop them; it is 1s everywhere.
        guard sink == 0x0101_0101_0101_0101 else { throw MoEError.internalError("the read probe read \(sink)") }
        return Double(buffer.count) / Double(best)
    }

    /// Bytes per piece of `secondsToRead`: smaller than a decode call's work items (a few
    /// hundred KiB of 4-bit rows), so that both threads read to the end.
    static let piece = 64 << 10

    /// The wall time of the worker threads reading `count` regions once (moe_measure_read_time),
    /// and the bytes they read: each region from its first 64-byte boundary, whole 256-byte
    /// steps, in pieces of `piece` bytes claimed as a call's work items are. The threads are
    /// woken before the clock starts: this is the read alone, not a call's fixed costs.
    static func secondsToRead(starts: UnsafePointer<UnsafeRawPointer?>, bytes: UnsafePointer<Int64>,
                              count: Int) throws -> (seconds: Double, bytes: Int) {
        guard count >= 0 else { throw MoEError.invalidArgument("count must not be negative, got \(count)") }
        var pieces: [(UnsafeRawPointer, Int)] = []
        for i in 0..<count {
            guard bytes[i] >= 0 else { throw MoEError.invalidArgument("bytes[\(i)] is negative (\(bytes[i]))") }
            guard bytes[i] > 0 else { continue }
            guard let start = starts[i] else { throw MoEError.invalidArgument("starts[\(i)] is NULL with bytes[\(i)] = \(bytes[i])") }
            let skip = (64 - Int(bitPattern: start) % 64) % 64
            var left = (Int(bytes[i]) - skip) / 256 * 256
            var at = start + skip
            while left > 0 {
                let n = Swift.min(left, piece)
                pieces.append((at, n))
                at += n
                left -= n
            }
        }
        let bits: Int32 = moe_cpu_isa_level() >= MOE_CPU_ISA_AVX512 ? 512 : 256
        let parts = UnsafeMutablePointer<UInt64>.allocate(capacity: Swift.max(pieces.count, 2))
        defer { parts.deallocate() }
        // A job of nothing rather than moe_cpu_pool_prepare, which wakes a started pool only:
        // in a process that has run no layer yet this starts the workers, off the clock.
        parallelFor(2) { parts[$0] = 0 }
        let start = DispatchTime.now().uptimeNanoseconds
        pieces.withUnsafeBufferPointer { list in
            parallelFor(list.count) { i in parts[i] = moe_cpu_stream_read(list[i].0, Int64(list[i].1), bits) }
        }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start) * 1e-9
        return (seconds, pieces.reduce(0) { $0 + $1.1 })
    }
}
