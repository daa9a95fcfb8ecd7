import CMoESwift
import XCTest
@testable import MoEKernels

/// Swift lists the cases of each option itself (so that switches stay exhaustive); these
/// must be exactly the rows of moe_options.h's tables, by code and by name.
final class OptionTableTests: XCTestCase {
    private func rows(_ table: moe_option_table) -> [Int32: String] {
        var out: [Int32: String] = [:]
        for code in Int32(-8)..<256 {
            if let name = moe_option_name(table, code) { out[code] = String(cString: name) }
        }
        return out
    }

    func testEverySwiftCaseIsARowAndEveryRowACase() {
        XCTAssertEqual(rows(MOE_OPTION_TABLE_BACKEND), Dictionary(uniqueKeysWithValues: MoEBackendKind.allCases.map { ($0.rawValue, $0.name) }))
        XCTAssertEqual(rows(MOE_OPTION_TABLE_SCORING), Dictionary(uniqueKeysWithValues: MoEScoring.allCases.map { ($0.rawValue, $0.description) }))
        XCTAssertEqual(rows(MOE_OPTION_TABLE_ACTIVATION), Dictionary(uniqueKeysWithValues: MoEActivation.allCases.map { ($0.rawValue, $0.description) }))
        XCTAssertEqual(rows(MOE_OPTION_TABLE_ACTIVATION_QUANTIZATION),
                       Dictionary(uniqueKeysWithValues: MoEActivationQuantization.allCases.map { ($0.rawValue, $0.description) }))
        XCTAssertEqual(rows(MOE_OPTION_TABLE_DTYPE), Dictionary(uniqueKeysWithValues: ScalarType.allCases.map { ($0.rawValue, $0.description) }))
        // Every format row is a dense dtype, one of MLX's quantizations or a ggml block type.
        let mlx: [Int32: String] = [Int32(MOE_FORMAT_AFFINE.rawValue): "affine", Int32(MOE_FORMAT_MXFP4.rawValue): "mxfp4"]
        let dense = Dictionary(uniqueKeysWithValues: ScalarType.allCases.map { ($0.rawValue, $0.description) })
        let ggml = Dictionary(uniqueKeysWithValues: GGMLType.allCases.map { ($0.format, $0.description) })
        XCTAssertEqual(rows(MOE_OPTION_TABLE_FORMAT), dense.merging(mlx) { a, _ in a }.merging(ggml) { a, _ in a })
        XCTAssertEqual(dense.count + mlx.count + ggml.count, rows(MOE_OPTION_TABLE_FORMAT).count)
        for (code, name) in rows(MOE_OPTION_TABLE_BACKEND) {
            XCTAssertEqual(moe_option_code(MOE_OPTION_TABLE_BACKEND, name), code)
        }
        XCTAssertEqual(moe_option_code(MOE_OPTION_TABLE_SCORING, "relu"), -1)
    }

    func testHiddenActAliases() {
        XCTAssertEqual(MoEActivation(hiddenAct: "swish"), .silu)
        XCTAssertEqual(MoEActivation(hiddenAct: "gelu_pytorch_tanh"), .geluTanh)
        XCTAssertNil(MoEActivation(hiddenAct: "gelu_10"))
        XCTAssertNil(MoEActivation(hiddenAct: ""))
        XCTAssertNil(MoEActivation(hiddenAct: "silu swish"))
        XCTAssertEqual(MoEActivation(hiddenAct: "gelu"), .gelu)
        XCTAssertEqual(MoEActivation(hiddenAct: "relu"), .relu)
        XCTAssertTrue(Set(MoEActivation.hiddenActNames).isSuperset(of: ["silu", "swish", "gelu_pytorch_tanh", "gelu", "relu"]))
    }

    func testAffineWidthsAndSpecialisations() {
        XCTAssertEqual(Quantization.affineBits, [2, 3, 4, 5, 6, 8])
        XCTAssertEqual(Quantization.affineGroupSizes, [32, 64, 128])
        func suffix(_ format: moe_format, _ bits: Int32) -> String {
            String(cString: moe_specialisation_suffix(moe_specialisation_of(Int32(format.rawValue), bits)))
        }
        XCTAssertEqual(suffix(MOE_FORMAT_BF16, 0), "bf16")
        XCTAssertEqual(suffix(MOE_FORMAT_AFFINE, 4), "q4")
        XCTAssertEqual(suffix(MOE_FORMAT_AFFINE, 8), "q8")
        XCTAssertEqual(suffix(MOE_FORMAT_AFFINE, 3), "any")
        XCTAssertEqual(suffix(MOE_FORMAT_MXFP4, 4), "mxfp4")
        XCTAssertNil(moe_specialisation_suffix(Int32(MOE_SPECIALISATION_COUNT.rawValue)))
    }
}
