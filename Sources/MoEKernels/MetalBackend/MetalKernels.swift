import CMoESwift

/// The MSL source of the Metal backend and its kernels' names. The source is
/// MetalSources.library, which the EmbedMSL build plugin (Plugins/EmbedMSL) assembles from
/// the files of Metal/library.txt with every `#include "x.h"` pasted, because Apple's
/// `makeLibrary(source:options:)` cannot resolve includes; `#line` markers in it name the
/// original files for the compiler's messages.
enum MetalKernels {
    /// The whole library source.
    static let source: String = MetalSources.library
    /// The function named after the source's identity (the last kernel embed-msl appends):
    /// a precompiled library holds it only if it was built from this very source.
    static let sourceIdentity: String = {
        let prefix = "kernel void moe_source_"
        guard let line = source.split(separator: "\n").last(where: { $0.hasPrefix(prefix) }) else { return "" }
        return "moe_source_" + line.dropFirst(prefix.count).prefix { $0.isHexDigit }
    }()
    /// The kernels' names (MSL `kernel void` functions). Those that read weights are
    /// template instances per format, `<kernel>_<suffix>` (MetalWeight.kernelSuffix).
    static let bucket = "moe_bucket"
    static let combine = "moe_combine"
    static let routerTopK = "moe_router_topk"
    static let quantizeQ8 = "moe_quantize_q8"
    static func router(_ suffix: String) -> String { "moe_router_" + suffix }
    static func routerGemv(_ suffix: String) -> String { "moe_router_gemv_" + suffix }
    static func gateUpGemv(_ suffix: String) -> String { "moe_gate_up_gemv_" + suffix }
    static func downGemv(_ suffix: String) -> String { "moe_down_gemv_" + suffix }
    static func gateUpGemm(_ suffix: String) -> String { "moe_gate_up_gemm_" + suffix }
    static func downGemm(_ suffix: String) -> String { "moe_down_gemm_" + suffix }
    /// Per activation dtype (its moe_dtype name): a caller's rows to float32 and back.
    static func loadActivations(_ dtype: ScalarType) -> String { "moe_load_activations_\(dtype)" }
    static func storeActivations(_ dtype: ScalarType) -> String { "moe_store_activations_\(dtype)" }
}
