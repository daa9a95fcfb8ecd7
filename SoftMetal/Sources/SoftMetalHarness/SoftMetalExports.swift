// SoftMetal's kernel harness (moe_softmetal_* in moe_softmetal.h): compile MSL and launch
// one kernel on the software Metal device, for the Python harness (SoftMetal/python/softmetal).
// Linked into libMoESwift, whose status codes and error slot it shares.
// Like every export, nothing here traps: errors become a status, a moe_softmetal_error
// kind and the thread's moe_last_error() message. Without SoftMetal (Apple platforms)
// every function returns MOE_ERROR_UNAVAILABLE.
import CMoESwift
import CSoftMetalHarness
#if os(Linux)
import Dispatch
import SoftMetal
#endif

private func unavailable(_ kind: UnsafeMutablePointer<Int32>?) -> moe_status {
    kind?.pointee = Int32(MOE_SOFTMETAL_RUNTIME.rawValue)
    moe_internal_set_error("SoftMetal is only built on Linux (on Apple platforms use the Metal backend)")
    return MOE_ERROR_UNAVAILABLE
}

#if os(Linux)
private final class SoftMetalHandle {
    let library: any MTLLibrary
    let queue: any MTLCommandQueue
    init(library: any MTLLibrary, queue: any MTLCommandQueue) {
        self.library = library
        self.queue = queue
    }
}

private let softMetalLock = DispatchQueue(label: "moe_softmetal.handles")
nonisolated(unsafe) private var softMetalHandles: [OpaquePointer: SoftMetalHandle] = [:]
nonisolated(unsafe) private var softMetalLastHandle = 8

private struct HarnessError: Error {
    var kind: moe_softmetal_error
    var status: moe_status
    var message: String
}

private func softMetalStatus(_ kind: UnsafeMutablePointer<Int32>?, _ body: () throws -> Void) -> moe_status {
    kind?.pointee = Int32(MOE_SOFTMETAL_OK.rawValue)
    do {
        try body()
        return MOE_OK
    } catch let e as HarnessError {
        kind?.pointee = Int32(e.kind.rawValue)
        moe_internal_set_error(e.message)
        return e.status
    } catch let e as SoftMetalError {
        let k: moe_softmetal_error
        switch e {
        case .compile: k = MOE_SOFTMETAL_COMPILE
        case .outOfBounds: k = MOE_SOFTMETAL_OUT_OF_BOUNDS
        case .barrierDivergence: k = MOE_SOFTMETAL_BARRIER_DIVERGENCE
        case .race: k = MOE_SOFTMETAL_RACE
        case .uninitializedRead: k = MOE_SOFTMETAL_UNINITIALIZED_READ
        case .invalidUsage: k = MOE_SOFTMETAL_INVALID_USAGE
        case .runtime: k = MOE_SOFTMETAL_RUNTIME
        }
        kind?.pointee = Int32(k.rawValue)
        moe_internal_set_error(e.message)
        return MOE_ERROR_INVALID_ARGUMENT
    } catch {
        kind?.pointee = Int32(MOE_SOFTMETAL_RUNTIME.rawValue)
        moe_internal_set_error("\(error)")
        return MOE_ERROR_INTERNAL
    }
}

private func usage(_ message: String) -> HarnessError {
    HarnessError(kind: MOE_SOFTMETAL_INVALID_USAGE, status: MOE_ERROR_INVALID_ARGUMENT, message: message)
}

private func handle(_ h: OpaquePointer?) throws -> SoftMetalHandle {
    guard let h else { throw usage("library handle is NULL") }
    guard let found = softMetalLock.sync(execute: { softMetalHandles[h] }) else {
        throw usage("library handle \(h) is not a live SoftMetal library")
    }
    return found
}
#endif

@_cdecl("moe_softmetal_compile")
public func moe_softmetal_compile(_ source: UnsafePointer<CChar>?, _ out: UnsafeMutablePointer<OpaquePointer?>?,
                                  _ kind: UnsafeMutablePointer<Int32>?) -> moe_status {
    moe_softmetal_compile_with_options(source, nil, out, kind)
}

