import CMoESwift

/// Checks of the caller's Metal objects for the encode API.
enum MetalEncodeTarget {
    static func check(_ commandBuffer: any MTLCommandBuffer, device backend: MetalBackend) throws {
        guard commandBuffer.device === backend.context.device else {
            throw MoEError.invalidArgument("the command buffer belongs to another Metal device than the layer's")
        }
        // Completed handlers (which return the scratch) may be added only before commit.
        switch commandBuffer.status {
        case .notEnqueued, .enqueued: break
        default:
            throw MoEError.invalidArgument("the command buffer is already committed (status \(commandBuffer.status)); "
                                           + "encode into one that is not")
        }
    }

    static func check(_ buffer: any MTLBuffer, _ name: String, device backend: MetalBackend) throws {
        guard buffer.device === backend.context.device else {
            throw MoEError.invalidArgument("\(name): the buffer belongs to another Metal device than the layer's")
        }
    }
}

extension MetalBackend {
    /// Records one forward (or, with `routing`, the experts-only call) into the caller's
    /// command buffer; the arguments are validated (MoELayer.encodeForward). Everything
    /// that can fail (kernels, scratch) is done before the first command is recorded.
    func encodeForward(_ input: MoEMetalArray, tokens: Int, options: MoEEncodeOptions, routing: MoEMetalRouting?,
                       output: MoEMetalArray, commandBuffer: any MTLCommandBuffer,
                       encoder: (any MTLComputeCommandEncoder)?, sync: MoEMetalSync) throws {
        let count = tokens * configuration.hiddenSize
        // float32 rows bind in place where the kernels can read them: x (read as float4) at
        // 16-byte offsets; the others at any float offset. The output too unless it shares
        // bytes with x or the residual without being them (the combine reads each element
        // before it writes that element, and nothing else).
        let xInPlace = input.dtype == .float32 && input.offset % 16 == 0
        var residualArray: MoEMetalArray?
        switch options.residual {
        case .none: residualArray = nil
        case .input: residualArray = input
        case .array(let r): residualArray = r
        }
        // The input as residual is x itself, wherever x is.
        var residualInPlace = true
        if case .array(let r) = options.residual { residualInPlace = r.dtype == .float32 }
        let outputInPlace = output.dtype == .float32
            && [input, residualArray].allSatisfy { other in
                guard let other else { return true }
                return output.isSame(as: other) || !output.overlaps(other, elements: count)
            }
        let normedInPlace = options.normedOutput.map { $0.dtype == .float32 } ?? true

        let load = xInPlace ? nil : context.activationKernel(input.dtype, load: true)
        let loadResidual = residualInPlace ? nil : context.activationKernel(residualArray!.dtype, load: true)
        let store = outputInPlace ? nil : context.activationKernel(output.dtype, load: false)
        let storeNormed = normedInPlace ? nil : context.activationKernel(options.normedOutput!.dtype, load: false)

        let scratch = try checkOutScratch(tokens: tokens)
        let session = try MetalSession(kind: kind, commandBuffer: commandBuffer, encoder: encoder,
                                       holding: [(self, scratch)], sync: sync)
        // From here on nothing throws.
        let x = xInPlace ? input.binding : MetalBinding(scratch.x)
        let pass = MetalPass(backend: self, session: session, scratch: scratch, tokens: tokens, x: x,
                             inputNorm: options.inputNorm)
        if let load { pass.convert(load, from: input.binding, to: x) }
        var residual: MetalBinding?
        if let r = residualArray {
            if case .input = options.residual {
                residual = x
            } else if let loadResidual {
                residual = MetalBinding(scratch.residual)
                pass.convert(loadResidual, from: r.binding, to: MetalBinding(scratch.residual))
            } else {
                residual = r.binding
            }
        }
        if let routing {
            pass.setRouting(ids: MetalBinding(routing.ids, offset: routing.idsOffset),
                            weights: MetalBinding(routing.weights, offset: routing.weightsOffset))
        } else {
            pass.route()
        }
        pass.groupPairsByExpert()
        pass.gateUp()
        pass.down()
        // Staged output: x's scratch (x is either that already, combined in place, or the
        // caller's buffer and the scratch is free).
        let y = outputInPlace ? output.binding : MetalBinding(scratch.x)
        let normed = options.normedOutput.map { normedInPlace ? $0.binding : MetalBinding(scratch.normed) }
        pass.combine(residual: residual, output: y, next: options.nextNorm, normed: normed)
        if let store { pass.convert(store, from: y, to: output.binding) }
        if let storeNormed, let normed { pass.convert(storeNormed, from: normed, to: options.normedOutput!.binding) }
        session.endRecording()
    }

    /// Records run_layers into the caller's command buffer (MoELayer.encodeLayers, which
    /// validated the arguments): x is updated in place in one float32 work buffer — the
    /// caller's output where the kernels can bind it, else the first layer's scratch —
    /// each layer's combine using it as its residual.
    static func encodeLayers(_ layers: [MetalBackend], _ input: MoEMetalArray, tokens: Int, inputNorms: [RMSNorm]?,
                             output: MoEMetalArray, commandBuffer: any MTLCommandBuffer,
                             encoder: (any MTLComputeCommandEncoder)?, sync: MoEMetalSync) throws {
        let first = layers[0]
        let count = tokens * first.configuration.hiddenSize
        let inputInPlace = input.dtype == .float32 && input.offset % 16 == 0
        let workInPlace = output.dtype == .float32 && output.offset % 16 == 0
            && (output.isSame(as: input) || !output.overlaps(input, elements: count))
        let load = inputInPlace ? nil : first.context.activationKernel(input.dtype, load: true)
        let store = workInPlace ? nil : first.context.activationKernel(output.dtype, load: false)

        var held: [(layer: MetalBackend, scratch: MetalScratch)] = []
        do {
            for layer in layers { held.append((layer, try layer.checkOutScratch(tokens: tokens))) }
        } catch {
            for (layer, scratch) in held { layer.pool.checkIn(scratch) }
            throw error
        }
        let session = try MetalSession(kind: first.kind, commandBuffer: commandBuffer, encoder: encoder, holding: held,
                                       sync: sync)
        // From here on nothing throws.
        let work = workInPlace ? output.binding : MetalBinding(held[0].scratch.x)
        var x = inputInPlace ? input.binding : work
        for (i, layer) in layers.enumerated() {
            let pass = MetalPass(backend: layer, session: session, scratch: held[i].scratch, tokens: tokens, x: x,
                                 inputNorm: inputNorms?[i])
            if i == 0, let load { pass.convert(load, from: input.binding, to: work) }
            pass.route()
            pass.groupPairsByExpert()
            pass.gateUp()
            pass.down()
            pass.combine(residual: x, output: work, next: nil)
            if i == layers.count - 1, let store { pass.convert(store, from: work, to: output.binding) }
            x = work
        }
        session.endRecording()
    }
}
