import CMoECPU
import CMoESwift

/// The element type of dense weights and of affine scales and biases (moe_dtype).
public enum ScalarType: MoEOptionRow, CustomStringConvertible {
    case float32
    case float16
    case bfloat16

    public var rawValue: Int32 {
        switch self {
        case .float32: return Int32(MOE_DTYPE_F32.rawValue)
        case .float16: return Int32(MOE_DTYPE_F16.rawValue)
        case .bfloat16: return Int32(MOE_DTYPE_BF16.rawValue)
        }
    }

    /// Bytes per element.
    public var size: Int { self == .float32 ? 4 : 2 }

    public var description: String { optionName(MOE_OPTION_TABLE_DTYPE, rawValue) }
}

/// One of ggml's block quantizations (llama.cpp's, GGUF's): a row of `cols` elements is
/// `cols / blockElements` blocks of `blockBytes` bytes each, scales inside the blocks, the
/// value of an element ggml's dequantization of its block (docs/formats.md, "ggml
/// blocks"). The types are the block rows of moe_options.h's MOE_GGML_TYPE_ROWS, read
/// through options.c, so a row added there is a type here.
public struct GGMLType: Sendable, Hashable, CustomStringConvertible {
    /// Its moe_format (100 + ggml's type number).
    public let format: Int32

    /// The type whose moe_format is `format`; nil unless `format` is a block row of
    /// MOE_GGML_TYPE_ROWS (ggml's F32, F16 and BF16 are dense formats, not block types).
    public init?(format: Int32) {
        guard moe_ggml_block_elems(format) > 0, ScalarType(rawValue: format) == nil else { return nil }
        self.format = format
    }

    /// The type of ggml's type number (GGUF's tensor type field); nil for types the layer
    /// does not read and for the dense ones (`WeightFormat(ggmlType:)` gives those).
    public init?(ggmlType: Int32) {
        self.init(format: moe_format_of_ggml_type(ggmlType))
    }

    /// The type of a format name ("q4_K", "mxfp4_ggml": moe_options.h's names).
    public init?(name: String) {
        self.init(format: moe_option_code(MOE_OPTION_TABLE_FORMAT, name))
    }

    /// Every block type, in code order.
    public static let allCases: [GGMLType] = (0..<256).compactMap { GGMLType(format: Int32($0)) }

    /// ggml's type number.
    public var ggmlType: Int32 { moe_ggml_type_of_format(format) }
    public var blockElements: Int { Int(moe_ggml_block_elems(format)) }
    public var blockBytes: Int { Int(moe_ggml_block_bytes(format)) }
    /// moe_options.h's name of the format ("q4_K").
    public var description: String { optionName(MOE_OPTION_TABLE_FORMAT, format) }
}

/// The quantizations: MLX's, in MLX's layout (a row of `cols` values is a little-endian bit
/// stream of packed codes, element 0 in the lowest bits, stored as uint32 words, with one
/// scale (and bias) per group of consecutive elements), and ggml's blocks as ggml stores them.
public enum Quantization: Sendable, Equatable, CustomStringConvertible {
    /// `value = scale * q + bias`, q the unsigned `bits`-bit code of the element.
    case affine(bits: Int, groupSize: Int)
    /// OCP MX FP4: `value = e2m1(code) * 2^(scale - 127)`, E8M0 byte scales, groups of 32.
    case mxfp4
    /// ggml's blocks of `type`: codes and scales interleaved in the blocks, no separate
    /// scales or biases.
    case ggml(GGMLType)

    /// moe_options.h's MOE_AFFINE_BITS_ROWS and MOE_AFFINE_GROUP_SIZE_ROWS.
    public static let affineBits = Set((1...32).filter { moe_affine_bits_allowed(Int32($0)) != 0 })
    public static let affineGroupSizes = Set((0...16).map { 1 << $0 }.filter { moe_affine_group_size_allowed(Int32($0)) != 0 })

    /// Bits per code; 0 for ggml's blocks, whose codes are not one width (a Q4_K block's
    /// 4-bit codes come with 6-bit scales: `GGMLType.blockBytes` is what a block takes).
    public var bits: Int {
        switch self {
        case .affine(let bits, _): return bits
        case .mxfp4: return 4
        case .ggml: return 0
        }
    }

    /// Elements per scale group; for ggml, per block (a row is a whole number of them).
    public var groupSize: Int {
        switch self {
        case .affine(_, let groupSize): return groupSize
        case .mxfp4: return Int(MOE_MXFP4_GROUP_SIZE)
        case .ggml(let t): return t.blockElements
        }
    }

