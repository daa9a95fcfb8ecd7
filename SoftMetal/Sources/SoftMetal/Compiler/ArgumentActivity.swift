#if os(Linux)
import Glibc

/// Which buffer and threadgroup arguments a compiled kernel uses after specialization:
/// Metal's reflection (`MTLArgument.isActive`) comes from the compiled function, after its
/// function constants and template arguments removed the code they disable, and only an
/// active argument must be bound (MLX launches its gemv without the bias buffer when it
/// adds none, though the kernel names `bias` in code that `if constexpr` drops).
///
/// Found statically, not by running: Metal's validation refuses an unbound active argument
/// whichever path a dispatch takes, so a check that faults only when the access runs would
/// pass launches that fail on a Mac. The kernel library's text is compiled once more, at
/// -O2 to LLVM IR, with each argument that a body thunk reads wrapped in a call to a pure
/// function named after the kernel and the index (`__sm_active_<kernel>_b3(...)`): the
/// optimizer deletes the call exactly when nothing uses its result, after inlining the
/// kernel, folding its constants and dropping dead arguments of the helpers it calls. The
/// calls left in the IR are the active arguments. Run only when a dispatch leaves an
/// argument unbound that the kernel's text names; cached on disk (`<key>.active`).
enum ArgumentActivity {
    /// Kernel symbol -> its active arguments, `b<i>` for `[[buffer(i)]]` and `t<i>` for
    /// `[[threadgroup(i)]]`; nil if the analysis could not run (the caller then treats
    /// every named argument as active).
    static func activeArguments(translated: String, timeout: Double?) -> [String: Set<String>]? {
        let flags = KernelCompiler.flags.filter { $0 != "-shared" } + ["-S", "-emit-llvm", "-w"]
        // The markers go around the file the build compiles, so that the MSL version and the
        // function constants' #defines still come before the runtime header.
        let lines = KernelCompiler.cachedCheck(translated: translated, flags: flags, tag: "argument-activity-3", ext: "active",
                                               sourceText: mark) { compiler, dir, source, base in
            guard let text = KernelCompiler.llvmIR(compiler: compiler, flags: flags, dir: dir, source: source, base: base,
                                                   ext: "active", timeout: timeout) else { return nil }
            let found = calls(inIR: text)
            var lines = ""
            for (symbol, arguments) in found.sorted(by: { $0.key < $1.key }) {
                lines += symbol + "\t" + arguments.sorted().joined(separator: " ") + "\n"
            }
            // Kernels without an active argument still get a line, so that they read as analysed.
            for symbol in thunkSymbols(translated) where found[symbol] == nil { lines += symbol + "\t\n" }
            return lines
        }
        return lines.map(parse)
    }

    private static let marker = "__sm_active_"

    /// The translated text with every `__d->buffers[i]` / `__d->tg_mem[i]` of a body thunk
    /// (`static void __sm_body_<symbol>(...)`, up to its launcher) wrapped in a marker call,
    /// the markers declared first (on one line, so that the text keeps its line numbers).
    static func mark(_ translated: String) -> String {
        let text = Array(translated.utf8)
        let head = Array("static void __sm_body_".utf8), launcher = Array("extern \"C\"".utf8)
        let fields: [(bytes: [UInt8], tag: String)] = [(Array("__d->buffers[".utf8), "b"), (Array("__d->tg_mem[".utf8), "t")]
        var out: [UInt8] = []
        out.reserveCapacity(text.count + text.count / 8)
        var declarations = ""
        var symbol: String? = nil  // inside the thunk of this kernel
        var i = 0
        while i < text.count {
            if symbol == nil, matches(text, i, head) {
                out += head
                i += head.count
                var name: [UInt8] = []
                while i < text.count, isIdentifier(text[i]) { name.append(text[i]); i += 1 }
                out += name
                symbol = String(decoding: name, as: UTF8.self)
                continue
            }
            if let current = symbol {
                if matches(text, i, launcher) { symbol = nil; continue }
                if let field = fields.first(where: { matches(text, i, $0.bytes) }) {
                    var j = i + field.bytes.count
                    var digits: [UInt8] = []
                    while j < text.count, text[j] >= 48, text[j] <= 57 { digits.append(text[j]); j += 1 }
                    if !digits.isEmpty, j < text.count, text[j] == UInt8(ascii: "]") {
                        let name = "\(marker)\(current)_\(field.tag)\(String(decoding: digits, as: UTF8.self))"
                        declarations += "extern \"C\" void* \(name)(void*) __attribute__((pure, nothrow)); "
                        out += Array("\(name)(".utf8) + text[i...j] + [UInt8(ascii: ")")]
                        i = j + 1
                        continue
                    }
                }
            }
            out.append(text[i])
            i += 1
        }
        // The MSL code gets internal linkage, as a kernel's whole program has in Apple's
        // compiler: a helper template (linkonce_odr otherwise) that ignores a parameter then
        // loses it to dead-argument elimination when it is not inlined (ggml's Q4_0 mat-vec
        // takes `shmem` and never uses it). The launchers after it stay external.
        var code = String(decoding: out, as: UTF8.self)
        let starts = ["using __sm_fn_", "static constexpr int32_t __sm_max_", "static void __sm_body_"]
            .compactMap { code.utf8.firstIndex(ofBytes: Array($0.utf8)) }
        if let first = starts.min() {
            var at = code.utf8[..<first].lastIndex(of: UInt8(ascii: "\n")).map { code.utf8.index(after: $0) } ?? code.startIndex
            // A `#line` directive just before it belongs to the launcher.
            if at > code.startIndex {
                let previousEnd = code.utf8.index(before: at)
                let previousStart = code.utf8[..<previousEnd].lastIndex(of: UInt8(ascii: "\n")).map { code.utf8.index(after: $0) } ?? code.startIndex
                if code[previousStart..<previousEnd].hasPrefix("#line ") { at = previousStart }
            }
            code = "#pragma clang attribute push (__attribute__((internal_linkage)), apply_to = function)\n"
                + code[..<at] + "#pragma clang attribute pop\n" + code[at...]
        }
        return declarations + "\n" + code
    }

