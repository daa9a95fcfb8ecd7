/// Activations in a Metal buffer: (tokens, hiddenSize) elements of `dtype`, row-major,
/// from byte `offset` of `buffer`. The layers compute in float32; float16 and bfloat16
/// rows are converted on the GPU as they are read and written (rounding to nearest even).
public struct MoEMetalArray {
    public var buffer: any MTLBuffer
    public var offset: Int
    public var dtype: ScalarType

    public init(_ buffer: any MTLBuffer, offset: Int = 0, dtype: ScalarType = .float32) {
        self.buffer = buffer
        self.offset = offset
        self.dtype = dtype
    }
}

/// What the encode API adds to the layer's output.
public enum MoEMetalResidual {
    case none
    /// (tokens, hiddenSize) of any dtype; may be the output itself.
    case array(MoEMetalArray)
    /// The layer's own input, before `inputNorm`: a decoder's post-attention block.
    case input
}

/// MoEForwardOptions for the encode API: `h = residual + moe(inputNorm(x))`, and with
/// `nextNorm`, `normedOutput = nextNorm(h)`. The norms' weights are host memory read during
/// the encode call only (copied into the call's scratch).
public struct MoEEncodeOptions {
    public var inputNorm: RMSNorm?
    public var residual: MoEMetalResidual
    public var nextNorm: RMSNorm?
    /// (tokens, hiddenSize); must not overlap the input, the residual or the output.
    public var normedOutput: MoEMetalArray?

    public init(inputNorm: RMSNorm? = nil, residual: MoEMetalResidual = .none,
                nextNorm: RMSNorm? = nil, normedOutput: MoEMetalArray? = nil) {
        self.inputNorm = inputNorm
        self.residual = residual
        self.nextNorm = nextNorm
        self.normedOutput = normedOutput
    }
}

/// A routing decision in Metal buffers, for `encodeExperts`: (tokens, topK) int32 expert
/// ids from byte `idsOffset` of `ids`, and (tokens, topK) float32 weights from byte
/// `weightsOffset` of `weights`.
public struct MoEMetalRouting {
    public var ids: any MTLBuffer
    public var idsOffset: Int
    public var weights: any MTLBuffer
    public var weightsOffset: Int

    public init(ids: any MTLBuffer, idsOffset: Int = 0, weights: any MTLBuffer, weightsOffset: Int = 0) {
        self.ids = ids
        self.idsOffset = idsOffset
        self.weights = weights
        self.weightsOffset = weightsOffset
    }
}

/// An event and a value: `waitEvent` holds the call's work until the event reaches the
/// value; `signalEvent` sets it once the work is done.
public struct MoEMetalEventValue {
    public var event: any MTLEvent
    public var value: UInt64

    public init(_ event: any MTLEvent, value: UInt64) {
        self.event = event
        self.value = value
    }
}

/// Ordering of the call's GPU work with the host's own, for hosts whose buffers Metal does
/// not track (MLX makes every buffer untracked and orders its passes with its own fences):
/// without it, the call's pass and the host's passes on those buffers may run at the same
/// time. Buffers Metal tracks (the default) need none of this.
///   - `waitFences`: the call's pass waits for each (updated by an earlier pass of the host);
///   - `updateFences`: each is updated once the call's pass completes (a later pass of the
///     host waits for it);
///   - `waitEvent` / `signalEvent`: with the call's own encoder only (`encoder` nil), the
///     command buffer waits for the event's value before the call's pass and signals the
///     value after it (events are encoded between encoders, so an open encoder of the
///     caller cannot take them).
/// With the caller's open encoder, the fences apply to that whole pass, as Metal's do.
public struct MoEMetalSync {
    public var waitFences: [any MTLFence]
    public var updateFences: [any MTLFence]
    public var waitEvent: MoEMetalEventValue?
    public var signalEvent: MoEMetalEventValue?

    public init(waitFences: [any MTLFence] = [], updateFences: [any MTLFence] = [],
                waitEvent: MoEMetalEventValue? = nil, signalEvent: MoEMetalEventValue? = nil) {
        self.waitFences = waitFences
        self.updateFences = updateFences
        self.waitEvent = waitEvent
        self.signalEvent = signalEvent
    }

