#if os(Linux)
import CSoftMetal
import Dispatch
import Glibc

/// Runs recorded dispatches: validates them like Metal's validation layer, splits the
/// threadgroups into chunks that Dispatch spreads over the cores (each chunk runs on one
/// OS thread through csm_run and the kernel's launcher), turns the runtime's error kinds
/// into SoftMetalError, and implements the race check and the run-ahead comparison.
enum Executor {
    static let cores: Int = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    static let errorCapacity = 2048

    private static let statsLock = SMLock()
    nonisolated(unsafe) private static var _stats = SoftMetalOptions.Statistics()
    static var stats: SoftMetalOptions.Statistics { statsLock.withLock { _stats } }

    private static func record(groups: Int, threads: Int, seconds: Double, raceChecked: Bool, orderChecked: Bool,
                               memoryChecked: Bool, runAheadChecked: Bool) {
        statsLock.withLock {
            _stats.dispatches += 1
            _stats.threadgroups += groups
            _stats.threads += threads
            _stats.seconds += seconds
            if raceChecked { _stats.raceCheckedDispatches += 1 }
            if orderChecked { _stats.orderCheckedDispatches += 1 }
            if memoryChecked { _stats.memoryCheckedDispatches += 1 }
            if runAheadChecked { _stats.runAheadCheckedDispatches += 1 }
        }
    }

    /// The product, or nil if it overflows Int.
    static func checkedProduct(_ factors: Int...) -> Int? {
        var product = 1
        for f in factors {
            let (p, overflow) = product.multipliedReportingOverflow(by: f)
            if overflow { return nil }
            product = p
        }
        return product
    }

