// A GGUF file through the Swift and C entry points (Checkpoint, MoELayer(checkpoint:),
// moe_checkpoint_open): a tiny qwen3moe file written here byte by byte must give the layer
// that the same arrays give directly. tests/python/test_gguf.py covers the architectures,
// ggml's block types and hostile files.
import Foundation
import XCTest
@testable import MoEKernels
import CMoESwift

final class GGUFTests: XCTestCase {
    let (h, i, e, k) = (32, 32, 4, 2)

    /// A GGUF v3 file of `blocks` qwen3moe MoE blocks (blk.0, ...), f32, and blk.0's arrays.
    func makeFile(blocks: Int = 1) throws -> (URL, router: [Float], gate: [Float], up: [Float], down: [Float]) {
        var out = Data()
        func append<T>(_ v: T) { withUnsafeBytes(of: v) { out.append(contentsOf: $0) } }
        func string(_ s: String) { append(UInt64(s.utf8.count).littleEndian); out.append(contentsOf: Array(s.utf8)) }
        var rng = SplitMix64(seed: 11)
        let tensors: [(String, [Int], [Float])] = (0..<blocks).flatMap { b in [
            ("blk.\(b).ffn_gate_inp.weight", [h, e], rng.floats(e * h)),
            ("blk.\(b).ffn_gate_exps.weight", [h, i, e], rng.floats(e * i * h, scale: 0.3)),
            ("blk.\(b).ffn_up_exps.weight", [h, i, e], rng.floats(e * i * h, scale: 0.3)),
            ("blk.\(b).ffn_down_exps.weight", [i, h, e], rng.floats(e * h * i, scale: 0.3)),
        ] }
        let keys: [(String, UInt32)] = [("qwen3moe.block_count", UInt32(blocks)), ("qwen3moe.embedding_length", UInt32(h)),
                                        ("qwen3moe.expert_count", UInt32(e)), ("qwen3moe.expert_used_count", UInt32(k)),
                                        ("qwen3moe.expert_feed_forward_length", UInt32(i))]
        out.append(contentsOf: Array("GGUF".utf8))
        append(UInt32(3).littleEndian)
        append(UInt64(tensors.count).littleEndian)
        append(UInt64(keys.count + 1).littleEndian)
        string("general.architecture")
        append(UInt32(8).littleEndian)  // string
        string("qwen3moe")
        for (key, value) in keys {
            string(key)
            append(UInt32(4).littleEndian)  // uint32
            append(value.littleEndian)
        }
        var offset = 0
        for (name, ne, values) in tensors {
            string(name)
            append(UInt32(ne.count).littleEndian)
            for n in ne { append(UInt64(n).littleEndian) }
            append(UInt32(0).littleEndian)  // F32
            append(UInt64(offset).littleEndian)
            offset += values.count * 4
        }
        out.append(contentsOf: [UInt8](repeating: 0, count: (32 - out.count % 32) % 32))
        for (_, _, values) in tensors { values.withUnsafeBytes { out.append(contentsOf: $0) } }
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("moe-gguf-\(UUID().uuidString).gguf")
        try out.write(to: url)
        return (url, tensors[0].2, tensors[1].2, tensors[2].2, tensors[3].2)
    }

    func testLoadsLikeTheSameArrays() throws {
        let (url, router, gate, up, down) = try makeFile()
        defer { try? FileManager.default.removeItem(at: url) }
        let checkpoint = try Checkpoint(path: url.path)
        XCTAssertEqual(checkpoint.modelType, "qwen3moe")
        XCTAssertEqual(checkpoint.moeLayers, [0])
        let loaded = try MoELayer(checkpoint: checkpoint, layer: 0, backend: .cpu)
        var c = MoEConfiguration(hiddenSize: h, intermediateSize: i, numExperts: e, topK: k)
        c.normTopKProb = true  // llama.cpp's qwen3moe
        XCTAssertEqual(loaded.configuration, c)
        let direct = try MoELayer(configuration: c,
                                  weights: MoEWeights(router: .array(router), gateUp: .separate(gate: .array(gate), up: .array(up)),
                                                      downProj: .array(down)),
                                  backend: .cpu)
        let x = seededFloats(3 * h, seed: 5)
        let (a, b) = (try loaded.forward(x), try direct.forward(x))
        XCTAssertEqual(a.count, b.count)
        for (u, v) in zip(a, b) { XCTAssertEqual(u, v, accuracy: 1e-6) }
        XCTAssertThrowsError(try MoELayer(checkpoint: checkpoint, layer: 1, backend: .cpu)) { error in
            XCTAssertTrue("\(error)".contains("out of range"), "\(error)")
        }
    }

