// Weight formats through the Swift API and the C ABI: MLX's affine quantization (every bit
// width, hand-packed here as little-endian bit streams), mxfp4 and bfloat16, against the
// float64 reference on the dequantized values; and the errors of bad moe_tensor fields.
import CMoECPU
import CMoESwift
import XCTest
@testable import MoEKernels

/// A (rows, cols) float matrix quantized as MLX does it (min/max per group), packed here
/// bit by bit, with the values it stands for (scale * q + bias, rounded once).
struct PackedAffine {
    var words: [UInt32]
    var scales: [Float]
    var biases: [Float]
    var values: [Float]

    init(_ w: [Float], bits: Int, groupSize: Int) {
        let levels = Float((1 << bits) - 1)
        var bitsOut = [UInt8](repeating: 0, count: w.count * bits)
        (scales, biases, values) = ([], [], [Float](repeating: 0, count: w.count))
        for g in 0..<(w.count / groupSize) {
            let group = w[g * groupSize..<(g + 1) * groupSize]
            let lo = group.min()!, hi = group.max()!
            let scale = Swift.max((hi - lo) / levels, 1e-8)
            scales.append(scale)
            biases.append(lo)
            for i in 0..<groupSize {
                let n = g * groupSize + i
                let q = Swift.min(Swift.max(((w[n] - lo) / scale).rounded(), 0), levels)
                values[n] = Float(Double(q) * Double(scale) + Double(lo))  // scale * q + bias, rounded once
                for b in 0..<bits { bitsOut[n * bits + b] = UInt8((Int(q) >> b) & 1) }
            }
        }
        words = [UInt32](repeating: 0, count: bitsOut.count / 32)
        for (n, bit) in bitsOut.enumerated() where bit != 0 { words[n / 32] |= 1 << UInt32(n % 32) }
    }

    /// Borrowed WeightData; the arrays must outlive the layer's creation.
    func data(bits: Int, groupSize: Int, body: (WeightData) throws -> Void) rethrows {
        try words.withUnsafeBytes { w in
            try scales.withUnsafeBytes { s in
                try biases.withUnsafeBytes { b in
                    try body(.quantized(QuantizedWeightData(.affine(bits: bits, groupSize: groupSize),
                                                            weight: w, scales: s, biases: b)))
                }
            }
        }
    }
}

/// bfloat16 bit patterns (round to nearest even) and their float values.
func bfloat16(_ w: [Float]) -> (bits: [UInt16], values: [Float]) {
    let bits = w.map { v -> UInt16 in
        let u = v.bitPattern
        return UInt16((u &+ 0x7FFF &+ ((u >> 16) & 1)) >> 16)
    }
    return (bits, bits.map { Float(bitPattern: UInt32($0) << 16) })
}

/// A layer whose gate (group 32), up (group 64) and down (group 32) are `bits`-bit affine,
/// checked against the reference on its dequantized values for 1, 3 and 20 tokens (the
/// decode and prefill paths of every backend); `inspect` sees the layer right after its
/// creation, with the packed tensors.
func checkAffineLayer(_ config: MoEConfiguration, bits: Int, seed: UInt64, backend: MoEBackendKind,
                      file: StaticString = #filePath, line: UInt = #line,
                      inspect: (MoELayer, [PackedAffine]) throws -> Void) throws {
    var d = LayerData.random(config, seed: seed)
    let h = config.hiddenSize
    let gate = PackedAffine(d.gate, bits: bits, groupSize: 32)
    let up = PackedAffine(d.up, bits: bits, groupSize: 64)
    let down = PackedAffine(d.down, bits: bits, groupSize: 32)
    (d.gate, d.up, d.down) = (gate.values, up.values, down.values)
    let x = seededFloats(20 * h, seed: seed + 1)
    try gate.data(bits: bits, groupSize: 32) { g in
        try up.data(bits: bits, groupSize: 64) { u in
            try down.data(bits: bits, groupSize: 32) { dn in
                var w = d.weights()
                w.gateUp = .separate(gate: g, up: u)
                w.downProj = dn
                let layer = try MoELayer(configuration: config, weights: w, backend: backend)
                try inspect(layer, [gate, up, down])
                for tokens in [1, 3, 20] {
                    let xs = Array(x[0..<tokens * h])
                    let (ids, _) = try layer.route(xs)
                    let ref = NaiveReference(d).forward(xs, tokens: tokens, forcedIds: ids)
                    assertClose(try layer.forward(xs), ref, "\(bits)-bit, \(tokens) tokens", file: file, line: line)
                }
            }
        }
    }
}

final class FormatTests: XCTestCase {
    let config = makeConfig(h: 64, i: 64, e: 6, k: 2) { $0.sharedIntermediateSize = 32 }

    func testAffineEveryBitWidthMatchesTheReference() throws {
        for bits in [2, 3, 4, 5, 6, 8] {
            try checkAffineLayer(config, bits: bits, seed: UInt64(40 + bits), backend: .cpu) { _, _ in }
        }
    }

    /// E8M0 scales at the ends of their range: 0 is 2^-127 (a float32 subnormal), 254 is
    /// 2^127, 255 is NaN; e2m1 code 1 is 0.5, code 9 is -0.5.
    func testMXFP4ScaleExtremes() {
        let scales: [UInt8] = [0, 127, 254, 255]
        var words = [UInt32](repeating: 0, count: 16)   // 4 groups of 32 codes
        for g in 0..<4 { for n in 0..<4 { words[g * 4 + n] = 0x9191_9191 } }   // codes 1, 9, 1, 9, ...
        let values = words.withUnsafeBytes { w in
            scales.withUnsafeBytes { s in
                WeightData.quantized(QuantizedWeightData(.mxfp4, weight: w, scales: s)).floats()
            }
        }
        XCTAssertEqual(values.count, 128)
        let expected: [Float] = [0x1p-128, 0.5, 0x1p126]   // 0.5 * 2^(s - 127)
        for g in 0..<3 {
            XCTAssertEqual(values[g * 32], expected[g], "group \(g)")
            XCTAssertEqual(values[g * 32 + 1], -expected[g], "group \(g)")
        }
        XCTAssertTrue(values[96..<128].allSatisfy(\.isNaN), "scale 255 is NaN")
    }