    static func run(_ c: DispatchCommand) throws {
        let start = DispatchTime.now().uptimeNanoseconds
        var counted: (groups: Int, threads: Int)?
        defer {
            if let counted {
                record(groups: counted.groups, threads: counted.threads,
                       seconds: Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9, raceChecked: c.checkRaces,
                       orderChecked: c.checkOrder, memoryChecked: c.checkMemory, runAheadChecked: c.schedule == .runAhead)
            }
        }
        if let failure = c.failure { throw failure }
        guard let kernel = c.kernel else { return }
        let t = c.threadsPerThreadgroup
        var groups: (Int, Int, Int)
        var grid: (Int, Int, Int)
        guard t.width >= 1, t.height >= 1, t.depth >= 1 else {
            throw SoftMetalError.invalidUsage("kernel \(kernel.name): threadsPerThreadgroup \(t.width)x\(t.height)x\(t.depth) has a zero dimension")
        }
        // Sizes come from the caller (a Python harness passes anything): every product is
        // checked, an overflow is a usage error rather than a trap.
        guard let perGroup = checkedProduct(t.width, t.height, t.depth), perGroup <= c.maxThreads else {
            throw SoftMetalError.invalidUsage("kernel \(kernel.name): threadsPerThreadgroup \(t.width)x\(t.height)x\(t.depth) exceeds maxTotalThreadsPerThreadgroup \(c.maxThreads)")
        }
        switch c.size {
        case .threadgroups(let g):
            groups = (g.width, g.height, g.depth)
            grid = (checkedProduct(g.width, t.width) ?? .max, checkedProduct(g.height, t.height) ?? .max,
                    checkedProduct(g.depth, t.depth) ?? .max)
        case .threads(let n):
            grid = (n.width, n.height, n.depth)
            groups = (n.width / t.width + (n.width % t.width == 0 ? 0 : 1),
                      n.height / t.height + (n.height % t.height == 0 ? 0 : 1),
                      n.depth / t.depth + (n.depth % t.depth == 0 ? 0 : 1))
        case .indirect(let buffer, let offset):
            guard offset >= 0, offset % 4 == 0, offset <= buffer.length - 12 else {
                throw SoftMetalError.invalidUsage("kernel \(kernel.name): indirect buffer offset \(offset) needs 12 bytes inside a buffer of \(buffer.length) (4-byte aligned)")
            }
            let p = (buffer.storage + offset).assumingMemoryBound(to: UInt32.self)
            groups = (Int(p[0]), Int(p[1]), Int(p[2]))
            grid = (checkedProduct(groups.0, t.width) ?? .max, checkedProduct(groups.1, t.height) ?? .max,
                    checkedProduct(groups.2, t.depth) ?? .max)
        }
        guard groups.0 >= 0, groups.1 >= 0, groups.2 >= 0 else {
            throw SoftMetalError.invalidUsage("kernel \(kernel.name): negative grid size")
        }
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 { return }
        guard let total = checkedProduct(groups.0, groups.1, groups.2), total <= Int(UInt32.max), grid.0 <= Int(UInt32.max), grid.1 <= Int(UInt32.max), grid.2 <= Int(UInt32.max) else {
            throw SoftMetalError.invalidUsage("kernel \(kernel.name): grid too large")
        }

        // Every buffer and threadgroup memory index the kernel uses must be bound: as in
        // Metal, one that the body names only in code its specialization removed need not be.
        for p in kernel.params {
            if p.kind == SM_PARAM_BUFFER {
                guard p.index < c.buffers.count, let binding = c.buffers[p.index] else {
                    if !kernel.isActive(p) { continue }
                    throw SoftMetalError.invalidUsage("kernel \(kernel.name): buffer(\(p.index)) (`\(p.type) \(p.name)`) is not bound: call setBuffer(_:offset:index:) or setBytes(_:length:index:) with index \(p.index)")
                }
                let available = binding.buffer.length - binding.offset
                if p.isReference && available < p.elemSize {
                    throw SoftMetalError.invalidUsage("kernel \(kernel.name): buffer(\(p.index)) (`\(p.type) \(p.name)`) has \(available) bytes, the type needs \(p.elemSize)")
                }
            } else if p.kind == SM_PARAM_THREADGROUP {
                guard p.index < c.threadgroupLengths.count, c.threadgroupLengths[p.index] > 0 else {
                    if !kernel.isActive(p) { continue }
                    throw SoftMetalError.invalidUsage("kernel \(kernel.name): threadgroup(\(p.index)) (`\(p.type) \(p.name)`) has no memory: call setThreadgroupMemoryLength(_:index:) with index \(p.index)")
                }
            }
        }
        // Each length is checked before the sum, so the sum cannot overflow.
        guard c.threadgroupLengths.allSatisfy({ $0 >= 0 && $0 <= 32768 }),
              case let dynamicTG = c.threadgroupLengths.reduce(0, +), dynamicTG <= 32768 else {
            throw SoftMetalError.invalidUsage("kernel \(kernel.name): the threadgroup memory lengths \(c.threadgroupLengths.filter { $0 != 0 }) exceed the 32768 bytes of Apple GPUs")
        }

        counted = (total, total * perGroup)
        var base = sm_dispatch()
        base.abi_version = UInt32(SM_ABI_VERSION)
        base.flags = c.poison ? UInt32(SM_FLAG_POISON) : 0
        if c.checkDivision || c.checkMemory { base.flags |= UInt32(SM_FLAG_CHECK_DIVISION) }
        base.kernel_name = UnsafePointer(kernel.cName)
        for (i, binding) in c.buffers.enumerated() {
            guard let binding else { continue }
            csm_set_buffer(&base, Int32(i), binding.buffer.storage + binding.offset, UInt64(binding.buffer.length - binding.offset))
        }
        for (i, length) in c.threadgroupLengths.enumerated() where length > 0 {
            csm_set_threadgroup_length(&base, Int32(i), UInt64(length))
        }
        csm_set_dims(&base, UInt32(groups.0), UInt32(groups.1), UInt32(groups.2), UInt32(t.width), UInt32(t.height),
                     UInt32(t.depth), UInt32(grid.0), UInt32(grid.1), UInt32(grid.2))
        base.order_mul = 1
        base.max_threads = UInt32(perGroup)

        let runAhead = UInt32(SM_FLAG_RUN_AHEAD), reverse = UInt32(SM_FLAG_REVERSE_SIMDGROUPS)
        switch c.schedule {
        case .roundRobin: break
        case .runAhead, .runAheadForward: base.flags |= runAhead
        case .runAheadReverse: base.flags |= runAhead | reverse
        }
        // Reruns from the same inputs; each must give the first run's bytes in every bound buffer.
        var reruns: [(flags: UInt32, seed: UInt64?, what: String, cause: String)] = []
        if c.schedule == .runAhead {
            reruns.append((base.flags | reverse, nil,
                           "a run with simdgroups running ahead in forward order and one in reverse order",
                           "a missing threadgroup barrier between one simdgroup's access to threadgroup (or device) memory and another simdgroup's, or a data race between simdgroups"))
        }
        if c.checkOrder {
            reruns.append((base.flags, UInt64.random(in: 1..<UInt64.max),
                           "a run in order and a run with permuted threads and threadgroups",
                           "a missing barrier, a data race between threads or threadgroups, or an order-dependent atomic"))
        }
        if reruns.isEmpty {
            try execute(kernel, base, total: total, lanes: perGroup, bindings: c.buffers, permutation: nil, checked: c.checkMemory || c.checkRaces,
                        uninitialized: c.checkMemory, staleReads: c.staleReads)
            return
        }
        var distinct: [BufferMemory] = []
        for case let binding? in c.buffers where !distinct.contains(where: { $0 === binding.buffer }) {
            distinct.append(binding.buffer)
        }
        let before = distinct.map { snapshot($0) }
        try execute(kernel, base, total: total, lanes: perGroup, bindings: c.buffers, permutation: nil, checked: c.checkMemory || c.checkRaces,
                    uninitialized: c.checkMemory, staleReads: c.staleReads)
        let first = distinct.map { snapshot($0) }
        for rerun in reruns {
            for (b, saved) in zip(distinct, before) { restore(b, saved) }
            var d = base
            d.flags = rerun.flags
            try execute(kernel, d, total: total, lanes: perGroup, bindings: c.buffers, permutation: rerun.seed)
            for (b, expected) in zip(distinct, first) {
                let now = snapshot(b)
                guard let at = now.indices.first(where: { now[$0] != expected[$0] }) else { continue }
                let names = c.buffers.enumerated().compactMap { i, binding -> String? in
                    guard let binding, binding.buffer === b else { return nil }
                    return "buffer(\(i)) at byte offset \(at - binding.offset)"
                }
                throw SoftMetalError.race("kernel \(kernel.name): the result depends on execution order: \(names.joined(separator: ", ")) differs between \(rerun.what) (byte \(expected[at]) vs \(now[at])); \(rerun.cause)")
            }
        }
    }

