// ggml's block formats through the Swift API and the C ABI: the types read from
// moe_options.h's rows, blocks packed by hand here (Q8_0 and Q4_0: one float16 scale per
// 32 codes) against the float64 reference on their values, and the errors of bad blocks.
// The other types' meanings are checked bit for bit against ggml's own code in
// tests/python/test_ggml_formats.py.
import CMoESwift
import XCTest
@testable import MoEKernels

/// Q8_0 (value = d * int8 code) or Q4_0 (value = d * (nibble - 8), low nibbles elements
/// 0-15, high nibbles 16-31) blocks of a float matrix, d a power of two, and their values.
struct PackedGGML {
    var bytes: [UInt8] = []
    var values: [Float] = []

    init(_ w: [Float], q8: Bool, log2Scale k: Int) {
        let d = Float(sign: .plus, exponent: k, significand: 1)
        let half = UInt16(15 + k) << 10
        values = [Float](repeating: 0, count: w.count)
        for b in 0..<(w.count / 32) {
            bytes += [UInt8(half & 0xff), UInt8(half >> 8)]
            let codes = (0..<32).map { i -> Int in
                let q = Int((w[b * 32 + i] / d).rounded())
                return q8 ? Swift.min(Swift.max(q, -127), 127) : Swift.min(Swift.max(q + 8, 0), 15)
            }
            for i in 0..<32 { values[b * 32 + i] = Float(q8 ? codes[i] : codes[i] - 8) * d }
            if q8 {
                bytes += codes.map { UInt8(bitPattern: Int8($0)) }
            } else {
                bytes += (0..<16).map { UInt8(codes[$0] | codes[$0 + 16] << 4) }
            }
        }
    }
}

final class GGMLFormatTests: XCTestCase {
    let config = makeConfig(h: 64, i: 64, e: 6, k: 2) { $0.sharedIntermediateSize = 32 }