@_cdecl("moe_softmetal_compile_with_options")
public func moe_softmetal_compile_with_options(_ source: UnsafePointer<CChar>?,
                                               _ options: UnsafePointer<moe_softmetal_compile_options>?,
                                               _ out: UnsafeMutablePointer<OpaquePointer?>?,
                                               _ kind: UnsafeMutablePointer<Int32>?) -> moe_status {
#if os(Linux)
    return softMetalStatus(kind) {
        guard let out else { throw usage("out is NULL") }
        out.pointee = nil
        guard let source else { throw usage("source is NULL") }
        guard let device = MTLCreateSystemDefaultDevice(), let queue = device.makeCommandQueue() else {
            throw HarnessError(kind: MOE_SOFTMETAL_RUNTIME, status: MOE_ERROR_INTERNAL, message: "no SoftMetal device")
        }
        let compileOptions = try options.map { try softMetalCompileOptions($0.pointee) }
        let library = try device.makeLibrary(source: String(cString: source), options: compileOptions)
        let made = SoftMetalHandle(library: library, queue: queue)
        out.pointee = softMetalLock.sync {
            softMetalLastHandle += 8
            let h = OpaquePointer(bitPattern: softMetalLastHandle)!
            softMetalHandles[h] = made
            return h
        }
    }
#else
    return unavailable(kind)
#endif
}

#if os(Linux)
/// The C options as SoftMetal's compile options (include directories, macros, language version).
private func softMetalCompileOptions(_ o: moe_softmetal_compile_options) throws -> SoftMetalCompileOptions {
    // compile_timeout came last; a struct that ends before it is the older layout.
    let withoutTimeout = UInt32(MemoryLayout<moe_softmetal_compile_options>.offset(of: \.compile_timeout)!)
    guard o.struct_size >= withoutTimeout else {
        throw usage("options.struct_size is \(o.struct_size), expected \(MemoryLayout<moe_softmetal_compile_options>.size)")
    }
    let result = SoftMetalCompileOptions()
    guard o.num_include_dirs >= 0, o.num_defines >= 0 else { throw usage("negative num_include_dirs or num_defines") }
    for i in 0..<Int(o.num_include_dirs) {
        guard let dir = o.include_dirs?[i] else { throw usage("include_dirs[\(i)] is NULL") }
        result.softMetalIncludeDirectories.append(String(cString: dir))
    }
    for i in 0..<Int(o.num_defines) {
        guard let name = o.define_names?[i] else { throw usage("define_names[\(i)] is NULL") }
        result.softMetalPreprocessorMacros[String(cString: name)] = o.define_values?[i].map { String(cString: $0) } ?? "1"
    }
    if o.metal_version != 0 {
        let major = UInt(o.metal_version / 100), minor = UInt(o.metal_version % 100 / 10)
        guard o.metal_version % 10 == 0, let version = MTLLanguageVersion(rawValue: major << 16 | minor) else {
            throw usage("metal_version \(o.metal_version) is not an MSL version SoftMetal knows (200...240, 300...320)")
        }
        result.languageVersion = version
    }
    if o.struct_size >= UInt32(MemoryLayout<moe_softmetal_compile_options>.size) && o.compile_timeout != 0 {
        guard o.compile_timeout > 0, o.compile_timeout.isFinite else { throw usage("compile_timeout \(o.compile_timeout) is not a positive number of seconds") }
        result.softMetalCompileTimeout = o.compile_timeout
    }
    return result
}
#endif

