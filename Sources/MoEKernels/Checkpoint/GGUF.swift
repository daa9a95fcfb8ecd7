#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// ggml's tensor types as GGUF names them: the type number of a tensor info, its block of
/// `blockElems` elements stored in `blockBytes` bytes (ggml's type traits). Every type a
/// GGUF file may hold is here, read by the layer or not, so that each tensor's bytes can be
/// bounded before the file is trusted; which of them the layer reads is moe_options.h's
/// MOE_GGML_TYPE_ROWS.
struct GGUFTensorType: Equatable {
    let number: UInt32
    let name: String
    let blockElems: Int
    let blockBytes: Int

    static let all: [UInt32: GGUFTensorType] = {
        let rows: [(UInt32, String, Int, Int)] = [
            (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
            (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 36),
            (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176),
            (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74),
            (18, "IQ3_XXS", 256, 98), (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
            (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
            (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56),
            (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
            (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
        ]
        return Dictionary(uniqueKeysWithValues: rows.map { ($0.0, GGUFTensorType(number: $0.0, name: $0.1, blockElems: $0.2, blockBytes: $0.3)) })
    }()
}

/// The type of a metadata value (GGUF's gguf_type).
enum GGUFValueType: UInt32 {
    case uint8 = 0, int8, uint16, int16, uint32, int32, float32, bool, string, array, uint64, int64, float64

    /// Bytes of a scalar of this type; nil for strings and arrays.
    var size: Int? {
        switch self {
        case .uint8, .int8, .bool: return 1
        case .uint16, .int16: return 2
        case .uint32, .int32, .float32: return 4
        case .uint64, .int64, .float64: return 8
        case .string, .array: return nil
        }
    }

    var name: String { "\(self)" }
}

/// One metadata value, borrowed from the file's mapping: nothing of it is copied or decoded
/// until asked for, so a tokenizer's 150k strings (or a hostile array's claimed billions)
/// cost nothing but the one pass that bounded them.
struct GGUFValue {
    let type: GGUFValueType
    /// The value's bytes; for an array, its elements (after the element type and count).
    let bytes: UnsafeRawBufferPointer
    /// For an array: its element type and count.
    let elementType: GGUFValueType?
    let count: Int

    private func load<T: FixedWidthInteger>(_: T.Type, at offset: Int = 0) -> T {
        T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
    }

    /// An integer of any integer type (not bool or float).
    var integer: Int? {
        switch type {
        case .uint8: return Int(load(UInt8.self))
        case .int8: return Int(load(Int8.self))
        case .uint16: return Int(load(UInt16.self))
        case .int16: return Int(load(Int16.self))
        case .uint32: return Int(load(UInt32.self))
        case .int32: return Int(load(Int32.self))
        case .uint64: let v = load(UInt64.self); return v <= UInt64(Int.max) ? Int(v) : nil
        case .int64: return Int(load(Int64.self))
        default: return nil
        }
    }

    var number: Double? {
        switch type {
        case .float32: return Double(Float(bitPattern: load(UInt32.self)))
        case .float64: return Double(bitPattern: load(UInt64.self))
        default: return integer.map(Double.init)
        }
    }

    var bool: Bool? { type == .bool ? load(UInt8.self) != 0 : nil }

    /// The string (invalid UTF-8 replaced).
    var string: String? { type == .string ? String(decoding: bytes, as: UTF8.self) : nil }

    /// The elements of an array of integers.
    var integers: [Int]? {
        guard type == .array, let elementType, let size = elementType.size, elementType != .bool,
              elementType != .float32, elementType != .float64 else { return nil }
        var out: [Int] = []
        out.reserveCapacity(count)
        for i in 0..<count {
            let v = GGUFValue(type: elementType, bytes: UnsafeRawBufferPointer(rebasing: bytes[i * size..<(i + 1) * size]),
                              elementType: nil, count: 1)
            guard let n = v.integer else { return nil }
            out.append(n)
        }
        return out
    }

    var description: String {
        if type == .array { return "an array of \(count) \(elementType?.name ?? "?")" }
        if let s = string { return CheckpointFolder.quoted(s.count > 80 ? String(s.prefix(80)) + "..." : s) }
        if let b = bool { return "\(b)" }
        if let n = integer { return "\(n)" }
        if type == .uint64 { return "\(load(UInt64.self))" }
        if let x = number { return "\(x)" }
        return type.name
    }
}

/// One tensor of a GGUF file: its ggml type, its dimensions as ggml gives them (`ne`, the
/// innermost first) and its bytes in the file's mapping.
struct GGUFTensor {
    let name: String
    let type: GGUFTensorType
    let ne: [Int]
    let bytes: UnsafeRawBufferPointer
    let memory: WeightMemory
    let file: String

    /// The row-major shape: `ne` reversed (ggml's ne[0] is the contiguous dimension, so
    /// `ffn_gate_exps` with ne = [H, I, E] is (E, I, H), rows of H elements).
    var shape: [Int] { ne.reversed() }

    var shapeDescription: String { "(" + shape.map(String.init).joined(separator: ", ") + ")" }
}

/// One GGUF file (v2 or v3), mapped read-only for as long as this object or a layer that
/// reads it in place lives: the magic "GGUF", a version, the tensor and key/value counts,
/// the key/values, the tensor infos, then the data section at the next multiple of
/// `general.alignment`. Every length, count, dimension and offset is checked against the
/// bytes that are really there before anything is sized from it.
final class GGUFFile {
    let path: String
    let version: Int
    let metadata: [String: GGUFValue]
    /// The tensors in file order, and by name.
    let tensors: [GGUFTensor]
    let memory: WeightMemory

    /// Bounds far above any real file (DeepSeek-V3 has about a thousand tensors and fifty keys, a
    /// tokenizer array about 150k strings) that keep a hostile count from sizing anything.
    static let maxTensors = 1 << 20
    static let maxKeys = 1 << 20
    /// ggml's GGML_MAX_NAME (64, with its NUL) and GGML_MAX_DIMS.
    static let maxNameBytes = 63
    static let maxDims = 4
    /// GGUF's key length limit.
    static let maxKeyBytes = 65535
    static let maxArrayDepth = 8
    static let defaultAlignment = 32

    /// Maps `name` of `folder` (see `CheckpointFolder` for which files may be read).
    init(_ name: String, in folder: CheckpointFolder) throws {
        let path = folder.display + "/" + name
        self.path = path
        let (fd, size) = try folder.open(name)
        defer { close(fd) }
        guard size >= 24 else {
            throw MoEError.invalidArgument("\(path) is not a GGUF file: \(size) bytes is shorter than GGUF's header")
        }
        let memory = try WeightMemory(file: fd, size: size, what: path)
        self.memory = memory
        var r = GGUFCursor(UnsafeRawBufferPointer(start: memory.base, count: size), path: path)
        guard r.data.prefix(4).elementsEqual("GGUF".utf8) else {
            throw MoEError.invalidArgument("\(path) is not a GGUF file: it does not start with \"GGUF\"")
        }
        r.at = 4
        let version = try r.u32("the version")
        guard version == 2 || version == 3 else {
            if version == 1 {
                throw MoEError.invalidArgument("\(path) is GGUF version 1, which is not read (versions 2 and 3 are)")
            }
            if version & 0xFFFF == 0, (2...3).contains(version >> 24) {
                throw MoEError.invalidArgument("\(path) is a big-endian GGUF file; only little-endian files are read")
            }
            throw MoEError.invalidArgument("\(path): GGUF version \(version) is not supported (2 and 3 are)")
        }
        self.version = Int(version)
        let tensorCount = try r.count("the tensor count", limit: Self.maxTensors)
        let keyCount = try r.count("the key/value count", limit: Self.maxKeys)

        var metadata: [String: GGUFValue] = [:]
        for k in 0..<keyCount {
            let keyBytes = try r.string("key \(k)", limit: Self.maxKeyBytes)
            let key = String(decoding: keyBytes, as: UTF8.self)
            let what = "key \(CheckpointFolder.quoted(key))"
            let value = try r.value(what, depth: 0)
            guard metadata.updateValue(value, forKey: key) == nil else {
                throw MoEError.invalidArgument("\(path): \(what) appears twice")
            }
        }
        self.metadata = metadata

        var alignment = Self.defaultAlignment
        if let a = metadata["general.alignment"] {
            guard a.type == .uint32, let n = a.integer, n > 0, n & (n - 1) == 0 else {
                throw MoEError.invalidArgument("\(path): general.alignment must be a uint32 power of two, got "
                                               + "\(a.type.name) \(a.description)")
            }
            alignment = n
        }

        var infos: [(name: String, type: GGUFTensorType, ne: [Int], offset: Int, bytes: Int)] = []
        var names = Set<String>()
        for t in 0..<tensorCount {
            let nameBytes = try r.string("the name of tensor \(t)", limit: Int.max)
            let name = String(decoding: nameBytes, as: UTF8.self)
            // Which of the declared tensors: a header whose tensor count exceeds the tensors
            // the file describes makes the reader take what follows for tensor infos.
            let which = "tensor \(t + 1) of the \(tensorCount) the header declares"
            func bad(_ why: String) -> MoEError {
                .invalidArgument("\(path): \(which) (\(CheckpointFolder.quoted(name))): \(why)")
            }
            guard !nameBytes.isEmpty else {
                throw MoEError.invalidArgument("\(path): \(which) has an empty name: the file is damaged, or its tensor "
                                               + "count (\(tensorCount)) is larger than the tensors it describes")
            }
            guard nameBytes.count <= Self.maxNameBytes else {
                throw MoEError.invalidArgument("\(path): the name of tensor \(t) is \(nameBytes.count) bytes long; "
                                               + "ggml's limit is \(Self.maxNameBytes)")
            }
            guard names.insert(name).inserted else { throw bad("the name appears twice") }
            let dims = try r.u32("the dimension count of tensor \(t)")
            guard (1...UInt32(Self.maxDims)).contains(dims) else {
                throw bad("\(dims) dimensions; ggml's tensors have 1 to \(Self.maxDims)")
            }
            var ne: [Int] = []
            var elements = 1
            for d in 0..<Int(dims) {
                let n = try r.u64("dimension \(d) of tensor \(CheckpointFolder.quoted(name))")
                guard n <= UInt64(Int64.max) else { throw bad("dimension \(d) is \(n), too large") }
                let (product, overflow) = elements.multipliedReportingOverflow(by: Int(n))
                guard !overflow else { throw bad("its dimensions' product overflows") }
                elements = product
                ne.append(Int(n))
            }
            let typeNumber = try r.u32("the type of tensor \(CheckpointFolder.quoted(name))")
            guard let type = GGUFTensorType.all[typeNumber] else { throw bad("unknown ggml type \(typeNumber)") }
            guard ne[0] % type.blockElems == 0 else {
                throw bad("its rows of \(ne[0]) elements are not whole blocks of \(type.blockElems) (\(type.name))")
            }
            let (bytes, overflow) = (elements / type.blockElems).multipliedReportingOverflow(by: type.blockBytes)
            guard !overflow else { throw bad("its size overflows") }
            let offset = try r.u64("the offset of tensor \(CheckpointFolder.quoted(name))")
            guard offset <= UInt64(Int.max) else { throw bad("offset \(offset) is outside the file") }
            guard Int(offset) % alignment == 0 else {
                throw bad("offset \(offset) is not a multiple of the alignment \(alignment)")
            }
            infos.append((name, type, ne, Int(offset), bytes))
        }
        // The data section starts at the next multiple of the alignment.
        let (padded, overflow) = r.at.addingReportingOverflow(alignment - 1)
        let dataStart = overflow ? Int.max : padded / alignment * alignment
        let dataBytes = Swift.max(0, size - dataStart)
        let file = UnsafeRawBufferPointer(start: memory.base, count: size)
        tensors = try infos.map { info in
            guard info.offset <= dataBytes, info.bytes <= dataBytes - info.offset else {
                throw MoEError.invalidArgument(
                    "\(path): tensor \(CheckpointFolder.quoted(info.name)): its \(info.bytes) bytes at offset \(info.offset) "
                    + "lie outside the file's data section (\(dataBytes) bytes)")
            }
            let start = dataStart + info.offset
            return GGUFTensor(name: info.name, type: info.type, ne: info.ne,
                              bytes: UnsafeRawBufferPointer(rebasing: file[start..<start + info.bytes]),
                              memory: memory, file: path)
        }
    }
}

/// Reads GGUF's little-endian fields from `data`, each bounded by what is left of it.
struct GGUFCursor {
    let data: UnsafeRawBufferPointer
    let path: String
    var at = 0

    init(_ data: UnsafeRawBufferPointer, path: String) {
        self.data = data
        self.path = path
    }

    var remaining: Int { data.count - at }

    private func truncated(_ what: String) -> MoEError {
        .invalidArgument("\(path) is truncated or corrupt: \(what) runs past the end of the file (\(data.count) bytes)")
    }

    mutating func take(_ n: Int, _ what: @autoclosure () -> String) throws -> UnsafeRawBufferPointer {
        guard n >= 0, n <= remaining else { throw truncated(what()) }
        defer { at += n }
        return UnsafeRawBufferPointer(rebasing: data[at..<at + n])
    }

    mutating func u32(_ what: @autoclosure () -> String) throws -> UInt32 {
        UInt32(littleEndian: try take(4, what()).loadUnaligned(as: UInt32.self))
    }

    mutating func u64(_ what: @autoclosure () -> String) throws -> UInt64 {
        UInt64(littleEndian: try take(8, what()).loadUnaligned(as: UInt64.self))
    }

    /// A u64 count, at most `limit`.
    mutating func count(_ what: String, limit: Int) throws -> Int {
        let n = try u64(what)
        guard n <= UInt64(limit) else {
            throw MoEError.invalidArgument("\(path): \(what) is \(n); the most this reader accepts is \(limit)")
        }
        return Int(n)
    }

    /// A string's bytes: a u64 length, then that many bytes (no NUL).
    mutating func string(_ what: @autoclosure () -> String, limit: Int) throws -> UnsafeRawBufferPointer {
        let n = try u64("the length of \(what())")
        guard n <= UInt64(remaining) else {
            throw truncated("\(what()) (\(n) bytes long)")
        }
        guard n <= UInt64(limit) else {
            throw MoEError.invalidArgument("\(path): \(what()) is \(n) bytes long; the limit is \(limit)")
        }
        return try take(Int(n), what())
    }

    /// A value of a type read here, then the value.
    mutating func value(_ what: String, depth: Int) throws -> GGUFValue {
        let raw = try u32("the type of \(what)")
        guard let type = GGUFValueType(rawValue: raw) else {
            throw MoEError.invalidArgument("\(path): \(what) has unknown value type \(raw)")
        }
        return try value(of: type, what, depth: depth)
    }

    /// `what` is only formatted for an error: a tokenizer's arrays have 150k elements.
    mutating func value(of type: GGUFValueType, _ what: @autoclosure () -> String, depth: Int) throws -> GGUFValue {
        if let size = type.size {
            return GGUFValue(type: type, bytes: try take(size, what()), elementType: nil, count: 1)
        }
        if type == .string {
            return GGUFValue(type: type, bytes: try string(what(), limit: Int.max), elementType: nil, count: 1)
        }
        guard depth < GGUFFile.maxArrayDepth else {
            throw MoEError.invalidArgument("\(path): \(what()) nests arrays more than \(GGUFFile.maxArrayDepth) deep")
        }
        let rawElement = try u32("the element type of \(what())")
        guard let element = GGUFValueType(rawValue: rawElement) else {
            throw MoEError.invalidArgument("\(path): \(what()) is an array of unknown value type \(rawElement)")
        }
        // The smallest an element can be: strings and arrays are at least their length
        // (and element type) fields, so a count beyond what is left fails before any loop.
        let least = element.size ?? (element == .string ? 8 : 12)
        let n = try u64("the length of \(what())")
        guard n <= UInt64(remaining / least) else {
            throw truncated("\(what()) (an array of \(n) \(element.name))")
        }
        let count = Int(n)
        let start = at
        if let size = element.size {
            _ = try take(count * size, what())
        } else if element == .string {
            for i in 0..<count {
                let length = try u64("the length of element \(i) of \(what())")
                guard length <= UInt64(remaining) else { throw truncated("element \(i) of \(what()) (\(length) bytes long)") }
                at += Int(length)
            }
        } else {
            for i in 0..<count { _ = try value(of: element, "element \(i) of \(what())", depth: depth + 1) }
        }
        return GGUFValue(type: .array, bytes: UnsafeRawBufferPointer(rebasing: data[start..<at]),
                         elementType: element, count: count)
    }
}
