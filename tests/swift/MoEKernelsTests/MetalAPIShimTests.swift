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

    /// Names that exist only in the macOS 15 / iOS 18 SDKs. `#available` does not hide a
    /// member the SDK lacks, so with Xcode 15 their every use must sit under
    /// `#if compiler(>=6.0)` (the Swift 6 compilers come with those SDKs). The Linux build
    /// compiles them against SoftMetal (or not at all: Accelerate), so only this reading of
    /// the source checks it here; the macOS CI job's Xcode 15 build is the real test.
    func testMacOS15NamesAreBehindTheCompilerCheck() throws {
        let names = [".mathMode", ".mathFloatingPointFunctions", "BLAS.threadingModel", "BLASSetThreading(",
                     "MTLMathMode", "MTLMathFloatingPointFunctions", ".version3_2"]
        let files = try XCTUnwrap(FileManager.default.enumerator(atPath: sources.path)).compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") }
        var uses = 0
        for file in files {
            let text = try String(contentsOf: sources.appendingPathComponent(file), encoding: .utf8)
            var conditions: [String] = []  // the enclosing #if branches, innermost last ("!" for #else)
            for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let line = raw.trimmingCharacters(in: .whitespaces)
                if line.hasPrefix("#if ") { conditions.append(String(line.dropFirst(4))) }
                else if line.hasPrefix("#elseif ") || line == "#else" { conditions[conditions.count - 1] = "!" }
                else if line == "#endif" { conditions.removeLast() }
                else if !line.hasPrefix("//"), let name = names.first(where: { line.contains($0) }) {
                    uses += 1
                    XCTAssertTrue(conditions.contains { $0.contains("compiler(>=6.0)") },
                                  "\(file):\(number + 1): \(name) outside #if compiler(>=6.0)")
                }
            }
        }
        XCTAssertGreaterThanOrEqual(uses, 3, "the check found the uses it is about (MetalContext, BLAS.swift)")
    }
}
