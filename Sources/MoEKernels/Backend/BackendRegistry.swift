/// Which backends exist in this build and process, and how `.auto` chooses among them.
enum BackendRegistry {
    /// Best first.
    static var available: [MoEBackendKind] { [.cpu] }

    static func make(_ kind: MoEBackendKind, configuration: MoEConfiguration,
                     weights: MoEWeights) throws -> any MoEBackend {
        switch kind {
        case .auto, .cpu:
            return try CPUBackend(configuration: configuration, weights: weights)
        case .metal:
            throw MoEError.unavailable("the metal backend needs an Apple GPU; available here: \(names)")
        case .softMetal:
            throw MoEError.unavailable("the softmetal backend is not built yet; available here: \(names)")
        }
    }

    private static var names: String { available.map(\.name).joined(separator: ", ") }
}
