#if os(Linux)
import Glibc

/// Runs the real C preprocessor (`clang++ -E`) on MSL before it is translated, so that
/// macro-generated kernels and instantiations (MLX's `instantiate_kernel(...)`), `#include
/// "x.h"` and `#if __METAL_VERSION__ >= 310` work as with Apple's compiler.
///
/// - `<metal_*>` and `<simd/*>` resolve to empty stand-in headers: the runtime header, which
///   the compiled C++ includes first, is the real <metal_stdlib>. (Its macros, e.g.
///   `INFINITY` or `METAL_FUNC`, pass through the preprocessor unexpanded and are expanded
///   in the final compile.)
/// - `#include "x.h"` resolves relative to the including file, then the include directories.
/// - The output's line markers (`# 12 "file" 2`) become `#line 12 "file"`, which the
///   translator's errors and the final compile both follow, so every message names the MSL
///   file and line. The main source is written to a temporary file whose path is replaced
///   by `source.metal`, so the output (and the cache key) does not depend on it.
struct MSLPreprocessor {
    struct Options: Equatable {
        var includeDirectories: [String] = []
        /// name -> value (`-Dname=value`), applied after the predefined macros so they can be overridden.
        var macros: [(String, String)] = []
        /// MSL version as `__METAL_VERSION__` spells it: 310 for MSL 3.1.
        var metalVersion = 310
        /// Seconds each clang++ run may take (nil: SOFTMETAL_COMPILE_TIMEOUT or 600). Not
        /// part of the preprocessed text, so not compared.
        var compileTimeout: Double?

        static func == (a: Options, b: Options) -> Bool {
            a.includeDirectories == b.includeDirectories && a.metalVersion == b.metalVersion
                && a.macros.map { "\($0.0)=\($0.1)" } == b.macros.map { "\($0.0)=\($0.1)" }
        }
    }

    /// The stand-in headers (Apple's <metal_*> headers and <simd/*>).
    static let standInHeaders = [
        "metal_stdlib", "metal_atomic", "metal_common", "metal_compute", "metal_config", "metal_geometric",
        "metal_graphics", "metal_integer", "metal_math", "metal_matrix", "metal_numeric", "metal_pack",
        "metal_quadgroup", "metal_relational", "metal_simdgroup", "metal_simdgroup_matrix", "metal_texture",
        "metal_types", "metal_type_traits", "metal_utility", "metal_limits", "metal_array", "metal_tensor",
        "metal_uniform", "metal_initializer_list", "metal_logging", "metal_raytracing",
        "simd/simd.h", "simd/base.h", "simd/vector.h", "simd/vector_types.h", "simd/matrix.h",
        "simd/matrix_types.h", "simd/math.h", "simd/common.h", "simd/geometry.h", "simd/packed.h",
    ]

    /// What Apple's compiler predefines for MSL (bfloat exists from MSL 3.1).
    static func predefinedMacros(metalVersion: Int) -> [(String, String)] {
        var macros = [("__METAL__", "1"), ("__METAL_VERSION__", "\(metalVersion)"), ("__SOFTMETAL__", "1")]
        if metalVersion >= 310 { macros.append(("__HAVE_BFLOAT__", "1")) }
        return macros
    }

    static func arguments(compiler: String, stubs: String, input: String, output: String, options: Options) -> [String] {
        var argv = [compiler, "-E", "-x", "c++", "-std=c++17", "-nostdinc", "-nostdinc++",
                    "-ferror-limit=20", "-fno-color-diagnostics", "-fno-caret-diagnostics"]
        for (name, value) in predefinedMacros(metalVersion: options.metalVersion) + options.macros {
            argv.append("-D\(name)=\(value)")
        }
        for dir in options.includeDirectories { argv += ["-I", dir] }
        argv += ["-I", stubs, input, "-o", output]
        return argv
    }

    private static let lock = SMLock()
    nonisolated(unsafe) private static var memo: [String: String] = [:]

