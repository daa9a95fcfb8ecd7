// The C ABI declared in Sources/CMoESwift/include/moe_swift.h. Every export catches every
// error and reports it as a status plus a thread-local message: nothing a C or Python
// caller passes may trap in here.
import CMoESwift

// MARK: Handles

/// Live layers by handle. A handle is only dereferenced after it is found here, so a
/// stale or forged handle gives an error instead of a crash, and destroying a layer while
/// another thread runs it only frees the layer when that call has finished.
private let liveLayers = Lock()
nonisolated(unsafe) private var layersByHandle: [OpaquePointer: MoELayer] = [:]
/// Handles are numbers that are never reused, not addresses: a stale handle cannot name a
/// newer layer that happens to live at the same address.
nonisolated(unsafe) private var lastHandle = 0

/// A new handle for `layer`.
func register(_ layer: MoELayer) -> OpaquePointer {
    liveLayers.withLock { () -> OpaquePointer in
        lastHandle += 16
        let handle = OpaquePointer(bitPattern: lastHandle)!
        layersByHandle[handle] = layer
        return handle
    }
}

private func layer(_ handle: OpaquePointer?) throws -> MoELayer {
    guard let handle else { throw MoEError.invalidArgument("layer handle is NULL") }
    guard let layer = liveLayers.withLock({ layersByHandle[handle] }) else {
        throw MoEError.invalidArgument("layer handle \(handle) is not a live layer (destroyed, or never created)")
    }
    return layer
}

/// The layer of a handle, for the exports of other files.
func liveLayer(_ handle: OpaquePointer?) throws -> MoELayer { try layer(handle) }

/// The layers of `count` handles (a run_layers call).
func liveLayers(_ handles: UnsafePointer<OpaquePointer?>?, _ count: Int64) throws -> [MoELayer] {
    guard count >= 1 else { throw MoEError.invalidArgument("num_layers must be at least 1, got \(count)") }
    guard let handles else { throw MoEError.invalidArgument("layers is NULL") }
    guard count <= Int64(Int32.max) else { throw MoEError.invalidArgument("num_layers = \(count) is too large") }
    return try (0..<Int(count)).map { i in
        do {
            return try layer(handles[i])
        } catch let error as MoEError {
            throw MoEError.invalidArgument("layers[\(i)]: \(error.description)")
        }
    }
}

/// Runs an export's body, turning a thrown error into its status and message.
func status(_ body: () throws -> Void) -> moe_status {
    moe_internal_call_begin()
    defer { moe_internal_call_end() }
    do {
        try body()
        return MOE_OK
    } catch let error as MoEError {
        moe_internal_set_error(error.description)
        switch error {
        case .invalidArgument: return MOE_ERROR_INVALID_ARGUMENT
        case .unavailable: return MOE_ERROR_UNAVAILABLE
        case .outOfMemory: return MOE_ERROR_OUT_OF_MEMORY
        case .internalError: return MOE_ERROR_INTERNAL
        }
    } catch {
        moe_internal_set_error("\(error)")
        return MOE_ERROR_INTERNAL
    }
}

// MARK: Exports

@_cdecl("moe_abi_version")
public func moe_abi_version() -> UInt32 { UInt32(MOE_SWIFT_ABI_VERSION) }

@_cdecl("moe_backend_available")
public func moe_backend_available(_ backend: Int32) -> Int32 {
    guard let kind = MoEBackendKind(rawValue: backend) else { return 0 }
    return kind == .auto || MoELayer.availableBackends.contains(kind) ? 1 : 0
}

@_cdecl("moe_cpu_instruction_set")
public func moe_cpu_instruction_set() -> UnsafePointer<CChar> {
    UnsafeRawPointer(MoELayer.cpuInstructionSet.utf8Start).assumingMemoryBound(to: CChar.self)
}

@_cdecl("moe_measure_read_bandwidth")
public func moe_measure_read_bandwidth(_ bytes: Int64, _ repeats: Int32, _ out: UnsafeMutablePointer<Double>?) -> moe_status {
    status {
        guard let out else { throw MoEError.invalidArgument("gb_per_s is NULL") }
        out.pointee = try ReadProbe.gigabytesPerSecond(bytes: Int(bytes), repeats: Int(repeats))
    }
}

