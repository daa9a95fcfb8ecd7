// MetalSources.generated.swift must hold exactly the files of Sources/MoEKernels/Metal/:
// after editing one, run `python3 scripts/embed_msl.py`.
import Foundation
import XCTest
@testable import MoEKernels

final class MetalSourcesTests: XCTestCase {
    func testGeneratedSourcesMatchTheMetalFiles() throws {
        let metal = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../../Sources/MoEKernels/Metal").standardized
        let onDisk = try FileManager.default.contentsOfDirectory(atPath: metal.path)
            .filter { $0.hasSuffix(".metal") || $0.hasSuffix(".h") }
        let include = metal.appendingPathComponent("../../CMoESwift/include").standardized
        XCTAssertEqual(Set(onDisk + ["moe_options.h"]), Set(MetalSources.names),
                       "a file was added or removed: run scripts/embed_msl.py")
        for name in MetalSources.names {
            let folder = name == "moe_options.h" ? include : metal
            let text = try String(contentsOf: folder.appendingPathComponent(name), encoding: .utf8)
            XCTAssertEqual(MetalSources.files[name], text, "\(name) changed: run scripts/embed_msl.py")
        }
        XCTAssertTrue(MetalKernels.source.contains("kernel"), "the library source is assembled")
        let includes = MetalKernels.source.split(separator: "\n").filter { $0.hasPrefix("#include \"moe_") }
        XCTAssertEqual(includes, [], "our own includes are expanded")
    }
}
