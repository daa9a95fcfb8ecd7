// Weights read in place (WeightData.mapped over a WeightMemory) against copies of the same
// bytes on every backend, bit for bit; who holds the memory; the memory check before a
// layer's copies are allocated; the same through the C ABI's mapped region.
import CMoESwift
import Foundation
import XCTest
@testable import MoEKernels
#if canImport(Glibc)
import Glibc
import SoftMetal
#elseif canImport(Darwin)
import Darwin
#endif

/// Page-aligned memory laid out like a file of tensors: each placed at the next offset
/// congruent to `misalign` modulo 16 (safetensors aligns nothing), its release counted.
final class TensorFile: @unchecked Sendable {
    let base: UnsafeMutableRawPointer
    let length: Int
    private var used = 0
    nonisolated(unsafe) static var released = 0

    init(pages: Int) {
        length = pages * WeightMemory.pageSize
        var raw: UnsafeMutableRawPointer?
        precondition(posix_memalign(&raw, WeightMemory.pageSize, length) == 0)
        base = raw!
    }

    func put<T>(_ values: [T], misalign: Int = 0) -> UnsafeRawBufferPointer {
        used = (used + 15) / 16 * 16 + misalign
        let bytes = values.count * MemoryLayout<T>.stride
        precondition(used + bytes <= length, "TensorFile too small")
        values.withUnsafeBytes { (base + used).copyMemory(from: $0.baseAddress!, byteCount: bytes) }
        defer { used += bytes }
        return UnsafeRawBufferPointer(start: base + used, count: bytes)
    }

    /// The memory, freed (and counted) once nothing holds it.
    func memory() throws -> WeightMemory {
        let address = Int(bitPattern: base)
        return try WeightMemory(base: base, length: length, release: {
            TensorFile.released += 1
            free(UnsafeMutableRawPointer(bitPattern: address))
        })
    }
}

final class MappedWeightsTests: XCTestCase {
    /// softmetal on Linux, metal on a Mac.
    static let gpu = MetalBackendTests.kind

    var backends: [MoEBackendKind] { [.cpu] + (MoELayer.availableBackends.contains(Self.gpu) ? [Self.gpu] : []) }

    /// A layer of every matrix format, some parts at offsets the Metal kernels cannot read
    /// in place (those are copied), as mapped and as plain borrowed weights of the same bytes.
    /// `memory`: the file's one WeightMemory when several layers are put in it.
    func weights(_ c: MoEConfiguration, file: TensorFile, memory: WeightMemory? = nil) throws
        -> (mapped: MoEWeights, copied: MoEWeights) {
        let data = LayerData.random(c, seed: 7)
        let (h, i, e) = (c.hiddenSize, c.intermediateSize, c.numExperts)
        let router = WeightData.dense(file.put(data.router, misalign: 4), .float32)       // f32 off a float4
        let gate = WeightData.dense(file.put(bfloat16(data.gate).bits, misalign: 2), .bfloat16)  // off 8 bytes
        let up4 = PackedAffine(data.up, bits: 4, groupSize: 32)
        let up = WeightData.quantized(QuantizedWeightData(.affine(bits: 4, groupSize: 32), weight: file.put(up4.words),
                                                          scales: file.put(up4.scales), biases: file.put(up4.biases)))
        let down8 = PackedAffine(data.down, bits: 8, groupSize: 64)
        let down = WeightData.quantized(QuantizedWeightData(.affine(bits: 8, groupSize: 64), weight: file.put(down8.words),
                                                            scales: file.put(bfloat16(down8.scales).bits, misalign: 2),
                                                            biases: file.put(bfloat16(down8.biases).bits, misalign: 2),
                                                            scaleType: .bfloat16))
        let shared = WeightData.dense(file.put(bfloat16(Array(data.gate[0..<i * h])).bits), .bfloat16)
        XCTAssertEqual(e * i * h % 64, 0)
        let memory = try memory ?? file.memory()
        func both(_ gateUp: GateUpWeights, _ down: WeightData, _ map: (WeightData) -> WeightData) -> MoEWeights {
            MoEWeights(router: map(router), gateUp: gateUp, downProj: map(down),
                       shared: SharedExpertWeights(gateProj: map(shared), upProj: map(shared), downProj: map(shared)))
        }
        let mapped = both(.separate(gate: .mapped(gate, in: memory), up: .mapped(up, in: memory)), down) {
            .mapped($0, in: memory)
        }
        let copied = both(.separate(gate: gate, up: up), down) { $0 }
        return (mapped, copied)
    }

