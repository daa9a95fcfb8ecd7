// The runtime header is joined from its parts in KernelCompiler.runtimeParts: a part file the
// list forgets would be embedded and silently left out.
#if os(Linux)
import Foundation
import XCTest
@testable import SoftMetal

final class RuntimeHeaderTests: XCTestCase {
    func testEveryPartIsJoinedOnceAndNamedByItsLineDirective() throws {
        let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../../Sources/SoftMetal/Runtime").standardized
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".h") }
        let listed = KernelCompiler.runtimeParts.map(\.name)
        XCTAssertEqual(listed.sorted(), files.sorted())
        XCTAssertEqual(Set(listed).count, listed.count)
        let directives = KernelCompiler.runtimeHeader.split(separator: "\n").filter { $0.hasPrefix("#line ") }
        XCTAssertEqual(directives.map(String.init), listed.map { "#line 1 \"\(KernelCompiler.runtimePartFolder)\($0)\"" })
    }
}
#endif
