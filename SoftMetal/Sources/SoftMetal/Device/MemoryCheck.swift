#if os(Linux)
import CSoftMetal
import Glibc

/// The host side of the memory check (see "the memory check" in the runtime header): the
/// shadow memory of one checked dispatch, and its finding turned into a message with the
/// MSL lines of both accesses.
final class MemoryCheck {
    /// Checked dispatches run one at a time: the instrumented library finds its dispatch
    /// through one global.
    static let lock = SMLock()

    let state: UnsafeMutablePointer<sm_check>
    private var maps: [(UnsafeMutableRawPointer, Int)] = []
    /// Stale reads: per distinct buffer, memory that may hold a stale byte where `pending` is 1.
    private var stale: [(buffer: BufferMemory, newest: UnsafeMutablePointer<UInt8>, pending: UnsafeMutablePointer<UInt8>)] = []

    /// `groups`: threadgroups in the dispatch (the memory model's release table);
    /// `uninitialized`: reads of unwritten memory are reported (the race detector alone does not);
    /// `staleReads`: unordered cross-threadgroup reads get the bytes the dispatch began with.
    /// `coherent`: the indices of the kernel's `coherent(device)` buffers.
    init(bindings: [(buffer: BufferMemory, offset: Int)?], dispatch: sm_dispatch, groups: Int, coherent: [Int] = [],
         uninitialized: Bool, staleReads: Bool) {
        state = .allocate(capacity: 1)
        state.initialize(to: sm_check())
        state.pointee.races = 1
        state.pointee.uninitialized = uninitialized ? 1 : 0
        if let releases = map(bytes: groups * Int(SM_RELEASES_PER_GROUP) * MemoryLayout<sm_release>.stride),
           let threads = map(bytes: Int(SM_SYNC_THREADS) * MemoryLayout<sm_thread_sync>.stride),
           let locations = map(bytes: Int(SM_SYNC_LOCATIONS) * MemoryLayout<sm_sync_location>.stride) {
            state.pointee.releases = releases.bindMemory(to: sm_release.self, capacity: groups * Int(SM_RELEASES_PER_GROUP))
            state.pointee.group_count = UInt32(groups)
            state.pointee.threads = threads.bindMemory(to: sm_thread_sync.self, capacity: Int(SM_SYNC_THREADS))
            state.pointee.locations = locations.bindMemory(to: sm_sync_location.self, capacity: Int(SM_SYNC_LOCATIONS))
        }
        state.pointee.stale_reads = staleReads ? 1 : 0
        let coherentBound = coherent.filter { $0 >= 0 && $0 < bindings.count && bindings[$0] != nil }
        if !coherentBound.isEmpty, let fences = map(bytes: groups * (Int(SM_SYNC_THREADS) + 1) * MemoryLayout<UInt32>.stride) {
            state.pointee.coherent_fences = fences.bindMemory(to: UInt32.self, capacity: groups * (Int(SM_SYNC_THREADS) + 1))
            withUnsafeMutableBytes(of: &state.pointee.coherent) { flags in
                for i in coherentBound where i < flags.count { flags[i] = 1 }
            }
        }
        // One shadow per buffer, shared by every index it is bound at (one buffer bound
        // twice is one memory).
        var shadows: [ObjectIdentifier: UnsafeMutablePointer<sm_shadow>?] = [:]
        for (i, binding) in bindings.enumerated() {
            guard let binding else { continue }
            let key = ObjectIdentifier(binding.buffer)
            if shadows[key] == nil { shadows[key] = map(cells: binding.buffer.length) }
            if let shadow = shadows[key]! {
                csm_check_set_buffer_shadow(state, Int32(i), shadow + binding.offset)
                if staleReads, let copies = staleCopies(binding.buffer) {
                    csm_check_set_stale(state, Int32(i), copies.initial + binding.offset, copies.newest + binding.offset,
                                        copies.pending + binding.offset)
                }
                if let bits = binding.buffer.initializationBits() {
                    csm_check_set_buffer_init(state, Int32(i), bits, UInt64(binding.offset))
                }
            } else {
                binding.buffer.markAllInitialized()  // untracked: its stores would not be recorded
            }
        }
        withUnsafeBytes(of: dispatch.tg_mem_lengths) { raw in
            for (i, length) in raw.bindMemory(to: UInt64.self).enumerated() where length > 0 {
                if let shadow = map(cells: Int(length)) { csm_check_set_threadgroup_shadow(state, Int32(i), shadow) }
            }
        }
        state.pointee.arena_shadow = map(cells: Int(SM_THREADGROUP_ARENA_CAPACITY))
    }

