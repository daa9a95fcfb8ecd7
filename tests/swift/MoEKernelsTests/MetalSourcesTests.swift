// The Metal library's source as the EmbedMSL build plugin assembles it
// (MetalSources.library, from Sources/MoEKernels/Metal/library.txt): each line is the line
// of the file that its `#line` marker names, every line of those files is there but our
// own includes, which are pasted, and the kernel files come in the list's order.
import Foundation
import XCTest
@testable import MoEKernels

final class MetalSourcesTests: XCTestCase {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../..").standardized

    func lines(_ path: String) throws -> [Substring] {
        let text = try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        if lines.last == "" { lines.removeLast() }
        return lines
    }

    func isQuotedInclude(_ line: Substring) -> Bool {
        line.drop { $0 == " " || $0 == "\t" }.replacingOccurrences(of: " ", with: "").hasPrefix("#include\"")
    }

    func testEveryLineIsTheLineItsMarkerNames() throws {
        var files: [String: [Substring]] = [:]
        var covered: [String: Set<Int>] = [:]
        var starts: [String] = []
        var file = "", line = 0
        var library = MetalSources.library.split(separator: "\n", omittingEmptySubsequences: false)
        XCTAssertEqual(library.removeLast(), "", "the source ends in a newline")
        for text in library {
            if text.hasPrefix("#line ") {
                let parts = text.split(separator: " ", maxSplits: 2)
                line = try XCTUnwrap(Int(parts[1]), String(text))
                file = String(parts[2].dropFirst().dropLast())
                if files[file] == nil { files[file] = try lines(file) }
                if line == 1 && MetalSources.kernelFiles.contains(file) { starts.append(file) }
                continue
            }
            let source = try XCTUnwrap(files[file], "a line before any #line marker: \(text)")
            XCTAssertLessThanOrEqual(line, source.count, "\(file) has no line \(line)")
            if line <= source.count { XCTAssertEqual(text, source[line - 1], "\(file):\(line)") }
            XCTAssertFalse(isQuotedInclude(text), "\(file):\(line): an include left in place")
            covered[file, default: []].insert(line)
            line += 1
        }
        for (name, source) in files {
            let missing = source.indices.filter { !covered[name, default: []].contains($0 + 1) && !isQuotedInclude(source[$0]) }
            XCTAssertEqual(missing.map { $0 + 1 }, [], "lines of \(name) missing from the library")
        }
        XCTAssertEqual(starts, MetalSources.kernelFiles, "each kernel file once, in order")
        let listed = try lines("Sources/MoEKernels/Metal/library.txt").filter { $0.hasPrefix("kernels ") }
            .map { "Sources/MoEKernels/Metal/" + $0.dropFirst("kernels ".count) }
        XCTAssertEqual(MetalSources.kernelFiles, listed)
    }
}
