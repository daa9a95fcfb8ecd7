#if canImport(ObjectiveC)
import ObjectiveC
#endif

/// Runs `body` inside an autorelease pool where Objective-C exists: Metal's command
/// buffers and encoders are autoreleased, and a thread with no pool of its own (a Python
/// thread, a Dispatch worker) would otherwise keep them for its whole life. Elsewhere
/// (SoftMetal on Linux) it just runs `body`.
@inline(__always)
func withAutoreleasePool<R>(_ body: () throws -> R) rethrows -> R {
    #if canImport(ObjectiveC)
    return try autoreleasepool(invoking: body)
    #else
    return try body()
    #endif
}