    /// Every layer of a many-layer file on the Metal backend wraps only its own block's pages
    /// (a few pages each, never the file), and the layers' wraps together are about the
    /// file once; the layers compute as the CPU's do.
    func testLayersOfOneFileWrapOnlyTheirOwnPages() throws {
        let gpu = MetalBackendTests.kind
        try XCTSkipUnless(MoELayer.availableBackends.contains(gpu))
        let blocks = 12
        let (url, _, _, _, _) = try makeFile(blocks: blocks)
        defer { try? FileManager.default.removeItem(at: url) }
        let fileSize = try XCTUnwrap(FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int)
        let checkpoint = try Checkpoint(path: url.path)
        let blockBytes = 4 * (e * h + 3 * e * i * h), page = WeightMemory.pageSize
        var wrapped = 0
        let x = seededFloats(3 * h, seed: 9)
        for layer in 0..<blocks {
            let loaded = try MoELayer(checkpoint: checkpoint, layer: layer, backend: gpu)
            let ranges = try XCTUnwrap(loaded.backend as? MetalBackend).mappedRanges
            let bytes = ranges.reduce(0) { $0 + $1.count }
            XCTAssertLessThanOrEqual(bytes, (blockBytes / page + 2) * page, "layer \(layer): \(ranges)")
            wrapped += bytes
            let cpu = try MoELayer(checkpoint: checkpoint, layer: layer, backend: .cpu)
            for (u, v) in zip(try loaded.forward(x), try cpu.forward(x)) { XCTAssertEqual(u, v, accuracy: 1e-5) }
        }
        XCTAssertLessThan(wrapped, 2 * fileSize, "\(blocks) layers wrap \(wrapped) bytes of a \(fileSize)-byte file")
        print("GGUF file of \(fileSize) bytes, \(blocks) layers on \(gpu.name): \(wrapped) bytes wrapped in all")
    }

    func testCABI() throws {
        let (url, _, _, _, _) = try makeFile()
        defer { try? FileManager.default.removeItem(at: url) }
        var checkpoint: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_checkpoint_open(url.path, &checkpoint), MOE_OK)
        defer { CMoESwift.moe_checkpoint_close(checkpoint) }
        var count: Int32 = 0
        XCTAssertEqual(CMoESwift.moe_checkpoint_moe_layers(checkpoint, nil, 0, &count), MOE_OK)
        XCTAssertEqual(count, 1)
        var layer: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_layer_create_from_checkpoint(checkpoint, 0, Int32(MOE_BACKEND_CPU.rawValue), 0,
                                                                  nil, nil, &layer), MOE_OK)
        CMoESwift.moe_layer_destroy(layer)
        // A file that is not GGUF, by its name, is an error that says so.
        let bad = url.deletingLastPathComponent().appendingPathComponent("moe-not-\(UUID().uuidString).gguf")
        try Data("not a gguf file at all, just text".utf8).write(to: bad)
        defer { try? FileManager.default.removeItem(at: bad) }
        var other: OpaquePointer?
        XCTAssertEqual(CMoESwift.moe_checkpoint_open(bad.path, &other), MOE_ERROR_INVALID_ARGUMENT)
        XCTAssertTrue(String(cString: CMoESwift.moe_last_error()).contains("is not a GGUF file"))
    }
}