@_cdecl("moe_softmetal_launch")
public func moe_softmetal_launch(_ library: OpaquePointer?, _ desc: UnsafeMutablePointer<moe_softmetal_launch_desc>?,
                                 _ kind: UnsafeMutablePointer<Int32>?) -> moe_status {
#if os(Linux)
    return softMetalStatus(kind) {
        let h = try handle(library)
        guard let desc else { throw usage("desc is NULL") }
        let withoutStaleReads = UInt32(MemoryLayout<moe_softmetal_launch_desc>.offset(of: \.stale_reads)!)
        guard desc.pointee.struct_size >= withoutStaleReads else {
            throw usage("desc.struct_size is \(desc.pointee.struct_size), expected \(MemoryLayout<moe_softmetal_launch_desc>.size)")
        }
        // A caller built against an older header passes a shorter struct: its missing fields are 0.
        var d = moe_softmetal_launch_desc()
        let given = min(Int(desc.pointee.struct_size), MemoryLayout<moe_softmetal_launch_desc>.size)
        withUnsafeMutableBytes(of: &d) { $0.copyMemory(from: UnsafeRawBufferPointer(start: desc, count: given)) }
        guard let name = d.kernel.map({ String(cString: $0) }) else { throw usage("desc.kernel is NULL") }
        guard h.library.functionNames.contains(name), var function = h.library.makeFunction(name: name) else {
            throw usage("no kernel named \(name) in the library (kernels: \(h.library.functionNames.joined(separator: ", ")))")
        }
        if d.num_constants > 0 {
            guard let library = h.library as? SoftMetalLibrary else { throw usage("not a SoftMetal library") }
            function = try h.library.makeFunction(name: name, constantValues: try constantValues(d, library))
        }
        let device = h.library.device
        let pipeline = try device.makeComputePipelineState(function: function)

        // The host's arrays, as ranges of its memory. Entries whose ranges overlap (one array
        // bound at several indices, overlapping views of one array) become one device buffer,
        // each bound at its offset in it, as one MTLBuffer bound twice is on Metal: the same
        // addresses, so that `src1 != src0` (ggml's soft_max without a mask) and in-place
        // kernels see what they see on a GPU, and a write through one binding is not undone
        // by copying back another binding's stale copy.
        let count = Int(d.num_buffers)
        guard count >= 0, count <= 31 else { throw usage("num_buffers \(count) is outside 0...31") }
        var entries: [(index: Int, start: UInt, length: Int, back: Bool)] = []
        for i in 0..<count {
            guard let indices = d.buffer_indices, let datas = d.buffer_data, let lengths = d.buffer_lengths else {
                throw usage("buffer_indices, buffer_data and buffer_lengths are required when num_buffers > 0")
            }
            let index = Int(indices[i]), length = Int(lengths[i])
            guard index >= 0, index < 31 else { throw usage("buffer index \(index) is outside 0...30") }
            guard length >= 0, let data = datas[i] ?? (length == 0 ? UnsafeMutableRawPointer(bitPattern: 16) : nil) else {
                throw usage("buffer(\(index)): NULL data or negative length")
            }
            guard length > 0 else {
                throw usage("buffer(\(index)) has 0 bytes: Metal has no empty buffers (makeBuffer(length: 0) is nil)")
            }
            let start = UInt(bitPattern: data)
            guard start <= UInt.max - UInt(length) else { throw usage("buffer(\(index)): the range wraps around the address space") }
            entries.append((index, start, length, d.buffer_write_back.map { $0[i] != 0 } ?? true))
        }
        // Groups of overlapping ranges: sorted by start, a range joins the group before it
        // while it begins below that group's end. Ranges that only touch stay apart (each
        // keeps its guard).
        var groups: [(start: UInt, end: UInt, members: [Int])] = []
        for e in entries.indices.sorted(by: { entries[$0].start < entries[$1].start }) {
            let end = entries[e].start + UInt(entries[e].length)
            if let last = groups.last, entries[e].start < last.end {
                groups[groups.count - 1].end = max(last.end, end)
                groups[groups.count - 1].members.append(e)
            } else {
                groups.append((entries[e].start, end, [e]))
            }
        }
        var bindings: [(index: Int, buffer: any MTLBuffer, offset: Int)] = []
        // What is copied back after the dispatch: per group, the union of its write-back
        // members' ranges, each byte once.
        var copyBack: [(buffer: any MTLBuffer, offset: Int, host: UnsafeMutableRawPointer, length: Int)] = []
        for g in groups {
            let length = Int(g.end - g.start)
            guard let b = device.makeBuffer(length: length, options: .storageModeShared) else {
                throw HarnessError(kind: MOE_SOFTMETAL_RUNTIME, status: MOE_ERROR_OUT_OF_MEMORY, message: "cannot allocate \(length) bytes")
            }
            b.contents().copyMemory(from: UnsafeRawPointer(bitPattern: g.start)!, byteCount: length)
            var back: (start: UInt, end: UInt)?
            for e in g.members {  // in order of start
                bindings.append((entries[e].index, b, Int(entries[e].start - g.start)))
                guard entries[e].back else { continue }
                let end = entries[e].start + UInt(entries[e].length)
                if let r = back, entries[e].start <= r.end {
                    back = (r.start, max(r.end, end))
                } else {
                    if let r = back { copyBack.append((b, Int(r.start - g.start), UnsafeMutableRawPointer(bitPattern: r.start)!, Int(r.end - r.start))) }
                    back = (entries[e].start, end)
                }
            }
            if let r = back { copyBack.append((b, Int(r.start - g.start), UnsafeMutableRawPointer(bitPattern: r.start)!, Int(r.end - r.start))) }
        }
        var indirect: (any MTLBuffer)?
        if d.mode == 2 {
            guard let data = d.indirect_data, d.indirect_length > 0,
                  let b = device.makeBuffer(bytes: data, length: Int(d.indirect_length), options: []) else {
                throw usage("mode 2 (indirect) needs indirect_data and indirect_length")
            }
            indirect = b
        } else if d.mode != 0 && d.mode != 1 {
            throw usage("mode \(d.mode) is not 0, 1 or 2")
        }

        guard let cb = h.queue.makeCommandBuffer(), let encoder = cb.makeComputeCommandEncoder() else {
            throw HarnessError(kind: MOE_SOFTMETAL_RUNTIME, status: MOE_ERROR_INTERNAL, message: "cannot make a command buffer")
        }
        if let e = encoder as? SoftMetalComputeCommandEncoder {
            e.softMetalCheckRaces = d.check_races != 0
            e.softMetalCheckOrder = d.check_order != 0
            e.softMetalPoisonThreadgroupMemory = d.poison_threadgroup_memory != 0
            e.softMetalCheckMemory = d.check_memory != 0
            e.softMetalStaleReads = d.stale_reads != 0
            e.softMetalCheckDivision = d.check_division != 0
            switch d.schedule {
            case 0: e.softMetalSchedule = .roundRobin
            case 1: e.softMetalSchedule = .runAhead
            case 2: e.softMetalSchedule = .runAheadForward
            case 3: e.softMetalSchedule = .runAheadReverse
            default: throw usage("schedule \(d.schedule) is not 0...3")
            }
        }
        encoder.setComputePipelineState(pipeline)
        for b in bindings { encoder.setBuffer(b.buffer, offset: b.offset, index: b.index) }
        for i in 0..<Int(max(0, d.num_threadgroup_memory)) {
            guard let indices = d.threadgroup_memory_indices, let lengths = d.threadgroup_memory_lengths else {
                throw usage("threadgroup_memory_indices and threadgroup_memory_lengths are required")
            }
            encoder.setThreadgroupMemoryLength(Int(lengths[i]), index: Int(indices[i]))
        }
        let size = [Int(d.size.0), Int(d.size.1), Int(d.size.2)]
        let tptg = [Int(d.threads_per_threadgroup.0), Int(d.threads_per_threadgroup.1), Int(d.threads_per_threadgroup.2)]
        let grid = MTLSize(width: size[0], height: size[1], depth: size[2])
        let threads = MTLSize(width: tptg[0], height: tptg[1], depth: tptg[2])
        switch d.mode {
        case 0: encoder.dispatchThreadgroups(grid, threadsPerThreadgroup: threads)
        case 1: encoder.dispatchThreads(grid, threadsPerThreadgroup: threads)
        default: encoder.dispatchThreadgroups(indirectBuffer: indirect!, indirectBufferOffset: Int(d.indirect_offset), threadsPerThreadgroup: threads)
        }
        encoder.endEncoding()
        let start = DispatchTime.now().uptimeNanoseconds
        cb.commit()
        cb.waitUntilCompleted()
        d.seconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        desc.pointee.seconds = d.seconds
        if let error = cb.error { throw error }
        for c in copyBack {
            c.host.copyMemory(from: c.buffer.contents() + c.offset, byteCount: c.length)
        }
    }
#else
    return unavailable(kind)
#endif
}

