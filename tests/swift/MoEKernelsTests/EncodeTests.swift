// The encode API as an app uses it: the app's own Metal kernel writes the layer's input
// into the app's buffer, the layer (or a stack of three) is recorded into the same command
// buffer, and the app's kernel reads the output into another buffer — one command buffer,
// one commit, one wait — against `forward` / `runLayers` bit for bit, in each activation
// dtype. Also: the counters of the encode calls, two command buffers in flight, the errors,
// and the same through the C ABI's declarations.
import CMoESwift
import Foundation
import XCTest
#if canImport(Metal)
import Metal
#else
import SoftMetal
#endif
@testable import MoEKernels

/// bfloat16 of a float, rounded to nearest even (a NaN stays a NaN with the quiet bit),
/// as its float value: what moe_store_activations_bfloat16 writes.
func roundedToBFloat16(_ v: Float) -> Float {
    let bits = v.bitPattern
    if v.isNaN { return Float(bitPattern: ((bits >> 16) | 0x40) << 16) }
    return Float(bitPattern: ((bits &+ 0x7FFF &+ ((bits >> 16) & 1)) >> 16) << 16)
}

/// A float as the dtype stores it, widened back.
func rounded(_ v: Float, to dtype: ScalarType) -> Float {
    switch dtype {
    case .float32: return v
    case .float16: return Float(Float16(v))
    case .bfloat16: return roundedToBFloat16(v)
    }
}

/// The app: a device, a queue, and two kernels per dtype that move rows between a float32
/// staging buffer and a buffer of the dtype.
final class EncodeApp {
    static let source = """
    #include <metal_stdlib>
    using namespace metal;

    inline void app_store(float v, device float* p) { *p = v; }
    inline void app_store(float v, device half* p) { *p = half(v); }
    // The app writes values that bfloat16 holds exactly: their low 16 bits are 0.
    inline void app_store(float v, device ushort* p) { *p = ushort(as_type<uint>(v) >> 16); }
    inline float app_load(float v) { return v; }
    inline float app_load(half v) { return float(v); }
    inline float app_load(ushort v) { return as_type<float>(uint(v) << 16); }

    template <typename T>
    kernel void app_write(device const float* src [[buffer(0)]], device T* dst [[buffer(1)]],
                          constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
        if (i < n) app_store(src[i] * 0.5f, dst + i);
    }
    template <typename T>
    kernel void app_read(device const T* src [[buffer(0)]], device float* dst [[buffer(1)]],
                         constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
        if (i < n) dst[i] = app_load(src[i]);
    }
    template [[host_name("app_write_float32")]] [[kernel]] decltype(app_write<float>) app_write<float>;
    template [[host_name("app_write_float16")]] [[kernel]] decltype(app_write<half>) app_write<half>;
    template [[host_name("app_write_bfloat16")]] [[kernel]] decltype(app_write<ushort>) app_write<ushort>;
    template [[host_name("app_read_float32")]] [[kernel]] decltype(app_read<float>) app_read<float>;
    template [[host_name("app_read_float16")]] [[kernel]] decltype(app_read<half>) app_read<half>;
    template [[host_name("app_read_bfloat16")]] [[kernel]] decltype(app_read<ushort>) app_read<ushort>;
    """

    let device: any MTLDevice
    let queue: any MTLCommandQueue
    private let library: any MTLLibrary
    private var pipelines: [String: any MTLComputePipelineState] = [:]

    init() throws {
        device = try XCTUnwrap(MTLCreateSystemDefaultDevice())
        queue = try XCTUnwrap(device.makeCommandQueue())
        library = try device.makeLibrary(source: Self.source, options: MTLCompileOptions())
    }

    func pipeline(_ name: String) throws -> any MTLComputePipelineState {
        if let made = pipelines[name] { return made }
        let made = try device.makeComputePipelineState(function: try XCTUnwrap(library.makeFunction(name: name)))
        pipelines[name] = made
        return made
    }

    func buffer(bytes: Int) throws -> any MTLBuffer {
        try XCTUnwrap(device.makeBuffer(length: max(bytes, 16), options: .storageModeShared))
    }

    /// A buffer Metal does not track, as MLX makes every buffer.
    func untrackedBuffer(bytes: Int) throws -> any MTLBuffer {
        try XCTUnwrap(device.makeBuffer(length: max(bytes, 16), options: [.storageModeShared, .hazardTrackingModeUntracked]))
    }