    func testMappedEqualsCopiedBitForBitOnEveryBackend() throws {
        let c = makeConfig(h: 64, i: 64, e: 8, k: 2) { $0.sharedIntermediateSize = 64 }
        for backend in backends {
            let released = TensorFile.released
            do {
                let file = TensorFile(pages: 16)
                let (mappedWeights, copiedWeights) = try weights(c, file: file)
                let mapped = try MoELayer(configuration: c, weights: mappedWeights, backend: backend)
                if backend == Self.gpu {
                    // Only the parts the kernels cannot read at their offset are copied.
                    let copies = MetalBackend.copiedBytes(c, mappedWeights)
                    XCTAssertEqual(Int(moe_internal_stats().pointee.allocated_bytes), copies)
                    XCTAssertLessThan(copies, MetalBackend.copiedBytes(c, copiedWeights) / 2)
                }
                let copied = try MoELayer(configuration: c, weights: copiedWeights, backend: backend)
                for tokens in [1, 37] {
                    let x = seededFloats(tokens * c.hiddenSize, seed: UInt64(tokens))
                    let y = try mapped.forward(x)
                    XCTAssertTrue(y.allSatisfy(\.isFinite))
                    assertBitwiseEqual(y, try copied.forward(x), "\(backend.name), \(tokens) tokens")
                }
                XCTAssertEqual(TensorFile.released, released, "the layer holds the memory it reads in place")
            }
            XCTAssertEqual(TensorFile.released, released + 1, "released once the layers are gone")
        }
    }

    /// The CPU repacks mapped 4-bit codes when the copies fit and reads them in place with
    /// its generic kernels when they do not: the layer still loads, within the spec's
    /// tolerance of the copied one.
    func testCPUReadsFourBitInPlaceWhenItsRepackDoesNotFit() throws {
        let c = makeConfig(h: 64, i: 64, e: 8, k: 2) { $0.sharedIntermediateSize = 64 }
        let file = TensorFile(pages: 16)
        let (mappedWeights, copiedWeights) = try weights(c, file: file)
        let repacked = CPUBackend.copiedBytes(c, mappedWeights), inPlace = CPUBackend.copiedBytes(c, mappedWeights, repack: false)
        XCTAssertLessThan(inPlace, repacked)
        let limit = (inPlace + repacked) / 2
        let mapped = try MoELayer(configuration: c, weights: mappedWeights, backend: .cpu, memoryLimit: limit)
        XCTAssertThrowsError(try MoELayer(configuration: c, weights: copiedWeights, backend: .cpu, memoryLimit: limit))
        let copied = try MoELayer(configuration: c, weights: copiedWeights, backend: .cpu)
        for tokens in [1, 37] {
            let x = seededFloats(tokens * c.hiddenSize, seed: UInt64(tokens))
            // Other kernels, another summation order: the spec's tolerance, not bit for bit.
            let (a, b) = (try mapped.forward(x), try copied.forward(x))
            let scale = b.map(abs).max()!
            XCTAssertLessThanOrEqual(zip(a, b).map { abs($0 - $1) }.max()!, 1e-4 * scale + 1e-5, "\(tokens) tokens")
            XCTAssertNotEqual(scale, 0)
        }
    }

