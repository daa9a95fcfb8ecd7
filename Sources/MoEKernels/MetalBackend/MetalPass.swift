import CMoESwift

/// A range of a device buffer as a kernel binds it: `buffer` from byte `offset`.
struct MetalBinding {
    let buffer: any MTLBuffer
    let offset: Int

    init(_ buffer: any MTLBuffer, offset: Int = 0) {
        self.buffer = buffer
        self.offset = offset
    }

    /// The same bytes of the same buffer.
    func isSame(as other: MetalBinding) -> Bool { buffer === other.buffer && offset == other.offset }

    /// Whether `bytes` from here and `otherBytes` from `other` share memory.
    func overlaps(_ other: MetalBinding, bytes: Int, otherBytes: Int) -> Bool {
        buffer === other.buffer && offset < other.offset + otherBytes && other.offset < offset + bytes
    }
}

/// What a call records into: one command buffer and one compute encoder, the call's own or
/// the caller's. Two owners, one recording:
///   - its own (the pointer API): `run` ends the encoder, commits and waits — the one wait
///     of the call; the scratch sets go back to their pools when the session goes away,
///     after the results have been copied out;
///   - the caller's (the encode API): nothing is committed or waited for; `endRecording`
///     ends the encoder only if the session made it, and hands the scratch sets to a
///     completed handler of the caller's command buffer, so a set is reused only once the
///     GPU is done with it and several command buffers can be in flight at once.
final class MetalSession {
    let commandBuffer: any MTLCommandBuffer
    let encoder: any MTLComputeCommandEncoder
    private let kind: MoEBackendKind
    private let ownsEncoder: Bool
    /// The caller's encoder is concurrent: the stages need barriers (MetalLayerEncoder.barriers).
    let needsBarriers: Bool
    private var ended = false
    private var held: [(layer: MetalBackend, scratch: MetalScratch)] = []
    /// The host's fences and events (encode API).
    private let sync: MoEMetalSync

    /// A command buffer of the backend's queue.
    init(_ backend: MetalBackend) throws {
        guard let commandBuffer = backend.context.queue.makeCommandBuffer(),
              let encoder = commandBuffer.makeComputeCommandEncoder() else {
            throw MoEError.internalError("the \(backend.kind.name) backend could not create a command buffer")
        }
        self.commandBuffer = commandBuffer
        self.encoder = encoder
        kind = backend.kind
        ownsEncoder = true
        needsBarriers = false
        sync = MoEMetalSync()
    }

    /// The caller's command buffer, and its open encoder or (nil) one of our own on it.
    /// `holding` are scratch sets already checked out for this call (the session returns
    /// them however it ends).
    init(kind: MoEBackendKind, commandBuffer: any MTLCommandBuffer, encoder: (any MTLComputeCommandEncoder)?,
         holding: [(layer: MetalBackend, scratch: MetalScratch)], sync: MoEMetalSync) throws {
        self.commandBuffer = commandBuffer
        self.kind = kind
        self.sync = sync
        held = holding
        // Events go between encoders: before ours is made (MoEMetalSync.validate refused
        // them with the caller's encoder). Should no encoder be made then (another encoder
        // of the command buffer still open, which Metal's validation stops at the event
        // already), the wait stays recorded: the one thing an error here leaves behind.
        if let wait = sync.waitEvent { commandBuffer.encodeWaitForEvent(wait.event, value: wait.value) }
        if let encoder {
            self.encoder = encoder
            ownsEncoder = false
            needsBarriers = encoder.dispatchType == .concurrent
        } else if let made = commandBuffer.makeComputeCommandEncoder() {
            self.encoder = made
            ownsEncoder = true
            needsBarriers = false
        } else {
            for (layer, scratch) in holding { layer.pool.checkIn(scratch) }
            throw MoEError.invalidArgument(
                "the command buffer gave no compute encoder (is another encoder of it still open? then pass that one)")
        }
        for fence in sync.waitFences { self.encoder.waitForFence(fence) }
    }