    /// The preprocessed source, with `#line` markers. A source that includes no file of its
    /// own (only <metal_*>) preprocesses the same every time: such results are kept in the
    /// process, so that a library made again costs no `clang++ -E` process.
    static func run(_ source: String, options: Options) throws -> String {
        let compiler = try KernelCompiler.findCompiler()
        let dir = KernelCompiler.cacheDirectory
        let stubs = try standInDirectory(dir)
        let key = Hash128.of([source, compiler, stubs] + arguments(compiler: compiler, stubs: stubs, input: "", output: "", options: options))
        if let known = lock.withLock({ memo[key] }) { return known }
        let text = try preprocess(source, options: options, compiler: compiler, dir: dir, stubs: stubs)
        if includesOnlyStandIns(text, stubs: stubs) {
            lock.withLock {
                if memo.count >= 512 { memo = [:] }
                memo[key] = text
            }
        }
        return text
    }

    /// True when every line marker names the source itself, a stand-in header or the
    /// preprocessor's own pseudo-files (`<built-in>`, `<command line>`).
    static func includesOnlyStandIns(_ text: String, stubs: String) -> Bool {
        for line in text.split(separator: "\n") where line.hasPrefix("#line ") {
            guard let marker = MSLTranslator.lineMarker(Array(line.utf8)[...]) else { continue }
            let file = marker.file
            if file != MSLTranslator.sourceName && !file.hasPrefix("<") && !file.hasPrefix(stubs + "/") { return false }
        }
        return true
    }

    private static func preprocess(_ source: String, options: Options, compiler: String, dir: String, stubs: String) throws -> String {
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        // A directory per run holding only the source: the main file's own directory is the
        // first place `#include "x.h"` looks, and nothing must be found there by accident.
        let work = "\(dir)/pp.\(unique)"
        try SMFile.makeDirectories(work)
        let input = "\(work)/\(MSLTranslator.sourceName)"
        let output = "\(work)/out.ii", log = "\(work)/log"
        // Everything in it: clang's own temporary output too, if it was stopped.
        defer { SoftMetalCache.removeTree(work) }
        try SMFile.writeAtomically(input, source, unique: unique)
        try MSLSandbox.checkDirectives(source: source, mainDirectory: work, includeDirectories: options.includeDirectories, stubs: stubs)
        let timeout = options.compileTimeout ?? KernelCompiler.defaultCompileTimeout
        let status = SMFile.spawn(arguments(compiler: compiler, stubs: stubs, input: input, output: output, options: options),
                                  output: log, timeout: timeout)
        let messages = ((try? SMFile.read(log)) ?? "").replacingAll(input, with: MSLTranslator.sourceName)
        guard status == 0 else {
            if let error = SMFile.spawnError(status, compiler: compiler, timeout: timeout) { throw error }
            throw SoftMetalError.compile(MSLSandbox.sanitize(messages, includeDirectories: options.includeDirectories, stubs: stubs))
        }
        let text = try SMFile.read(output)
        try MSLSandbox.checkPreprocessed(text, mainFile: input, includeDirectories: options.includeDirectories, stubs: stubs)
        return normalizeLineMarkers(text, mainFile: input)
    }

    /// `# 12 "path" 1 3` -> `#line 12 "file"` (flags dropped: the final compile has no
    /// include stack to push or pop; the main file's temporary path -> source.metal).
    static func normalizeLineMarkers(_ text: String, mainFile: String) -> String {
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        for (i, line) in lines.enumerated() where line.hasPrefix("# ") {
            guard let marker = MSLTranslator.lineMarker(Array(line.utf8)[...]) else { continue }
            let file = marker.file == mainFile ? MSLTranslator.sourceName : marker.file
            lines[i] = "#line \(marker.line) \(MSLTranslator.cString(file))"
        }
        return lines.joined(separator: "\n")
    }

    /// `<cache>/msl-headers-v1/`, holding the empty stand-in headers (written once).
    static func standInDirectory(_ cache: String) throws -> String {
        let dir = "\(cache)/msl-headers-v1"
        let done = "\(dir)/.complete"
        if access(done, R_OK) == 0 { return dir }
        try SMFile.makeDirectories(dir + "/simd")
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        for name in standInHeaders where access("\(dir)/\(name)", R_OK) != 0 {
            try SMFile.writeAtomically("\(dir)/\(name)", "// SoftMetal: the runtime header provides <\(name)>.\n", unique: unique)
        }
        try SMFile.writeAtomically(done, "", unique: unique)
        return dir
    }
}
#endif
