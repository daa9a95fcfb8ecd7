extension MoELayer {
    /// Several layers in one call, each layer's output feeding the next:
    /// `x_{i+1} = x_i + layer_i(x_i)`, and `output = x_n`; with `inputNorms` (one per layer),
    /// a stack of decoder post-attention blocks: `x_{i+1} = x_i + layer_i(inputNorms[i](x_i))`.
    /// All layers must run on the same backend and have the same hidden size; `input` and
    /// `output` (tokens, H) may be the same memory or overlap. On the Metal backends the whole stack is one command
    /// buffer with one wait at its end; on the CPU it is a loop of forwards.
    public static func runLayers(_ layers: [MoELayer], _ input: UnsafePointer<Float>, tokens: Int,
                                 inputNorms: [RMSNorm]? = nil,
                                 into output: UnsafeMutablePointer<Float>) throws {
        guard let first = layers.first else {
            CallStats.begin(.auto, tokens: tokens, layers: 0)
            throw MoEError.invalidArgument("run_layers needs at least one layer")
        }
        let kind = first.backendKind, h = first.configuration.hiddenSize
        CallStats.begin(kind, tokens: tokens, layers: layers.count)
        for (i, layer) in layers.enumerated() {
            guard layer.backendKind == kind else {
                throw MoEError.invalidArgument(
                    "all layers must run on the same backend: layers[0] runs on \(kind.name), layers[\(i)] on \(layer.backendKind.name)")
            }
            guard layer.configuration.hiddenSize == h else {
                throw MoEError.invalidArgument(
                    "all layers must have the same hidden_size: layers[0] has \(h), layers[\(i)] has \(layer.configuration.hiddenSize)")
            }
            try layer.checkCall(tokens: tokens)
            try layer.requireWholeLayer(for: "a stack (each layer's output feeds the next)")
        }
        if let inputNorms {
            guard inputNorms.count == layers.count else {
                throw MoEError.invalidArgument(
                    "input_norms must have one norm per layer (\(layers.count)), got \(inputNorms.count)")
            }
            for (i, norm) in inputNorms.enumerated() { try norm.validate("input_norms[\(i)]") }
        }
        if tokens == 0 { return }
        try writing(output, count: tokens * h, readingFrom: [input]) { output in
            try withAutoreleasePool {
                let session = try first.backend.makeStackSession(input: input, tokens: tokens, hiddenSize: h, output: output)
                for (i, layer) in layers.enumerated() {
                    let (pass, x, next) = try session.nextPass(layer.backend, inputNorm: inputNorms?[i])
                    try pass.runLayer(residual: x, output: next, next: nil)
                }
                try session.finish()
            }
        }
    }
}
