// The C ABI, called through the declarations of Sources/CMoESwift/include/moe_swift.h.
//
// Every call is written `CMoESwift.moe_...`: MoEKernels also exports Swift functions of
// the same names (the @_cdecl implementations), and qualifying with the C module makes the
// compiler type-check each call against the header's prototype, while the linker binds it
// to the @_cdecl symbol. A signature drift between header and exports therefore breaks
// this file's compilation (types) or its results (values), not silently passes.
import CMoESwift
import Dispatch
import Foundation
import XCTest
@testable import MoEKernels

/// A `moe_layer_desc` filled from a LayerData, with C copies of the arrays that this
/// object owns (so tests can overwrite them after creation).
final class CDescriptor {
    var desc = moe_layer_desc()
    private var buffers: [UnsafeMutableBufferPointer<Float>] = []

    init(_ d: LayerData, fused: Bool = false, backend: moe_backend = MOE_BACKEND_CPU) {
        CMoESwift.moe_layer_desc_init(&desc)
        let c = d.config
        desc.backend = Int32(backend.rawValue)
        desc.hidden_size = Int64(c.hiddenSize)
        desc.intermediate_size = Int64(c.intermediateSize)
        desc.num_experts = Int64(c.numExperts)
        desc.top_k = Int64(c.topK)
        desc.scoring = c.scoring.rawValue  // the header's codes (OptionTableTests)
        desc.norm_topk_prob = c.normTopKProb ? 1 : 0
        desc.routed_scaling_factor = c.routedScalingFactor
        desc.n_group = Int32(c.nGroup)
        desc.topk_group = Int32(c.topKGroup)
        desc.activation = c.activation.rawValue
        desc.swiglu_alpha = c.swigluAlpha
        desc.swiglu_limit = c.swigluLimit
        desc.router_weight = copy(d.router)
        desc.router_bias = copy(d.routerBias)
        desc.selection_bias = copy(d.selectionBias)
        desc.per_expert_scale = copy(d.perExpertScale)
        if fused {
            desc.gate_up_proj = copy(d.fusedGateUp)
        } else {
            desc.gate_proj = copy(d.gate)
            desc.up_proj = copy(d.up)
        }
        desc.down_proj = copy(d.down)
        desc.gate_up_bias = copy(d.gateUpBias)
        desc.down_bias = copy(d.downBias)
        desc.shared_intermediate_size = Int64(c.sharedIntermediateSize)
        desc.shared_gate_proj = copy(d.sharedGate)
        desc.shared_up_proj = copy(d.sharedUp)
        desc.shared_down_proj = copy(d.sharedDown)
        desc.shared_sigmoid_gate = copy(d.sharedSigmoidGate)
    }

    func copy(_ a: [Float]?) -> UnsafePointer<Float>? {
        guard let a else { return nil }
        let b = UnsafeMutableBufferPointer<Float>.allocate(capacity: max(a.count, 1))
        _ = b.initialize(from: a)
        buffers.append(b)
        return UnsafePointer(b.baseAddress!)
    }

    /// Overwrites every array the descriptor points to.
    func poisonArrays() {
        for b in buffers { b.update(repeating: .nan) }
    }

    /// Creates a layer from the descriptor (or fails the test).
    func create(file: StaticString = #filePath, line: UInt = #line) -> OpaquePointer? {
        var layer: OpaquePointer?
        let status = CMoESwift.moe_layer_create(&desc, &layer)
        XCTAssertEqual(status, MOE_OK, lastError(), file: file, line: line)
        XCTAssertNotNil(layer, file: file, line: line)
        return layer
    }

    deinit { buffers.forEach { $0.deallocate() } }
}

func lastError() -> String { String(cString: CMoESwift.moe_last_error()) }