@_cdecl("moe_softmetal_fiber_switch_ns")
public func moe_softmetal_fiber_switch_ns(_ library: OpaquePointer?, _ iterations: Int64,
                                          _ out: UnsafeMutablePointer<Double>?) -> moe_status {
#if os(Linux)
    return softMetalStatus(nil) {
        let h = try handle(library)
        guard let out else { throw usage("out is NULL") }
        guard iterations > 0 else { throw usage("iterations must be positive") }
        out.pointee = try SoftMetalOptions.measureFiberSwitchNanoseconds(in: h.library, iterations: Int(iterations))
    }
#else
    return unavailable(nil)
#endif
}

@_cdecl("moe_softmetal_free")
public func moe_softmetal_free(_ library: OpaquePointer?) {
#if os(Linux)
    guard let library else { return }
    _ = softMetalLock.sync { softMetalHandles.removeValue(forKey: library) }
#endif
}

#if os(Linux)
/// The launch's function constants as Metal takes them: each value converted to the type
/// its declaration has (the harness's callers pass numbers without types).
private func constantValues(_ d: moe_softmetal_launch_desc, _ library: SoftMetalLibrary) throws -> MTLFunctionConstantValues {
    let declared = library.softMetalFunctionConstants
    let names = declared.map { "\($0.name) (\($0.index), \($0.type))" }.joined(separator: ", ")
    guard let values = d.constant_values else { throw usage("constant_values is NULL with num_constants > 0") }
    let result = MTLFunctionConstantValues()
    for i in 0..<Int(d.num_constants) {
        let index = d.constant_indices.map { Int($0[i]) } ?? -1
        let name = index < 0 ? d.constant_names?[i].map { String(cString: $0) } : nil
        guard let c = declared.first(where: { index >= 0 ? $0.index == index : $0.name == name }) else {
            throw usage("no function constant \(index >= 0 ? "with index \(index)" : "named \(name ?? "(NULL)")") in the library (declared: \(names.isEmpty ? "none" : names))")
        }
        guard let type = SoftMetalLibrary.softMetalDataType(ofConstantType: c.type) else {
            throw usage("function constant \(c.name): type \(c.type) is not supported")
        }
        let v = values[i]
        func exact<T: BinaryInteger>(_: T.Type) throws -> T {
            guard let n = T(exactly: v) else {
                throw usage("function constant \(c.name) is \(c.type): \(v) is not a value of that type")
            }
            return n
        }
        var bytes: [UInt8]
        switch type {
        case .bool: bytes = [v != 0 ? 1 : 0]
        case .float: bytes = withUnsafeBytes(of: Float(v)) { Array($0) }
        case .half: bytes = withUnsafeBytes(of: Float16(v)) { Array($0) }
        case .int: bytes = withUnsafeBytes(of: try exact(Int32.self)) { Array($0) }
        case .uint: bytes = withUnsafeBytes(of: try exact(UInt32.self)) { Array($0) }
        case .short: bytes = withUnsafeBytes(of: try exact(Int16.self)) { Array($0) }
        case .ushort: bytes = withUnsafeBytes(of: try exact(UInt16.self)) { Array($0) }
        case .char: bytes = withUnsafeBytes(of: try exact(Int8.self)) { Array($0) }
        case .uchar: bytes = withUnsafeBytes(of: try exact(UInt8.self)) { Array($0) }
        case .long: bytes = withUnsafeBytes(of: try exact(Int64.self)) { Array($0) }
        default: bytes = withUnsafeBytes(of: try exact(UInt64.self)) { Array($0) }
        }
        bytes.withUnsafeBytes { result.setConstantValue($0.baseAddress!, type: type, index: c.index) }
    }
    return result
}
#endif