@_cdecl("moe_memory_check")
public func moe_memory_check(_ bytes: Int64, _ memoryLimit: Int64, _ what: UnsafePointer<CChar>?) -> moe_status {
    status {
        guard bytes >= 0 else { throw MoEError.invalidArgument("bytes must not be negative, got \(bytes)") }
        guard memoryLimit >= 0 else {
            throw MoEError.invalidArgument("memory_limit must be >= 0 bytes, got \(memoryLimit)")
        }
        let name = what.map { String(cString: $0) } ?? "the host"
        try MemoryBudget.check(needed: Int(bytes), limit: memoryLimit == 0 ? nil : Int(memoryLimit), what: name,
                               hint: "Arrays that are already C-contiguous float32, float16 or bfloat16 are "
                                   + "not copied before the layer is made")
    }
}

@_cdecl("moe_measure_read_time")
public func moe_measure_read_time(_ starts: UnsafePointer<UnsafeRawPointer?>?, _ bytes: UnsafePointer<Int64>?,
                                  _ count: Int32, _ seconds: UnsafeMutablePointer<Double>?,
                                  _ bytesRead: UnsafeMutablePointer<Int64>?) -> moe_status {
    status {
        guard let seconds else { throw MoEError.invalidArgument("seconds is NULL") }
        guard count >= 0 else { throw MoEError.invalidArgument("count must not be negative, got \(count)") }
        guard count == 0 || (starts != nil && bytes != nil) else {
            throw MoEError.invalidArgument("starts and bytes must not be NULL when count is \(count)")
        }
        var none: UnsafeRawPointer? = nil
        var zero: Int64 = 0
        let read = try ReadProbe.secondsToRead(starts: starts ?? withUnsafePointer(to: &none) { $0 },
                                               bytes: bytes ?? withUnsafePointer(to: &zero) { $0 }, count: Int(count))
        seconds.pointee = read.seconds
        bytesRead?.pointee = Int64(read.bytes)
    }
}

@_cdecl("moe_layer_desc_init")
public func moe_layer_desc_init(_ desc: UnsafeMutablePointer<moe_layer_desc>?) {
    desc?.pointee = LayerDescriptor.defaults
}

@_cdecl("moe_layer_create")
public func moe_layer_create(_ desc: UnsafePointer<moe_layer_desc>?,
                             _ out: UnsafeMutablePointer<OpaquePointer?>?) -> moe_status {
    status {
        guard let out else { throw MoEError.invalidArgument("out (the moe_layer** to fill) is NULL") }
        out.pointee = nil
        guard let desc else { throw MoEError.invalidArgument("desc is NULL") }
        // Read first (and released on any failure below when the layer does not hold it).
        let memory = try LayerDescriptor.mappedMemory(desc)
        let d = try LayerDescriptor.read(desc)
        let made = try MoELayer(configuration: d.configuration, weights: try d.weights(memory: memory),
                                backend: d.backend, memoryLimit: try d.memoryLimit)
        out.pointee = register(made)
    }
}

@_cdecl("moe_layer_forward")
public func moe_layer_forward(_ handle: OpaquePointer?, _ x: UnsafePointer<Float>?, _ tokens: Int64,
                              _ residual: UnsafePointer<Float>?, _ y: UnsafeMutablePointer<Float>?) -> moe_status {
    status {
        let layer = try layer(handle)
        if tokens == 0 { return CallStats.begin(layer.backendKind, tokens: 0) }
        guard let x else { throw MoEError.invalidArgument("x is NULL") }
        guard let y else { throw MoEError.invalidArgument("y is NULL") }
        try layer.forward(x, tokens: Int(tokens), residual: residual, into: y)
    }
}

@_cdecl("moe_layer_forward_routed")
public func moe_layer_forward_routed(_ handle: OpaquePointer?, _ x: UnsafePointer<Float>?, _ tokens: Int64,
                                     _ ids: UnsafePointer<Int32>?, _ weights: UnsafePointer<Float>?,
                                     _ y: UnsafeMutablePointer<Float>?) -> moe_status {
    status {
        let layer = try layer(handle)
        if tokens == 0 { return CallStats.begin(layer.backendKind, tokens: 0) }
        guard let x else { throw MoEError.invalidArgument("x is NULL") }
        guard let ids else { throw MoEError.invalidArgument("ids is NULL") }
        guard let weights else { throw MoEError.invalidArgument("weights is NULL") }
        guard let y else { throw MoEError.invalidArgument("y is NULL") }
        try layer.experts(x, tokens: Int(tokens), ids: ids, weights: weights, into: y)
    }
}