    /// `WeightData.experts`: each expert's tensor on its own — bf16 gate, 4-bit affine up
    /// (scales and biases), float32 down — half of the experts in one memory and half in
    /// another (a checkpoint's two shards), one expert borrowed (not mapped: the Metal
    /// backend then stacks that projection), on every backend bit for bit as the stacked
    /// tensors; and only the routed projections take the form.
    func testPerExpertTensorsEqualStackedOnEveryBackend() throws {
        let c = makeConfig(h: 128, i: 64, e: 4, k: 2)
        let data = LayerData.random(c, seed: 21)
        let (h, i, e) = (c.hiddenSize, c.intermediateSize, c.numExperts)
        let files = [TensorFile(pages: 16), TensorFile(pages: 16)]
        let memories = try files.map { try $0.memory() }
        func expert<T>(_ values: [T], _ x: Int, _ count: Int) -> [T] { Array(values[(x * count)..<((x + 1) * count)]) }
        let up4 = PackedAffine(data.up, bits: 4, groupSize: 32)
        let (wordsPer, scalesPer) = (up4.words.count / e, up4.scales.count / e)
        func perExpert(borrowLast: Bool, _ make: (TensorFile, Int) -> WeightData) -> WeightData {
            .experts((0..<e).map { x in
                let file = files[x % 2], tensor = make(file, x)
                return borrowLast && x == e - 1 ? tensor : .mapped(tensor, in: memories[x % 2])
            })
        }
        let gate = perExpert(borrowLast: false) { f, x in .dense(f.put(bfloat16(expert(data.gate, x, i * h)).bits), .bfloat16) }
        let up = perExpert(borrowLast: false) { f, x in
            .quantized(QuantizedWeightData(.affine(bits: 4, groupSize: 32), weight: f.put(expert(up4.words, x, wordsPer)),
                                           scales: f.put(expert(up4.scales, x, scalesPer)),
                                           biases: f.put(expert(up4.biases, x, scalesPer))))
        }
        let down = perExpert(borrowLast: true) { f, x in .dense(f.put(expert(data.down, x, h * i)), .float32) }
        let perExpertWeights = MoEWeights(router: .array(data.router), gateUp: .separate(gate: gate, up: up), downProj: down)
        let stacked = MoEWeights(router: .array(data.router),
                                 gateUp: .separate(gate: .dense(files[0].put(bfloat16(data.gate).bits), .bfloat16),
                                                   up: .quantized(QuantizedWeightData(.affine(bits: 4, groupSize: 32),
                                                                                       weight: files[0].put(up4.words),
                                                                                       scales: files[0].put(up4.scales),
                                                                                       biases: files[0].put(up4.biases)))),
                                 downProj: .array(data.down))
        for backend in backends {
            let a = try MoELayer(configuration: c, weights: perExpertWeights, backend: backend)
            let b = try MoELayer(configuration: c, weights: stacked, backend: backend)
            for tokens in [1, 37] {
                let x = seededFloats(tokens * h, seed: UInt64(tokens))
                assertBitwiseEqual(try a.forward(x), try b.forward(x), "\(backend.name), \(tokens) tokens")
            }
        }
        var router = perExpertWeights
        router.router = .experts((0..<e).map { x in .array(expert(data.router, x, h)) })
        XCTAssertThrowsError(try MoELayer(configuration: c, weights: router, backend: .cpu)) {
            XCTAssertTrue("\($0)".contains("router_weight: only the routed experts' projections"), "\($0)")
        }
    }

    func testWeightMemoryMustBeWholePages() throws {
        let file = TensorFile(pages: 2)
        defer { free(file.base) }
        for (offset, length) in [(8, WeightMemory.pageSize), (0, 4096), (0, 0)] {
            XCTAssertThrowsError(try WeightMemory(base: file.base + offset, length: length)) { error in
                XCTAssertTrue("\(error)".contains("16384-byte page boundary"), "\(error)")
            }
        }
        let memory = try WeightMemory(base: file.base, length: WeightMemory.pageSize)
        let c = makeConfig(h: 16, i: 16, e: 2, k: 1)
        let outside = UnsafeRawBufferPointer(start: file.base + WeightMemory.pageSize, count: 2 * 16 * 4)
        let inside = UnsafeRawBufferPointer(start: file.base, count: 2 * 16 * 4)
        let w = MoEWeights(router: .mapped(.dense(outside, .float32), in: memory),
                           gateUp: .fused(.array([Float](repeating: 0, count: 2 * 32 * 16))),
                           downProj: .array([Float](repeating: 0, count: 2 * 16 * 16)))
        XCTAssertThrowsError(try MoELayer(configuration: c, weights: w, backend: .cpu)) { error in
            XCTAssertTrue("\(error)".contains("do not all lie in the weight memory"), "\(error)")
        }
        var ok = w
        ok.router = .mapped(.dense(inside, .float32), in: memory)
        XCTAssertNoThrow(try MoELayer(configuration: c, weights: ok, backend: .cpu))
    }

