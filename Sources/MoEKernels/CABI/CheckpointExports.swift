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

@_cdecl("moe_layer_create_from_checkpoint")
public func moe_layer_create_from_checkpoint(_ handle: OpaquePointer?, _ layer: Int32, _ backend: Int32,
                                             _ numOverrides: Int32, _ names: UnsafePointer<UnsafePointer<CChar>?>?,
                                             _ values: UnsafePointer<Double>?,
                                             _ out: UnsafeMutablePointer<OpaquePointer?>?) -> moe_status {
    status {
        guard let out else { throw MoEError.invalidArgument("out (the moe_layer** to fill) is NULL") }
        out.pointee = nil
        let checkpoint = try checkpoint(handle)
        guard let kind = MoEBackendKind(rawValue: backend) else {
            throw MoEError.invalidArgument("backend \(backend) is not a moe_backend value")
        }
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
        let made = try MoELayer(checkpoint: checkpoint, layer: Int(layer), backend: kind, overrides: overrides)
        out.pointee = register(made)
    }
}

@_cdecl("moe_checkpoint_close")
public func moe_checkpoint_close(_ handle: OpaquePointer?) {
    guard let handle else { return }
    _ = liveCheckpoints.withLock { checkpointsByHandle.removeValue(forKey: handle) }
}