    deinit {
        if ownsEncoder && !ended { encoder.endEncoding() }  // Metal requires it before an encoder goes away
        for (layer, scratch) in held { layer.pool.checkIn(scratch) }
    }

    /// A scratch set for `tokens` tokens from `backend`'s pool, the session's until it ends.
    func checkOut(_ backend: MetalBackend, tokens: Int) throws -> MetalScratch {
        let scratch = try backend.checkOutScratch(tokens: tokens)
        held.append((backend, scratch))
        return scratch
    }

    /// Ends encoding, commits, and waits: the one wait of a pointer-API call.
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

    /// The encode API's end: the caller commits. Nothing here can fail, so a caller's
    /// command buffer never holds half a call.
    func endRecording() {
        // The caller's next kernel reads what the last stage wrote.
        if needsBarriers { encoder.memoryBarrier(scope: .buffers) }
        for fence in sync.updateFences { encoder.updateFence(fence) }
        if ownsEncoder {
            ended = true
            encoder.endEncoding()
        }
        if let signal = sync.signalEvent { commandBuffer.encodeSignalEvent(signal.event, value: signal.value) }
        let sets = ScratchReturn(held)
        held = []
        commandBuffer.addCompletedHandler { _ in sets.checkIn() }
    }
}

/// Scratch sets on their way back to their layers' pools from a completed handler (which
/// Metal calls on a thread of its own; the pools lock). Holding the layers holds everything
/// the recorded commands read — weights, their file mappings, pipelines — until the GPU is
/// done: a command buffer made with unretained references (as MLX makes its own) keeps
/// none of it, and an app may release the layer right after encoding.
private final class ScratchReturn: @unchecked Sendable {
    private let sets: [(layer: MetalBackend, scratch: MetalScratch)]
    init(_ sets: [(layer: MetalBackend, scratch: MetalScratch)]) { self.sets = sets }
    func checkIn() { for (layer, scratch) in sets { layer.pool.checkIn(scratch) } }
}

/// One layer's pass on the Metal backend: the stages are encoded into the session's
/// encoder as they are called. x (the input) is a device binding: the caller's buffer
/// (encode API), or the pass's scratch with the host input copied in (pointer API), or
/// the x of the session's previous pass (a stack).
/// As an MoEPass (pointer API) the combine writes the output over x and `finish` runs the
/// session and copies the results out.
final class MetalPass: MoEPass {
    let backend: MetalBackend
    let scratch: MetalScratch
    private let session: MetalSession
    private var layer: MetalLayerEncoder
    let tokens: Int
    /// The host input of a pointer-API pass.
    private let input: UnsafePointer<Float>?
    /// Where the stages read x.
    let x: MetalBinding
    private var output: UnsafeMutablePointer<Float>?
    private var normedOutput: UnsafeMutablePointer<Float>?

    /// A pass reading x on the device; `scratch` is one of `session`'s sets.
    init(backend: MetalBackend, session: MetalSession, scratch: MetalScratch, tokens: Int, x: MetalBinding,
         inputNorm: RMSNorm?) {
        self.backend = backend
        self.session = session
        self.scratch = scratch
        self.tokens = tokens
        self.x = x
        input = nil
        layer = MetalLayerEncoder(backend: backend, encoder: session.encoder, scratch: scratch, tokens: tokens, x: x)
        layer.barriers = session.needsBarriers
        if let inputNorm {
            MetalScratch.upload(inputNorm, hidden: backend.configuration.hiddenSize, to: scratch.inputNormWeight)
            layer.inputNorm = inputNorm
        }
    }