/// Forward through the C ABI with arrays.
func cForward(_ layer: OpaquePointer?, _ x: [Float], tokens: Int, residual: [Float]? = nil, h: Int)
    -> (moe_status, [Float]) {
    var y = [Float](repeating: .nan, count: tokens * h)
    let status = x.withUnsafeBufferPointer { xp in
        y.withUnsafeMutableBufferPointer { yp in
            if let residual {
                return residual.withUnsafeBufferPointer { rp in
                    CMoESwift.moe_layer_forward(layer, xp.baseAddress, Int64(tokens), rp.baseAddress, yp.baseAddress)
                }
            }
            return CMoESwift.moe_layer_forward(layer, xp.baseAddress, Int64(tokens), nil, yp.baseAddress)
        }
    }
    return (status, y)
}

func cRoute(_ layer: OpaquePointer?, _ x: [Float], tokens: Int, k: Int) -> (moe_status, [Int32], [Float]) {
    var ids = [Int32](repeating: -1, count: tokens * k)
    var w = [Float](repeating: .nan, count: tokens * k)
    let status = x.withUnsafeBufferPointer { xp in
        ids.withUnsafeMutableBufferPointer { ip in
            w.withUnsafeMutableBufferPointer { wp in
                CMoESwift.moe_layer_route(layer, xp.baseAddress, Int64(tokens), ip.baseAddress, wp.baseAddress)
            }
        }
    }
    return (status, ids, w)
}

final class CABITests: XCTestCase {
    let config = makeConfig(h: 9, i: 5, e: 6, k: 2) {
        $0.sharedIntermediateSize = 3
        $0.scoring = .sigmoid
        $0.nGroup = 3
        $0.topKGroup = 2
        $0.routedScalingFactor = 1.5
    }

    var data: LayerData {
        var o = LayerOptions()
        (o.routerBias, o.selectionBias, o.perExpertScale, o.gateUpBias, o.downBias, o.sharedSigmoidGate) =
            (true, true, true, true, true, true)
        return LayerData.random(config, o, seed: 31)
    }

    /// Asserts that `call` fails with `expected` and that moe_last_error() is a message of
    /// this call naming `word`. The call runs twice, after two different earlier errors
    /// were left in the thread's slot, so a stale message cannot pass for this call's.
    func expectFailure(_ expected: moe_status, mentioning word: String,
                       file: StaticString = #filePath, line: UInt = #line, _ call: () -> moe_status) {
        var messages = [String]()
        for prime in 0..<2 {
            var out: OpaquePointer?
            if prime == 0 {
                XCTAssertNotEqual(CMoESwift.moe_layer_create(nil, &out), MOE_OK, file: file, line: line)
            } else {
                XCTAssertNotEqual(CMoESwift.moe_layer_forward(nil, nil, 1, nil, nil), MOE_OK, file: file, line: line)
            }
            let primed = lastError()
            XCTAssertFalse(primed.isEmpty, file: file, line: line)
            XCTAssertEqual(call(), expected, file: file, line: line)
            messages.append(lastError())
        }
        XCTAssertEqual(messages[0], messages[1], "the call did not set its own message", file: file, line: line)
        XCTAssertFalse(messages[0].isEmpty, file: file, line: line)
        XCTAssertTrue(words(messages[0]).contains(word), "message \"\(messages[0])\" does not name \(word)",
                      file: file, line: line)
    }

    // MARK: Version, enums, defaults

    func testVersionAndEnumValues() {
        XCTAssertEqual(CMoESwift.moe_abi_version(), UInt32(MOE_SWIFT_ABI_VERSION))
        // The Swift enums' codes are the header's by construction (OptionTableTests).
        XCTAssertEqual(CMoESwift.moe_backend_available(Int32(MOE_BACKEND_AUTO.rawValue)), 1)
        XCTAssertEqual(CMoESwift.moe_backend_available(Int32(MOE_BACKEND_CPU.rawValue)), 1)
        XCTAssertEqual(CMoESwift.moe_backend_available(-1), 0)
        XCTAssertEqual(CMoESwift.moe_backend_available(99), 0)
        for kind in [MoEBackendKind.metal, .softMetal] {
            XCTAssertEqual(CMoESwift.moe_backend_available(kind.rawValue),
                           MoELayer.availableBackends.contains(kind) ? 1 : 0)
        }
    }