    func buffer(_ values: [Float]) throws -> any MTLBuffer {
        let b = try buffer(bytes: values.count * 4)
        values.withUnsafeBytes { b.contents().copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        return b
    }

    func buffer(_ values: [Int32]) throws -> any MTLBuffer {
        let b = try buffer(bytes: values.count * 4)
        values.withUnsafeBytes { b.contents().copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        return b
    }

    func floats(_ buffer: any MTLBuffer, count: Int, offset: Int = 0) -> [Float] {
        Array(UnsafeBufferPointer(start: (buffer.contents() + offset).assumingMemoryBound(to: Float.self), count: count))
    }

    /// `kernel` over `count` elements: buffer 0, buffer 1 (at their offsets) and n.
    func encode(_ kernel: String, _ encoder: any MTLComputeCommandEncoder, _ a: MoEMetalArray, _ b: MoEMetalArray,
                count: Int) throws {
        encoder.setComputePipelineState(try pipeline(kernel))
        encoder.setBuffer(a.buffer, offset: a.offset, index: 0)
        encoder.setBuffer(b.buffer, offset: b.offset, index: 1)
        var n = UInt32(count)
        encoder.setBytes(&n, length: 4, index: 2)
        encoder.dispatchThreads(MTLSize(width: count, height: 1, depth: 1),
                                threadsPerThreadgroup: MTLSize(width: 64, height: 1, depth: 1))
    }

    /// The app's kernel writing `staging / 2` into `x` (in x's dtype).
    func write(_ staging: any MTLBuffer, to x: MoEMetalArray, count: Int, _ encoder: any MTLComputeCommandEncoder) throws {
        try encode("app_write_\(x.dtype)", encoder, MoEMetalArray(staging), x, count: count)
    }

    /// The app's kernel reading `y` (in y's dtype) into float32 `result`.
    func read(_ y: MoEMetalArray, to result: any MTLBuffer, count: Int, _ encoder: any MTLComputeCommandEncoder) throws {
        try encode("app_read_\(y.dtype)", encoder, y, MoEMetalArray(result), count: count)
    }
}

final class EncodeTests: XCTestCase {
    static let kind = MetalBackendTests.kind
    static let dtypes: [ScalarType] = [.float32, .float16, .bfloat16]

    override func setUpWithError() throws {
        guard MoELayer.availableBackends.contains(Self.kind) else {
            throw XCTSkip("the \(Self.kind.name) backend is not available here")
        }
    }

    /// A layer the size of a real model's hidden state (H = 2048), with few narrow experts
    /// and a shared expert so that SoftMetal runs it in seconds.
    static func data(seed: UInt64) -> LayerData {
        .random(makeConfig(h: 2048, i: 64, e: 8, k: 2) { $0.sharedIntermediateSize = 32 }, seed: seed)
    }

    /// Input rows that float16 and bfloat16 hold exactly once the app halves them:
    /// bfloat16 values (8 significant bits) in the normal range of float16.
    static func input(_ count: Int, seed: UInt64) -> [Float] {
        seededFloats(count, seed: seed, scale: 4).map { v in
            let b = Float(bitPattern: v.bitPattern & 0xFFFF_0000)
            return abs(b) < 1e-3 ? 0 : b
        }
    }

    func assertBitwiseEqual(_ got: [Float], _ want: [Float], _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(got.count, want.count, what, file: file, line: line)
        let differ = zip(got, want).enumerated().filter { $0.element.0.bitPattern != $0.element.1.bitPattern }
        XCTAssert(differ.isEmpty, "\(what): \(differ.count) elements differ, first at \(differ.first.map { "\($0.offset): \($0.element.0) vs \($0.element.1)" } ?? "")",
                  file: file, line: line)
    }

    /// The counters of an encode call: kernels recorded, nothing committed, waited for,
    /// copied through host memory or allocated.
    func assertEncodedOnly(_ what: String, dispatches: Int, file: StaticString = #filePath, line: UInt = #line) {
        let s = MoECallStats.last
        XCTAssertEqual(s.dispatches, dispatches, what, file: file, line: line)
        XCTAssertEqual([s.commandBuffers, s.cpuWaits, s.hostCopies, s.allocations], [0, 0, 0, 0],
                       "\(what): command buffers, waits, host copies, allocations", file: file, line: line)
    }

    func testAppEncodesLayerAndStackIntoItsCommandBuffer() throws {
        let app = try EncodeApp()
        let data = Self.data(seed: 1)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let stack = try [Self.data(seed: 2), Self.data(seed: 3), Self.data(seed: 4)].map {
            try MoELayer(configuration: $0.config, weights: $0.weights(), backend: Self.kind)
        }
        let h = data.config.hiddenSize
        let inputNormWeight = seededFloats(h, seed: 5, scale: 0.5).map { $0 + 1 }
        let nextNormWeight = seededFloats(h, seed: 6, scale: 0.5)
        let stackNorms = (0..<3).map { seededFloats(h, seed: 7 + UInt64($0), scale: 0.5).map { $0 + 1 } }
        for tokens in [1, 37] {
            let count = tokens * h
            let staging = Self.input(count, seed: UInt64(tokens))
            let x = staging.map { $0 * 0.5 }  // what the app's kernel writes
            try inputNormWeight.withUnsafeBufferPointer { inW in
            try nextNormWeight.withUnsafeBufferPointer { nextW in
            try withNorms(stackNorms) { norms in
                let inputNorm = RMSNorm(weight: inW.baseAddress!, eps: 1e-6)
                let nextNorm = RMSNorm(weight: nextW.baseAddress!, eps: 1e-6, offset: 1)
                // The references: the pointer API on the same backend (which also leaves a
                // scratch set of this size in each layer's pool: the encode calls below
                // allocate nothing).
                var y = [Float](repeating: 0, count: count), normed = y, stacked = y
                try x.withUnsafeBufferPointer { xs in
                    try normed.withUnsafeMutableBufferPointer { n in
                        try layer.forward(xs.baseAddress!, tokens: tokens,
                                          options: MoEForwardOptions(inputNorm: inputNorm, residual: .input, nextNorm: nextNorm,
                                                                     normedOutput: n.baseAddress!),
                                          into: &y)
                    }
                    try MoELayer.runLayers(stack, xs.baseAddress!, tokens: tokens, inputNorms: norms, into: &stacked)
                }
                for dtype in Self.dtypes {
                    let what = "\(dtype) T=\(tokens)"
                    let e = dtype.size
                    // Offsets that are multiples of the element size only (x at 3 elements:
                    // float32 x is then staged, the kernels read it as float4).
                    let xs = MoEMetalArray(try app.buffer(bytes: 3 * e + count * e), offset: 3 * e, dtype: dtype)
                    let ys = MoEMetalArray(try app.buffer(bytes: 5 * e + count * e), offset: 5 * e, dtype: dtype)
                    let ns = MoEMetalArray(try app.buffer(bytes: 64 + count * e), offset: 64, dtype: dtype)
                    let stackOut = MoEMetalArray(try app.buffer(bytes: 16 + count * e), offset: 16, dtype: dtype)
                    let results = try (0..<3).map { _ in try app.buffer(bytes: count * 4) }
                    let stagingBuffer = try app.buffer(staging)

                    let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
                    // One open encoder for the app's kernel and the layer ...
                    let encoder = try XCTUnwrap(cb.makeComputeCommandEncoder())
                    try app.write(stagingBuffer, to: xs, count: count, encoder)
                    try layer.encodeForward(xs, tokens: tokens,
                                            options: MoEEncodeOptions(inputNorm: inputNorm, residual: .input,
                                                                      nextNorm: nextNorm, normedOutput: ns),
                                            into: ys, commandBuffer: cb, encoder: encoder)
                    // The forward's dispatches (decode: router logits and top-k; prefill:
                    // router and bucket; then gate/up and down for the routed and the shared
                    // expert, combine), plus the conversions: x (float32 at 12 bytes is
                    // staged too), and y and normed unless float32.
                    let forward = 7
                    assertEncodedOnly("layer \(what)", dispatches: forward + (dtype == .float32 ? 1 : 3))
                    try app.read(ys, to: results[0], count: count, encoder)
                    try app.read(ns, to: results[1], count: count, encoder)
                    encoder.endEncoding()
                    // ... and the stack in an encoder of its own on the same command buffer.
                    try MoELayer.encodeLayers(stack, xs, tokens: tokens, inputNorms: norms, into: stackOut, commandBuffer: cb)
                    assertEncodedOnly("stack \(what)", dispatches: 3 * forward + (dtype == .float32 ? 1 : 2))
                    XCTAssertEqual(MoECallStats.last.layers, 3)
                    let reader = try XCTUnwrap(cb.makeComputeCommandEncoder())
                    try app.read(stackOut, to: results[2], count: count, reader)
                    reader.endEncoding()
                    cb.commit()
                    cb.waitUntilCompleted()
                    XCTAssertNil(cb.error, what)

                    assertBitwiseEqual(app.floats(results[0], count: count), y.map { rounded($0, to: dtype) }, "y \(what)")
                    assertBitwiseEqual(app.floats(results[1], count: count), normed.map { rounded($0, to: dtype) },
                                       "normed \(what)")
                    assertBitwiseEqual(app.floats(results[2], count: count), stacked.map { rounded($0, to: dtype) },
                                       "stack \(what)")
                }
            }
            }
            }
        }
    }

    /// 8-bit activations through the encode API: the same recording as `forward` (bit for
    /// bit) with q8's dispatches — x's grid values once, a's before the routed and the
    /// shared down — and not the float-exact result. ggml's q8_0 blocks for every expert
    /// matrix; decode (GEMVs) and prefill (GEMMs).
    func testQ8ActivationsEncodeAsForward() throws {
        let app = try EncodeApp()
        var config = makeConfig(h: 256, i: 64, e: 4, k: 2) { $0.sharedIntermediateSize = 32 }
        let d = LayerData.random(config, seed: 40)
        let matrices = [d.gate, d.up, d.down, d.sharedGate!, d.sharedUp!, d.sharedDown!]
        let blocks = matrices.map { m -> UnsafeMutableRawBufferPointer in
            let bytes = PackedGGML(m, q8: true, log2Scale: -9).bytes
            let b = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 16)
            b.copyBytes(from: bytes)
            return b
        }
        defer { blocks.forEach { $0.deallocate() } }
        let q8 = GGMLType(name: "q8_0")!
        func ggml(_ i: Int) -> WeightData { .quantized(QuantizedWeightData(ggml: q8, blocks: UnsafeRawBufferPointer(blocks[i]))) }
        var w = d.weights()
        w.gateUp = .separate(gate: ggml(0), up: ggml(1))
        w.downProj = ggml(2)
        w.shared = SharedExpertWeights(gateProj: ggml(3), upProj: ggml(4), downProj: ggml(5))
        let exact = try MoELayer(configuration: config, weights: w, backend: Self.kind)
        config.activationQuantization = .q8
        let layer = try MoELayer(configuration: config, weights: w, backend: Self.kind)
        for tokens in [1, 9] {
            let count = tokens * config.hiddenSize
            let x = Self.input(count, seed: 41)
            let y = try layer.forward(x)   // also leaves a scratch set of this size in the pool
            XCTAssertNotEqual(y, try exact.forward(x), "q8 changes a quantized layer's result")
            let xs = MoEMetalArray(try app.buffer(x)), ys = MoEMetalArray(try app.buffer(bytes: count * 4))
            let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
            try layer.encodeForward(xs, tokens: tokens, into: ys, commandBuffer: cb)
            assertEncodedOnly("q8 T=\(tokens)", dispatches: 7 + 3)
            cb.commit()
            cb.waitUntilCompleted()
            XCTAssertNil(cb.error)
            assertBitwiseEqual(app.floats(ys.buffer, count: count), y, "q8 T=\(tokens)")
        }
    }

    /// Norms over C copies of the weights, valid in `body`.
    func withNorms<R>(_ weights: [[Float]], _ body: ([RMSNorm]) throws -> R) rethrows -> R {
        let copies = weights.map { w -> UnsafeMutableBufferPointer<Float> in
            let p = UnsafeMutableBufferPointer<Float>.allocate(capacity: w.count)
            _ = p.initialize(from: w)
            return p
        }
        defer { copies.forEach { $0.deallocate() } }
        return try body(copies.map { RMSNorm(weight: $0.baseAddress!, eps: 1e-5) })
    }

    /// float32 in place (x and y bound at their offsets, the output over the input), the
    /// experts-only call with the routing in buffers, and two command buffers in flight:
    /// each holds a scratch set of its own until it completes.
    func testInPlaceExpertsAndTwoCommandBuffersInFlight() throws {
        let app = try EncodeApp()
        let data = Self.data(seed: 11)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let (h, tokens) = (data.config.hiddenSize, 37)
        let count = tokens * h
        let inputs = [Self.input(count, seed: 12), Self.input(count, seed: 13)]
        let want = try inputs.map { try layer.forward($0, residual: $0) }
        let (ids, weights) = try layer.route(inputs[0])
        let wantExperts = try layer.experts(inputs[0], ids: ids, weights: weights)

        let buffers = try inputs.map { try app.buffer([Float](repeating: 0, count: 4) + $0) }
        let cbs = try (0..<2).map { _ in try XCTUnwrap(app.queue.makeCommandBuffer()) }
        for (n, cb) in cbs.enumerated() {
            let x = MoEMetalArray(buffers[n], offset: 16)
            try layer.encodeForward(x, tokens: tokens, options: MoEEncodeOptions(residual: .array(x)), into: x, commandBuffer: cb)
            // The first takes the set the forwards left in the pool; the second, with the
            // first not yet complete, has to make one.
            XCTAssertEqual(MoECallStats.last.allocations == 0, n == 0, "command buffer \(n): \(MoECallStats.last)")
        }
        let idsBuffer = try app.buffer(ids), weightsBuffer = try app.buffer([0, 0] + weights)
        let expertsOut = try app.buffer(bytes: count * 4)
        let third = try XCTUnwrap(app.queue.makeCommandBuffer())
        try layer.encodeExperts(MoEMetalArray(try app.buffer(inputs[0])), tokens: tokens,
                                routing: MoEMetalRouting(ids: idsBuffer, weights: weightsBuffer, weightsOffset: 8),
                                into: MoEMetalArray(expertsOut), commandBuffer: third)
        XCTAssertEqual(MoECallStats.last.hostCopies, 0)
        // Handlers run in the order they were added: once this one has, the layer's have
        // returned their scratch sets.
        let returned = DispatchSemaphore(value: 0)
        for cb in cbs + [third] {
            cb.addCompletedHandler { _ in returned.signal() }
        }
        for cb in cbs.reversed() + [third] { cb.commit() }
        for cb in cbs + [third] { cb.waitUntilCompleted() }
        for _ in 0..<3 { returned.wait() }
        for n in 0..<2 {
            assertBitwiseEqual(app.floats(buffers[n], count: count, offset: 16), want[n], "in flight \(n)")
        }
        assertBitwiseEqual(app.floats(expertsOut, count: count), wantExperts, "experts")
        // The experts-only call in decode too (its GEMVs read the caller's ids directly).
        let decodeX = Array(inputs[1].prefix(2 * h))
        let (decodeIds, decodeWeights) = try layer.route(decodeX)
        let decodeOut = try app.buffer(bytes: 2 * h * 4)
        let fourth = try XCTUnwrap(app.queue.makeCommandBuffer())
        try layer.encodeExperts(MoEMetalArray(try app.buffer(decodeX)), tokens: 2,
                                routing: MoEMetalRouting(ids: try app.buffer([7] + decodeIds), idsOffset: 4,
                                                         weights: try app.buffer(decodeWeights)),
                                into: MoEMetalArray(decodeOut), commandBuffer: fourth)
        fourth.commit()
        fourth.waitUntilCompleted()
        assertBitwiseEqual(app.floats(decodeOut, count: 2 * h),
                           try layer.experts(decodeX, ids: decodeIds, weights: decodeWeights), "experts, decode")

        let again = try XCTUnwrap(app.queue.makeCommandBuffer())
        try layer.encodeForward(MoEMetalArray(buffers[0], offset: 16), tokens: tokens,
                                into: MoEMetalArray(try app.buffer(bytes: count * 4)), commandBuffer: again)
        XCTAssertEqual(MoECallStats.last.allocations, 0, "the completed command buffers gave their sets back")
    }

    /// A command buffer with unretained references (MLX makes its own so) keeps nothing the
    /// layer's commands read alive; the app releases the layers right after encoding, then
    /// commits. SoftMetal fails a command buffer whose buffers or pipelines were released
    /// before it completed (where a GPU would read freed memory): the layer must hold its
    /// own until then.
    func testLayersReleasedRightAfterEncodingIntoAnUnretainedCommandBuffer() throws {
        let app = try EncodeApp()
        let (h, tokens) = (2048, 9)
        let input = Self.input(tokens * h, seed: 31)
        let x = try app.buffer(input), y = try app.buffer(bytes: tokens * h * 4), stacked = try app.buffer(bytes: tokens * h * 4)
        let commandBuffer = try XCTUnwrap(app.queue.makeCommandBufferWithUnretainedReferences())
        XCTAssertFalse(commandBuffer.retainedReferences)
        var want: [Float] = [], wantStack: [Float] = []
        weak var released: MoELayer?
        do {
            let layers = try [31, 32].map { seed -> MoELayer in
                let data = Self.data(seed: UInt64(seed))
                return try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
            }
            want = try layers[0].forward(input)
            wantStack = [Float](repeating: 0, count: tokens * h)
            try input.withUnsafeBufferPointer { xs in
                try wantStack.withUnsafeMutableBufferPointer {
                    try MoELayer.runLayers(layers, xs.baseAddress!, tokens: tokens, into: $0.baseAddress!)
                }
            }
            try layers[0].encodeForward(MoEMetalArray(x), tokens: tokens, into: MoEMetalArray(y), commandBuffer: commandBuffer)
            try MoELayer.encodeLayers(layers, MoEMetalArray(x), tokens: tokens, into: MoEMetalArray(stacked),
                                      commandBuffer: commandBuffer)
            released = layers[1]
        }
        XCTAssertNil(released, "the app's last reference to the layers is gone before the commit")
        commandBuffer.commit()
        commandBuffer.waitUntilCompleted()
        XCTAssertEqual(commandBuffer.status, .completed, "\(String(describing: commandBuffer.error))")
        assertBitwiseEqual(app.floats(y, count: tokens * h), want, "the layer")
        assertBitwiseEqual(app.floats(stacked, count: tokens * h), wantStack, "the stack")
    }

    /// A host whose buffers Metal does not track (MLX's way): its pass writes x, the layer's
    /// pass reads x and writes y, its next pass reads y, all in one command buffer. Nothing
    /// orders the passes then, and SoftMetal reports the race a GPU would run; the host's
    /// fences (Swift and C) or events passed to the call order them, and the result is the
    /// forward's bit for bit.
    func testUntrackedHostBuffersAreOrderedByTheCallersFencesOrEvents() throws {
        let app = try EncodeApp()
        let data = Self.data(seed: 51)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let (h, tokens) = (data.config.hiddenSize, 3)
        let count = tokens * h
        let staging = Self.input(count, seed: 52)
        let want = try layer.forward(staging.map { $0 * 0.5 })
        let cDesc = CDescriptor(data, backend: moe_backend(rawValue: UInt32(Self.kind.rawValue)))
        var cLayer: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_layer_create(&cDesc.desc, &cLayer), MOE_OK)
        defer { CMoESwift.moe_layer_destroy(cLayer) }
        let event = try XCTUnwrap(app.device.makeEvent())
        var eventValue: UInt64 = 0
        for mode in ["nothing", "fences", "events", "C fences"] {
            let (written, read) = (try XCTUnwrap(app.device.makeFence()), try XCTUnwrap(app.device.makeFence()))
            let xs = MoEMetalArray(try app.untrackedBuffer(bytes: count * 4)), ys = MoEMetalArray(try app.untrackedBuffer(bytes: count * 4))
            let result = try app.buffer(bytes: count * 4)
            let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
            let writer = try XCTUnwrap(cb.makeComputeCommandEncoder())
            try app.write(try app.buffer(staging), to: xs, count: count, writer)
            if mode.hasSuffix("fences") { writer.updateFence(written) }
            writer.endEncoding()
            var sync = MoEMetalSync()
            switch mode {
            case "fences":
                sync = MoEMetalSync(waitFences: [written], updateFences: [read])
            case "events":
                cb.encodeSignalEvent(event, value: eventValue + 1)
                sync = MoEMetalSync(waitEvent: MoEMetalEventValue(event, value: eventValue + 1),
                                    signalEvent: MoEMetalEventValue(event, value: eventValue + 2))
            default: break
            }
            if mode == "C fences" {
                var desc = moe_encode_desc()
                CMoESwift.moe_encode_desc_init(&desc)
                desc.command_buffer = opaque(cb)
                desc.num_tokens = Int64(tokens)
                desc.x = cArray(xs)
                desc.y = cArray(ys)
                var waits: [UnsafeMutableRawPointer?] = [opaque(written)], updates: [UnsafeMutableRawPointer?] = [opaque(read)]
                let status = waits.withUnsafeMutableBufferPointer { w in
                    updates.withUnsafeMutableBufferPointer { u in
                        desc.wait_fences = UnsafePointer(w.baseAddress)
                        desc.num_wait_fences = 1
                        desc.update_fences = UnsafePointer(u.baseAddress)
                        desc.num_update_fences = 1
                        return CMoESwift.moe_layer_encode(cLayer, &desc)
                    }
                }
                XCTAssertEqual(status, MOE_OK, String(cString: CMoESwift.moe_last_error()))
            } else {
                try layer.encodeForward(xs, tokens: tokens, into: ys, commandBuffer: cb, sync: sync)
            }
            if mode == "events" { cb.encodeWaitForEvent(event, value: eventValue + 2) }
            eventValue += 2
            let reader = try XCTUnwrap(cb.makeComputeCommandEncoder())
            if mode.hasSuffix("fences") { reader.waitForFence(read) }
            try app.read(ys, to: result, count: count, reader)
            reader.endEncoding()
            cb.commit()
            cb.waitUntilCompleted()
            if mode == "nothing" {
                XCTAssertEqual(cb.status, .error)
                let message = "\(String(describing: cb.error))"
                XCTAssertTrue(message.contains("SoftMetal race") && message.contains("moe_") && message.contains("untracked"),
                              message)
            } else {
                XCTAssertEqual(cb.status, .completed, "\(mode): \(String(describing: cb.error))")
                assertBitwiseEqual(app.floats(result, count: count), want, mode)
            }
        }
        // Events go between encoders: not with the caller's open encoder.
        let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        let encoder = try XCTUnwrap(cb.makeComputeCommandEncoder())
        let x = MoEMetalArray(try app.buffer(bytes: count * 4))
        XCTAssertThrowsError(try layer.encodeForward(x, tokens: tokens, into: x, commandBuffer: cb, encoder: encoder,
                                                     sync: MoEMetalSync(signalEvent: MoEMetalEventValue(event, value: 1)))) {
            XCTAssertTrue("\($0)".contains("sync.signalEvent: events are encoded between encoders"), "\($0)")
        }
        encoder.endEncoding()
    }