    /// Zero-filled cells, reserved lazily (only the pages of bytes the kernel touches
    /// become memory); nil if the address space says no (then no race tracking there).
    private func map(cells: Int) -> UnsafeMutablePointer<sm_shadow>? {
        let (bytes, overflow) = cells.multipliedReportingOverflow(by: MemoryLayout<sm_shadow>.stride)
        guard !overflow else { return nil }
        return map(bytes: bytes)?.bindMemory(to: sm_shadow.self, capacity: cells)
    }

    private func map(bytes: Int) -> UnsafeMutableRawPointer? {
        guard bytes > 0 else { return nil }
        let p = mmap(nil, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        guard let p, p != MAP_FAILED else { return nil }
        maps.append((p, bytes))
        return p
    }

    /// A buffer's bytes as the dispatch begins, and room for the bytes stale ones displace
    /// (one set per buffer, shared by every index it is bound at).
    private func staleCopies(_ buffer: BufferMemory) -> (initial: UnsafeMutablePointer<UInt8>, newest: UnsafeMutablePointer<UInt8>,
                                                            pending: UnsafeMutablePointer<UInt8>)? {
        if let i = stale.firstIndex(where: { $0.buffer === buffer }) {
            let newest = stale[i].newest, pending = stale[i].pending
            return (newest + buffer.length, newest, pending)
        }
        // initial follows newest in one mapping.
        guard let both = map(bytes: 2 * buffer.length), let pending = map(bytes: buffer.length) else { return nil }
        let newest = both.bindMemory(to: UInt8.self, capacity: 2 * buffer.length)
        (newest + buffer.length).update(from: buffer.storage.assumingMemoryBound(to: UInt8.self), count: buffer.length)
        let p = pending.bindMemory(to: UInt8.self, capacity: buffer.length)
        stale.append((buffer, newest, p))
        return (newest + buffer.length, newest, p)
    }

    func release() {
        // Bytes that still hold a stale value get the newest one back: the writes did land.
        for s in stale {
            let memory = s.buffer.storage.assumingMemoryBound(to: UInt8.self)
            for b in 0..<s.buffer.length where s.pending[b] != 0 { memory[b] = s.newest[b] }
        }
        stale = []
        for (p, n) in maps { munmap(p, n) }
        maps = []
        state.deallocate()
    }

    func error(_ message: String) -> SoftMetalError {
        switch Int32(state.pointee.kind) {
        case SM_CHECK_RACE: return .race(message)
        case SM_CHECK_UNINITIALIZED: return .uninitializedRead(message)
        default: return .outOfBounds(message)
        }
    }

    func message(_ kernel: CompiledKernel, _ bindings: [(buffer: BufferMemory, offset: Int)?], library: String,
                 groups: (UInt32, UInt32, UInt32)) -> String {
        let c = state.pointee
        let lines = MemoryCheck.sourceLines(library, [c.pc, c.other_pc])
        func thread(_ t: UInt32, _ group: UInt32) -> String {
            let linear = UInt64(group &- 1), gx = UInt64(groups.0), gy = UInt64(groups.1)
            return "thread \(t) of threadgroup (\(linear % gx), \(linear / gx % gy), \(linear / (gx * gy)))"
        }
        let offset = Int64(bitPattern: c.offset)
        let place: String
        switch c.region {
        case SM_REGION_NONE:
            place = "address 0x\(String(UInt(c.address), radix: 16)) (no buffer is bound)"
        case SM_REGION_ARENA:
            place = "byte offset \(offset) of a \(c.region_length)-byte threadgroup variable declared in the kernel"
                + (c.kind == UInt32(SM_CHECK_BOUNDS) ? " (outside every such variable: past its end, or before the first)" : "")
        case let r where r < 0:
            place = "threadgroup(\(-r - 1)) at byte offset \(offset) (its length is \(c.region_length) bytes)"
        case let i where c.outside != 0:
            place = "address 0x\(String(UInt(c.address), radix: 16)), outside every bound buffer (nearest: buffer(\(i)) at byte offset \(offset), \(c.region_length) bytes are bound)"
        default:
            place = "buffer(\(c.region)) at byte offset \(offset) (\(c.region_length) bytes are bound)"
        }
        let access = c.is_write != 0 ? "write" : "read"
        let me = thread(c.thread, c.group)
        switch Int32(c.kind) {
        case SM_CHECK_RACE:
            let other = thread(c.other_thread, c.other_group)
            let why = c.group == c.other_group
                ? "with no threadgroup_barrier between them (nor, in one simdgroup, a simd operation)"
                : "and nothing orders the two: threadgroups of one dispatch are not ordered by a threadgroup_barrier, "
                    + "whatever its mem_flags; MSL orders them only through atomic_thread_fence(mem_flags::mem_device, "
                    + "memory_order_seq_cst, thread_scope_device) after the access and before an atomic write in one "
                    + "threadgroup, and after an atomic read of that write and before the access in the other (or "
                    + "through separate dispatches)"
                    + (c.atomic_read != 0 ? "; a relaxed atomic load is no exception: it may return the value from "
                        + "before the write (the previous dispatch's)" : "")
            let verb = c.is_write != 0 ? "writes it" : c.atomic_read != 0 ? "reads it with an atomic load" : "reads it"
            return "kernel \(kernel.name): data race on \(place): \(me) \(verb) at \(lines[0]), "
                + "\(other) \(c.other_is_write != 0 ? "wrote" : "read") it at \(lines[1]), \(why)"
        case SM_CHECK_UNINITIALIZED where c.region >= 0:
            return "kernel \(kernel.name): read of \(place) that was never written, by \(me) at \(lines[0]) "
                + "(neither the host, through makeBuffer(bytes:) or contents(), nor an earlier dispatch wrote it)"
        case SM_CHECK_UNINITIALIZED:
            return "kernel \(kernel.name): read of \(place) that no thread of the threadgroup has written, by \(me) at \(lines[0]) "
                + "(threadgroup memory starts undefined on a GPU)"
        default:
            return "kernel \(kernel.name): out-of-bounds \(access) of \(c.size) bytes at \(place) by \(me) at \(lines[0])"
        }
    }

    /// "MSL line N" (or "file line N") of code offsets in the library, through
    /// llvm-symbolizer (beside clang++, or on PATH): the innermost frame that is not
    /// SoftMetal's runtime header.
    static func sourceLines(_ library: String, _ pcs: [UInt32]) -> [String] {
        let unknown = pcs.map { _ in "an unknown line (no llvm-symbolizer)" }
        guard let symbolizer = findSymbolizer() else { return unknown }
        let output = "\(KernelCompiler.cacheDirectory)/symbolize.\(getpid()).\(UInt64.random(in: 0..<UInt64.max)).txt"
        defer { unlink(output) }
        // Return addresses: the call is the instruction before.
        let argv = [symbolizer, "--obj=\(library)", "--functions=none"] + pcs.map { "0x\(String(max($0, 1) - 1, radix: 16))" }
        guard SMFile.spawn(argv, output: output, timeout: 120) == 0, let text = try? SMFile.read(output) else { return unknown }
        let blocks = text.split(separator: "\n", omittingEmptySubsequences: false)
            .split(separator: "", omittingEmptySubsequences: true)
        return pcs.indices.map { i in
            guard i < blocks.count else { return unknown[i] }
            let frames = blocks[i].map { String($0) }
            let frame = frames.first { !$0.contains(KernelCompiler.runtimePartFolder) } ?? frames.first ?? "??"
            // file:line:column
            let parts = frame.split(separator: ":")
            guard parts.count >= 2, let line = Int(parts[parts.count - 2]), line > 0 else { return "an unknown line" }
            let file = parts[0..<(parts.count - 2)].joined(separator: ":")
            if file.hasSuffix(MSLTranslator.sourceName) { return "MSL line \(line)" }
            if file.contains(KernelCompiler.runtimePartFolder), let part = file.split(separator: "/").last {
                return "a SoftMetal library function (line \(line) of its runtime's \(part))"
            }
            return "\(file) line \(line)"
        }
    }

    private static func findSymbolizer() -> String? {
        var dirs: [String] = []
        if let cxx = try? KernelCompiler.findCompiler(), let slash = cxx.lastIndex(of: "/") {
            dirs.append(String(cxx[..<slash]))
        }
        dirs += (SMEnv.get("PATH") ?? "/usr/bin:/bin").split(separator: ":").map(String.init)
        return dirs.map { "\($0)/llvm-symbolizer" }.first { access($0, X_OK) == 0 }
    }
}
#endif
