/// Which backends exist in this build and process, and how `.auto` chooses among them.
///
/// "metal" is the Metal backend on an Apple GPU (Apple platforms); "softmetal" is the same
/// backend code on SoftMetal, the software Metal device (Linux only: a CPU emulation for
/// tests, never chosen by "auto"); "auto" picks "metal" when it can start, else "cpu".
enum BackendRegistry {
    /// Best first.
    static var available: [MoEBackendKind] {
        var kinds: [MoEBackendKind] = []
        if metalAvailable { kinds.append(.metal) }
        kinds.append(.cpu)
        if softMetalAvailable { kinds.append(.softMetal) }
        return kinds
    }

    /// `memoryLimit`: bytes the weights' copies may take at most (beside what the system
    /// has left; see MemoryBudget).
    static func make(_ kind: MoEBackendKind, configuration: MoEConfiguration,
                     weights: MoEWeights, memoryLimit: Int? = nil) throws -> any MoEBackend {
        switch kind {
        case .auto:
            if metalAvailable, let backend = try? makeMetal(configuration, weights, memoryLimit) { return backend }
            return try CPUBackend(configuration: configuration, weights: weights, memoryLimit: memoryLimit)
        case .cpu:
            return try CPUBackend(configuration: configuration, weights: weights, memoryLimit: memoryLimit)
        case .metal:
            guard metalDeviceKind == .metal else {
                throw MoEError.unavailable("the metal backend needs an Apple GPU (Metal); this build has none. "
                                           + "\"softmetal\" runs the same backend code on the CPU. Available here: \(names)")
            }
            return try makeMetal(configuration, weights, memoryLimit)
        case .softMetal:
            guard metalDeviceKind == .softMetal else {
                throw MoEError.unavailable("the softmetal backend (the software Metal device) is only built on Linux; "
                                           + "on Apple platforms use metal. Available here: \(names)")
            }
            return try makeMetal(configuration, weights, memoryLimit)
        }
    }

    // The kind is checked first: asking MetalContext starts the device (on Linux,
    // SoftMetal compiles the kernels), which `available` must not do for a kind this
    // build cannot have.
    private static var metalAvailable: Bool { metalDeviceKind == .metal && MetalContext.isAvailable }

    private static var softMetalAvailable: Bool { metalDeviceKind == .softMetal && MetalContext.isAvailable }

    private static func makeMetal(_ c: MoEConfiguration, _ w: MoEWeights, _ memoryLimit: Int?) throws -> any MoEBackend {
        try MetalBackend(configuration: c, weights: w, memoryLimit: memoryLimit)
    }

    private static var names: String { available.map(\.name).joined(separator: ", ") }
}