    /// Both sides of the overlap rule, by its effect: the normed output right after the
    /// output in one buffer is taken and both hold the pointer API's results; one element
    /// of overlap is refused before anything is recorded, and both ranges keep their bytes.
    func testNormedOutputAdjacentIsTakenOverlappingIsRefused() throws {
        let app = try EncodeApp()
        let data = Self.data(seed: 31)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let (h, tokens) = (data.config.hiddenSize, 3)
        let count = h * tokens
        let x = Self.input(count, seed: 32)
        let normWeight = seededFloats(h, seed: 33, scale: 0.5).map { $0 + 1 }
        try normWeight.withUnsafeBufferPointer { w in
            let nextNorm = RMSNorm(weight: w.baseAddress!, eps: 1e-6)
            var y = [Float](repeating: 0, count: count), normed = y
            try x.withUnsafeBufferPointer { xs in
                try normed.withUnsafeMutableBufferPointer { n in
                    try layer.forward(xs.baseAddress!, tokens: tokens,
                                      options: MoEForwardOptions(nextNorm: nextNorm, normedOutput: n.baseAddress!), into: &y)
                }
            }
            let xs = MoEMetalArray(try app.buffer(x))
            let sentinel = [Float](repeating: -7, count: 2 * count)
            let both = try app.buffer(sentinel)
            let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
            XCTAssertThrowsError(try layer.encodeForward(
                xs, tokens: tokens, options: MoEEncodeOptions(nextNorm: nextNorm, normedOutput: MoEMetalArray(both, offset: 4 * count - 4)),
                into: MoEMetalArray(both), commandBuffer: cb)) {
                XCTAssertTrue("\($0)".contains("must not overlap"), "\($0)")
            }
            try layer.encodeForward(xs, tokens: tokens,
                                    options: MoEEncodeOptions(nextNorm: nextNorm, normedOutput: MoEMetalArray(both, offset: 4 * count)),
                                    into: MoEMetalArray(both), commandBuffer: cb)
            cb.commit()
            cb.waitUntilCompleted()
            XCTAssertNil(cb.error)
            assertBitwiseEqual(app.floats(both, count: count), y, "y")
            assertBitwiseEqual(app.floats(both, count: count, offset: 4 * count), normed, "normed")

            // Refused: nothing recorded, both ranges as they were.
            let untouched = try app.buffer(sentinel)
            let refused = try XCTUnwrap(app.queue.makeCommandBuffer())
            XCTAssertThrowsError(try layer.encodeForward(
                xs, tokens: tokens, options: MoEEncodeOptions(nextNorm: nextNorm, normedOutput: MoEMetalArray(untouched, offset: 4)),
                into: MoEMetalArray(untouched), commandBuffer: refused))
            refused.commit()
            refused.waitUntilCompleted()
            XCTAssertEqual(app.floats(untouched, count: 2 * count), sentinel)
        }
    }

