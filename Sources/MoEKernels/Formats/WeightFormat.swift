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

/// MLX's quantizations, in MLX's layout: a row of `cols` values is a little-endian bit
/// stream of packed codes (element 0 in the lowest bits) stored as uint32 words, with one
/// scale (and bias) per group of consecutive elements.
public enum Quantization: Sendable, Equatable, CustomStringConvertible {
    /// `value = scale * q + bias`, q the unsigned `bits`-bit code of the element.
    case affine(bits: Int, groupSize: Int)
    /// OCP MX FP4: `value = e2m1(code) * 2^(scale - 127)`, E8M0 byte scales, groups of 32.
    case mxfp4

    /// moe_options.h's MOE_AFFINE_BITS_ROWS and MOE_AFFINE_GROUP_SIZE_ROWS.
    public static let affineBits = Set((1...32).filter { moe_affine_bits_allowed(Int32($0)) != 0 })
    public static let affineGroupSizes = Set((0...16).map { 1 << $0 }.filter { moe_affine_group_size_allowed(Int32($0)) != 0 })

    public var bits: Int {
        switch self {
        case .affine(let bits, _): return bits
        case .mxfp4: return 4
        }
    }

    public var groupSize: Int {
        switch self {
        case .affine(_, let groupSize): return groupSize
        case .mxfp4: return Int(MOE_MXFP4_GROUP_SIZE)
        }
    }

    public var description: String {
        switch self {
        case .affine(let bits, let groupSize): return "affine \(bits)-bit (group size \(groupSize))"
        case .mxfp4: return "mxfp4"
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

    public var description: String {
        switch self {
        case .dense(let t): return t.description
        case .quantized(let q, let s):
            if case .mxfp4 = q { return q.description }
            return "\(q) with \(s) scales"
        }
    }

    /// Bytes of one row of `cols` elements (the packed codes for quantized formats).
    func rowBytes(cols: Int) -> Int {
        switch self {
        case .dense(let t): return cols * t.size
        case .quantized(let q, _): return cols * q.bits / 8
        }
    }

    /// Bytes of one row's scales (and, for affine, of its biases).
    func scaleRowBytes(cols: Int) -> Int {
        switch self {
        case .dense: return 0
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
        }
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
        if case .quantized(let q, let s) = self {
            m.bits = Int32(q.bits)
            m.group_size = Int32(q.groupSize)
            m.scale_type = s.rawValue
        }
        return m
    }
}
