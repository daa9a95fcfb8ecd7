import CMoESwift

/// What the calling thread's current call does on its device, in the C thread-local slot
/// that moe_last_stats() reads (so Swift, C and Python see the same numbers). Each public
/// call (layer creation, forward, route, runLayers) starts with `begin`.
public struct MoECallStats: Equatable, Sendable {
    /// The backend of the call (nil before any call on this thread).
    public var backend: MoEBackendKind?
    public var tokens: Int
    public var layers: Int
    /// Compute kernels encoded.
    public var dispatches: Int
    /// Command buffers committed.
    public var commandBuffers: Int
    /// Times the CPU waited for the GPU.
    public var cpuWaits: Int
    /// Device buffers created during the call, and their total length.
    public var allocations: Int
    public var allocatedBytes: Int
    /// Activation arrays (input, residual, output, normed rows, routing) copied between
    /// host memory and device buffers: the staging of the pointer API; 0 for the encode calls.
    public var hostCopies: Int

    /// The calling thread's last call.
    public static var last: MoECallStats {
        let s = moe_internal_stats()!.pointee
        return MoECallStats(backend: MoEBackendKind(rawValue: s.backend), tokens: Int(s.tokens),
                            layers: Int(s.layers), dispatches: Int(s.dispatches),
                            commandBuffers: Int(s.command_buffers), cpuWaits: Int(s.cpu_waits),
                            allocations: Int(s.allocations), allocatedBytes: Int(s.allocated_bytes),
                            hostCopies: Int(s.host_copies))
    }
}

/// Counting into the calling thread's slot.
enum CallStats {
    static func begin(_ backend: MoEBackendKind, tokens: Int, layers: Int = 1) {
        var s = moe_stats()
        s.struct_size = UInt32(MemoryLayout<moe_stats>.size)
        s.backend = backend.rawValue
        s.tokens = Int64(tokens)
        s.layers = Int64(layers)
        moe_internal_stats()!.pointee = s
    }

    static func dispatch() { moe_internal_stats()!.pointee.dispatches += 1 }
    static func commandBuffer() { moe_internal_stats()!.pointee.command_buffers += 1 }
    static func cpuWait() { moe_internal_stats()!.pointee.cpu_waits += 1 }
    static func hostCopy() { moe_internal_stats()!.pointee.host_copies += 1 }
    static func allocation(bytes: Int) {
        let s = moe_internal_stats()!
        s.pointee.allocations += 1
        s.pointee.allocated_bytes += Int64(bytes)
    }
}
