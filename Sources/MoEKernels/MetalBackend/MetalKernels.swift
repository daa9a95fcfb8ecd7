import CMoESwift

/// The MSL source of the Metal backend, compiled into the binary as string literals
/// (MetalSources.generated.swift, written by scripts/embed_msl.py) and assembled here: each `#include "x.h"` of our own headers is replaced by the file
/// (recursively: headers include headers; their include guards drop repeats), because
/// Apple's `makeLibrary(source:options:)` cannot resolve includes.
/// tests/python/metal_kernels.py assembles the same source for the kernel tests.
enum MetalKernels {
    static let headers: [String: String] = MetalSources.files.filter { $0.key.hasSuffix(".h") }

    /// In this order (helpers of later files may come from earlier ones).
    static let files: [String] = MetalSources.names.filter { $0.hasSuffix(".metal") }

    /// The whole library source.
    static let source: String = files.map { expand(MetalSources.files[$0]!) }.joined(separator: "\n")

    private static func expand(_ text: String) -> String {
        var out: [Substring] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.drop { $0 == " " || $0 == "\t" }
            if trimmed.hasPrefix("#include \""), let end = trimmed.dropFirst(10).firstIndex(of: "\"") {
                let name = String(trimmed[trimmed.index(trimmed.startIndex, offsetBy: 10)..<end])
                if let header = headers[name] {
                    out.append(Substring(expand(header)))
                    continue
                }
            }
            out.append(line)
        }
        return out.joined(separator: "\n")
    }

    /// The kernels' names (MSL `kernel void` functions). Those that read weights are
    /// template instances per format, `<kernel>_<suffix>` (MetalWeight.kernelSuffix).
    static let bucket = "moe_bucket"
    static let combine = "moe_combine"
    static func router(_ suffix: String) -> String { "moe_router_" + suffix }
    static func routerGemv(_ suffix: String) -> String { "moe_router_gemv_" + suffix }
    static func gateUpGemv(_ suffix: String) -> String { "moe_gate_up_gemv_" + suffix }
    static func downGemv(_ suffix: String) -> String { "moe_down_gemv_" + suffix }
    static func gateUpGemm(_ suffix: String) -> String { "moe_gate_up_gemm_" + suffix }
    static func downGemm(_ suffix: String) -> String { "moe_down_gemm_" + suffix }
}
