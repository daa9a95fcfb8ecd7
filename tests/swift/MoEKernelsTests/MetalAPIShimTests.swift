// No machine of this project compiles the Apple branch of MetalBackend/MetalAPI.swift; the
// Linux build only proves the SoftMetal branch complete. These checks read the source so
// that the two branches cannot drift apart, and no file goes back to importing Metal itself.
import Foundation
import XCTest

final class MetalAPIShimTests: XCTestCase {
    private let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../../Sources/MoEKernels").standardized

    func testBothBranchesAliasTheSameNamesFromTheirOwnModule() throws {
        let text = try String(contentsOf: sources.appendingPathComponent("MetalBackend/MetalAPI.swift"), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let ifLine = lines.firstIndex(of: "#if canImport(Metal)"), let elseLine = lines.firstIndex(of: "#else"),
              let endLine = lines.firstIndex(of: "#endif"), ifLine < elseLine, elseLine < endLine else {
            return XCTFail("MetalAPI.swift: expected one #if canImport(Metal) / #else / #endif at column 0")
        }
        // `[public ]typealias X = Module.X` lines of one branch, as X (with its access level).
        func aliases(_ range: Range<Int>, module: String) -> [String] {
            lines[range].filter { $0.hasPrefix("typealias ") || $0.hasPrefix("public typealias ") }.map { line in
                let access = line.hasPrefix("public ") ? "public " : ""
                let parts = line.dropFirst(access.count + "typealias ".count).components(separatedBy: " = ")
                XCTAssertEqual(parts.count, 2, line)
                XCTAssertEqual(parts.last, "\(module).\(parts[0])", "an alias must name its own module's same name")
                return access + parts[0]
            }
        }
        let metal = aliases(ifLine + 1 ..< elseLine, module: "Metal")
        let softMetal = aliases(elseLine + 1 ..< endLine, module: "SoftMetal")
        XCTAssertFalse(metal.isEmpty)
        XCTAssertEqual(metal, softMetal, "both branches declare the same names, in the same order")
        let kinds = lines[ifLine ..< endLine].filter { $0.hasPrefix("let metalDeviceKind") }
        XCTAssertEqual(kinds, ["let metalDeviceKind = MoEBackendKind.metal", "let metalDeviceKind = MoEBackendKind.softMetal"])
    }

    func testOnlyTheShimImportsMetalOrSoftMetal() throws {
        let shim = "MetalBackend/MetalAPI.swift"
        for folder in ["MetalBackend", "Backend"] {
            for name in try FileManager.default.contentsOfDirectory(atPath: sources.appendingPathComponent(folder).path)
            where name.hasSuffix(".swift") && "\(folder)/\(name)" != shim {
                let text = try String(contentsOf: sources.appendingPathComponent("\(folder)/\(name)"), encoding: .utf8)
                for word in ["import Metal", "import SoftMetal", "canImport(Metal)", "canImport(SoftMetal)"] {
                    XCTAssertFalse(text.contains(word), "\(folder)/\(name) says \(word): go through \(shim)")
                }
            }
        }
    }
}
