#if canImport(Metal)
import Metal
#elseif canImport(SoftMetal)
import SoftMetal
#endif
import CMoESwift

#if canImport(Metal) || canImport(SoftMetal)
/// One forward (or routing) on the Metal backend: the stages are encoded as they are
/// called, into one command buffer and one compute encoder; `finish` commits it and waits
/// once. The input is copied into a pooled device buffer at creation, the residual at
/// `combine`, the output out after the wait.
final class MetalPass: MoEPass {
    private let backend: MetalBackend
    private let scratch: MetalScratch
    private let commandBuffer: any MTLCommandBuffer
    private let encoder: any MTLComputeCommandEncoder
    private var layer: MetalLayerEncoder
    private let tokens: Int
    private let input: UnsafePointer<Float>
    private var output: UnsafeMutablePointer<Float>?
    private var normedOutput: UnsafeMutablePointer<Float>?
    private var ended = false

    init(backend: MetalBackend, input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?) throws {
        let scratch = try backend.checkOutScratch(tokens: tokens)
        guard let commandBuffer = backend.context.queue.makeCommandBuffer(),
              let encoder = commandBuffer.makeComputeCommandEncoder() else {
            backend.pool.checkIn(scratch)
            throw MoEError.internalError("the \(backend.kind.name) backend could not create a command buffer")
        }
        self.backend = backend
        self.scratch = scratch
        self.commandBuffer = commandBuffer
        self.encoder = encoder
        self.tokens = tokens
        self.input = input
        let h = backend.configuration.hiddenSize
        scratch.x.contents().copyMemory(from: input, byteCount: tokens * h * MemoryLayout<Float>.stride)
        layer = MetalLayerEncoder(backend: backend, encoder: encoder, scratch: scratch, tokens: tokens, x: scratch.x)
        if let inputNorm {
            MetalScratch.upload(inputNorm, hidden: h, to: scratch.inputNormWeight)
            layer.inputNorm = inputNorm
        }
    }

    deinit {
        if !ended { encoder.endEncoding() }  // Metal requires it before an encoder goes away
        backend.pool.checkIn(scratch)
    }

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
        // The input as residual (a decoder block) is on the device already.
        var residualBuffer: (any MTLBuffer)? = residual == input ? scratch.x : nil
        if let residual, residual != input {
            scratch.residual.contents().copyMemory(from: residual, byteCount: tokens * h * MemoryLayout<Float>.stride)
            residualBuffer = scratch.residual
        }
        if let next { MetalScratch.upload(next.norm, hidden: h, to: scratch.nextNormWeight) }
        // The output overwrites the input buffer: nothing reads x after the expert stages
        // (the combine reads each element as residual before it writes it).
        layer.combine(residual: residualBuffer, output: scratch.x, nextNorm: next?.norm)
        self.output = output
        normedOutput = next?.output
    }

    func finish() throws {
        ended = true
        try MetalPass.run(commandBuffer, encoder: encoder, kind: backend.kind)
        if let output {
            let count = tokens * backend.configuration.hiddenSize
            output.update(from: scratch.x.contents().assumingMemoryBound(to: Float.self), count: count)
        }
        if let normedOutput {
            let count = tokens * backend.configuration.hiddenSize
            normedOutput.update(from: scratch.normed.contents().assumingMemoryBound(to: Float.self), count: count)
        }
    }

    func readRouting(ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>) {
        let count = tokens * backend.configuration.topK
        ids.update(from: scratch.ids.contents().assumingMemoryBound(to: Int32.self), count: count)
        weights.update(from: scratch.weights.contents().assumingMemoryBound(to: Float.self), count: count)
    }

    /// Ends encoding, commits, and waits: the one wait of a call.
    static func run(_ commandBuffer: any MTLCommandBuffer, encoder: any MTLComputeCommandEncoder,
                    kind: MoEBackendKind) throws {
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
#endif
