// The encode calls of the C ABI (moe_swift.h, "Encode, don't run"): the caller's Metal
// objects arrive as opaque pointers and are bridged back to objects here.
import CMoESwift

/// `moe_encode_desc` read and its objects bridged.
enum EncodeDescriptor {
    static let minimumSize = MemoryLayout<moe_encode_desc>.offset(of: \moe_encode_desc.normed)!
        + MemoryLayout<moe_metal_array>.size

    /// The first `struct_size` bytes over the defaults, so shorter (older) structs get them.
    static func read(_ pointer: UnsafePointer<moe_encode_desc>?) throws -> moe_encode_desc {
        guard let pointer else { throw MoEError.invalidArgument("desc is NULL") }
        let size = Int(pointer.pointee.struct_size)
        guard size >= minimumSize else {
            throw MoEError.invalidArgument(
                "desc.struct_size is \(size); call moe_encode_desc_init() before filling the descriptor")
        }
        var d = moe_encode_desc()
        moe_encode_desc_init(&d)
        withUnsafeMutableBytes(of: &d) { dst in
            dst.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: Swift.min(size, dst.count)))
        }
        return d
    }

    /// The object behind an opaque pointer, borrowed (a Metal object is retained by
    /// whoever made it; so is SoftMetal's). A pointer that is not an object cannot be told
    /// from one: the header says so.
    static func object<T>(_ pointer: UnsafeMutableRawPointer?, _ name: String, as type: T.Type, what: String) throws -> T? {
        guard let pointer else { return nil }
        let object = Unmanaged<AnyObject>.fromOpaque(pointer).takeUnretainedValue()
        guard let typed = object as? T else {
            throw MoEError.invalidArgument("\(name) is not \(what)")
        }
        return typed
    }

    static func commandBuffer(_ d: moe_encode_desc) throws -> any MTLCommandBuffer {
        guard let made = try object(d.command_buffer, "command_buffer", as: (any MTLCommandBuffer).self,
                                    what: "an MTLCommandBuffer") else {
            throw MoEError.invalidArgument("command_buffer is NULL")
        }
        return made
    }

    static func encoder(_ d: moe_encode_desc) throws -> (any MTLComputeCommandEncoder)? {
        try object(d.encoder, "encoder", as: (any MTLComputeCommandEncoder).self, what: "an MTLComputeCommandEncoder")
    }

    static func buffer(_ pointer: UnsafeMutableRawPointer?, _ name: String) throws -> (any MTLBuffer)? {
        try object(pointer, name, as: (any MTLBuffer).self, what: "an MTLBuffer")
    }

    /// An array, or nil where its buffer is NULL.
    static func array(_ a: moe_metal_array, _ name: String) throws -> MoEMetalArray? {
        guard let buffer = try buffer(a.buffer, "\(name).buffer") else { return nil }
        guard let dtype = ScalarType(rawValue: a.dtype) else {
            throw MoEError.invalidArgument("\(name).dtype = \(a.dtype) is not a moe_dtype")
        }
        guard a.offset >= 0 && a.offset <= Int64(Int.max) else {
            throw MoEError.invalidArgument("\(name).offset \(a.offset) is negative")
        }
        return MoEMetalArray(buffer, offset: Int(a.offset), dtype: dtype)
    }

    static func required(_ a: moe_metal_array, _ name: String) throws -> MoEMetalArray {
        guard let made = try array(a, name) else { throw MoEError.invalidArgument("\(name).buffer is NULL") }
        return made
    }

    static func tokens(_ d: moe_encode_desc) throws -> Int {
        guard d.num_tokens >= 0 && d.num_tokens <= Int64(Int32.max) else {
            throw MoEError.invalidArgument("num_tokens must be in 0...\(Int32.max), got \(d.num_tokens)")
        }
        return Int(d.num_tokens)
    }

    /// The fences and events of `d` (MoEMetalSync).
    static func sync(_ d: moe_encode_desc) throws -> MoEMetalSync {
        func fences(_ list: UnsafePointer<UnsafeMutableRawPointer?>?, _ count: Int32, _ name: String) throws -> [any MTLFence] {
            guard count > 0 else {
                if count < 0 { throw MoEError.invalidArgument("num_\(name) is negative (\(count))") }
                return []
            }
            guard count <= 64 else { throw MoEError.invalidArgument("num_\(name) is \(count); at most 64 fences") }
            guard let list else { throw MoEError.invalidArgument("\(name) is NULL but num_\(name) is \(count)") }
            return try (0..<Int(count)).map { i in
                guard let fence = try object(list[i], "\(name)[\(i)]", as: (any MTLFence).self, what: "an MTLFence") else {
                    throw MoEError.invalidArgument("\(name)[\(i)] is NULL")
                }
                return fence
            }
        }
        func event(_ pointer: UnsafeMutableRawPointer?, _ value: UInt64, _ name: String) throws -> MoEMetalEventValue? {
            try object(pointer, name, as: (any MTLEvent).self, what: "an MTLEvent").map { MoEMetalEventValue($0, value: value) }
        }
        return MoEMetalSync(waitFences: try fences(d.wait_fences, d.num_wait_fences, "wait_fences"),
                            updateFences: try fences(d.update_fences, d.num_update_fences, "update_fences"),
                            waitEvent: try event(d.wait_event, d.wait_value, "wait_event"),
                            signalEvent: try event(d.signal_event, d.signal_value, "signal_event"))
    }

    /// For the calls that take only x and y: the other fields must be unset.
    static func requireOnlyXAndY(_ d: moe_encode_desc, _ call: String) throws {
        if d.residual.buffer != nil || d.residual_is_input != 0 || d.input_norm.weight != nil
            || d.next_norm.weight != nil || d.normed.buffer != nil {
            throw MoEError.invalidArgument("\(call) takes no residual, norms or normed in desc")
        }
    }
}