    func testTheTypesAreTheHeaderRows() {
        XCTAssertEqual(GGMLType.allCases.map(\.description),
                       ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs",
                        "mxfp4_ggml"])
        for t in GGMLType.allCases {
            XCTAssertEqual(t.format, 100 + t.ggmlType)
            XCTAssertEqual(GGMLType(ggmlType: t.ggmlType), t)
            XCTAssertEqual(GGMLType(name: t.description), t)
            XCTAssertEqual(WeightFormat(ggmlType: t.ggmlType), .quantized(.ggml(t), scaleType: .float32))
            XCTAssertEqual(Int32(bitPattern: WeightFormat.quantized(.ggml(t), scaleType: .float32).code.rawValue), t.format)
        }
        let q4K = GGMLType(name: "q4_K")!
        XCTAssertEqual([q4K.ggmlType, Int32(q4K.blockElements), Int32(q4K.blockBytes)], [12, 256, 144])
        XCTAssertEqual(WeightFormat.quantized(.ggml(q4K), scaleType: .float32).rowBytes(cols: 768), 3 * 144)
        XCTAssertEqual(WeightFormat(ggmlType: 0), .float32)
        XCTAssertEqual(WeightFormat(ggmlType: 1), .dense(.float16))
        XCTAssertEqual(WeightFormat(ggmlType: 30), .dense(.bfloat16))
        XCTAssertNil(WeightFormat(ggmlType: 9))    // Q8_1: ggml's activation blocks, not a weight type here
        XCTAssertNil(GGMLType(ggmlType: 1))        // dense, not blocks
        XCTAssertNil(GGMLType(name: "q4_k"))
    }

    func testHandPackedBlocksMatchTheReference() throws {
        var d = LayerData.random(config, seed: 70)
        let gate = PackedGGML(d.gate, q8: true, log2Scale: -9)
        let down = PackedGGML(d.down, q8: false, log2Scale: -5)
        (d.gate, d.down) = (gate.values, down.values)
        let h = config.hiddenSize, x = seededFloats(20 * h, seed: 71)
        try gate.bytes.withUnsafeBytes { g in
            try down.bytes.withUnsafeBytes { dn in
                var w = d.weights()
                w.gateUp = .separate(gate: .quantized(QuantizedWeightData(ggml: GGMLType(name: "q8_0")!, blocks: g)),
                                     up: WeightData(d.up))
                w.downProj = .quantized(QuantizedWeightData(ggml: GGMLType(name: "q4_0")!, blocks: dn))
                let layer = try MoELayer(configuration: config, weights: w, backend: .cpu)
                for tokens in [1, 3, 20] {
                    let xs = Array(x[0..<tokens * h])
                    let (ids, _) = try layer.route(xs)
                    let ref = NaiveReference(d).forward(xs, tokens: tokens, forcedIds: ids)
                    assertClose(try layer.forward(xs), ref, "q8_0 gate, q4_0 down, \(tokens) tokens")
                }
            }
        }
    }

    func testBlocksThroughTheABIReadDataOnly() throws {
        var d = LayerData.random(config, seed: 72)
        let down = PackedGGML(d.down, q8: true, log2Scale: -8)
        d.down = down.values
        let cd = CDescriptor(d)
        cd.desc.down_proj = nil
        let h = config.hiddenSize, x = seededFloats(5 * h, seed: 73)
        try down.bytes.withUnsafeBytes { blocks in
            cd.desc.down_proj_tensor.format = Int32(MOE_FORMAT_GGML_Q8_0.rawValue)
            cd.desc.down_proj_tensor.data = blocks.baseAddress
            // Ignored for ggml's formats (moe_swift.h): whatever they hold.
            cd.desc.down_proj_tensor.bits = 3
            cd.desc.down_proj_tensor.group_size = 48
            cd.desc.down_proj_tensor.scales = blocks.baseAddress
            let layer = cd.create()
            defer { CMoESwift.moe_layer_destroy(layer) }
            _ = try XCTUnwrap(layer, lastError())
            let (_, ids, _) = cRoute(layer, x, tokens: 5, k: config.topK)
            let ref = NaiveReference(d).forward(x, tokens: 5, forcedIds: ids)
            assertClose(cForward(layer, x, tokens: 5, h: h).1, ref, "q8_0 down through moe_tensor")
        }
    }

    func testBadBlocksAreNamed() throws {
        let d = LayerData.random(config, seed: 74)
        let bytes = [UInt8](repeating: 0, count: 1 << 16)
        try bytes.withUnsafeBytes { raw in
            // Through the C ABI: H = 64 is not a whole number of Q4_K's 256-element blocks;
            // code 105 (ggml's type 5, removed from ggml) is no format.
            for (format, word) in [(Int32(MOE_FORMAT_GGML_Q4_K.rawValue), "multiple of q4_K's block of 256"),
                                   (105, "gate_proj_tensor.format 105 is not a moe_format value")] {
                let cd = CDescriptor(d)
                cd.desc.gate_proj = nil
                cd.desc.gate_proj_tensor.format = format
                cd.desc.gate_proj_tensor.data = raw.baseAddress
                var layer: OpaquePointer?
                XCTAssertEqual(CMoESwift.moe_layer_create(&cd.desc, &layer), MOE_ERROR_INVALID_ARGUMENT, word)
                XCTAssertNil(layer)
                XCTAssertTrue(lastError().contains(word), "\"\(lastError())\" does not name \(word)")
            }
            // Through the Swift API: the byte count, and scales given apart.
            let q80 = GGMLType(name: "q8_0")!
            let rows = config.numExperts * config.intermediateSize, rowBytes = 2 * 34
            let cases: [(WeightData, String)] = [
                (.quantized(QuantizedWeightData(ggml: q80, blocks: UnsafeRawBufferPointer(rebasing: raw[0..<rows * rowBytes - 34]))),
                 "must have \(rows * rowBytes) bytes (2 blocks of 34 bytes per row), got \(rows * rowBytes - 34)"),
                (.quantized(QuantizedWeightData(.ggml(q80), weight: UnsafeRawBufferPointer(rebasing: raw[0..<rows * rowBytes]),
                                                scales: UnsafeRawBufferPointer(rebasing: raw[0..<4]))),
                 "keeps its scales in its blocks"),
            ]
            for (gate, word) in cases {
                var w = d.weights()
                w.gateUp = .separate(gate: gate, up: WeightData(d.up))
                XCTAssertThrowsError(try MoELayer(configuration: config, weights: w, backend: .cpu), word) { error in
                    XCTAssertTrue("\(error)".contains(word), "\"\(error)\" does not name \(word)")
                    XCTAssertTrue("\(error)".contains("gate"), "\"\(error)\" does not name the tensor")
                }
            }
        }
    }
}
