// The encode entry points of the C ABI under inputs nobody should pass (the header promises
// that no input aborts): a seeded fuzzer over every field of moe_encode_desc, the routed
// call's ids and offsets and the stack's layer counts, whose cases must each return a
// status (never trap) and, when MOE_OK, run on the device without a fault. Also: an
// encoder that was already ended, and routed ids outside [0, E) in decode and prefill.
import CMoESwift
import Foundation
import XCTest
#if canImport(Metal)
import Metal
#else
import SoftMetal
#endif
@testable import MoEKernels

final class EncodeFuzzTests: XCTestCase {
    static let kind = MetalBackendTests.kind

    override func setUpWithError() throws {
        guard MoELayer.availableBackends.contains(Self.kind) else {
            throw XCTSkip("the \(Self.kind.name) backend is not available here")
        }
    }

    private func opaque(_ object: AnyObject) -> UnsafeMutableRawPointer { Unmanaged.passUnretained(object).toOpaque() }

    /// Seeded choices: the same cases on every run.
    struct Cases {
        var rng: SplitMix64
        mutating func pick<T>(_ choices: [T]) -> T { choices[rng.below(choices.count)] }
        mutating func chance(_ percent: Int) -> Bool { rng.below(100) < percent }
    }

    func testEncodeEntryPointsNeverTrap() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 64, i: 32, e: 4, k: 2) { $0.sharedIntermediateSize = 16 }, seed: 5)
        let (h, k) = (data.config.hiddenSize, data.config.topK)
        let metal = CDescriptor(data, backend: moe_backend(rawValue: UInt32(Self.kind.rawValue)))
        var layers: [OpaquePointer?] = [nil, nil]
        for i in 0..<2 { XCTAssertEqual(CMoESwift.moe_layer_create(&metal.desc, &layers[i]), MOE_OK) }
        var cpuLayer: OpaquePointer?
        let cpu = CDescriptor(data, backend: MOE_BACKEND_CPU)
        XCTAssertEqual(CMoESwift.moe_layer_create(&cpu.desc, &cpuLayer), MOE_OK)
        defer { (layers + [cpuLayer]).forEach { CMoESwift.moe_layer_destroy($0) } }

        let small = try app.buffer(bytes: 4096), large = try app.buffer(bytes: 64 * h * 4)
        let ids = try app.buffer((0..<64 * k).map { Int32($0 % 4) })
        let weights = try app.buffer([Float](repeating: 0.5, count: 64 * k))
        let norm = [Float](repeating: 1, count: h)
        let offsets: [Int64] = [0, 4, 6, 16, 2048, 4092, 4096, 4100, 64 * Int64(h) * 4 - 4, -4, Int64.min, Int64.max,
                                Int64.max - 3, 1 << 62, Int64(Int32.max) * 4, Int64(UInt32.max) + 1]
        let counts: [Int64] = [0, 1, 2, 5, 17, -1, Int64(Int32.max), Int64(Int32.max) + 1, Int64.max, Int64.min]
        var cases = Cases(rng: SplitMix64(seed: 42))
        var statuses: [UInt32: Int] = [:]
        var cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        var recorded = 0
        let total = 10_000
        try norm.withUnsafeBufferPointer { normWeight in
            for n in 0..<total {
                var d = moe_encode_desc()
                CMoESwift.moe_encode_desc_init(&d)
                if cases.chance(5) { d.struct_size = UInt32(cases.pick([0, 8, 40, 1 << 20])) }
                d.command_buffer = cases.chance(3) ? nil : cases.chance(2) ? opaque(small) : opaque(cb)
                d.num_tokens = cases.chance(70) ? Int64(cases.pick([0, 1, 2, 5, 9])) : cases.pick(counts)
                func array() -> moe_metal_array {
                    var a = moe_metal_array()
                    a.buffer = cases.chance(5) ? nil : cases.chance(3) ? opaque(cb) : opaque(cases.pick([small, large]))
                    a.offset = cases.chance(60) ? Int64(cases.pick([0, 16, 256])) : cases.pick(offsets)
                    a.dtype = cases.chance(85) ? Int32(cases.pick([0, 1, 2])) : cases.pick([3, 7, -1, Int32.max])
                    return a
                }
                d.x = array()
                d.y = array()
                if cases.chance(30) { d.residual = array() }
                if cases.chance(15) { d.residual_is_input = cases.pick([1, 2, -1]) }
                if cases.chance(20) {
                    d.input_norm.weight = normWeight.baseAddress
                    d.input_norm.eps = cases.pick([1e-6, 0, -1, .nan, .infinity])
                }
                if cases.chance(20) {
                    d.next_norm.weight = normWeight.baseAddress
                    d.next_norm.eps = cases.pick([1e-6, 0, .nan])
                    d.normed = array()
                } else if cases.chance(5) {
                    d.normed = array()
                }
                let status: moe_status
                switch n % 3 {
                case 0:
                    status = CMoESwift.moe_layer_encode(cases.chance(5) ? cpuLayer : layers[0], &d)
                case 1:
                    let idsBuffer = cases.chance(5) ? nil : cases.chance(3) ? opaque(cb) : opaque(ids)
                    let weightsBuffer = cases.chance(5) ? nil : opaque(weights)
                    status = CMoESwift.moe_layer_encode_routed(
                        layers[0], &d, idsBuffer, cases.chance(60) ? Int64(cases.pick([0, 8])) : cases.pick(offsets),
                        weightsBuffer, cases.chance(60) ? 0 : cases.pick(offsets))
                default:
                    let count = cases.chance(70) ? Int64(cases.pick([1, 2])) : cases.pick(counts)
                    status = layers.withUnsafeBufferPointer { handles in
                        CMoESwift.moe_run_layers_encode(cases.chance(3) ? nil : handles.baseAddress, count, &d, nil)
                    }
                }
                statuses[status.rawValue, default: 0] += 1
                if status == MOE_OK {
                    recorded += 1
                } else {
                    XCTAssertFalse(String(cString: CMoESwift.moe_last_error()).isEmpty, "case \(n): an error without a message")
                }
                // What was recorded runs on the device, every dozen recorded calls.
                if recorded == 12 || n == total - 1 {
                    cb.commit()
                    cb.waitUntilCompleted()
                    XCTAssertEqual(cb.status, .completed, "case \(n): \(String(describing: cb.error))")
                    cb = try XCTUnwrap(app.queue.makeCommandBuffer())
                    recorded = 0
                }
            }
        }
        // Both sides were exercised: calls that passed and each kind of refusal.
        XCTAssertGreaterThan(statuses[MOE_OK.rawValue, default: 0], 100, "\(statuses)")
        XCTAssertGreaterThan(statuses[MOE_ERROR_INVALID_ARGUMENT.rawValue, default: 0], 1000, "\(statuses)")
        XCTAssertGreaterThan(statuses[MOE_ERROR_UNAVAILABLE.rawValue, default: 0], 0, "\(statuses)")
        print("encode fuzzer: \(total) cases, statuses \(statuses.sorted { $0.key < $1.key })")
    }

    /// A huge offset is an error naming the buffer (it used to overflow `offset + bytes`
    /// while the message was formed, and trap).
    func testHugeOffsetsAreErrors() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 64, i: 32, e: 4, k: 2), seed: 6)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let buffer = try app.buffer(bytes: 4096)
        let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        for offset in [Int.max - 3, Int.max - 255, 1 << 62] {  // the first overflows offset + bytes
            XCTAssertThrowsError(try layer.encodeForward(MoEMetalArray(buffer, offset: offset), tokens: 2,
                                                         into: MoEMetalArray(buffer), commandBuffer: cb)) { error in
                XCTAssert("\(error)".contains("x: 128 elements of float32 from offset \(offset) need "), "\(error)")
                XCTAssert("\(error)".hasSuffix("bytes; the buffer has 4096"), "\(error)")
            }
            XCTAssertThrowsError(try layer.encodeExperts(
                MoEMetalArray(buffer), tokens: 2, routing: MoEMetalRouting(ids: buffer, idsOffset: offset, weights: buffer),
                into: MoEMetalArray(buffer, offset: 1024), commandBuffer: cb)) { error in
                XCTAssert("\(error)".contains("ids: 4 elements of int32 from offset \(offset) need "), "\(error)")
            }
        }
    }

    /// An encoder the caller has already ended: Metal's validation layer stops the program
    /// there; SoftMetal fails the command buffer, naming the misuse, instead of dropping the
    /// layer's dispatches and completing as if it had run.
    func testAnEndedEncoderFailsTheCommandBuffer() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 64, i: 32, e: 4, k: 2), seed: 7)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let x = MoEMetalArray(try app.buffer(seededFloats(2 * 64, seed: 8)))
        let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
        let encoder = try XCTUnwrap(cb.makeComputeCommandEncoder())
        encoder.endEncoding()
        try layer.encodeForward(x, tokens: 2, into: MoEMetalArray(try app.buffer(bytes: 2 * 64 * 4)), commandBuffer: cb,
                                encoder: encoder)
        cb.commit()
        cb.waitUntilCompleted()
        XCTAssertEqual(cb.status, .error)
        XCTAssert("\(String(describing: cb.error))".contains("after endEncoding()"), "\(String(describing: cb.error))")
    }

    /// Routed ids outside [0, E) (they are on the GPU, unchecked) select nothing: such a
    /// pair adds nothing to its token's output, in decode (the GEMVs read the ids) and in
    /// prefill (the buckets and GEMMs), and no expert is read past the weights.
    func testRoutedIdsOutsideTheExpertsAddNothing() throws {
        let app = try EncodeApp()
        let data = LayerData.random(makeConfig(h: 256, i: 64, e: 8, k: 4), seed: 9)
        let layer = try MoELayer(configuration: data.config, weights: data.weights(), backend: Self.kind)
        let (h, e) = (256, Int32(8))
        for tokens in [2, 37] {
            let x = seededFloats(tokens * h, seed: UInt64(tokens))
            var (ids, weights) = try layer.route(x)
            let bad: [Int32] = [-1, e, Int32.max, Int32.min, e + 1]
            var valid = ids, zeroed = weights
            for pair in stride(from: 1, to: ids.count, by: 3) {
                ids[pair] = bad[pair % bad.count]
                valid[pair] = 0
                zeroed[pair] = 0
            }
            let want = try layer.experts(x, ids: valid, weights: zeroed)
            let out = try app.buffer(bytes: tokens * h * 4)
            // Stale values in the scratch's pair rows from an earlier call must not show.
            _ = try layer.forward(seededFloats(tokens * h, seed: 99, scale: 100))
            let cb = try XCTUnwrap(app.queue.makeCommandBuffer())
            try layer.encodeExperts(MoEMetalArray(try app.buffer(x)), tokens: tokens,
                                    routing: MoEMetalRouting(ids: try app.buffer(ids), weights: try app.buffer(weights)),
                                    into: MoEMetalArray(out), commandBuffer: cb)
            cb.commit()
            cb.waitUntilCompleted()
            XCTAssertEqual(cb.status, .completed, "\(String(describing: cb.error))")
            let got = app.floats(out, count: tokens * h)
            let differ = zip(got, want).filter { $0 != $1 }.count
            XCTAssertEqual(differ, 0, "\(tokens) tokens: \(differ) elements differ from the experts without those pairs")
        }
    }
}
