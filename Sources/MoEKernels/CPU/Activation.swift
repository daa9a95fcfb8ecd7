#if canImport(Darwin)
import Darwin
#else
import Glibc
#endif

/// The gated activations of the spec, evaluated in float32.
struct GatedActivation {
    let kind: MoEActivation
    let alpha: Float
    let limit: Float

    @inline(__always)
    func callAsFunction(_ g: Float, _ u: Float) -> Float {
        switch kind {
        case .silu:
            return g / (1 + expf(-g)) * u
        case .geluTanh:
            return 0.5 * g * (1 + tanhf(0.7978845608 * (g + 0.044715 * g * g * g))) * u
        case .swigluOAI:
            let gc = Swift.min(g, limit)
            let uc = Swift.max(Swift.min(u, limit), -limit)
            return gc / (1 + expf(-alpha * gc)) * (uc + 1)
        case .gelu:
            return 0.5 * g * (1 + erff(g * 0.70710678118654752)) * u
        case .relu:
            return Swift.max(g, 0) * u
        case .swigluClamped:
            let gc = Swift.min(g, limit)
            return gc / (1 + expf(-gc)) * Swift.max(Swift.min(u, limit), -limit)
        }
    }
}