    private static func snapshot(_ b: BufferMemory) -> [UInt8] {
        Array(UnsafeRawBufferPointer(start: b.storage, count: b.length))
    }

    private static func restore(_ b: BufferMemory, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { b.storage.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
    }

    private static func gcd(_ a: Int, _ b: Int) -> Int { b == 0 ? a : gcd(b, a % b) }

    private struct ChunkResult {
        var kind: Int32 = 0
        var message = ""
    }

    /// Runs all threadgroups; `permutation` (a seed) changes the order of threadgroups
    /// (and of chunks) and of the lanes inside each threadgroup. `checked`: with the memory
    /// check, on one thread, one dispatch at a time.
    private static func execute(_ kernel: CompiledKernel, _ base: sm_dispatch, total: Int, lanes: Int,
                                bindings: [(buffer: BufferMemory, offset: Int)?], permutation: UInt64?,
                                checked: Bool = false, uninitialized: Bool = true, staleReads: Bool = false) throws {
        if !checked {
            // Its stores are not seen: the memory check takes its buffers as written.
            for binding in bindings { binding?.buffer.markAllInitialized() }
        }
        if checked {
            let (launcher, path) = try kernel.checkedLauncher()
            try MemoryCheck.lock.withLock {
                let coherent = kernel.params.filter { $0.kind == SM_PARAM_BUFFER && $0.coherent }.map(\.index)
                let check = MemoryCheck(bindings: bindings, dispatch: base, groups: total, coherent: coherent, uninitialized: uninitialized,
                                        staleReads: staleReads)
                defer { check.release() }
                var d = base
                d.check = check.state
                try execute(kernel, launcher, d, total: total, lanes: lanes, bindings: bindings, permutation: permutation,
                            chunks: 1, check: (check, path))
            }
            return
        }
        try execute(kernel, kernel.launcher, base, total: total, lanes: lanes, bindings: bindings, permutation: permutation,
                    chunks: min(total, cores * 4), check: nil)
    }

    private static func execute(_ kernel: CompiledKernel, _ launcher: sm_launcher, _ base: sm_dispatch, total: Int, lanes: Int,
                                bindings: [(buffer: BufferMemory, offset: Int)?], permutation: UInt64?, chunks: Int,
                                check: (MemoryCheck, String)?) throws {
        var template = base
        // One deadline for the whole dispatch (the watchdog's timeout), not one per chunk.
        let timeout = csm_timeout_seconds()
        let deadline = timeout > 0 ? csm_now() + timeout : 0
        if let seed = permutation {
            var mul = Int(seed % UInt64(max(total, 1))) | 1
            while gcd(mul, total) != 1 { mul += 1 }
            template.order_mul = UInt32(mul % max(total, 1) == 0 ? 1 : mul % total)
            template.order_add = UInt32(Int(seed >> 32) % total)
            template.seed = seed
        }
        let results = UnsafeMutableBufferPointer<ChunkResult>.allocate(capacity: chunks)
        results.initialize(repeating: ChunkResult())
        // Deinitialised, not only deallocated: the messages are heap Strings.
        defer {
            _ = results.deinitialize()
            results.deallocate()
        }
        let work = { (i: Int) in
            let chunk = permutation == nil ? i : chunks - 1 - i
            var d = template
            d.first_group = UInt32(total * chunk / chunks)
            d.end_group = UInt32(total * (chunk + 1) / chunks)
            let message = UnsafeMutablePointer<CChar>.allocate(capacity: errorCapacity)
            message.initialize(to: 0)
            defer { message.deallocate() }
            d.error = message
            d.error_capacity = UInt32(errorCapacity)
            let kind = csm_run(launcher, &d, UInt32(lanes), deadline)
            guard kind != SM_OK else { return }
            var text = String(cString: message)
            if kind == SM_ERROR_CHECK, let (memory, path) = check {
                results[chunk] = ChunkResult(kind: kind, message: memory.message(kernel, bindings, library: path, groups: base.threadgroups))
                return
            }
            if kind == SM_ERROR_OUT_OF_BOUNDS {
                text = outOfBoundsMessage(kernel, bindings)
            } else if kind == SM_ERROR_STACK_OVERFLOW {
                text = "kernel \(kernel.name): stack overflow in a GPU thread (thread-private memory over the fiber stack size; set SOFTMETAL_STACK_KB)"
            } else if kind == SM_ERROR_TRAP {
                text = trapMessage(kernel)
            } else if kind == SM_ERROR_TIMEOUT {
                text = "kernel \(kernel.name): did not finish within \(csm_timeout_seconds()) s (SOFTMETAL_TIMEOUT_S): an endless loop, or a thread spinning on a value that another thread sets (SoftMetal runs a thread until it reaches a barrier, a simd operation or its end, so spin-waits never see the other threads)"
            }
            results[chunk] = ChunkResult(kind: kind, message: text)
        }
        if chunks == 1 { work(0) } else { DispatchQueue.concurrentPerform(iterations: chunks, execute: work) }
        guard let failed = results.first(where: { $0.kind != SM_OK }) else { return }
        switch failed.kind {
        case SM_ERROR_CHECK: throw check!.0.error(failed.message)
        case SM_ERROR_OUT_OF_BOUNDS: throw SoftMetalError.outOfBounds(failed.message)
        case SM_ERROR_DIVERGENCE: throw SoftMetalError.barrierDivergence(failed.message)
        default: throw SoftMetalError.runtime(failed.message)
        }
    }

    /// Called on the thread whose csm_run reported SM_ERROR_TRAP.
    private static func trapMessage(_ kernel: CompiledKernel) -> String {
        let what: String
        switch (csm_fault_signal(), csm_fault_code()) {
        case (SIGFPE, Int32(FPE_INTDIV)): what = "an integer division or remainder by zero"
        case (SIGFPE, Int32(FPE_INTOVF)): what = "an integer division that overflows (INT_MIN / -1)"
        case (SIGFPE, _): what = "an arithmetic exception (SIGFPE)"
        case (SIGILL, _): what = "a trap instruction (SIGILL: __builtin_trap() or an undefined-behaviour check)"
        default: what = "a breakpoint trap (SIGTRAP)"
        }
        let address = csm_fault_address()
        let hex = String(UInt(bitPattern: Int(bitPattern: address)), radix: 16)
        if csm_fault_signal() == SIGFPE, csm_fault_code() == Int32(FPE_INTDIV) || csm_fault_code() == Int32(FPE_INTOVF) {
            // Stopped only because the division check is on (otherwise the handler gives the value).
            var place = "at address 0x\(hex)"
            var base: UInt = 0
            if let file = csm_code_object(address, &base), case let offset = UInt(address) &- base, offset > 0, offset < UInt(UInt32.max) {
                // sourceLines takes return addresses (it looks one byte back): the instruction's own + 1.
                place = "at \(MemoryCheck.sourceLines(String(cString: file), [UInt32(offset + 1)])[0])"
            }
            return "kernel \(kernel.name): an integer division or remainder by zero (or INT_MIN / -1) \(place): undefined in MSL; "
                + "without the division check it gives x / 0 = 0, x % 0 = x, as Apple's CPUs do (a GPU does not trap; what Apple's GPUs give is not documented)"
        }
        return "kernel \(kernel.name): \(what) at address 0x\(hex); on a GPU its result would be undefined"
    }

    /// Called on the thread whose csm_run reported the fault.
    private static func outOfBoundsMessage(_ kernel: CompiledKernel, _ bindings: [(buffer: BufferMemory, offset: Int)?]) -> String {
        let address = Int(bitPattern: csm_fault_address())
        let start = Int(bitPattern: csm_fault_region_start())
        let length = Int(bitPattern: csm_fault_region_length())
        let tag = csm_fault_region_tag()
        if start == 0 {
            // Not a guard page: the nearest bound buffer says how far out the access was.
            var nearest: (distance: Int, text: String)?
            for (i, binding) in bindings.enumerated() {
                guard let binding else { continue }
                let base = Int(bitPattern: binding.buffer.storage) + binding.offset
                let offset = address &- base
                let distance = offset < 0 ? -offset : offset
                if nearest == nil || distance < nearest!.distance {
                    nearest = (distance, "buffer(\(i)) at byte offset \(offset) (\(binding.buffer.length - binding.offset) bytes are bound)")
                }
            }
            let hex = String(UInt(bitPattern: address), radix: 16)
            return "kernel \(kernel.name): invalid memory access at address 0x\(hex), far from every buffer\(nearest.map { "; nearest: \($0.text)" } ?? ""): an index far out of range (e.g. read from poisoned or unwritten threadgroup memory: 0xFFFFFFFF), a bad pointer, or a misaligned vector access"
        }
        if tag == -100 {
            return "kernel \(kernel.name): out-of-bounds access to threadgroup variables declared in the kernel (byte offset \(address - start) of the threadgroup arena)"
        }
        if tag < 0 {
            return "kernel \(kernel.name): out-of-bounds access to threadgroup(\(-tag - 1)) at byte offset \(address - start) (its length is \(length) bytes)"
        }
        var names: [String] = []
        for (i, binding) in bindings.enumerated() {
            guard let binding, Int(bitPattern: binding.buffer.storage) == start else { continue }
            let available = binding.buffer.length - binding.offset
            names.append("buffer(\(i)) at byte offset \(address - start - binding.offset) (\(available) bytes are bound\(binding.offset > 0 ? " from offset \(binding.offset)" : ""))")
        }
        if names.isEmpty {
            return "kernel \(kernel.name): out-of-bounds access at byte offset \(address - start) of a \(length)-byte buffer that is not bound to this dispatch"
        }
        return "kernel \(kernel.name): out-of-bounds access to \(names.joined(separator: " and "))"
    }
}
#endif