@_cdecl("moe_layer_forward_routed_typed")
public func moe_layer_forward_routed_typed(_ handle: OpaquePointer?, _ x: UnsafeRawPointer?, _ xDtype: Int32,
                                           _ tokens: Int64, _ ids: UnsafeRawPointer?, _ idsBytes: Int32,
                                           _ weights: UnsafeRawPointer?, _ weightsDtype: Int32,
                                           _ y: UnsafeMutableRawPointer?, _ yDtype: Int32) -> moe_status {
    status {
        let layer = try layer(handle)
        let types = try [("x_dtype", xDtype), ("weights_dtype", weightsDtype), ("y_dtype", yDtype)].map { name, code in
            guard let type = ScalarType(rawValue: code) else {
                throw MoEError.invalidArgument("\(name) = \(code) is not a moe_dtype (float32, float16 or bfloat16)")
            }
            return type
        }
        guard idsBytes == 4 || idsBytes == 8 else {
            throw MoEError.invalidArgument("ids_bytes must be 4 (int32) or 8 (int64), got \(idsBytes)")
        }
        guard tokens >= 0 && tokens <= Int64(Int32.max) else {
            throw MoEError.invalidArgument("num_tokens must be in 0...\(Int32.max), got \(tokens)")
        }
        if tokens == 0 { return CallStats.begin(layer.backendKind, tokens: 0) }
        guard let x else { throw MoEError.invalidArgument("x is NULL") }
        guard let ids else { throw MoEError.invalidArgument("ids is NULL") }
        guard let weights else { throw MoEError.invalidArgument("weights is NULL") }
        guard let y else { throw MoEError.invalidArgument("y is NULL") }
        let c = layer.configuration
        let (count, pairs) = (Int(tokens) * c.hiddenSize, Int(tokens) * c.topK)
        if types[0] != types[2] && UnsafeRawPointer(y) < x + count * types[0].size && x < UnsafeRawPointer(y) + count * types[2].size {
            throw MoEError.invalidArgument("x and y overlap in different dtypes")
        }
        // float32 and int32 arrays are used where they lie; the others through float32 /
        // int32 copies (a decode step's are a few kilobytes).
        let xs = ActivationRows(x, dtype: types[0], count: count)
        let ws = ActivationRows(weights, dtype: types[1], count: pairs)
        var wideIds: [Int32] = []
        if idsBytes == 8 {
            let wide = ids.assumingMemoryBound(to: Int64.self)
            wideIds = try (0..<pairs).map { n in
                guard let v = Int32(exactly: wide[n]) else {
                    throw MoEError.invalidArgument("ids[\(n / c.topK), \(n % c.topK)] = \(wide[n]) is not an expert id "
                                                   + "(0..<\(c.numExperts))")
                }
                return v
            }
        }
        try wideIds.withUnsafeBufferPointer { wide in
            let idsPointer = idsBytes == 8 ? wide.baseAddress! : ids.assumingMemoryBound(to: Int32.self)
            if types[2] == .float32 {
                try layer.experts(xs.pointer, tokens: Int(tokens), ids: idsPointer, weights: ws.pointer,
                                  into: y.assumingMemoryBound(to: Float.self))
            } else {
                var out = [Float](repeating: 0, count: count)
                try out.withUnsafeMutableBufferPointer { out in
                    try layer.experts(xs.pointer, tokens: Int(tokens), ids: idsPointer, weights: ws.pointer,
                                      into: out.baseAddress!)
                    ActivationRows.store(out, into: y, dtype: types[2])
                }
            }
        }
        withExtendedLifetime((xs, ws)) {}
    }
}

@_cdecl("moe_layer_route")
public func moe_layer_route(_ handle: OpaquePointer?, _ x: UnsafePointer<Float>?, _ tokens: Int64,
                            _ ids: UnsafeMutablePointer<Int32>?, _ weights: UnsafeMutablePointer<Float>?) -> moe_status {
    status {
        let layer = try layer(handle)
        if tokens == 0 { return CallStats.begin(layer.backendKind, tokens: 0) }
        guard let x else { throw MoEError.invalidArgument("x is NULL") }
        guard let ids else { throw MoEError.invalidArgument("ids is NULL") }
        guard let weights else { throw MoEError.invalidArgument("weights is NULL") }
        try layer.route(x, tokens: Int(tokens), ids: ids, weights: weights)
    }
}

@_cdecl("moe_layer_backend")
public func moe_layer_backend(_ handle: OpaquePointer?) -> Int32 {
    guard let handle, let layer = liveLayers.withLock({ layersByHandle[handle] }) else { return -1 }
    return layer.backendKind.rawValue
}

@_cdecl("moe_layer_get_info")
public func moe_layer_get_info(_ handle: OpaquePointer?, _ out: UnsafeMutablePointer<moe_layer_info>?) -> moe_status {
    status {
        let layer = try layer(handle)
        try writeInfo(layer.configuration, backend: layer.backendKind, to: out)
    }
}

