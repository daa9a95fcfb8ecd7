// The Metal library's source as the EmbedMSL build plugin assembles it
// (MetalSources.library, from Sources/MoEKernels/Metal/library.txt): each line is the line
// of the file that its `#line` marker names, every line of those files is there but our
// own includes, which are pasted, and the kernel files come in the list's order; and the
// compiler (SoftMetal here, Apple's on a Mac) names those files and lines in its errors.
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
        // The source's identity, which embed-msl appends after the files (a blank line, a
        // comment, the kernel named after the hash of everything before it).
        let identity = library.suffix(3)
        library.removeLast(3)
        XCTAssertEqual(identity.first, "")
        XCTAssertEqual(identity.last, "kernel void \(MetalKernels.sourceIdentity)() {}")
        XCTAssertEqual(MetalKernels.sourceIdentity.count, "moe_source_".count + 16)
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

    /// The library with `replacement` in place of each named line (file, line) of the
    /// files it was assembled from: the first place where the markers say that line is.
    func planted(_ errors: [(file: String, line: Int, text: String)]) throws -> String {
        var file = "", line = 0, done = Set<Int>()
        var out: [Substring] = []
        for text in MetalSources.library.split(separator: "\n", omittingEmptySubsequences: false) {
            if text.hasPrefix("#line ") {
                let parts = text.split(separator: " ", maxSplits: 2)
                line = try XCTUnwrap(Int(parts[1]))
                file = String(parts[2].dropFirst().dropLast())
                out.append(text)
                continue
            }
            if let i = errors.indices.first(where: { errors[$0].file == file && errors[$0].line == line && !done.contains($0) }) {
                out.append(Substring(errors[i].text))
                done.insert(i)
            } else {
                out.append(text)
            }
            line += 1
        }
        XCTAssertEqual(done.count, errors.count, "every error planted")
        return out.joined(separator: "\n")
    }

    /// An error planted in a kernel file and one in a header pasted into the library are
    /// reported at their own files and lines, as the compiler of the "metal" or "softmetal"
    /// backend sees the library (the options of MetalContext).
    func testCompileErrorsNameTheRealFileAndLine() throws {
        guard MoELayer.availableBackends.contains(metalDeviceKind), let device = metalSystemDevice() else {
            throw XCTSkip("the \(metalDeviceKind.name) backend is not available here")
        }
        let kernel = "Sources/MoEKernels/Metal/moe_combine.metal", header = "Sources/MoEKernels/Metal/moe_common.h"
        let kernelLine = try XCTUnwrap(try lines(kernel).firstIndex { $0.contains("const uint t = group.y;") }) + 1
        let headerLine = try XCTUnwrap(try lines(header).firstIndex { $0.hasPrefix("#define MOE_NONE") }) + 1
        let source = try planted([(kernel, kernelLine, "    const uint t = planted_kernel_error;"),
                                  (header, headerLine + 1, "static planted_header_error x;")])
        do {
            _ = try device.makeLibrary(source: source, options: MetalContext.compileOptions())
            XCTFail("the planted errors compiled")
        } catch {
            let message = String(describing: error)
            XCTAssertTrue(message.contains("\(kernel):\(kernelLine):"), message)
            XCTAssertTrue(message.contains("\(header):\(headerLine + 1):"), message)
            XCTAssertTrue(message.contains("planted_kernel_error") && message.contains("planted_header_error"), message)
        }
    }

    /// A metallib built ahead of time (scripts/build-metallib.sh) is used only if it holds
    /// the function named after this source's identity; the compiled source has it. Here
    /// (SoftMetal, no file libraries) every path falls back to compiling the source, and
    /// $MOE_SWIFT_METALLIB is the first path looked at.
    func testAPrecompiledLibraryMustBeOfThisSource() throws {
        guard MoELayer.availableBackends.contains(metalDeviceKind) else {
            throw XCTSkip("the \(metalDeviceKind.name) backend is not available here")
        }
        let context = try MetalContext.shared()
        XCTAssertTrue(context.library.functionNames.contains(MetalKernels.sourceIdentity))
        setenv("MOE_SWIFT_METALLIB", "/nonexistent/moe_swift.metallib", 1)
        defer { unsetenv("MOE_SWIFT_METALLIB") }
        XCTAssertEqual(MetalContext.precompiledLibraryPaths.first, "/nonexistent/moe_swift.metallib")
        XCTAssertNil(MetalContext.precompiledLibrary(context.device))
        // The identity is the FNV-1a hash of the text before it: any change of the source
        // changes it, so a metallib of another version is not taken for this one.
        let marker = "\n// The identity of this source"
        let before = try XCTUnwrap(MetalKernels.source.components(separatedBy: marker).first)
        var hash: UInt64 = 1469598103934665603
        for byte in before.utf8 { hash = (hash ^ UInt64(byte)) &* 1099511628211 }
        let hex = String(hash, radix: 16)
        XCTAssertEqual(MetalKernels.sourceIdentity, "moe_source_" + String(repeating: "0", count: 16 - hex.count) + hex)
    }

    /// On macOS 13 the library compiles as MSL 3.0, that system's default (compileOptions
    /// asks for 3.1 only from macOS 14): nothing of 3.1 (`bfloat`, ...) may be used, which
    /// SoftMetal's language check enforces as Apple's compiler does. The macOS CI job
    /// compiles it with `-std=metal3.0` too.
    func testTheLibraryCompilesAsMSL30() throws {
        guard MoELayer.availableBackends.contains(metalDeviceKind), let device = metalSystemDevice() else {
            throw XCTSkip("the \(metalDeviceKind.name) backend is not available here")
        }
        let options = MetalContext.compileOptions()
        options.languageVersion = .version3_0
        let library = try device.makeLibrary(source: MetalKernels.source, options: options)
        XCTAssertNotNil(library.makeFunction(name: MetalKernels.combine))
        // The check bites: a bfloat in the same source is refused as MSL 3.0, accepted as 3.1.
        let bfloat = MetalKernels.source + "\nkernel void planted_bfloat(device bfloat* p [[buffer(0)]]) { p[0] = bfloat(1.0f); }\n"
        XCTAssertThrowsError(try device.makeLibrary(source: bfloat, options: options))
    }

    /// scripts/assemble-msl.sh (what the macOS CI job hands to `xcrun metal`) writes the
    /// source this binary embeds, byte for byte.
    func testTheAssembleScriptWritesTheEmbeddedSource() throws {
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("assemble-msl-\(ProcessInfo.processInfo.processIdentifier).metal")
        defer { try? FileManager.default.removeItem(at: out) }
        let script = Process()
        script.executableURL = URL(fileURLWithPath: "/bin/bash")
        script.arguments = [root.appendingPathComponent("scripts/assemble-msl.sh").path, out.path]
        try script.run()
        script.waitUntilExit()
        XCTAssertEqual(script.terminationStatus, 0)
        XCTAssertEqual(try String(contentsOf: out, encoding: .utf8), MetalSources.library)
    }
}
