/// Activations of a host's dtype as the float32 the layer computes in: float32 where they
/// lie, float16 and bfloat16 widened into a copy (exactly), and float32 results narrowed
/// back with rounding to nearest even (a NaN stays a NaN), as the Metal backends'
/// conversion kernels do.
final class ActivationRows {
    let pointer: UnsafePointer<Float>
    private let copy: UnsafeMutableBufferPointer<Float>?

    init(_ raw: UnsafeRawPointer, dtype: ScalarType, count: Int) {
        switch dtype {
        case .float32:
            pointer = raw.assumingMemoryBound(to: Float.self)
            copy = nil
        case .float16, .bfloat16:
            let out = UnsafeMutableBufferPointer<Float>.allocate(capacity: Swift.max(count, 1))
            let bits = raw.assumingMemoryBound(to: UInt16.self)
            if dtype == .bfloat16 {
                for i in 0..<count { out[i] = Float(bitPattern: UInt32(bits[i]) << 16) }
            } else {
                for i in 0..<count { out[i] = Float(Float16(bitPattern: bits[i])) }
            }
            pointer = UnsafePointer(out.baseAddress!)
            copy = out
        }
    }

    deinit { copy?.deallocate() }

    /// `values` written to `raw` in `dtype`.
    static func store(_ values: UnsafeMutableBufferPointer<Float>, into raw: UnsafeMutableRawPointer, dtype: ScalarType) {
        switch dtype {
        case .float32:
            raw.copyMemory(from: values.baseAddress!, byteCount: values.count * 4)
        case .float16:
            let out = raw.assumingMemoryBound(to: UInt16.self)
            for i in values.indices { out[i] = Float16(values[i]).bitPattern }
        case .bfloat16:
            let out = raw.assumingMemoryBound(to: UInt16.self)
            for i in values.indices {
                let b = values[i].bitPattern
                out[i] = values[i].isNaN ? UInt16(truncatingIfNeeded: (b >> 16) | 0x40)
                    : UInt16(truncatingIfNeeded: (b &+ 0x7FFF &+ ((b >> 16) & 1)) >> 16)
            }
        }
    }
}
