// The checkpoint functions of moe_swift.h: handles registered like layers', so that a stale
// or forged handle is an error, not a crash.
import CMoESwift
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

private let liveCheckpoints = Lock()
nonisolated(unsafe) private var checkpointsByHandle: [OpaquePointer: Checkpoint] = [:]
nonisolated(unsafe) private var lastCheckpointHandle = 0

private func checkpoint(_ handle: OpaquePointer?) throws -> Checkpoint {
    guard let handle else { throw MoEError.invalidArgument("checkpoint handle is NULL") }
    guard let checkpoint = liveCheckpoints.withLock({ checkpointsByHandle[handle] }) else {
        throw MoEError.invalidArgument("checkpoint handle \(handle) is not open (closed, or never opened)")
    }
    return checkpoint
}

@_cdecl("moe_checkpoint_open")
public func moe_checkpoint_open(_ path: UnsafePointer<CChar>?, _ out: UnsafeMutablePointer<OpaquePointer?>?) -> moe_status {
    status {
        guard let out else { throw MoEError.invalidArgument("out (the moe_checkpoint** to fill) is NULL") }
        out.pointee = nil
        guard let path else { throw MoEError.invalidArgument("path is NULL") }
        // The path's bytes as they are: a folder name need not be UTF-8.
        let opened = try Checkpoint(pathBytes: Array(UnsafeBufferPointer(start: UnsafeRawPointer(path)
            .assumingMemoryBound(to: UInt8.self), count: strlen(path))))
        out.pointee = liveCheckpoints.withLock { () -> OpaquePointer in
            lastCheckpointHandle += 16
            let handle = OpaquePointer(bitPattern: lastCheckpointHandle)!
            checkpointsByHandle[handle] = opened
            return handle
        }
    }
}

@_cdecl("moe_checkpoint_moe_layers")
public func moe_checkpoint_moe_layers(_ handle: OpaquePointer?, _ indices: UnsafeMutablePointer<Int32>?,
                                      _ capacity: Int32, _ count: UnsafeMutablePointer<Int32>?) -> moe_status {
    status {
        let layers = try checkpoint(handle).moeLayers
        guard let count else { throw MoEError.invalidArgument("count is NULL") }
        guard capacity >= 0 else { throw MoEError.invalidArgument("capacity must be >= 0, got \(capacity)") }
        if capacity > 0 && indices == nil { throw MoEError.invalidArgument("indices is NULL but capacity is \(capacity)") }
        for (i, layer) in layers.prefix(Int(capacity)).enumerated() { indices![i] = Int32(layer) }
        count.pointee = Int32(layers.count)
    }
}

@_cdecl("moe_checkpoint_layer_info")
public func moe_checkpoint_layer_info(_ handle: OpaquePointer?, _ layer: Int32,
                                      _ out: UnsafeMutablePointer<moe_layer_info>?) -> moe_status {
    status {
        let c = try checkpoint(handle).configuration(layer: Int(layer), overrides: [:])
        try writeInfo(c, backend: .auto, to: out)
    }
}

@_cdecl("moe_layer_create_from_checkpoint")
public func moe_layer_create_from_checkpoint(_ handle: OpaquePointer?, _ layer: Int32, _ backend: Int32,
                                             _ numOverrides: Int32, _ names: UnsafePointer<UnsafePointer<CChar>?>?,
                                             _ values: UnsafePointer<Double>?,
                                             _ out: UnsafeMutablePointer<OpaquePointer?>?) -> moe_status {
    moe_layer_create_from_checkpoint_ex(handle, layer, backend, numOverrides, names, values, nil, out)
}

@_cdecl("moe_load_options_init")
public func moe_load_options_init(_ options: UnsafeMutablePointer<moe_load_options>?) {
    guard let options else { return }
    options.pointee = moe_load_options()
    options.pointee.struct_size = UInt32(MemoryLayout<moe_load_options>.size)
}

@_cdecl("moe_layer_create_from_checkpoint_ex")
public func moe_layer_create_from_checkpoint_ex(_ handle: OpaquePointer?, _ layer: Int32, _ backend: Int32,
                                                _ numOverrides: Int32, _ names: UnsafePointer<UnsafePointer<CChar>?>?,
                                                _ values: UnsafePointer<Double>?,
                                                _ options: UnsafePointer<moe_load_options>?,
                                                _ out: UnsafeMutablePointer<OpaquePointer?>?) -> moe_status {
    status {
        guard let out else { throw MoEError.invalidArgument("out (the moe_layer** to fill) is NULL") }
        out.pointee = nil
        let checkpoint = try checkpoint(handle)
        let kind = try MoEBackendKind.decoded(backend, field: "backend")
        var overrides: [String: Double] = [:]
        if numOverrides != 0 {
            guard numOverrides > 0, let names, let values else {
                throw MoEError.invalidArgument("num_overrides is \(numOverrides): it needs override_names and override_values")
            }
            for i in 0..<Int(numOverrides) {
                guard let name = names[i] else { throw MoEError.invalidArgument("override_names[\(i)] is NULL") }
                overrides[String(cString: name)] = values[i]
            }
        }
        // The caller's first struct_size bytes over the defaults (all 0).
        var load = moe_load_options()
        if let options {
            let size = Int(options.pointee.struct_size)
            guard size >= MemoryLayout<moe_load_options>.offset(of: \moe_load_options.copy_weights)! + 4 else {
                throw MoEError.invalidArgument("options.struct_size is \(size); call moe_load_options_init() first")
            }
            withUnsafeMutableBytes(of: &load) { dst in
                dst.copyMemory(from: UnsafeRawBufferPointer(start: options, count: Swift.min(size, dst.count)))
            }
        }
        guard load.memory_limit >= 0 else {
            throw MoEError.invalidArgument("memory_limit must be >= 0 bytes (0: no limit), got \(load.memory_limit)")
        }
        let share = try LayerDescriptor.share(first: load.first_local_expert, count: load.num_local_experts,
                                              stride: load.local_expert_stride, numExperts: nil)
        let made = try MoELayer(checkpoint: checkpoint, layer: Int(layer), backend: kind, overrides: overrides,
                                copyWeights: load.copy_weights != 0,
                                memoryLimit: load.memory_limit == 0 ? nil : Int(load.memory_limit),
                                localExperts: share, sharedExpert: load.without_shared_expert == 0,
                                sharedExpertPart: load.shared_expert_parts > 1
                                    ? (Int(load.shared_expert_part), Int(load.shared_expert_parts)) : nil)
        out.pointee = register(made)
    }
}

@_cdecl("moe_checkpoint_close")
public func moe_checkpoint_close(_ handle: OpaquePointer?) {
    guard let handle else { return }
    _ = liveCheckpoints.withLock { checkpointsByHandle.removeValue(forKey: handle) }
}
