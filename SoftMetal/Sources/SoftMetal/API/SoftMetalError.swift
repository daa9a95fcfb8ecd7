#if os(Linux)
/// Errors of the software device. Metal reports compile errors as a thrown error from
/// makeLibrary and execution errors through MTLCommandBuffer.status / .error; SoftMetal
/// does the same, with these values.
public enum SoftMetalError: Error, CustomStringConvertible, Equatable {
    /// The MSL did not translate or compile: the compiler's message, lines of the MSL source.
    case compile(String)
    /// A kernel accessed memory past the end (or before the start) of a buffer or of
    /// threadgroup memory: which kernel, which buffer index, which byte offset.
    case outOfBounds(String)
    /// Threads of a threadgroup reached different barriers, or a simd operation was reached
    /// by the threads of a simdgroup at different places (or never by some).
    case barrierDivergence(String)
    /// The race check ran the dispatch twice in different thread orders and got different
    /// results, or the memory check saw two threads touch a byte (one writing) with no
    /// barrier ordering them.
    case race(String)
    /// The memory check saw a read of threadgroup memory that no thread of the threadgroup
    /// had written.
    case uninitializedRead(String)
    /// An API misuse Metal's validation layer would report (unbound buffer, bad sizes).
    case invalidUsage(String)
    /// Another failure while running a kernel (stack overflow, ...).
    case runtime(String)

    public var message: String {
        switch self {
        case .compile(let m), .outOfBounds(let m), .barrierDivergence(let m), .race(let m),
             .uninitializedRead(let m), .invalidUsage(let m), .runtime(let m):
            return m
        }
    }

    public var description: String {
        switch self {
        case .compile(let m): return "SoftMetal compile error: \(m)"
        case .outOfBounds(let m): return "SoftMetal out-of-bounds access: \(m)"
        case .barrierDivergence(let m): return "SoftMetal barrier divergence: \(m)"
        case .race(let m): return "SoftMetal race: \(m)"
        case .uninitializedRead(let m): return "SoftMetal uninitialized read: \(m)"
        case .invalidUsage(let m): return "SoftMetal invalid usage: \(m)"
        case .runtime(let m): return "SoftMetal runtime error: \(m)"
        }
    }
}
#endif