@_cdecl("moe_encode_desc_init")
public func moe_encode_desc_init(_ desc: UnsafeMutablePointer<moe_encode_desc>?) {
    guard let desc else { return }
    desc.pointee = moe_encode_desc()
    desc.pointee.struct_size = UInt32(MemoryLayout<moe_encode_desc>.size)
    let f32 = Int32(MOE_DTYPE_F32.rawValue)
    desc.pointee.x.dtype = f32
    desc.pointee.residual.dtype = f32
    desc.pointee.y.dtype = f32
    desc.pointee.normed.dtype = f32
}

@_cdecl("moe_layer_encode")
public func moe_layer_encode(_ handle: OpaquePointer?, _ desc: UnsafePointer<moe_encode_desc>?) -> moe_status {
    status {
        let layer = try liveLayer(handle)
        let d = try EncodeDescriptor.read(desc)
        let residual: MoEMetalResidual
        switch (d.residual_is_input != 0, try EncodeDescriptor.array(d.residual, "residual")) {
        case (true, nil): residual = .input
        case (true, _?): throw MoEError.invalidArgument("give residual or residual_is_input, not both")
        case (false, let r?): residual = .array(r)
        case (false, nil): residual = .none
        }
        let next = ForwardDescriptor.norm(d.next_norm)
        let normed = try EncodeDescriptor.array(d.normed, "normed")
        if next == nil && normed != nil { throw MoEError.invalidArgument("normed is set but next_norm.weight is NULL") }
        let options = MoEEncodeOptions(inputNorm: ForwardDescriptor.norm(d.input_norm), residual: residual,
                                       nextNorm: next, normedOutput: normed)
        try layer.encodeForward(try EncodeDescriptor.required(d.x, "x"), tokens: try EncodeDescriptor.tokens(d),
                                options: options, into: try EncodeDescriptor.required(d.y, "y"),
                                commandBuffer: try EncodeDescriptor.commandBuffer(d),
                                encoder: try EncodeDescriptor.encoder(d), sync: try EncodeDescriptor.sync(d))
    }
}

@_cdecl("moe_layer_encode_routed")
public func moe_layer_encode_routed(_ handle: OpaquePointer?, _ desc: UnsafePointer<moe_encode_desc>?,
                                    _ ids: UnsafeMutableRawPointer?, _ idsOffset: Int64,
                                    _ weights: UnsafeMutableRawPointer?, _ weightsOffset: Int64) -> moe_status {
    status {
        let layer = try liveLayer(handle)
        let d = try EncodeDescriptor.read(desc)
        try EncodeDescriptor.requireOnlyXAndY(d, "moe_layer_encode_routed")
        guard let idsBuffer = try EncodeDescriptor.buffer(ids, "ids_buffer") else {
            throw MoEError.invalidArgument("ids_buffer is NULL")
        }
        guard let weightsBuffer = try EncodeDescriptor.buffer(weights, "weights_buffer") else {
            throw MoEError.invalidArgument("weights_buffer is NULL")
        }
        guard idsOffset >= 0, weightsOffset >= 0 else {
            throw MoEError.invalidArgument("ids_offset and weights_offset must not be negative")
        }
        let routing = MoEMetalRouting(ids: idsBuffer, idsOffset: Int(idsOffset), weights: weightsBuffer,
                                      weightsOffset: Int(weightsOffset))
        try layer.encodeExperts(try EncodeDescriptor.required(d.x, "x"), tokens: try EncodeDescriptor.tokens(d),
                                routing: routing, into: try EncodeDescriptor.required(d.y, "y"),
                                commandBuffer: try EncodeDescriptor.commandBuffer(d),
                                encoder: try EncodeDescriptor.encoder(d), sync: try EncodeDescriptor.sync(d))
    }
}

@_cdecl("moe_run_layers_encode")
public func moe_run_layers_encode(_ handles: UnsafePointer<OpaquePointer?>?, _ count: Int64,
                                  _ desc: UnsafePointer<moe_encode_desc>?,
                                  _ inputNorms: UnsafePointer<moe_rms_norm>?) -> moe_status {
    status {
        let layers = try liveLayers(handles, count)
        let d = try EncodeDescriptor.read(desc)
        try EncodeDescriptor.requireOnlyXAndY(d, "moe_run_layers_encode")
        let norms = try inputNorms.map { norms in
            try (0..<layers.count).map { i in
                guard let norm = ForwardDescriptor.norm(norms[i]) else {
                    throw MoEError.invalidArgument("input_norms[\(i)].weight is NULL")
                }
                return norm
            }
        }
        try MoELayer.encodeLayers(layers, try EncodeDescriptor.required(d.x, "x"), tokens: try EncodeDescriptor.tokens(d),
                                  inputNorms: norms, into: try EncodeDescriptor.required(d.y, "y"),
                                  commandBuffer: try EncodeDescriptor.commandBuffer(d),
                                  encoder: try EncodeDescriptor.encoder(d), sync: try EncodeDescriptor.sync(d))
    }
}
