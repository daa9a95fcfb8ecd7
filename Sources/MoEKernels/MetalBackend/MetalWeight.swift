import CMoESwift

/// One weight matrix on the device in the format it was given in — never widened: its
/// codes (or dense values), scales and biases, each the caller's bytes copied once, and
/// the `moe_weight_desc` that tells a kernel how to read a row (Metal/moe_formats.h).
struct MetalWeight {
    let codes: any MTLBuffer
    let scales: (any MTLBuffer)?
    let biases: (any MTLBuffer)?
    let format: WeightFormat
    var desc: moe_weight_desc

    /// Uploads `data`, a tensor of experts of `rowsPerExpert` rows each (any value for a
    /// single matrix).
    init(_ data: WeightData, rowsPerExpert: Int, context: MetalContext, what: String) throws {
        func upload(_ bytes: UnsafeRawBufferPointer, _ part: String) throws -> any MTLBuffer {
            let buffer = try context.makeBuffer(bytes: bytes.count, what: what + part)
            if let base = bytes.baseAddress { buffer.contents().copyMemory(from: base, byteCount: bytes.count) }
            return buffer
        }
        switch data {
        case .array(let a):
            codes = try a.withUnsafeBytes { try upload($0, "") }
            (scales, biases) = (nil, nil)
        case .borrowed(let b):
            codes = try upload(UnsafeRawBufferPointer(b), "")
            (scales, biases) = (nil, nil)
        case .dense(let raw, _):
            codes = try upload(raw, "")
            (scales, biases) = (nil, nil)
        case .quantized(let q):
            codes = try upload(q.weight, " (codes)")
            scales = try upload(q.scales, " (scales)")
            biases = try q.biases.map { try upload($0, " (biases)") }
        }
        format = data.format
        desc = moe_weight_desc()
        desc.rows_per_expert = UInt32(rowsPerExpert)
        desc.format = format.code.rawValue
        switch format {
        case .dense(let t):
            desc.bits = UInt32(8 * t.size)
        case .quantized(let q, let scaleType):
            desc.bits = UInt32(q.bits)
            desc.group_shift = UInt32(q.groupSize.trailingZeroBitCount)
            desc.scale_type = UInt32(scaleType.rawValue)
        }
    }

    /// The same buffers, read from row `rowOffset` of each expert (the up half of a fused
    /// gate_up tensor).
    func offset(by rowOffset: Int) -> MetalWeight {
        var w = self
        w.desc.row_offset = UInt32(rowOffset)
        return w
    }

    /// The host-name suffix of the kernel instances that read this format: its row of
    /// MOE_SPECIALISATION_ROWS (moe_options.h).
    var kernelSuffix: String {
        String(cString: moe_specialisation_suffix(moe_specialisation_of(Int32(desc.format), Int32(format.bits))))
    }

    /// The suffix of kernels that read gate and up with one loader: theirs if they agree
    /// (group size and scale type are per dispatch, so need not), else `any`.
    static func kernelSuffix(gate: MetalWeight, up: MetalWeight) -> String {
        gate.kernelSuffix == up.kernelSuffix ? gate.kernelSuffix : "any"
    }
}
