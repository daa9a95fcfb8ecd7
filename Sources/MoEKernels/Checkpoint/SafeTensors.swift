#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One tensor of a safetensors file: its stored dtype ("BF16", "U32"...), shape, and its
/// bytes inside the file's mapping `memory` (valid while that is held).
struct StoredTensor {
    let name: String
    let dtype: String
    let shape: [Int]
    let bytes: UnsafeRawBufferPointer
    let memory: WeightMemory

    static let dtypeSizes: [String: Int] = [
        "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4,
        "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    ]

    /// The dense scalar type of a float tensor, nil for other dtypes.
    var scalarType: ScalarType? {
        switch dtype {
        case "F32": return .float32
        case "F16": return .float16
        case "BF16": return .bfloat16
        default: return nil
        }
    }

    var shapeDescription: String { "(" + shape.map(String.init).joined(separator: ", ") + ")" }
}

/// One .safetensors file, memory-mapped read-only for as long as this object or a layer
/// that reads it in place lives: an 8-byte little-endian header length, a JSON header
/// {name: {dtype, shape, data_offsets}}, then the raw data. Tensors are borrowed from the
/// mapping, never copied here.
final class SafeTensorsFile {
    let path: String
    let tensors: [String: StoredTensor]
    let memory: WeightMemory
    private let length: Int

    /// The header's limit, as in the safetensors library: far above any real header, and
    /// the bound on what a file can make us parse.
    static let headerLimit = 100_000_000

    /// Maps `name` of `folder` (see `CheckpointFolder` for which files may be read).
    init(_ name: String, in folder: CheckpointFolder) throws {
        path = folder.display + "/" + name
        let (fd, size) = try folder.open(name)
        defer { close(fd) }
        length = size
        let notSafetensors = MoEError.invalidArgument(
            "\(path) is not a safetensors file: its first 8 bytes do not give a header length within the file "
            + "and the format's limit of \(Self.headerLimit) bytes")
        guard length >= 8 else { throw notSafetensors }
        memory = try WeightMemory(file: fd, size: length, what: path)
        let file = UnsafeRawBufferPointer(start: memory.base, count: length)
        var headerLength: UInt64 = 0
        for i in 0..<8 { headerLength |= UInt64(file[i]) << (8 * i) }
        // The number itself is not printed: for a file that is not safetensors it is the
        // file's first 8 bytes.
        guard headerLength > 0 && headerLength <= UInt64(Swift.min(length - 8, Self.headerLimit)) else {
            throw notSafetensors
        }
        let end = 8 + Int(headerLength)
        tensors = try Self.parseHeader(UnsafeRawBufferPointer(rebasing: file[8..<end]),
                                       data: UnsafeRawBufferPointer(rebasing: file[end...]), path: path, memory: memory)
    }

    private static func parseHeader(_ header: UnsafeRawBufferPointer, data: UnsafeRawBufferPointer,
                                    path: String, memory: WeightMemory) throws -> [String: StoredTensor] {
        guard let entries = try JSON.parse(header, what: "the header of \(path)").object else {
            throw MoEError.invalidArgument("\(path): the header is not a JSON object")
        }
        var tensors: [String: StoredTensor] = [:]
        for (name, entry) in entries where name != "__metadata__" {
            func bad(_ why: String) -> MoEError { .invalidArgument("\(path): tensor \(name): \(why)") }
            guard let dtype = entry["dtype"]?.string, let size = StoredTensor.dtypeSizes[dtype] else {
                throw bad("unknown dtype \(entry["dtype"]?.string ?? "(none)")")
            }
            guard let dims = entry["shape"]?.array?.compactMap(\.int), dims.count == entry["shape"]?.array?.count,
                  dims.allSatisfy({ $0 >= 0 }) else { throw bad("bad shape") }
            guard let offsets = entry["data_offsets"]?.array?.compactMap(\.int), offsets.count == 2,
                  offsets[0] >= 0, offsets[0] <= offsets[1], offsets[1] <= data.count else {
                throw bad("data_offsets outside the file's \(data.count) data bytes")
            }
            var count = size
            for d in dims {
                let (product, overflow) = count.multipliedReportingOverflow(by: d)
                guard !overflow else { throw bad("shape too large") }
                count = product
            }
            guard count == offsets[1] - offsets[0] else {
                throw bad("shape \(dims) of \(dtype) needs \(count) bytes, data_offsets give \(offsets[1] - offsets[0])")
            }
            tensors[name] = StoredTensor(name: name, dtype: dtype, shape: dims,
                                         bytes: UnsafeRawBufferPointer(rebasing: data[offsets[0]..<offsets[1]]), memory: memory)
        }
        return tensors
    }
}
