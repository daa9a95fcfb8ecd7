import Dispatch

/// Runs `body(i)` for every `i` in `0..<count` on Dispatch's worker pool. The split of the
/// work into items is fixed by the caller, never by the number of threads, so results do
/// not depend on how many cores run them.
@inline(__always)
func parallelFor(_ count: Int, _ body: (Int) -> Void) {
    if count == 1 {
        body(0)
    } else if count > 1 {
        DispatchQueue.concurrentPerform(iterations: count, execute: body)
    }
}
