import CMoESwift

/// `moe_forward_desc` read into MoEForwardOptions.
enum ForwardDescriptor {
    /// The first version of the struct: a caller's struct_size below this is not a
    /// moe_forward_desc at all.
    static let minimumSize = MemoryLayout<moe_forward_desc>.offset(of: \moe_forward_desc.normed)!
        + MemoryLayout<UnsafeMutablePointer<Float>?>.size

    /// The first `struct_size` bytes over zeros, so shorter (older) structs get defaults.
    static func read(_ pointer: UnsafePointer<moe_forward_desc>) throws -> moe_forward_desc {
        let size = Int(pointer.pointee.struct_size)
        guard size >= minimumSize else {
            throw MoEError.invalidArgument(
                "desc.struct_size is \(size); call moe_forward_desc_init() before filling the descriptor")
        }
        var d = moe_forward_desc()
        withUnsafeMutableBytes(of: &d) { dst in
            dst.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: Swift.min(size, dst.count)))
        }
        return d
    }

    /// A norm, or nil where its weight is NULL (validated later, with the call).
    static func norm(_ n: moe_rms_norm) -> RMSNorm? {
        n.weight.map { RMSNorm(weight: $0, eps: n.eps, offset: n.offset) }
    }

    static func options(_ d: moe_forward_desc) throws -> MoEForwardOptions {
        let residual: MoEResidual
        switch (d.residual_is_input != 0, d.residual) {
        case (true, nil): residual = .input
        case (true, _?): throw MoEError.invalidArgument("give residual or residual_is_input, not both")
        case (false, let r?): residual = .buffer(r)
        case (false, nil): residual = .none
        }
        let next = norm(d.next_norm)
        if next == nil && d.normed != nil {
            throw MoEError.invalidArgument("normed is set but next_norm.weight is NULL")
        }
        return MoEForwardOptions(inputNorm: norm(d.input_norm), residual: residual,
                                 nextNorm: next, normedOutput: d.normed)
    }
}