    /// A mapped file starts on a huge-page boundary (Linux: 2 MiB, where the kernel can map
    /// the page cache's 2 MiB folios) and is advised for huge pages; its bytes read back as
    /// written, the last one included.
    func testFileMappingStartsOnAHugePageBoundary() throws {
        let size = 3 << 20 | 5
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("moe-map-\(UUID().uuidString)").path
        let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 12) }
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        defer { close(fd) }
        let memory = try WeightMemory(file: fd, size: size, what: path)
        XCTAssertEqual(Int(bitPattern: memory.base) % WeightMemory.fileMappingAlignment, 0)
        XCTAssertEqual(memory.length % WeightMemory.pageSize, 0)
        XCTAssertGreaterThanOrEqual(memory.length, size)
        let mapped = UnsafeRawBufferPointer(start: memory.base, count: size)
        XCTAssertTrue(mapped.elementsEqual(bytes))
        #if os(Linux)
        XCTAssertGreaterThanOrEqual(WeightMemory.fileMappingAlignment, 2 << 20)
        // The advice shows as the mapping's "hg" flag, where the kernel has huge pages.
        if FileManager.default.fileExists(atPath: "/sys/kernel/mm/transparent_hugepage/enabled") {
            // Read to the end: /proc files report a size of 0.
            let smaps = String(decoding: try XCTUnwrap(FileHandle(forReadingAtPath: "/proc/self/smaps")).readDataToEndOfFile(),
                               as: UTF8.self)
            let start = String(UInt(bitPattern: Int(bitPattern: memory.base)), radix: 16)
            let entry = try XCTUnwrap(smaps.components(separatedBy: "\n").drop { !$0.hasPrefix(start + "-") }
                .first { $0.hasPrefix("VmFlags:") })
            XCTAssertTrue(entry.split(separator: " ").contains("hg"), entry)
        }
        #endif
    }

    /// Two layers mapped from one file, on a device whose maxBufferLength (64 KiB here; Apple
    /// guarantees 256 MB) is shorter than each layer's span: each layer wraps only pages of
    /// its own tensors, in pieces within the limit, and computes as its copy does; a tensor
    /// longer than the limit is a clear error, not a nil buffer.
    func testEachLayerWrapsItsOwnSpanInPiecesWithinMaxBufferLength() throws {
        #if os(Linux)
        try XCTSkipUnless(MoELayer.availableBackends.contains(Self.gpu))
        let saved = SoftMetalOptions.maxBufferLength
        defer { SoftMetalOptions.maxBufferLength = saved }
        let limit = 4 * WeightMemory.pageSize
        SoftMetalOptions.maxBufferLength = limit
        let c = makeConfig(h: 128, i: 64, e: 4, k: 2) { $0.sharedIntermediateSize = 64 }
        let file = TensorFile(pages: 32)
        let memory = try file.memory()
        let first = try weights(c, file: file, memory: memory)
        let boundary = file.put([UInt8](repeating: 0, count: 1)).baseAddress! - UnsafeRawPointer(file.base)
        let second = try weights(c, file: file, memory: memory)
        let x = seededFloats(5 * c.hiddenSize, seed: 5)
        var wraps: [[Range<Int>]] = []
        for (mapped, copied) in [first, second] {
            let layer = try MoELayer(configuration: c, weights: mapped, backend: Self.gpu)
            let ranges = try XCTUnwrap(layer.backend as? MetalBackend).mappedRanges
            XCTAssertTrue(ranges.allSatisfy { $0.count <= limit }, "\(ranges)")
            wraps.append(ranges)
            assertBitwiseEqual(try layer.forward(x), try MoELayer(configuration: c, weights: copied, backend: Self.gpu).forward(x),
                               "layer \(wraps.count)")
        }
        XCTAssertGreaterThan(wraps[0].count, 1, "the first layer's span is longer than the limit: \(wraps[0])")
        let page = WeightMemory.pageSize
        XCTAssertTrue(wraps[0].allSatisfy { $0.upperBound <= (boundary + page - 1) / page * page }, "\(wraps[0]) past \(boundary)")
        XCTAssertTrue(wraps[1].allSatisfy { $0.lowerBound >= boundary / page * page }, "\(wraps[1]) before \(boundary)")
        XCTAssertLessThan(wraps[1].reduce(0) { $0 + $1.count }, file.length / 2, "never the whole file")

        SoftMetalOptions.maxBufferLength = WeightMemory.pageSize
        XCTAssertThrowsError(try MoELayer(configuration: c, weights: first.mapped, backend: Self.gpu)) { error in
            guard case MoEError.outOfMemory(let message) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(message.contains("more than this softmetal device's maxBufferLength (16384 bytes)"), message)
            XCTAssertTrue(message.contains(" in one buffer") || message.contains("one tensor of"), message)
        }
        #else
        throw XCTSkip("SoftMetal's maxBufferLength is settable; a Mac's is not")
        #endif
    }

    func testMemoryLimitBelowTheCopiesFailsBeforeAllocating() throws {
        let c = makeConfig(h: 64, i: 32, e: 4, k: 2)
        let data = LayerData.random(c, seed: 3)
        let copies = 4 * (c.numExperts * c.hiddenSize + 3 * c.numExperts * c.intermediateSize * c.hiddenSize)
        XCTAssertEqual(CPUBackend.copiedBytes(c, data.weights()), copies)
        for backend in backends {
            XCTAssertThrowsError(try MoELayer(configuration: c, weights: data.weights(), backend: backend,
                                              memoryLimit: copies / 2)) { error in
                guard case MoEError.outOfMemory(let message) = error else { return XCTFail("\(error)") }
                XCTAssertTrue(message.contains("only \(copies / 2) bytes"), message)
                XCTAssertTrue(message.contains("needs"), message)
            }
            XCTAssertEqual(moe_internal_stats().pointee.allocated_bytes, 0, "nothing allocated before the error")
            XCTAssertNoThrow(try MoELayer(configuration: c, weights: data.weights(), backend: backend,
                                          memoryLimit: 2 * copies))
        }
        // Mapped dense weights cost no copy: under the same limit they load.
        let file = TensorFile(pages: 8)
        let memory = try file.memory()
        let bf = { (w: [Float]) in WeightData.mapped(.dense(file.put(bfloat16(w).bits), .bfloat16), in: memory) }
        let mapped = MoEWeights(router: bf(data.router), gateUp: .separate(gate: bf(data.gate), up: bf(data.up)),
                                downProj: bf(data.down))
        for backend in backends {
            XCTAssertNoThrow(try MoELayer(configuration: c, weights: mapped, backend: backend, memoryLimit: copies / 2))
        }
    }

    func testAvailableMemoryIsTheSmallestKnownBound() throws {
        let given = try XCTUnwrap(MemoryBudget.available(limit: 12345))
        XCTAssertEqual(given.bytes, 12345)
        XCTAssertTrue(given.source.contains("memory_limit"))
        #if os(Linux)
        // The system's figures change from one read to the next: only their source is fixed.
        let system = try XCTUnwrap(MemoryBudget.available(limit: nil), "MemAvailable is always there on Linux")
        XCTAssertGreaterThan(system.bytes, 0)
        XCTAssertTrue(system.source.contains("MemAvailable") || system.source.contains("cgroup"), system.source)
        XCTAssertFalse(try XCTUnwrap(MemoryBudget.available(limit: Int.max)).source.contains("memory_limit"))
        #endif
        XCTAssertTrue(MemoryBudget.fits(12345, limit: 12345))
        XCTAssertFalse(MemoryBudget.fits(12346, limit: 12345))
    }

    func testCABIMappedRegionIsReleasedOnceAfterTheLastLayer() throws {
        let c = makeConfig(h: 32, i: 32, e: 4, k: 2)
        let data = LayerData.random(c, seed: 5)
        for backend in backends {
            let file = TensorFile(pages: 4)
            let router = file.put(data.router), gate = file.put(data.gate), up = file.put(data.up)
            let down = file.put(bfloat16(data.down).bits)
            var desc = moe_layer_desc()
            moe_layer_desc_init(&desc)
            desc.backend = backend.rawValue
            (desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k) = (32, 32, 4, 2)
            desc.router_weight = router.baseAddress!.assumingMemoryBound(to: Float.self)
            desc.gate_proj = gate.baseAddress!.assumingMemoryBound(to: Float.self)
            desc.up_proj = up.baseAddress!.assumingMemoryBound(to: Float.self)
            desc.down_proj_tensor.format = Int32(MOE_FORMAT_BF16.rawValue)
            desc.down_proj_tensor.data = down.baseAddress
            desc.mapped_memory = UnsafeRawPointer(file.base)
            desc.mapped_length = Int64(file.length)
            desc.mapped_context = file.base
            desc.mapped_release = { context in
                TensorFile.released += 1
                free(context)
            }
            let released = TensorFile.released
            var layer: OpaquePointer?
            XCTAssertEqual(moe_layer_create(&desc, &layer), MOE_OK, String(cString: moe_last_error()))
            XCTAssertEqual(TensorFile.released, released)
            let x = seededFloats(3 * 32, seed: 1)
            var y = [Float](repeating: 0, count: 3 * 32)
            XCTAssertEqual(moe_layer_forward(layer, x, 3, nil, &y), MOE_OK)
            let copied = try MoELayer(configuration: data.config, weights: MoEWeights(
                router: .array(data.router), gateUp: .separate(gate: .array(data.gate), up: .array(data.up)),
                downProj: .dense(down, .bfloat16)), backend: backend)
            assertBitwiseEqual(y, try copied.forward(x), "C ABI, \(backend.name)")
            moe_layer_destroy(layer)
            XCTAssertEqual(TensorFile.released, released + 1)

            // A region that is not whole pages: an error, and the release still comes, once.
            let bad = TensorFile(pages: 1)
            desc.mapped_memory = UnsafeRawPointer(bad.base + 64)
            desc.mapped_context = bad.base
            XCTAssertEqual(moe_layer_create(&desc, &layer), MOE_ERROR_INVALID_ARGUMENT)
            XCTAssertTrue(String(cString: moe_last_error()).contains("page boundary"))
            XCTAssertEqual(TensorFile.released, released + 2)
        }
    }
}