    func testDescInitDefaults() {
        var d = moe_layer_desc()
        withUnsafeMutableBytes(of: &d) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0xA5) }
        CMoESwift.moe_layer_desc_init(&d)
        XCTAssertEqual(Int(d.struct_size), MemoryLayout<moe_layer_desc>.size)
        XCTAssertEqual(d.backend, Int32(MOE_BACKEND_AUTO.rawValue))
        XCTAssertEqual([d.hidden_size, d.intermediate_size, d.num_experts, d.top_k, d.shared_intermediate_size],
                       [0, 0, 0, 0, 0])
        XCTAssertEqual(d.scoring, Int32(MOE_SCORING_SOFTMAX.rawValue))
        XCTAssertEqual(d.norm_topk_prob, 1)
        XCTAssertEqual(d.routed_scaling_factor, 1)
        XCTAssertEqual(d.n_group, 1)
        XCTAssertEqual(d.topk_group, 1)
        XCTAssertEqual(d.activation, Int32(MOE_ACTIVATION_SILU.rawValue))
        XCTAssertEqual(d.swiglu_alpha, 1.702)
        XCTAssertEqual(d.swiglu_limit, 7)
        let pointers: [UnsafePointer<Float>?] = [
            d.router_weight, d.router_bias, d.selection_bias, d.per_expert_scale, d.gate_proj, d.up_proj,
            d.gate_up_proj, d.down_proj, d.gate_up_bias, d.down_bias, d.shared_gate_proj, d.shared_up_proj,
            d.shared_down_proj, d.shared_sigmoid_gate,
        ]
        XCTAssertTrue(pointers.allSatisfy { $0 == nil })
        // NULL is ignored.
        CMoESwift.moe_layer_desc_init(nil)
    }

    // MARK: Round trip

    func testRoundTripEqualsSwiftAPI() throws {
        let d = data
        let swift = try d.layer()
        let h = config.hiddenSize, k = config.topK
        for fused in [false, true] {
            for backend in [MOE_BACKEND_CPU, MOE_BACKEND_AUTO] {
                let cd = CDescriptor(d, fused: fused, backend: backend)
                let layer = cd.create()
                defer { CMoESwift.moe_layer_destroy(layer) }
                XCTAssertEqual(CMoESwift.moe_layer_backend(layer), Int32(MOE_BACKEND_CPU.rawValue))
                // The caller may free (here: overwrite) its arrays right after creation.
                cd.poisonArrays()

                for t in [1, 4, 23] {
                    let x = seededFloats(t * h, seed: UInt64(60 + t), scale: 2)
                    let r = seededFloats(t * h, seed: UInt64(70 + t))
                    let (s1, y) = cForward(layer, x, tokens: t, h: h)
                    XCTAssertEqual(s1, MOE_OK, lastError())
                    assertBitwiseEqual(y, try swift.forward(x), "C forward, fused \(fused), T \(t)")
                    assertClose(y, NaiveReference(d).forward(x, tokens: t, forcedIds: try swift.route(x).ids),
                                "C forward vs reference")
                    let (s2, yr) = cForward(layer, x, tokens: t, residual: r, h: h)
                    XCTAssertEqual(s2, MOE_OK, lastError())
                    assertBitwiseEqual(yr, try swift.forward(x, residual: r), "C forward with residual")

                    // residual aliasing y
                    var buffer = r
                    let s3 = x.withUnsafeBufferPointer { xp in
                        buffer.withUnsafeMutableBufferPointer { bp in
                            CMoESwift.moe_layer_forward(layer, xp.baseAddress, Int64(t), UnsafePointer(bp.baseAddress),
                                                        bp.baseAddress)
                        }
                    }
                    XCTAssertEqual(s3, MOE_OK, lastError())
                    assertBitwiseEqual(buffer, yr, "C forward, residual aliasing y")

                    let (s4, ids, w) = cRoute(layer, x, tokens: t, k: k)
                    XCTAssertEqual(s4, MOE_OK, lastError())
                    let expected = try swift.route(x)
                    XCTAssertEqual(ids, expected.ids)
                    assertBitwiseEqual(w, expected.weights, "C route weights")
                }
                // T = 0: nothing is read or written, NULL arrays are fine.
                XCTAssertEqual(CMoESwift.moe_layer_forward(layer, nil, 0, nil, nil), MOE_OK)
                XCTAssertEqual(CMoESwift.moe_layer_route(layer, nil, 0, nil, nil), MOE_OK)
                var untouched: [Float] = [42]
                let x: [Float] = [1]
                _ = untouched.withUnsafeMutableBufferPointer {
                    CMoESwift.moe_layer_forward(layer, x, 0, nil, $0.baseAddress)
                }
                XCTAssertEqual(untouched, [42])
            }
        }
    }

    func testEveryActivationAndScoringThroughTheABI() throws {
        let edits: [(inout MoEConfiguration) -> Void] = [
            { $0.activation = .geluTanh },
            { $0.activation = .swigluOAI; $0.swigluAlpha = 1.5; $0.swigluLimit = 4 },
            { $0.activation = .gelu },
            { $0.activation = .relu },
            { $0.scoring = .sigmoid; $0.normTopKProb = false; $0.routedScalingFactor = 0.5 },
        ]
        for (n, edit) in edits.enumerated() {
            var c = makeConfig(h: 7, i: 3, e: 4, k: 2)
            edit(&c)
            let d = LayerData.random(c, seed: 80 + UInt64(n))
            let cd = CDescriptor(d)
            let layer = cd.create()
            defer { CMoESwift.moe_layer_destroy(layer) }
            let x = seededFloats(5 * 7, seed: 90, scale: 2)
            let (status, y) = cForward(layer, x, tokens: 5, h: 7)
            XCTAssertEqual(status, MOE_OK)
            assertBitwiseEqual(y, try d.layer().forward(x), "case \(n)")
        }
    }

    // MARK: struct_size

    func testStructSize() throws {
        let d = data
        let h = config.hiddenSize
        let x = seededFloats(3 * h, seed: 33)
        let expected = try d.layer().forward(x)
        let current = MemoryLayout<moe_layer_desc>.size
        let minimum = LayerDescriptor.minimumSize
        XCTAssertGreaterThan(minimum, MemoryLayout<moe_layer_desc>.offset(of: \moe_layer_desc.router_weight)!)
        XCTAssertLessThanOrEqual(minimum, current)

        // An older caller: only the first `minimum` bytes are its struct; whatever follows
        // in its memory must be ignored (fields it does not know take their defaults).
        // (With ABI version 1 the oldest struct is the current one, so minimum == current
        // and nothing follows; the test keeps working once fields are appended.)
        let cd = CDescriptor(d)
        let raw = UnsafeMutableRawBufferPointer.allocate(byteCount: current + 64, alignment: 16)
        defer { raw.deallocate() }
        for n in 0..<raw.count { raw[n] = 0xFF }
        withUnsafeBytes(of: cd.desc) { raw.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<minimum])) }
        let descPointer = raw.baseAddress!.bindMemory(to: moe_layer_desc.self, capacity: 1)
        descPointer.pointee.struct_size = UInt32(minimum)
        var layer: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_layer_create(descPointer, &layer), MOE_OK, lastError())
        assertBitwiseEqual(cForward(layer, x, tokens: 3, h: h).1, expected, "struct_size = minimum")
        CMoESwift.moe_layer_destroy(layer)

        // A newer caller's longer struct (zero-filled unknown fields): the known part is used.
        for n in 0..<raw.count { raw[n] = 0 }
        withUnsafeBytes(of: cd.desc) { raw.copyMemory(from: $0) }
        descPointer.pointee.struct_size = UInt32(current + 64)
        layer = nil
        XCTAssertEqual(CMoESwift.moe_layer_create(descPointer, &layer), MOE_OK, lastError())
        assertBitwiseEqual(cForward(layer, x, tokens: 3, h: h).1, expected, "struct_size > current")
        CMoESwift.moe_layer_destroy(layer)

        // Too small: not a descriptor at all (e.g. moe_layer_desc_init() was not called).
        for size in [0, 4, 8, minimum - 8, minimum - 1] {
            var small = cd.desc
            small.struct_size = UInt32(size)
            var out: OpaquePointer? = OpaquePointer(bitPattern: 0x1000)
            expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "struct_size") {
                CMoESwift.moe_layer_create(&small, &out)
            }
            XCTAssertNil(out, "*out is NULL after a failure")
        }
    }

    // MARK: Errors

    func testCreateErrors() {
        let d = data
        func failing(_ word: String, _ status: moe_status = MOE_ERROR_INVALID_ARGUMENT,
                     line: UInt = #line, _ edit: (inout moe_layer_desc) -> Void) {
            let cd = CDescriptor(d)
            edit(&cd.desc)
            var out: OpaquePointer? = OpaquePointer(bitPattern: 0x1000)
            expectFailure(status, mentioning: word, line: line) { CMoESwift.moe_layer_create(&cd.desc, &out) }
            XCTAssertNil(out, "*out is NULL after a failure", line: line)
        }
        // NULL desc / out.
        var out: OpaquePointer?
        expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "desc") { CMoESwift.moe_layer_create(nil, &out) }
        let cd = CDescriptor(d)
        expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "out") { CMoESwift.moe_layer_create(&cd.desc, nil) }

        // Enum values.
        failing("backend") { $0.backend = 4 }
        failing("backend") { $0.backend = -1 }
        failing("scoring") { $0.scoring = 2 }
        failing("scoring") { $0.scoring = -7 }
        failing("activation") { $0.activation = Int32(MoEActivation.allCases.count) }
        failing("activation") { $0.activation = Int32.min }
        for kind in [MoEBackendKind.metal, .softMetal] where !MoELayer.availableBackends.contains(kind) {
            failing(kind.name, MOE_ERROR_UNAVAILABLE) { $0.backend = kind.rawValue }
        }
        // Sizes and options.
        failing("hidden_size") { $0.hidden_size = 0 }
        failing("hidden_size") { $0.hidden_size = -9 }
        failing("hidden_size") { $0.hidden_size = 1 << 40 }
        failing("intermediate_size") { $0.intermediate_size = 0 }
        failing("num_experts") { $0.num_experts = -1 }
        failing("num_experts") { $0.num_experts = Int64.min }
        failing("top_k") { $0.top_k = 0 }
        failing("top_k") { $0.top_k = 7 }
        failing("n_group") { $0.n_group = 4 }
        failing("n_group") { $0.n_group = 0 }
        failing("topk_group") { $0.topk_group = 4 }
        failing("topk_group") { $0.topk_group = 0 }
        failing("topk_group") { $0.topk_group = 1; $0.top_k = 3 }
        failing("shared_intermediate_size") { $0.shared_intermediate_size = -3 }
        failing("routed_scaling_factor") { $0.routed_scaling_factor = .nan }
        failing("swiglu_limit") { $0.swiglu_limit = 0 }
        // Arrays.
        failing("router_weight") { $0.router_weight = nil }
        failing("down_proj") { $0.down_proj = nil }
        failing("gate_up_proj") { $0.gate_up_proj = $0.gate_proj }           // all three given
        failing("gate_up_proj") { $0.gate_up_proj = $0.gate_proj; $0.up_proj = nil }  // gate_proj and gate_up_proj
        failing("gate_up_proj") { $0.up_proj = nil }                          // gate_proj alone
        failing("gate_up_proj") { $0.gate_proj = nil; $0.up_proj = nil }      // none
        failing("shared_gate_proj") { $0.shared_gate_proj = nil }
        failing("shared_up_proj") { $0.shared_up_proj = nil }
        failing("shared_down_proj") { $0.shared_down_proj = nil }
    }

    func testCallErrors() throws {
        let h = config.hiddenSize, k = config.topK
        let cd = CDescriptor(data)
        let layer = cd.create()
        defer { CMoESwift.moe_layer_destroy(layer) }
        let x = seededFloats(2 * h, seed: 34)
        var y = [Float](repeating: 0, count: 2 * h)
        var ids = [Int32](repeating: 0, count: 2 * k)
        var w = [Float](repeating: 0, count: 2 * k)
        let invalid = MOE_ERROR_INVALID_ARGUMENT

        y.withUnsafeMutableBufferPointer { yp in
            let y = yp.baseAddress
            expectFailure(invalid, mentioning: "x") { CMoESwift.moe_layer_forward(layer, nil, 2, nil, y) }
            expectFailure(invalid, mentioning: "y") { CMoESwift.moe_layer_forward(layer, x, 2, nil, nil) }
            expectFailure(invalid, mentioning: "num_tokens") { CMoESwift.moe_layer_forward(layer, x, -1, nil, y) }
            expectFailure(invalid, mentioning: "num_tokens") { CMoESwift.moe_layer_forward(layer, x, Int64.min, x, y) }
            expectFailure(invalid, mentioning: "handle") { CMoESwift.moe_layer_forward(nil, x, 2, nil, y) }
        }
        ids.withUnsafeMutableBufferPointer { ip in
            w.withUnsafeMutableBufferPointer { wp in
                let (ids, w) = (ip.baseAddress, wp.baseAddress)
                expectFailure(invalid, mentioning: "x") { CMoESwift.moe_layer_route(layer, nil, 2, ids, w) }
                expectFailure(invalid, mentioning: "ids") { CMoESwift.moe_layer_route(layer, x, 2, nil, w) }
                expectFailure(invalid, mentioning: "weights") { CMoESwift.moe_layer_route(layer, x, 2, ids, nil) }
                expectFailure(invalid, mentioning: "num_tokens") { CMoESwift.moe_layer_route(layer, x, -5, ids, w) }
                expectFailure(invalid, mentioning: "handle") { CMoESwift.moe_layer_route(nil, x, 2, ids, w) }
            }
        }
        XCTAssertEqual(y, [Float](repeating: 0, count: 2 * h), "failed calls wrote nothing")
        XCTAssertEqual(ids, [Int32](repeating: 0, count: 2 * k))

        // The layer still works after all that, and a success leaves the message alone.
        _ = CMoESwift.moe_layer_forward(nil, nil, 1, nil, nil)
        let before = lastError()
        let (status, out) = cForward(layer, x, tokens: 2, h: h)
        XCTAssertEqual(status, MOE_OK)
        assertBitwiseEqual(out, try data.layer().forward(x), "after errors")
        XCTAssertEqual(lastError(), before, "a successful call changed the error message")
    }

    func testDestroyedAndForgedHandles() throws {
        let h = config.hiddenSize, k = config.topK
        let x = seededFloats(h, seed: 35)
        var y = [Float](repeating: 0, count: h)
        var ids = [Int32](repeating: 0, count: k)
        var w = [Float](repeating: 0, count: k)
        let cd = CDescriptor(data)
        let destroyed = cd.create()
        CMoESwift.moe_layer_destroy(destroyed)
        // A live layer created afterwards does not make the old handle valid again.
        let live = cd.create()
        defer { CMoESwift.moe_layer_destroy(live) }
        XCTAssertNotEqual(live, destroyed)

        var forged: [OpaquePointer?] = [destroyed, OpaquePointer(bitPattern: 0x10), OpaquePointer(bitPattern: 0xDEAD_BEE0),
                                        OpaquePointer(bitPattern: UInt.max)]
        // The address of some real memory is not a layer either.
        let memory = UnsafeMutableRawPointer.allocate(byteCount: 256, alignment: 16)
        defer { memory.deallocate() }
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: 256)
        forged.append(OpaquePointer(memory))
        for handle in forged {
            y.withUnsafeMutableBufferPointer { yp in
                expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "handle") {
                    CMoESwift.moe_layer_forward(handle, x, 1, nil, yp.baseAddress)
                }
            }
            ids.withUnsafeMutableBufferPointer { ip in
                w.withUnsafeMutableBufferPointer { wp in
                    expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "handle") {
                        CMoESwift.moe_layer_route(handle, x, 1, ip.baseAddress, wp.baseAddress)
                    }
                }
            }
            // T = 0 still checks the handle.
            expectFailure(MOE_ERROR_INVALID_ARGUMENT, mentioning: "handle") {
                CMoESwift.moe_layer_forward(handle, nil, 0, nil, nil)
            }
            XCTAssertEqual(CMoESwift.moe_layer_backend(handle), -1)
        }
        XCTAssertEqual(CMoESwift.moe_layer_backend(nil), -1)
        XCTAssertEqual(CMoESwift.moe_layer_backend(live), Int32(MOE_BACKEND_CPU.rawValue))
        // Destroying NULL is ignored; the live layer is unaffected by all of the above.
        CMoESwift.moe_layer_destroy(nil)
        XCTAssertEqual(cForward(live, x, tokens: 1, h: h).0, MOE_OK)
    }

    // MARK: Threads

    /// An error on one thread does not change another thread's message.
    func testLastErrorIsThreadLocal() {
        final class Box: @unchecked Sendable {
            var fresh = "", own = "", ownLater = ""
        }
        let box = Box()
        let errorSet = DispatchSemaphore(value: 0), mainErred = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)

        var out: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_layer_create(nil, &out), MOE_ERROR_INVALID_ARGUMENT)
        let mainFirst = lastError()
        XCTAssertTrue(words(mainFirst).contains("desc"))

        let thread = Thread {
            box.fresh = lastError()
            _ = CMoESwift.moe_layer_forward(OpaquePointer(bitPattern: 0xBAD0), nil, 1, nil, nil)
            box.own = lastError()
            errorSet.signal()
            mainErred.wait()
            box.ownLater = lastError()
            done.signal()
        }
        thread.start()
        errorSet.wait()
        // The other thread's failure did not touch this thread's message...
        XCTAssertEqual(lastError(), mainFirst)
        // ...and this thread's next failure does not touch the other thread's.
        XCTAssertEqual(CMoESwift.moe_layer_route(nil, nil, 1, nil, nil), MOE_ERROR_INVALID_ARGUMENT)
        let mainSecond = lastError()
        mainErred.signal()
        done.wait()

        XCTAssertEqual(box.fresh, "", "a new thread starts without a message")
        XCTAssertTrue(words(box.own).contains("handle"), box.own)
        XCTAssertNotEqual(box.own, mainFirst)
        XCTAssertNotEqual(box.own, mainSecond)
        XCTAssertEqual(box.ownLater, box.own)
        XCTAssertEqual(lastError(), mainSecond)
    }

    /// The same handle used from several threads at once gives the sequential results.
    func testConcurrentForwardThroughTheABI() throws {
        let h = config.hiddenSize
        let cd = CDescriptor(data)
        let layer = cd.create()
        defer { CMoESwift.moe_layer_destroy(layer) }
        let x = seededFloats(19 * h, seed: 36, scale: 2)
        let expected = cForward(layer, x, tokens: 19, h: h).1
        let iterations = 12
        let outputs = UnsafeMutableBufferPointer<Float>.allocate(capacity: iterations * 19 * h)
        let statuses = UnsafeMutableBufferPointer<moe_status>.allocate(capacity: iterations)
        defer { outputs.deallocate(); statuses.deallocate() }
        let handle = layer
        x.withUnsafeBufferPointer { xp in
            DispatchQueue.concurrentPerform(iterations: iterations) { n in
                statuses[n] = CMoESwift.moe_layer_forward(handle, xp.baseAddress, 19, nil,
                                                          outputs.baseAddress! + n * 19 * h)
            }
        }
        for n in 0..<iterations {
            XCTAssertEqual(statuses[n], MOE_OK)
            assertBitwiseEqual(Array(outputs[n * 19 * h..<(n + 1) * 19 * h]), expected, "iteration \(n)")
        }
    }
}