    /// Whether scales come as a tensor of their own (MLX's formats) rather than inside the
    /// codes' blocks (ggml's).
    public var hasSeparateScales: Bool {
        if case .ggml = self { return false }
        return true
    }

    public var description: String {
        switch self {
        case .affine(let bits, let groupSize): return "affine \(bits)-bit (group size \(groupSize))"
        case .mxfp4: return "mxfp4"
        case .ggml(let t): return "ggml \(t)"
        }
    }

    /// Throws naming `name` if MLX has no such quantization.
    func validate(_ name: String) throws {
        guard case .affine(let bits, let groupSize) = self else { return }
        guard Self.affineBits.contains(bits) else {
            throw MoEError.invalidArgument("\(name): bits must be one of \(Self.affineBits.sorted()), got \(bits)")
        }
        guard Self.affineGroupSizes.contains(groupSize) else {
            throw MoEError.invalidArgument(
                "\(name): group_size must be one of \(Self.affineGroupSizes.sorted()), got \(groupSize)")
        }
    }
}

/// How one weight tensor is stored. Every backend keeps a weight in its given format.
public enum WeightFormat: Sendable, Equatable, CustomStringConvertible {
    case dense(ScalarType)
    /// Quantized; `scaleType` is the element type of affine scales and biases (mxfp4
    /// scales are E8M0 bytes whatever it says).
    case quantized(Quantization, scaleType: ScalarType)

    public static let float32 = WeightFormat.dense(.float32)

    /// The format that keeps tensors of ggml's type number `ggmlType` (GGUF's tensor type
    /// field): dense for F32, F16 and BF16, else the block type; nil if the layer does not
    /// read that type.
    public init?(ggmlType: Int32) {
        let code = moe_format_of_ggml_type(ggmlType)
        if let t = ScalarType(rawValue: code) {
            self = .dense(t)
        } else if let t = GGMLType(format: code) {
            self = .quantized(.ggml(t), scaleType: .float32)
        } else {
            return nil
        }
    }

    public var description: String {
        switch self {
        case .dense(let t): return t.description
        case .quantized(let q, let s):
            if case .affine = q { return "\(q) with \(s) scales" }
            return q.description
        }
    }

    /// Bytes of one row of `cols` elements (the packed codes for quantized formats).
    func rowBytes(cols: Int) -> Int {
        switch self {
        case .dense(let t): return cols * t.size
        case .quantized(.ggml(let t), _): return cols / t.blockElements * t.blockBytes
        case .quantized(let q, _): return cols * q.bits / 8
        }
    }

    /// Bytes of one row's scales (and, for affine, of its biases).
    func scaleRowBytes(cols: Int) -> Int {
        switch self {
        case .dense, .quantized(.ggml, _): return 0
        case .quantized(.mxfp4, _): return cols / 32
        case .quantized(let q, let s): return cols / q.groupSize * s.size
        }
    }

    /// Its moe_format.
    var code: moe_format {
        switch self {
        case .dense(.float32): return MOE_FORMAT_F32
        case .dense(.float16): return MOE_FORMAT_F16
        case .dense(.bfloat16): return MOE_FORMAT_BF16
        case .quantized(.affine, _): return MOE_FORMAT_AFFINE
        case .quantized(.mxfp4, _): return MOE_FORMAT_MXFP4
        case .quantized(.ggml(let t), _): return moe_format(rawValue: UInt32(bitPattern: t.format))
        }
    }

    /// Whether this is a quantized format (the products that 8-bit activations apply to).
    var isQuantized: Bool {
        if case .quantized = self { return true }
        return false
    }

    /// Bits per code of a quantized format (0 for dense ones).
    var bits: Int {
        if case .quantized(let q, _) = self { return q.bits }
        return 0
    }

    var hasBiases: Bool {
        if case .quantized(.affine, _) = self { return true }
        return false
    }

    /// The kernel-side description of a matrix in this format (pointers left nil).
    func cpuMatrix(cols: Int) -> moe_cpu_matrix {
        var m = moe_cpu_matrix()
        m.cols = Int64(cols)
        m.row_bytes = Int64(rowBytes(cols: cols))
        m.format = Int32(bitPattern: code.rawValue)
        if case .quantized(.ggml, _) = self {
            // The kernels find a block's size from the format; a group size would send
            // the row through the group-parameter paths of MLX's formats.
        } else if case .quantized(let q, let s) = self {
            m.bits = Int32(q.bits)
            m.group_size = Int32(q.groupSize)
            m.scale_type = s.rawValue
        }
        return m
    }
}