    var hasEvents: Bool { waitEvent != nil || signalEvent != nil }

    /// Throws unless every fence and event is `backend`'s device's, and events come without an encoder.
    func validate(device backend: MetalBackend, encoder: (any MTLComputeCommandEncoder)?) throws {
        let device = backend.context.device
        for (name, fences) in [("waitFences", waitFences), ("updateFences", updateFences)] {
            for (i, fence) in fences.enumerated() where fence.device !== device {
                throw MoEError.invalidArgument("sync.\(name)[\(i)] belongs to another Metal device than the layer's")
            }
        }
        for (name, e) in [("waitEvent", waitEvent), ("signalEvent", signalEvent)] {
            guard let e else { continue }
            if let other = e.event.device, other !== device {
                throw MoEError.invalidArgument("sync.\(name) belongs to another Metal device than the layer's")
            }
            if encoder != nil {
                throw MoEError.invalidArgument(
                    "sync.\(name): events are encoded between encoders, and your encoder is open; order with fences, "
                    + "or end your encoder and pass encoder nil")
            }
        }
    }
}

// MARK: Encode, don't run

// The layer recorded into a command buffer the caller owns, on the metal and softmetal
// backends: no commit, no wait, no copy through host memory, and in steady state no device
// allocation. The results are those of `forward` bit for bit once the command buffer has
// completed.
//
// `encoder`: nil records into a compute encoder of our own on `commandBuffer` (made and
// ended in the call; no other encoder of it may be open). Given, it is the caller's open
// compute encoder, which must belong to `commandBuffer` (Metal offers no way to check).
// Serial or concurrent: on a concurrent one the call puts a memory barrier between its
// stages and after its last, so the caller's next dispatch sees its output; the caller's
// dispatches before the call must already be complete or barriered, as for any kernel. It
// stays open, with its pipeline, buffer bindings and threadgroup memory lengths changed, as
// after any kernel an app encodes. The command buffer is still needed then: see below.
//
// `sync` (MoEMetalSync): fences and events that order the call's pass with the host's own
// passes on buffers Metal does not track (MLX's); tracked buffers need none.
//
// Scratch: the intermediate buffers of a call come from the layer's pool and are the
// command buffer's until it completes — a completed handler added to `commandBuffer` puts
// them back. So the command buffer must not be committed yet (the encode call refuses it
// otherwise: Metal takes handlers only before commit), several command buffers may be in
// flight with calls of the same layer, and a command buffer that is never committed
// keeps its sets until it is released. The same handler holds the layer's backend (its
// weights, their file mappings, its pipelines) until the GPU is done, so the app may release
// the layer right after encoding, even into a command buffer with unretained references
// (makeCommandBufferWithUnretainedReferences, as MLX makes its own), which keeps nothing
// alive. The caller's buffers (x, the output, the residual, the routing) are the caller's
// to keep alive until the command buffer completes, as for any kernel it encodes.
//
// Every argument is checked before anything is recorded: a thrown error leaves the
// command buffer as it was. ids in `encodeExperts` are the exception: they are on the GPU
// when the call is made, so they cannot be refused; a pair whose id is outside
// 0..<numExperts selects nothing and adds nothing to its token's output (the bucket, GEMV
// and combine kernels skip it).
extension MoELayer {
    /// Records `output = moe(input) (+ residual)` (and the options' norms) for `tokens`
    /// rows into `commandBuffer`, not yet committed; the caller commits. `output` may be the
    /// input or the residual (the same bytes) or overlap them in any way. `encoder`: the
    /// caller's open compute encoder of `commandBuffer`, or nil for one of our own. The
    /// command buffer is needed even with an encoder: the scratch of the call goes back to
    /// the layer's pool from a completed handler added to it, once the GPU is done with it
    /// (the rules are in the comment above this extension).
    public func encodeForward(_ input: MoEMetalArray, tokens: Int, options: MoEEncodeOptions = MoEEncodeOptions(),
                              into output: MoEMetalArray, commandBuffer: any MTLCommandBuffer,
                              encoder: (any MTLComputeCommandEncoder)? = nil, sync: MoEMetalSync = MoEMetalSync()) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        let metal = try encodingBackend()
        try checkCall(tokens: tokens)
        try sync.validate(device: metal, encoder: encoder)
        try options.inputNorm?.validate("input_norm")
        try options.nextNorm?.validate("next_norm")
        if options.nextNorm != nil && options.normedOutput == nil {
            throw MoEError.invalidArgument("next_norm needs an output for the normed rows (normedOutput is nil)")
        }
        if options.nextNorm == nil && options.normedOutput != nil {
            throw MoEError.invalidArgument("normedOutput is given but nextNorm is nil")
        }
        if options.nextNorm != nil { try requireWholeLayer(for: "the next norm") }
        let count = tokens * configuration.hiddenSize
        try input.validate("x", elements: count, device: metal)
        try output.validate("the output", elements: count, device: metal)
        if case .array(let residual) = options.residual { try residual.validate("the residual", elements: count, device: metal) }
        if let normed = options.normedOutput {
            try normed.validate("the normed output", elements: count, device: metal)
            var others = [("x", input), ("the output", output)]
            if case .array(let residual) = options.residual { others.append(("the residual", residual)) }
            for (name, other) in others where normed.overlaps(other, elements: count) {
                throw MoEError.invalidArgument("the normed output must not overlap \(name)")
            }
        }
        try MetalEncodeTarget.check(commandBuffer, device: metal)
        if tokens == 0 { return }
        try metal.encodeForward(input, tokens: tokens, options: options, routing: nil, output: output,
                                commandBuffer: commandBuffer, encoder: encoder, sync: sync)
    }

    /// Records the routed experts with the routing given (no router, no shared expert, no
    /// residual): `output[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(input[t])`.
    public func encodeExperts(_ input: MoEMetalArray, tokens: Int, routing: MoEMetalRouting,
                              into output: MoEMetalArray, commandBuffer: any MTLCommandBuffer,
                              encoder: (any MTLComputeCommandEncoder)? = nil, sync: MoEMetalSync = MoEMetalSync()) throws {
        CallStats.begin(backend.kind, tokens: tokens)
        let metal = try encodingBackend()
        try checkCall(tokens: tokens)
        try sync.validate(device: metal, encoder: encoder)
        let count = tokens * configuration.hiddenSize, pairs = tokens * configuration.topK
        try input.validate("x", elements: count, device: metal)
        try output.validate("the output", elements: count, device: metal)
        try MoEMetalArray(routing.ids, offset: routing.idsOffset, dtype: .float32)
            .validate("ids", elements: pairs, device: metal, typeName: "int32")
        try MoEMetalArray(routing.weights, offset: routing.weightsOffset, dtype: .float32)
            .validate("weights", elements: pairs, device: metal)
        try MetalEncodeTarget.check(commandBuffer, device: metal)
        if tokens == 0 { return }
        try metal.encodeForward(input, tokens: tokens, options: MoEEncodeOptions(), routing: routing, output: output,
                                commandBuffer: commandBuffer, encoder: encoder, sync: sync)
    }

    /// Records `runLayers`: `x_{i+1} = x_i + layer_i(inputNorms[i](x_i))`, `output = x_n`,
    /// for `tokens` rows. All layers must run on the same Metal backend and have the same
    /// hidden size; `input` and `output` may be the same bytes or overlap.
    public static func encodeLayers(_ layers: [MoELayer], _ input: MoEMetalArray, tokens: Int,
                                    inputNorms: [RMSNorm]? = nil, into output: MoEMetalArray,
                                    commandBuffer: any MTLCommandBuffer,
                                    encoder: (any MTLComputeCommandEncoder)? = nil, sync: MoEMetalSync = MoEMetalSync()) throws {
        guard let first = layers.first else {
            CallStats.begin(.auto, tokens: tokens, layers: 0)
            throw MoEError.invalidArgument("encodeLayers needs at least one layer")
        }
        CallStats.begin(first.backendKind, tokens: tokens, layers: layers.count)
        let metal = try first.encodingBackend()
        try sync.validate(device: metal, encoder: encoder)
        var backends: [MetalBackend] = []
        let h = first.configuration.hiddenSize
        for (i, layer) in layers.enumerated() {
            guard layer.backendKind == first.backendKind, let backend = layer.backend as? MetalBackend else {
                throw MoEError.invalidArgument(
                    "all layers must run on the same backend: layers[0] runs on \(first.backendKind.name), "
                    + "layers[\(i)] on \(layer.backendKind.name)")
            }
            guard layer.configuration.hiddenSize == h else {
                throw MoEError.invalidArgument(
                    "all layers must have the same hidden_size: layers[0] has \(h), layers[\(i)] has \(layer.configuration.hiddenSize)")
            }
            try layer.checkCall(tokens: tokens)
            try layer.requireWholeLayer(for: "a stack (each layer's output feeds the next)")
            backends.append(backend)
        }
        if let inputNorms {
            guard inputNorms.count == layers.count else {
                throw MoEError.invalidArgument(
                    "input_norms must have one norm per layer (\(layers.count)), got \(inputNorms.count)")
            }
            for (i, norm) in inputNorms.enumerated() { try norm.validate("input_norms[\(i)]") }
        }
        try input.validate("x", elements: tokens * h, device: metal)
        try output.validate("the output", elements: tokens * h, device: metal)
        try MetalEncodeTarget.check(commandBuffer, device: metal)
        if tokens == 0 { return }
        try MetalBackend.encodeLayers(backends, input, tokens: tokens, inputNorms: inputNorms, output: output,
                                      commandBuffer: commandBuffer, encoder: encoder, sync: sync)
    }

    /// The layer's Metal backend, or why the encode API is not offered.
    func encodingBackend() throws -> MetalBackend {
        guard let metal = backend as? MetalBackend else {
            throw MoEError.unavailable(
                "encoding into a command buffer needs a Metal backend (metal or softmetal); this layer runs on "
                + "\(backend.kind.name): use forward")
        }
        return metal
    }
}

