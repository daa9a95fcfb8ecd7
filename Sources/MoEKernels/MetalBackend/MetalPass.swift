import CMoESwift

/// One command buffer with one compute encoder, committed once with one wait: what a
/// call records its passes into (one forward, or every layer of run_layers).
final class MetalSession {
    let commandBuffer: any MTLCommandBuffer
    let encoder: any MTLComputeCommandEncoder
    private let kind: MoEBackendKind
    private var ended = false

    init(_ backend: MetalBackend) throws {
        guard let commandBuffer = backend.context.queue.makeCommandBuffer(),
              let encoder = commandBuffer.makeComputeCommandEncoder() else {
            throw MoEError.internalError("the \(backend.kind.name) backend could not create a command buffer")
        }
        self.commandBuffer = commandBuffer
        self.encoder = encoder
        kind = backend.kind
    }

    deinit {
        if !ended { encoder.endEncoding() }  // Metal requires it before an encoder goes away
    }

    /// Ends encoding, commits, and waits: the one wait of a call.
    func run() throws {
        ended = true
        encoder.endEncoding()
        commandBuffer.commit()
        CallStats.commandBuffer()
        commandBuffer.waitUntilCompleted()
        CallStats.cpuWait()
        if let error = commandBuffer.error {
            throw MoEError.internalError("the \(kind.name) command buffer failed: \(error)")
        }
    }
}

/// One layer's pass on the Metal backend: the stages are encoded as they are called into
/// its session's command buffer; `finish` runs the session and copies the results out.
/// x (the input, then the output: the combine writes it in place) is a device buffer: the
/// pass's own scratch, with the input copied in, or the one of the session's previous pass.
final class MetalPass: MoEPass {
    private let backend: MetalBackend
    private let scratch: MetalScratch
    private let session: MetalSession
    private var layer: MetalLayerEncoder
    private let tokens: Int
    private let input: UnsafePointer<Float>
    /// The device buffer holding x.
    let x: any MTLBuffer
    private var output: UnsafeMutablePointer<Float>?
    private var normedOutput: UnsafeMutablePointer<Float>?

    init(backend: MetalBackend, input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?,
         session: MetalSession? = nil, x: (any MTLBuffer)? = nil) throws {
        let scratch = try backend.checkOutScratch(tokens: tokens)
        do {
            self.session = try session ?? MetalSession(backend)
        } catch {
            backend.pool.checkIn(scratch)
            throw error
        }
        self.backend = backend
        self.scratch = scratch
        self.tokens = tokens
        self.input = input
        let h = backend.configuration.hiddenSize
        if let x {
            self.x = x
        } else {
            scratch.x.contents().copyMemory(from: input, byteCount: tokens * h * MemoryLayout<Float>.stride)
            self.x = scratch.x
        }
        layer = MetalLayerEncoder(backend: backend, encoder: self.session.encoder, scratch: scratch, tokens: tokens, x: self.x)
        if let inputNorm {
            MetalScratch.upload(inputNorm, hidden: h, to: scratch.inputNormWeight)
            layer.inputNorm = inputNorm
        }
    }

    deinit { backend.pool.checkIn(scratch) }

    func route() { layer.route() }

    /// The routing goes where the router would have written it: the later stages read it
    /// on the device as usual.
    func setRouting(ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>) {
        let count = tokens * backend.configuration.topK
        scratch.ids.contents().assumingMemoryBound(to: Int32.self).update(from: ids, count: count)
        scratch.weights.contents().assumingMemoryBound(to: Float.self).update(from: weights, count: count)
        layer.withShared = false
    }
    func groupPairsByExpert() { layer.groupPairsByExpert() }
    func gateUp() { layer.gateUp() }
    func down() { layer.down() }

    func combine(residual: UnsafePointer<Float>?, output: UnsafeMutablePointer<Float>, next: NextNorm?) {
        let h = backend.configuration.hiddenSize
        // The input as residual (a decoder block, a layer of a stack) is on the device already.
        var residualBuffer: (any MTLBuffer)? = residual == input ? x : nil
        if let residual, residual != input {
            scratch.residual.contents().copyMemory(from: residual, byteCount: tokens * h * MemoryLayout<Float>.stride)
            residualBuffer = scratch.residual
        }
        if let next { MetalScratch.upload(next.norm, hidden: h, to: scratch.nextNormWeight) }
        // The output overwrites x: nothing reads x after the expert stages (the combine
        // reads each element as residual before it writes it).
        layer.combine(residual: residualBuffer, output: x, nextNorm: next?.norm)
        self.output = output
        normedOutput = next?.output
    }

    func finish() throws {
        try session.run()
        let count = tokens * backend.configuration.hiddenSize
        output?.update(from: x.contents().assumingMemoryBound(to: Float.self), count: count)
        normedOutput?.update(from: scratch.normed.contents().assumingMemoryBound(to: Float.self), count: count)
    }

    func readRouting(ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) {
        let count = tokens * backend.configuration.topK
        ids.update(from: scratch.ids.contents().assumingMemoryBound(to: Int32.self), count: count)
        weights.update(from: scratch.weights.contents().assumingMemoryBound(to: Float.self), count: count)
    }
}

/// run_layers on the Metal backend: every layer's pass is recorded into one session (one
/// command buffer, one wait), x stays in one device buffer that each layer's combine
/// updates in place (its residual is x itself); with an input norm, each layer's router
/// normalises x into that layer's scratch first and its experts read that.
final class MetalStackSession: MoEStackSession {
    private let session: MetalSession
    private let input: UnsafePointer<Float>
    private let output: UnsafeMutablePointer<Float>
    private let tokens: Int
    private var passes: [MetalPass] = []

    init(_ backend: MetalBackend, input: UnsafePointer<Float>, tokens: Int, output: UnsafeMutablePointer<Float>) throws {
        session = try MetalSession(backend)
        self.input = input
        self.output = output
        self.tokens = tokens
    }

    func nextPass(_ backend: any MoEBackend, inputNorm: RMSNorm?) throws
        -> (pass: any MoEPass, x: UnsafePointer<Float>, next: UnsafeMutablePointer<Float>) {
        guard let metal = backend as? MetalBackend else {
            throw MoEError.invalidArgument("every layer of a stack must run on the same backend")
        }
        let pass = try MetalPass(backend: metal, input: input, tokens: tokens, inputNorm: inputNorm,
                                 session: session, x: passes.first?.x)
        passes.append(pass)
        // x as the residual is `input` (on the device: x); the last pass's finish copies x out.
        return (pass, input, output)
    }

    func finish() throws {
        guard let last = passes.last else { return }
        try last.finish()
    }
}
