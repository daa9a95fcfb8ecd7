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

    static func make(_ kind: MoEBackendKind, configuration: MoEConfiguration,
                     weights: MoEWeights) throws -> any MoEBackend {
        switch kind {
        case .auto:
            if metalAvailable, let backend = try? makeMetal(configuration, weights) { return backend }
            return try CPUBackend(configuration: configuration, weights: weights)
        case .cpu:
            return try CPUBackend(configuration: configuration, weights: weights)
        case .metal:
            #if canImport(Metal)
            return try makeMetal(configuration, weights)
            #else
            throw MoEError.unavailable("the metal backend needs an Apple GPU (Metal); this build has none. "
                                       + "\"softmetal\" runs the same backend code on the CPU. Available here: \(names)")
            #endif
        case .softMetal:
            #if canImport(SoftMetal) && !canImport(Metal)
            return try makeMetal(configuration, weights)
            #else
            throw MoEError.unavailable("the softmetal backend (the software Metal device) is only built on Linux; "
                                       + "on Apple platforms use metal. Available here: \(names)")
            #endif
        }
    }

    private static var metalAvailable: Bool {
        #if canImport(Metal)
        return MetalContext.isAvailable
        #else
        return false
        #endif
    }

    private static var softMetalAvailable: Bool {
        #if canImport(SoftMetal) && !canImport(Metal)
        return MetalContext.isAvailable
        #else
        return false
        #endif
    }

    #if canImport(Metal) || canImport(SoftMetal)
    private static func makeMetal(_ c: MoEConfiguration, _ w: MoEWeights) throws -> any MoEBackend {
        try MetalBackend(configuration: c, weights: w)
    }
    #else
    private static func makeMetal(_ c: MoEConfiguration, _ w: MoEWeights) throws -> any MoEBackend {
        throw MoEError.unavailable("no Metal backend in this build")
    }
    #endif

    private static var names: String { available.map(\.name).joined(separator: ", ") }
}