extension MoEMetalArray {
    var bytesPerElement: Int { dtype.size }

    /// Throws naming `name` unless `elements` of `dtype` fit the buffer from `offset`, the
    /// offset is a multiple of the element size, and the buffer is `device`'s.
    func validate(_ name: String, elements: Int, device backend: MetalBackend, typeName: String? = nil) throws {
        let typeName = typeName ?? dtype.description
        try MetalEncodeTarget.check(buffer, name, device: backend)
        guard offset >= 0 else { throw MoEError.invalidArgument("\(name): offset \(offset) is negative") }
        guard offset % bytesPerElement == 0 else {
            throw MoEError.invalidArgument(
                "\(name): offset \(offset) is not a multiple of \(bytesPerElement) bytes (an element of \(typeName))")
        }
        // Every sum checked: an offset near Int.max must give this message, not a trap.
        let (bytes, overflow) = elements.multipliedReportingOverflow(by: bytesPerElement)
        let (end, past) = offset.addingReportingOverflow(bytes)
        guard !overflow, !past, end <= buffer.length else {
            let need = overflow || past ? "more than \(Int.max)" : "\(end)"
            throw MoEError.invalidArgument(
                "\(name): \(elements) elements of \(typeName) from offset \(offset) need \(need) "
                + "bytes; the buffer has \(buffer.length)")
        }
    }

    /// Whether `elements` here and `elements` of `other` share bytes.
    func overlaps(_ other: MoEMetalArray, elements: Int) -> Bool {
        binding.overlaps(other.binding, bytes: elements * bytesPerElement, otherBytes: elements * other.bytesPerElement)
    }

    /// The same elements of the same buffer.
    func isSame(as other: MoEMetalArray) -> Bool { dtype == other.dtype && binding.isSame(as: other.binding) }

    var binding: MetalBinding { MetalBinding(buffer, offset: offset) }
}