    /// A pointer-API pass: its own session unless one is given; x is `x` if given, else
    /// the host input copied into the pass's scratch.
    init(backend: MetalBackend, input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?,
         session: MetalSession? = nil, x: MetalBinding? = nil) throws {
        let session = try session ?? MetalSession(backend)
        let scratch = try session.checkOut(backend, tokens: tokens)
        let x = x ?? {
            scratch.x.contents().copyMemory(from: input, byteCount: tokens * backend.configuration.hiddenSize
                                                * MemoryLayout<Float>.stride)
            CallStats.hostCopy()
            return MetalBinding(scratch.x)
        }()
        self.backend = backend
        self.session = session
        self.scratch = scratch
        self.tokens = tokens
        self.x = x
        self.input = input
        layer = MetalLayerEncoder(backend: backend, encoder: session.encoder, scratch: scratch, tokens: tokens, x: x)
        layer.barriers = session.needsBarriers
        if let inputNorm {
            MetalScratch.upload(inputNorm, hidden: backend.configuration.hiddenSize, to: scratch.inputNormWeight)
            layer.inputNorm = inputNorm
        }
    }

    func route() { layer.route() }

    /// The routing goes where the router would have written it: the later stages read it
    /// on the device as usual.
    func setRouting(ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>) {
        let count = tokens * backend.configuration.topK
        scratch.ids.contents().assumingMemoryBound(to: Int32.self).update(from: ids, count: count)
        scratch.weights.contents().assumingMemoryBound(to: Float.self).update(from: weights, count: count)
        CallStats.hostCopy()
        CallStats.hostCopy()
        layer.withShared = false
    }

    /// The routing read from the caller's buffers (int32 ids, float32 weights, (tokens, k) each).
    func setRouting(ids: MetalBinding, weights: MetalBinding) {
        layer.ids = ids
        layer.routingWeights = weights
        layer.withShared = false
    }

    func groupPairsByExpert() { layer.groupPairsByExpert() }
    func gateUp() { layer.gateUp() }
    func down() { layer.down() }

    /// The combine on the device: `output = moe + residual`, and `normed = next(output)`
    /// (nil: into the scratch's normed rows). `output` may be x or the residual.
    func combine(residual: MetalBinding?, output: MetalBinding, next: RMSNorm?, normed: MetalBinding? = nil) {
        if let next { MetalScratch.upload(next, hidden: backend.configuration.hiddenSize, to: scratch.nextNormWeight) }
        layer.combine(residual: residual, output: output, nextNorm: next, normed: normed ?? MetalBinding(scratch.normed))
    }

    func combine(residual: UnsafePointer<Float>?, output: UnsafeMutablePointer<Float>, next: NextNorm?) {
        // The input as residual (a decoder block, a layer of a stack) is on the device already.
        var residualBinding: MetalBinding? = residual == input ? x : nil
        if let residual, residual != input {
            let h = backend.configuration.hiddenSize
            scratch.residual.contents().copyMemory(from: residual, byteCount: tokens * h * MemoryLayout<Float>.stride)
            CallStats.hostCopy()
            residualBinding = MetalBinding(scratch.residual)
        }
        // The output overwrites x: nothing reads x after the expert stages (the combine
        // reads each element as residual before it writes it).
        combine(residual: residualBinding, output: x, next: next?.norm)
        self.output = output
        normedOutput = next?.output
    }

    /// Converts `tokens` rows between a caller's dtype and float32 (MetalLayerEncoder.convert).
    func convert(_ kernel: any MTLComputePipelineState, from source: MetalBinding, to destination: MetalBinding) {
        layer.convert(kernel, from: source, to: destination)
    }

    func finish() throws {
        try session.run()
        let count = tokens * backend.configuration.hiddenSize
        if let output {
            output.update(from: (x.buffer.contents() + x.offset).assumingMemoryBound(to: Float.self), count: count)
            CallStats.hostCopy()
        }
        if let normedOutput {
            normedOutput.update(from: scratch.normed.contents().assumingMemoryBound(to: Float.self), count: count)
            CallStats.hostCopy()
        }
    }

    func readRouting(ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) {
        let count = tokens * backend.configuration.topK
        ids.update(from: scratch.ids.contents().assumingMemoryBound(to: Int32.self), count: count)
        weights.update(from: scratch.weights.contents().assumingMemoryBound(to: Float.self), count: count)
        CallStats.hostCopy()
        CallStats.hostCopy()
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
