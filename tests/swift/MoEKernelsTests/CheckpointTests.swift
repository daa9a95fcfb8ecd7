// MoELayer(checkpoint:layer:backend:) on a tiny Mixtral-layout checkpoint written here with
// Foundation: the same arrays given directly must give the same layer.
import Foundation
import XCTest
import MoEKernels
import CMoESwift

final class CheckpointTests: XCTestCase {
    let (h, i, e, k) = (32, 16, 4, 2)

    /// Writes `tensors` (float32, name -> (shape, values)) as a safetensors file.
    func writeSafetensors(_ url: URL, _ tensors: [(String, [Int], [Float])]) throws {
        var header: [String: Any] = [:]
        var data = Data()
        for (name, shape, values) in tensors {
            let begin = data.count
            values.withUnsafeBytes { data.append(contentsOf: $0) }
            header[name] = ["dtype": "F32", "shape": shape, "data_offsets": [begin, data.count]]
        }
        var json = try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])
        json.append(contentsOf: [UInt8](repeating: 0x20, count: (8 - json.count % 8) % 8))
        var file = Data()
        withUnsafeBytes(of: UInt64(json.count).littleEndian) { file.append(contentsOf: $0) }
        file.append(json)
        file.append(data)
        try file.write(to: url)
    }

    /// A 2-layer Mixtral checkpoint (block_sparse_moe, per-expert w1/w3/w2) and layer 1's arrays.
    func makeCheckpoint(modelType: String = "mixtral") throws -> (URL, router: [Float], gate: [Float], up: [Float], down: [Float]) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("moe-ckpt-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let config: [String: Any] = ["model_type": modelType, "hidden_size": h, "intermediate_size": i,
                                     "num_local_experts": e, "num_experts_per_tok": k, "num_hidden_layers": 2,
                                     "hidden_act": "silu"]
        try JSONSerialization.data(withJSONObject: config).write(to: dir.appendingPathComponent("config.json"))
        var rng = SplitMix64(seed: 7)
        var tensors: [(String, [Int], [Float])] = []
        var arrays: [[Float]] = []
        for layer in 0..<2 {
            let p = "model.layers.\(layer).block_sparse_moe"
            let router = rng.floats(e * h)
            tensors.append(("\(p).gate.weight", [e, h], router))
            var gate: [Float] = [], up: [Float] = [], down: [Float] = []
            for x in 0..<e {
                let (g, u, d) = (rng.floats(i * h, scale: 0.3), rng.floats(i * h, scale: 0.3), rng.floats(h * i, scale: 0.3))
                tensors += [("\(p).experts.\(x).w1.weight", [i, h], g), ("\(p).experts.\(x).w3.weight", [i, h], u),
                            ("\(p).experts.\(x).w2.weight", [h, i], d)]
                gate += g; up += u; down += d
            }
            arrays = [router, gate, up, down]
        }
        try writeSafetensors(dir.appendingPathComponent("model.safetensors"), tensors)
        return (dir, arrays[0], arrays[1], arrays[2], arrays[3])
    }

    func testLoadsLikeTheSameArrays() throws {
        let (dir, router, gate, up, down) = try makeCheckpoint()
        defer { try? FileManager.default.removeItem(at: dir) }
        let loaded = try MoELayer(checkpoint: dir.path, layer: 1, backend: .cpu)
        XCTAssertEqual(loaded.configuration, MoEConfiguration(hiddenSize: h, intermediateSize: i, numExperts: e, topK: k))
        let direct = try MoELayer(configuration: loaded.configuration,
                                  weights: MoEWeights(router: .array(router), gateUp: .separate(gate: .array(gate), up: .array(up)),
                                                      downProj: .array(down)),
                                  backend: .cpu)
        let x = seededFloats(5 * h, seed: 3)
        let (a, b) = (try loaded.forward(x), try direct.forward(x))
        XCTAssertEqual(a.count, b.count)
        for (u, v) in zip(a, b) { XCTAssertEqual(u, v, accuracy: 1e-6) }

        let checkpoint = try Checkpoint(path: dir.path)
        XCTAssertEqual(checkpoint.moeLayers, [0, 1])
        XCTAssertEqual(try MoELayer(checkpoint: checkpoint, layer: 0, backend: .cpu, overrides: ["top_k": 3]).configuration.topK, 3)
    }

    func testErrorsNameTheCause() throws {
        let (dir, _, _, _, _) = try makeCheckpoint(modelType: "llama")
        defer { try? FileManager.default.removeItem(at: dir) }
        XCTAssertThrowsError(try MoELayer(checkpoint: dir.path, layer: 0)) { error in
            XCTAssertTrue("\(error)".contains("model_type \"llama\" is not supported"), "\(error)")
        }
        XCTAssertThrowsError(try MoELayer(checkpoint: dir.path + "/nowhere", layer: 0)) { error in
            XCTAssertTrue("\(error)".contains("cannot open the checkpoint folder \(dir.path)/nowhere"), "\(error)")
        }
    }

    /// The C functions, each called as CMoESwift.moe_... so that the compiler checks the
    /// exports against the header's prototypes (see CABITests).
    func testCABI() throws {
        let (dir, _, _, _, _) = try makeCheckpoint()
        defer { try? FileManager.default.removeItem(at: dir) }
        var checkpoint: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_checkpoint_open(dir.path, &checkpoint), MOE_OK)
        var count: Int32 = 0
        XCTAssertEqual(CMoESwift.moe_checkpoint_moe_layers(checkpoint, nil, 0, &count), MOE_OK)
        XCTAssertEqual(count, 2)
        var indices = [Int32](repeating: -1, count: 2)
        XCTAssertEqual(CMoESwift.moe_checkpoint_moe_layers(checkpoint, &indices, 1, &count), MOE_OK)
        XCTAssertEqual(indices, [0, -1])

        var layer: OpaquePointer?
        let name = strdup("top_k")
        defer { free(name) }
        var names: [UnsafePointer<CChar>?] = [UnsafePointer(name)]
        var values: [Double] = [3]
        XCTAssertEqual(CMoESwift.moe_layer_create_from_checkpoint(checkpoint, 1, Int32(MOE_BACKEND_CPU.rawValue), 1,
                                                                  &names, &values, &layer), MOE_OK)
        CMoESwift.moe_checkpoint_close(checkpoint)  // the layer keeps its own copy
        var info = moe_layer_info()
        info.struct_size = UInt32(MemoryLayout<moe_layer_info>.size)
        XCTAssertEqual(CMoESwift.moe_layer_get_info(layer, &info), MOE_OK)
        XCTAssertEqual([info.hidden_size, info.intermediate_size, info.num_experts, info.top_k, info.shared_intermediate_size],
                       [Int64(h), Int64(i), Int64(e), 3, 0])
        XCTAssertEqual(info.backend, Int32(MOE_BACKEND_CPU.rawValue))
        var y = [Float](repeating: 0, count: h)
        XCTAssertEqual(CMoESwift.moe_layer_forward(layer, seededFloats(h, seed: 1), 1, nil, &y), MOE_OK)
        CMoESwift.moe_layer_destroy(layer)

        // A closed handle is an error, not a crash.
        XCTAssertEqual(CMoESwift.moe_checkpoint_moe_layers(checkpoint, nil, 0, &count), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertTrue(String(cString: CMoESwift.moe_last_error()).contains("not open"))
    }
}
