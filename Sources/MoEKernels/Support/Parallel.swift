import CMoECPU
import Dispatch

/// Runs `body(i)` for every `i` in `0..<count` on the CPU backend's worker threads
/// (moe_cpu_pool.h: they spin between the stages of a call instead of being woken for
/// each), or on Dispatch's pool where that is busy or absent. The split of the work into
/// items is fixed by the caller, never by the number of threads, so results do not depend
/// on how many cores run them.
func parallelFor(_ count: Int, _ body: (Int) -> Void) {
    if count == 1 {
        body(0)
        return
    }
    guard count > 1 else { return }
    let ran = withoutActuallyEscaping(body) { body in
        var body = body
        return withUnsafeMutablePointer(to: &body) { context in
            moe_cpu_pool_run(Int64(count), context) { context, index in
                context!.assumingMemoryBound(to: ((Int) -> Void).self).pointee(Int(index))
            } != 0
        }
    }
    if !ran { DispatchQueue.concurrentPerform(iterations: count, execute: body) }
}