/// moe_layer_info of a configuration into the caller's struct (its first struct_size bytes).
func writeInfo(_ c: MoEConfiguration, backend: MoEBackendKind, to out: UnsafeMutablePointer<moe_layer_info>?) throws {
    guard let out else { throw MoEError.invalidArgument("out is NULL") }
    let size = Int(out.pointee.struct_size)
    guard size >= 8 else { throw MoEError.invalidArgument("out->struct_size is \(size); set it to sizeof(moe_layer_info)") }
    var info = moe_layer_info(struct_size: out.pointee.struct_size, backend: backend.rawValue,
                              hidden_size: Int64(c.hiddenSize), intermediate_size: Int64(c.intermediateSize),
                              num_experts: Int64(c.numExperts), top_k: Int64(c.topK),
                              shared_intermediate_size: Int64(c.sharedIntermediateSize),
                              first_local_expert: Int64(c.heldExperts.first),
                              num_local_experts: Int64(c.heldExperts.count),
                              local_expert_stride: Int64(c.heldExperts.stride))
    // An older caller's shorter struct gets only the fields it knows.
    withUnsafeBytes(of: &info) { src in
        UnsafeMutableRawPointer(out).copyMemory(from: src.baseAddress!, byteCount: Swift.min(size, src.count))
    }
}

@_cdecl("moe_layer_destroy")
public func moe_layer_destroy(_ handle: OpaquePointer?) {
    guard let handle else { return }
    _ = liveLayers.withLock { layersByHandle.removeValue(forKey: handle) }
}

@_cdecl("moe_forward_desc_init")
public func moe_forward_desc_init(_ desc: UnsafeMutablePointer<moe_forward_desc>?) {
    desc?.pointee = moe_forward_desc()
    desc?.pointee.struct_size = UInt32(MemoryLayout<moe_forward_desc>.size)
}

@_cdecl("moe_layer_forward_ex")
public func moe_layer_forward_ex(_ handle: OpaquePointer?, _ desc: UnsafePointer<moe_forward_desc>?) -> moe_status {
    status {
        let layer = try layer(handle)
        guard let desc else { throw MoEError.invalidArgument("desc is NULL") }
        let d = try ForwardDescriptor.read(desc)
        let options = try ForwardDescriptor.options(d)
        try options.validate()  // also for 0 tokens: a bad eps is the caller's bug either way
        if d.num_tokens == 0 { return CallStats.begin(layer.backendKind, tokens: 0) }
        guard d.num_tokens > 0 && d.num_tokens <= Int64(Int32.max) else {
            throw MoEError.invalidArgument("num_tokens must be in 0...\(Int32.max), got \(d.num_tokens)")
        }
        guard let x = d.x else { throw MoEError.invalidArgument("x is NULL") }
        guard let y = d.y else { throw MoEError.invalidArgument("y is NULL") }
        try layer.forward(x, tokens: Int(d.num_tokens), options: options, into: y)
    }
}

@_cdecl("moe_run_layers")
public func moe_run_layers(_ handles: UnsafePointer<OpaquePointer?>?, _ count: Int64, _ x: UnsafePointer<Float>?,
                           _ tokens: Int64, _ y: UnsafeMutablePointer<Float>?) -> moe_status {
    moe_run_layers_ex(handles, count, x, tokens, y, nil)
}

@_cdecl("moe_run_layers_ex")
public func moe_run_layers_ex(_ handles: UnsafePointer<OpaquePointer?>?, _ count: Int64, _ x: UnsafePointer<Float>?,
                              _ tokens: Int64, _ y: UnsafeMutablePointer<Float>?,
                              _ inputNorms: UnsafePointer<moe_rms_norm>?) -> moe_status {
    status {
        let layers = try liveLayers(handles, count)
        guard tokens >= 0 && tokens <= Int64(Int32.max) else {
            throw MoEError.invalidArgument("num_tokens must be in 0...\(Int32.max), got \(tokens)")
        }
        if tokens > 0 {
            guard x != nil else { throw MoEError.invalidArgument("x is NULL") }
            guard y != nil else { throw MoEError.invalidArgument("y is NULL") }
        }
        let norms = try inputNorms.map { norms in
            try (0..<Int(count)).map { i in
                guard let norm = ForwardDescriptor.norm(norms[i]) else {
                    throw MoEError.invalidArgument("input_norms[\(i)].weight is NULL")
                }
                return norm
            }
        }
        let dummy = UnsafeMutablePointer<Float>.allocate(capacity: 1)
        defer { dummy.deallocate() }
        try MoELayer.runLayers(layers, x ?? UnsafePointer(dummy), tokens: Int(tokens), inputNorms: norms,
                               into: y ?? dummy)
    }
}