    static func matches(_ text: [UInt8], _ at: Int, _ pattern: [UInt8]) -> Bool {
        guard at + pattern.count <= text.count, text[at] == pattern[0] else { return false }
        for k in 1..<pattern.count where text[at + k] != pattern[k] { return false }
        return true
    }

    private static func isIdentifier(_ c: UInt8) -> Bool {
        (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 95
    }

    /// The body thunks' symbols in a translated text.
    static func thunkSymbols(_ translated: String) -> [String] {
        let text = Array(translated.utf8), head = Array("static void __sm_body_".utf8)
        var symbols: [String] = []
        var i = 0
        while i < text.count {
            if matches(text, i, head) {
                i += head.count
                var name: [UInt8] = []
                while i < text.count, isIdentifier(text[i]) { name.append(text[i]); i += 1 }
                symbols.append(String(decoding: name, as: UTF8.self))
            } else {
                i += 1
            }
        }
        return symbols
    }

    /// Marker calls left in optimized IR, by kernel symbol.
    static func calls(inIR ir: String) -> [String: Set<String>] {
        var found: [String: Set<String>] = [:]
        let at = Array(("@" + marker).utf8)
        for line in ir.split(separator: "\n") where !line.hasPrefix("declare") {
            let bytes = Array(line.utf8)
            var i = 0
            while i < bytes.count {
                guard matches(bytes, i, at) else { i += 1; continue }
                i += at.count
                var name: [UInt8] = []
                while i < bytes.count, isIdentifier(bytes[i]) { name.append(bytes[i]); i += 1 }
                // <symbol>_b<digits> / <symbol>_t<digits>: the symbol may contain underscores.
                guard let us = name.lastIndex(of: UInt8(ascii: "_")), us + 2 < name.count + 1 else { continue }
                let tail = name[(us + 1)...]
                guard tail.count > 1, tail.first == UInt8(ascii: "b") || tail.first == UInt8(ascii: "t"),
                      tail.dropFirst().allSatisfy({ $0 >= 48 && $0 <= 57 }) else { continue }
                found[String(decoding: name[..<us], as: UTF8.self), default: []].insert(String(decoding: tail, as: UTF8.self))
            }
        }
        return found
    }

    private static func parse(_ text: String) -> [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "\t", maxSplits: 1, omittingEmptySubsequences: false)
            guard let symbol = parts.first, !symbol.isEmpty else { continue }
            result[String(symbol)] = Set((parts.count > 1 ? parts[1] : "").split(separator: " ").map(String.init))
        }
        return result
    }
}
#endif

#if os(Linux)
extension String.UTF8View {
    /// The index where `pattern` first occurs.
    func firstIndex(ofBytes pattern: [UInt8]) -> Index? {
        let bytes = Array(self)
        guard !pattern.isEmpty, bytes.count >= pattern.count else { return nil }
        for i in 0...(bytes.count - pattern.count) where ArgumentActivity.matches(bytes, i, pattern) {
            return index(startIndex, offsetBy: i)
        }
        return nil
    }
}
#endif