    func testBFloat16AndMXFP4ThroughTheABI() throws {
        var d = LayerData.random(config, seed: 50)
        let (bf, bfValues) = bfloat16(d.gate)
        d.gate = bfValues
        // mxfp4 down_proj: codes 0...15 cycling, scales 2^-3 and 2^-2 alternating.
        let e2m1: [Float] = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6]
        let count = d.down.count
        var codes = [UInt32](repeating: 0, count: count / 8)
        var scales = [UInt8](repeating: 0, count: count / 32)
        for n in 0..<count {
            let code = UInt32((n * 7 + n / 5) % 16)
            codes[n / 8] |= code << UInt32(4 * (n % 8))
            scales[n / 32] = UInt8(127 - 3 + (n / 32) % 2)
            d.down[n] = e2m1[Int(code)] * (((n / 32) % 2 == 0) ? 0.125 : 0.25)
        }
        let cd = CDescriptor(d)
        cd.desc.gate_proj = nil
        cd.desc.down_proj = nil
        let h = config.hiddenSize
        let x = seededFloats(7 * h, seed: 51)
        try bf.withUnsafeBytes { bfBytes in
            try codes.withUnsafeBytes { codeBytes in
                try scales.withUnsafeBytes { scaleBytes in
                    cd.desc.gate_proj_tensor.format = Int32(MOE_FORMAT_BF16.rawValue)
                    cd.desc.gate_proj_tensor.data = bfBytes.baseAddress
                    cd.desc.down_proj_tensor.format = Int32(MOE_FORMAT_MXFP4.rawValue)
                    cd.desc.down_proj_tensor.data = codeBytes.baseAddress
                    cd.desc.down_proj_tensor.scales = scaleBytes.baseAddress
                    let layer = cd.create()
                    defer { CMoESwift.moe_layer_destroy(layer) }
                    let (_, ids, _) = cRoute(layer, x, tokens: 7, k: config.topK)
                    let ref = NaiveReference(d).forward(x, tokens: 7, forcedIds: ids)
                    assertClose(cForward(layer, x, tokens: 7, h: h).1, ref, "bf16 gate, mxfp4 down")
                    _ = try XCTUnwrap(layer)
                }
            }
        }
    }

    func testBadTensorFieldsAreNamed() {
        let d = LayerData.random(config, seed: 60)
        // Large enough for any format of these shapes: no case may read past them.
        let words = [UInt32](repeating: 0, count: 1 << 16), scales = [Float](repeating: 1, count: 1 << 16)
        words.withUnsafeBytes { w in
            scales.withUnsafeBytes { s in
                /// gate_proj as a tensor of `format` (an affine one with bits, group size and biases).
                func gate(_ desc: inout moe_layer_desc, _ format: moe_format, bits: Int32 = 4, group: Int32 = 32) {
                    desc.gate_proj = nil
                    desc.gate_proj_tensor = moe_tensor(format: Int32(format.rawValue), bits: bits, group_size: group,
                                                       scale_dtype: 0, data: w.baseAddress, scales: s.baseAddress,
                                                       biases: format == MOE_FORMAT_AFFINE ? s.baseAddress : nil)
                }
                let cases: [(String, (inout moe_layer_desc) -> Void)] = [
                    ("gate_proj_tensor.format", { gate(&$0, MOE_FORMAT_BF16); $0.gate_proj_tensor.format = 9 }),
                    ("bits", { gate(&$0, MOE_FORMAT_AFFINE, bits: 7) }),
                    ("group_size", { gate(&$0, MOE_FORMAT_AFFINE, group: 48) }),
                    ("scale_dtype", { gate(&$0, MOE_FORMAT_AFFINE); $0.gate_proj_tensor.scale_dtype = 5 }),
                    ("scales", { gate(&$0, MOE_FORMAT_AFFINE); $0.gate_proj_tensor.scales = nil }),
                    ("biases", { gate(&$0, MOE_FORMAT_AFFINE); $0.gate_proj_tensor.biases = nil }),
                    ("mxfp4", { gate(&$0, MOE_FORMAT_MXFP4); $0.gate_proj_tensor.biases = s.baseAddress }),
                    ("mxfp4", { gate(&$0, MOE_FORMAT_MXFP4, group: 64) }),
                    ("not both", { gate(&$0, MOE_FORMAT_BF16); $0.gate_proj = s.baseAddress!.assumingMemoryBound(to: Float.self) }),
                    ("multiple", { gate(&$0, MOE_FORMAT_AFFINE, group: 128) }),  // H = 64 < 128
                ]
                for (word, edit) in cases {
                    let cd = CDescriptor(d)
                    edit(&cd.desc)
                    var layer: OpaquePointer?
                    XCTAssertEqual(CMoESwift.moe_layer_create(&cd.desc, &layer), MOE_ERROR_INVALID_ARGUMENT, word)
                    XCTAssertNil(layer)
                    XCTAssertTrue(lastError().contains(word), "\"\(lastError())\" does not name \(word)")
                }
            }
        }
    }
}
