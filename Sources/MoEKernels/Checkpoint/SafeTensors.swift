#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One tensor of a safetensors file: its stored dtype ("BF16", "U32"...), shape, and its
/// bytes inside the file's mapping (valid while the file is open).
struct StoredTensor {
    let name: String
    let dtype: String
    let shape: [Int]
    let bytes: UnsafeRawBufferPointer

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

/// Reads a whole (small) file: config.json, the shard index.
func readFile(_ path: String) throws -> [UInt8] {
    guard let f = fopen(path, "rb") else {
        throw MoEError.invalidArgument("cannot open \(path): \(String(cString: strerror(errno)))")
    }
    defer { fclose(f) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, f) }
        if n == 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
    }
    return bytes
}

func fileExists(_ path: String) -> Bool { access(path, F_OK) == 0 }

/// One .safetensors file, memory-mapped read-only for as long as this object lives: an
/// 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
/// then the raw data. Tensors are borrowed from the mapping, never copied here.
final class SafeTensorsFile {
    let path: String
    let tensors: [String: StoredTensor]
    private let base: UnsafeMutableRawPointer?
    private let length: Int

    init(path: String) throws {
        self.path = path
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw MoEError.invalidArgument("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw MoEError.invalidArgument("cannot stat \(path)") }
        length = Int(info.st_size)
        guard length >= 8 else { throw MoEError.invalidArgument("\(path) is not a safetensors file (\(length) bytes)") }
        // MAP_PRIVATE + PROT_READ: the pages are the page cache's, shared with other readers.
        guard let mapped = mmap(nil, length, PROT_READ, MAP_PRIVATE, fd, 0), mapped != MAP_FAILED else {
            throw MoEError.outOfMemory("cannot map \(path) (\(length) bytes): \(String(cString: strerror(errno)))")
        }
        base = mapped
        let file = UnsafeRawBufferPointer(start: mapped, count: length)
        var headerLength = 0
        for i in 0..<8 { headerLength |= Int(file[i]) << (8 * i) }
        guard headerLength > 0 && headerLength <= length - 8 else {
            munmap(mapped, length)
            throw MoEError.invalidArgument("\(path): header length \(headerLength) does not fit the file (\(length) bytes)")
        }
        do {
            tensors = try Self.parseHeader(UnsafeRawBufferPointer(rebasing: file[8..<8 + headerLength]),
                                           data: UnsafeRawBufferPointer(rebasing: file[(8 + headerLength)...]),
                                           path: path)
        } catch {
            munmap(mapped, length)
            throw error
        }
    }

    deinit {
        if let base { munmap(base, length) }
    }

    private static func parseHeader(_ header: UnsafeRawBufferPointer, data: UnsafeRawBufferPointer,
                                    path: String) throws -> [String: StoredTensor] {
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
                                         bytes: UnsafeRawBufferPointer(rebasing: data[offsets[0]..<offsets[1]]))
        }
        return tensors
    }
}