    func testBadArgumentsAreClearErrorsAndRecordNothing() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 64, i: 32, e: 4, k: 2), seed: 21)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let (h, tokens) = (64, 3)
        let big = try app.buffer(bytes: 4096)
        let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        func expect(_ fragment: String, file: StaticString = #filePath, line: UInt = #line,
                    _ body: () throws -> Void) {
            XCTAssertThrowsError(try body(), file: file, line: line) { error in
                guard case MoEError.invalidArgument(let message) = error else {
                    return XCTFail("\(error)", file: file, line: line)
                }
                XCTAssert(message.contains(fragment), "\(message) should say \(fragment)", file: file, line: line)
            }
        }
        let ok = MoEMetalArray(big)
        expect("offset 2 is not a multiple of 4") {
            try layer.encodeForward(MoEMetalArray(big, offset: 2), tokens: tokens, into: ok, commandBuffer: cb)
        }
        expect("offset 3 is not a multiple of 2") {
            try layer.encodeForward(ok, tokens: tokens, into: MoEMetalArray(big, offset: 3, dtype: .bfloat16), commandBuffer: cb)
        }
        expect("offset -16 is negative") {
            try layer.encodeForward(ok, tokens: tokens, into: MoEMetalArray(big, offset: -16), commandBuffer: cb)
        }
        expect("need 4100 bytes; the buffer has 4096") {
            try layer.encodeForward(ok, tokens: tokens, into: MoEMetalArray(big, offset: 3332), commandBuffer: cb)
        }
        expect("x: 768 elements of float16 from offset 0 need 1536 bytes; the buffer has 1024") {
            try layer.encodeForward(MoEMetalArray(try app.buffer(bytes: 1024), dtype: .float16),
                                    tokens: 4 * tokens, into: ok, commandBuffer: cb)
        }
        expect("the normed output must not overlap the output") {
            var w = [Float](repeating: 1, count: h)
            try w.withUnsafeMutableBufferPointer { w in
                try layer.encodeForward(ok, tokens: tokens,
                                        options: MoEEncodeOptions(nextNorm: RMSNorm(weight: w.baseAddress!, eps: 1e-6),
                                                                  normedOutput: MoEMetalArray(big, offset: 1024)),
                                        into: MoEMetalArray(big, offset: 1024 + 4 * h), commandBuffer: cb)
            }
        }
        expect("ids: 8 elements of int32 from offset 4080 need 4112 bytes") {
            try layer.encodeExperts(ok, tokens: 4, routing: MoEMetalRouting(ids: big, idsOffset: 4096 - 16, weights: big),
                                    into: MoEMetalArray(big, offset: 2048), commandBuffer: cb)
        }
        let committed = try XCTUnwrap(app.queue.makeCommandBuffer())
        committed.commit()
        expect("already committed") {
            try layer.encodeForward(ok, tokens: tokens, into: ok, commandBuffer: committed)
        }
        XCTAssertThrowsError(try data.layer().encodeForward(ok, tokens: tokens, into: ok, commandBuffer: cb)) { error in
            guard case MoEError.unavailable(let message) = error else { return XCTFail("\(error)") }
            XCTAssert(message.contains("runs on cpu"), message)
        }
        // Nothing was recorded: the command buffer still takes an encoder and runs empty.
        XCTAssertNotNil(cb.makeComputeCommandEncoder().map { $0.endEncoding() })
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertEqual(cb.status, .completed)
    }

    // MARK: C ABI

    private func opaque(_ object: AnyObject) -> UnsafeMutableRawPointer { Unmanaged.passUnretained(object).toOpaque() }

    private func cArray(_ a: MoEMetalArray) -> moe_metal_array {
        moe_metal_array(buffer: opaque(a.buffer), offset: Int64(a.offset), dtype: a.dtype.rawValue)
    }

    func testCEncodeCallsEqualTheirRunningCalls() throws {
        let app = try EncodeApp()
        let datas = [Self.data(seed: 31), Self.data(seed: 32), Self.data(seed: 33)]
        let backend = moe_backend(rawValue: UInt32(Self.kind.rawValue))
        let descs = datas.map { CDescriptor($0, backend: backend) }
        var handles: [OpaquePointer?] = []
        for d in descs {
            var handle: OpaquePointer?
            XCTAssertEqual(CMoESwift.moe_layer_create(&d.desc, &handle), MOE_OK, String(cString: CMoESwift.moe_last_error()))
            handles.append(handle)
        }
        defer { handles.forEach { CMoESwift.moe_layer_destroy($0) } }
        let (h, tokens) = (datas[0].config.hiddenSize, 5)
        let count = tokens * h
        let x = Self.input(count, seed: 34)
        var want = [Float](repeating: 0, count: count), wantStack = want
        XCTAssertEqual(CMoESwift.moe_layer_forward(handles[0], x, Int64(tokens), nil, &want), MOE_OK)
        XCTAssertEqual(CMoESwift.moe_run_layers(handles, 3, x, Int64(tokens), &wantStack), MOE_OK)

        for dtype in Self.dtypes {
            let xs = MoEMetalArray(try app.buffer(bytes: count * 4), dtype: dtype)
            let ys = MoEMetalArray(try app.buffer(bytes: 2 * count * 4), offset: count * dtype.size, dtype: dtype)
            let results = try (0..<2).map { _ in try app.buffer(bytes: count * 4) }
            let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
            // A concurrent encoder, as MLX keeps open per stream: the layer orders its own
            // stages and itself after the app's write and before the app's read.
            let encoder = try XCTUnwrap(cb.makeComputeCommandEncoder(dispatchType: .concurrent))
            try app.write(try app.buffer(x.map { $0 * 2 }), to: xs, count: count, encoder)
            var desc = moe_encode_desc()
            CMoESwift.moe_encode_desc_init(&desc)
            desc.command_buffer = opaque(cb)
            desc.encoder = opaque(encoder)
            desc.num_tokens = Int64(tokens)
            desc.x = cArray(xs)
            desc.y = cArray(ys)
            XCTAssertEqual(CMoESwift.moe_layer_encode(handles[0], &desc), MOE_OK, String(cString: CMoESwift.moe_last_error()))
            try app.read(ys, to: results[0], count: count, encoder)
            encoder.endEncoding()
            desc.encoder = nil
            XCTAssertEqual(CMoESwift.moe_run_layers_encode(handles, 3, &desc, nil), MOE_OK,
                           String(cString: CMoESwift.moe_last_error()))
            var stats = moe_stats()
            stats.struct_size = UInt32(MemoryLayout<moe_stats>.size)
            XCTAssertEqual(CMoESwift.moe_last_stats(&stats), MOE_OK)
            XCTAssertEqual([stats.layers, stats.command_buffers, stats.cpu_waits, stats.host_copies], [3, 0, 0, 0])
            let reader = try XCTUnwrap(cb.makeComputeCommandEncoder())
            try app.read(ys, to: results[1], count: count, reader)
            reader.endEncoding()
            cb.commit()
            cb.waitUntilCompleted()
            assertBitwiseEqual(app.floats(results[0], count: count), want.map { rounded($0, to: dtype) }, "C \(dtype)")
            assertBitwiseEqual(app.floats(results[1], count: count), wantStack.map { rounded($0, to: dtype) },
                               "C stack \(dtype)")
        }
    }

    func testCEncodeErrors() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 64, i: 32, e: 4, k: 2), seed: 41)
        let metal = CDescriptor(data, backend: moe_backend(rawValue: UInt32(Self.kind.rawValue)))
        let cpu = CDescriptor(data, backend: MOE_BACKEND_CPU)
        var layer: OpaquePointer?, cpuLayer: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_layer_create(&metal.desc, &layer), MOE_OK)
        XCTAssertEqual(CMoESwift.moe_layer_create(&cpu.desc, &cpuLayer), MOE_OK)
        defer {
            CMoESwift.moe_layer_destroy(layer)
            CMoESwift.moe_layer_destroy(cpuLayer)
        }
        let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        let big = try app.buffer(bytes: 4096)
        func fresh() -> moe_encode_desc {
            var d = moe_encode_desc()
            CMoESwift.moe_encode_desc_init(&d)
            d.command_buffer = opaque(cb)
            d.num_tokens = 2
            d.x = cArray(MoEMetalArray(big))
            d.y = cArray(MoEMetalArray(big, offset: 2048))
            return d
        }
        func expect(_ status: moe_status, _ fragment: String, _ edit: (inout moe_encode_desc) -> Void,
                    on handle: OpaquePointer? = nil, file: StaticString = #filePath, line: UInt = #line) {
            var d = fresh()
            edit(&d)
            XCTAssertEqual(CMoESwift.moe_layer_encode(handle ?? layer, &d), status, file: file, line: line)
            let message = String(cString: CMoESwift.moe_last_error())
            XCTAssert(message.contains(fragment), "\(message) should say \(fragment)", file: file, line: line)
        }
        expect(MOE_ERROR_INVALID_ARGUMENT, "command_buffer is NULL") { $0.command_buffer = nil }
        expect(MOE_ERROR_INVALID_ARGUMENT, "x.buffer is NULL") { $0.x.buffer = nil }
        expect(MOE_ERROR_INVALID_ARGUMENT, "x.buffer is not an MTLBuffer") { $0.x.buffer = self.opaque(cb) }
        expect(MOE_ERROR_INVALID_ARGUMENT, "command_buffer is not an MTLCommandBuffer") { $0.command_buffer = self.opaque(big) }
        expect(MOE_ERROR_INVALID_ARGUMENT, "y.dtype = 7 is not a moe_dtype") { $0.y.dtype = 7 }
        expect(MOE_ERROR_INVALID_ARGUMENT, "offset 6 is not a multiple of 4") { $0.y.offset = 6 }
        expect(MOE_ERROR_INVALID_ARGUMENT, "the buffer has 4096") { $0.y.offset = 4096 - 4 * 64 }
        expect(MOE_ERROR_INVALID_ARGUMENT, "struct_size") { $0.struct_size = 8 }
        expect(MOE_ERROR_INVALID_ARGUMENT, "normed is set but next_norm.weight is NULL") {
            $0.normed = self.cArray(MoEMetalArray(big, offset: 1024))
        }
        expect(MOE_ERROR_UNAVAILABLE, "runs on cpu", { _ in }, on: cpuLayer)
        var d = fresh()
        d.residual_is_input = 1
        var one: OpaquePointer? = layer
        XCTAssertEqual(CMoESwift.moe_run_layers_encode(&one, 1, &d, nil), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssert(String(cString: CMoESwift.moe_last_error()).contains("takes no residual"))
        d = fresh()
        XCTAssertEqual(CMoESwift.moe_layer_encode_routed(layer, &d, nil, 0, opaque(big), 0), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssert(String(cString: CMoESwift.moe_last_error()).contains("ids_buffer is NULL"))
        XCTAssertEqual(CMoESwift.moe_layer_encode(layer, nil), MOE_ERROR_INVALID_ARGUMENT)
    }
}
