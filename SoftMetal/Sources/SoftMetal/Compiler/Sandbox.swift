#if os(Linux)
import Glibc

/// What keeps MSL source from acting as host code. A kernel library is compiled C++ that
/// runs in this process, so without these checks a "kernel" could call `system`, read host
/// files into a buffer or run code when it is loaded. Apple's compiler offers none of that,
/// so SoftMetal refuses it:
///
/// - before preprocessing (`checkDirectives`): `#embed`, `#include_next`, `#import`,
///   `__has_embed`, `__has_include_next`, pragmas the preprocessor acts on, and `#include` /
///   `__has_include` of an absolute path or of a file found outside the include folders
///   (through `..` or a symbolic link), in the source and in every file its literal includes
///   reach;
/// - after preprocessing (`checkPreprocessed`): every file the preprocessor entered lies in
///   an include folder (or is a stand-in header), whatever macro named it, and passes the
///   checks the source did;
/// - before compiling (`checkTranslated`): the text handed to clang++ has no directive but
///   `#line` and harmless `#pragma`s (a macro can expand to `# include <stdio.h>`, which
///   `clang -E` prints as a line of its own), no inline assembly and no attribute that runs
///   code at load time or places code in a section;
/// - before dlopen (`checkLibrary`): the shared object's dynamic symbol table imports only
///   what the runtime's own code and clang's lowering of MSL need, and it has no more
///   initialisers, finalisers or libraries than a library of no kernels at all, and no
///   IFUNC resolvers (which the loader runs).
enum MSLSandbox {
    // MARK: include directives

    /// The folders whose files a source may include, as real paths.
    struct Roots {
        var folders: [String]

        init(includeDirectories: [String], stubs: String?) {
            folders = (includeDirectories + (stubs.map { [$0] } ?? [])).filter { !$0.isEmpty }
                .map { MSLSandbox.realPath($0) ?? MSLSandbox.normalize($0) }
        }

        func contains(_ path: String) -> Bool {
            let real = MSLSandbox.realPath(path) ?? MSLSandbox.normalize(path)
            return folders.contains { real == $0 || real.hasPrefix($0.hasSuffix("/") ? $0 : $0 + "/") }
        }
    }

    static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    /// `a/./b/../c` -> `a/c`, lexically (no file system).
    static func normalize(_ path: String) -> String {
        var parts: [Substring] = []
        for part in path.split(separator: "/") where part != "." {
            if part == "..", let last = parts.last, last != ".." { parts.removeLast() } else { parts.append(part) }
        }
        return (path.hasPrefix("/") ? "/" : "") + parts.joined(separator: "/")
    }

    /// One preprocessor directive (`#` first on a logical line), or a `__has_*` operator.
    struct Directive {
        var line: Int
        var text: String   // the logical line, for messages (the source's own text)
        var name: String   // include, embed, __has_include, ...
        var operand: String?  // the header name, with its delimiters: "x.h" or <x.h>
    }

    /// The directives and `__has_*` operators of a file, with their lines; comments,
    /// string literals and line continuations are understood well enough not to be fooled
    /// by them (a directive inside a comment is not one).
    static func directives(_ text: String) -> [Directive] {
        var found: [Directive] = []
        let bytes = Array(text.utf8)
        var i = 0, line = 1
        var atLineStart = true
        var inBlockComment = false
        func skipContinuation() -> Bool {
            if i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "\n") {
                i += 2; line += 1; return true
            }
            return false
        }
        while i < bytes.count {
            if skipContinuation() { continue }
            let c = bytes[i]
            if inBlockComment {
                if c == UInt8(ascii: "*"), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "/") { inBlockComment = false; i += 2; continue }
                if c == UInt8(ascii: "\n") { line += 1 }
                i += 1; continue
            }
            if c == UInt8(ascii: "\n") { line += 1; atLineStart = true; i += 1; continue }
            if c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") || c == 0x0D || c == 0x0C || c == 0x0B { i += 1; continue }
            if c == UInt8(ascii: "/"), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "*") { inBlockComment = true; i += 2; continue }
            if c == UInt8(ascii: "/"), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "/") {
                while i < bytes.count, bytes[i] != UInt8(ascii: "\n") { if !skipContinuation() { i += 1 } }
                continue
            }
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                i += 1
                while i < bytes.count, bytes[i] != c, bytes[i] != UInt8(ascii: "\n") { i += bytes[i] == UInt8(ascii: "\\") ? 2 : 1 }
                i += 1; atLineStart = false; continue
            }
            // `%:` is the digraph of `#`, a directive as well.
            let digraph = c == UInt8(ascii: "%") && i + 1 < bytes.count && bytes[i + 1] == UInt8(ascii: ":")
            if (c == UInt8(ascii: "#") || digraph) && atLineStart {
                if digraph { i += 1 }
                // The logical line with comments as spaces (`# /* c */ embed` is `#embed`).
                let startLine = line
                var logical: [UInt8] = []
                var quote: UInt8?
                while i < bytes.count, bytes[i] != UInt8(ascii: "\n") {
                    if skipContinuation() { continue }
                    let b = bytes[i]
                    let next: UInt8 = i + 1 < bytes.count ? bytes[i + 1] : 0
                    if let q = quote {
                        logical.append(b)
                        if b == UInt8(ascii: "\\") && next != UInt8(ascii: "\n") && next != 0 { logical.append(next); i += 2; continue }
                        if b == q { quote = nil }
                        i += 1; continue
                    }
                    if b == UInt8(ascii: "\"") || b == UInt8(ascii: "'") { quote = b; logical.append(b); i += 1; continue }
                    if b == UInt8(ascii: "/") && next == UInt8(ascii: "*") {
                        i += 2
                        while i < bytes.count, !(bytes[i] == UInt8(ascii: "*") && i + 1 < bytes.count && bytes[i + 1] == UInt8(ascii: "/")) {
                            if bytes[i] == UInt8(ascii: "\n") { line += 1 }
                            i += 1
                        }
                        i += 2
                        logical.append(UInt8(ascii: " "))
                        continue
                    }
                    if b == UInt8(ascii: "/") && next == UInt8(ascii: "/") {
                        while i < bytes.count, bytes[i] != UInt8(ascii: "\n") { if !skipContinuation() { i += 1 } }
                        break
                    }
                    logical.append(b); i += 1
                }
                let text = String(decoding: logical, as: UTF8.self)
                let body = text.dropFirst().drop { $0 == " " || $0 == "\t" }  // `#`, or the `:` of `%:`
                let name = String(body.prefix { $0.isLetter || $0.isNumber || $0 == "_" })
                let rest = body.dropFirst(name.count).drop { $0 == " " || $0 == "\t" }
                found.append(Directive(line: startLine, text: text.trimmingSpaces, name: name,
                                       operand: name == "pragma" ? String(rest) : headerName(rest)))
                for p in pragmaOperators(in: text) {
                    found.append(Directive(line: startLine, text: "_Pragma(\"\(p)\")", name: "pragma", operand: p))
                }
                for op in hasOperators(in: text) { found.append(Directive(line: startLine, text: text.trimmingSpaces, name: op.name, operand: op.operand)) }
                continue
            }
            atLineStart = false
            if isIdentifierStart(c) {
                let start = i
                while i < bytes.count, isIdentifierByte(bytes[i]) { i += 1 }
                let word = String(decoding: bytes[start..<i], as: UTF8.self)
                if word.hasPrefix("__has_") {
                    found.append(Directive(line: line, text: word, name: word, operand: nil))
                }
                if word == "_Pragma" {
                    var end = i
                    while end < bytes.count, bytes[end] != UInt8(ascii: "\n") { end += 1 }
                    for p in pragmaOperators(in: "_Pragma" + String(decoding: bytes[i..<end], as: UTF8.self)) {
                        found.append(Directive(line: line, text: "_Pragma(\"\(p)\")", name: "pragma", operand: p))
                    }
                }
                continue
            }
            i += 1
        }
        return found
    }

    /// `"x.h"` or `<x.h>` at the start of `s`, delimiters kept; nil for anything else (a macro).
    static func headerName(_ s: Substring) -> String? {
        guard let first = s.first, first == "\"" || first == "<" else { return nil }
        let close: Character = first == "\"" ? "\"" : ">"
        guard let end = s.dropFirst().firstIndex(of: close) else { return nil }
        return String(s[s.startIndex...end])
    }

    /// The destringized operands of `_Pragma("...")` in a line (a macro's body included:
    /// the pragma acts where the macro is used).
    static func pragmaOperators(in text: String) -> [String] {
        var out: [String] = []
        var rest = Substring(text)
        while let r = rest.firstRange(of: "_Pragma") {
            var after = rest[r.upperBound...].drop { $0 == " " || $0 == "\t" }
            guard after.first == "(" else { rest = rest[r.upperBound...]; continue }
            after = after.dropFirst().drop { $0 == " " || $0 == "\t" }
            if after.first == "L" || after.first == "u" || after.first == "U" { after = after.drop { $0 != "\"" } }
            guard after.first == "\"" else { rest = rest[r.upperBound...]; continue }
            var value = "", escaped = false
            for ch in after.dropFirst() {
                if escaped { value.append(ch); escaped = false; continue }
                if ch == "\\" { escaped = true; continue }
                if ch == "\"" { break }
                value.append(ch)
            }
            out.append(value)
            rest = rest[r.upperBound...]
        }
        return out
    }

    /// `__has_include(...)`, `__has_embed(...)`... inside a directive line.
    static func hasOperators(in text: String) -> [(name: String, operand: String?)] {
        var out: [(String, String?)] = []
        var rest = Substring(text)
        while let r = rest.firstRange(of: "__has_") {
            let name = "__has_" + rest[r.upperBound...].prefix { $0.isLetter || $0.isNumber || $0 == "_" }
            var after = rest[r.upperBound...].dropFirst(name.count - 6).drop { $0 == " " || $0 == "\t" }
            if after.first == "(" { after = after.dropFirst().drop { $0 == " " || $0 == "\t" } }
            out.append((name, headerName(after)))
            rest = rest[r.upperBound...]
        }
        return out
    }

    static func isIdentifierStart(_ c: UInt8) -> Bool {
        (c >= 0x61 && c <= 0x7A) || (c >= 0x41 && c <= 0x5A) || c == 0x5F || c >= 0x80
    }
    static func isIdentifierByte(_ c: UInt8) -> Bool { isIdentifierStart(c) || (c >= 0x30 && c <= 0x39) }

    static let refusedDirectives: [String: String] = [
        "embed": "`#embed` reads a file into the program; MSL has no `#embed`",
        "include_next": "`#include_next` searches the system's header folders; SoftMetal resolves includes only inside the include folders",
        "import": "`#import` is not MSL",
        "__has_embed": "`__has_embed` looks for files outside the include folders; MSL has no `#embed`",
        "__has_include_next": "`__has_include_next` searches the system's header folders",
    ]

    /// Refuses the directives that reach outside the include folders, in `source` and in
    /// every file its literal includes can reach (each candidate the preprocessor may pick).
    /// `mainDirectory`: where the main file's own `#include "x"` looks first.
    static func checkDirectives(source: String, mainDirectory: String, includeDirectories: [String], stubs: String) throws {
        try checkDirectives(files: [(source, MSLTranslator.sourceName, mainDirectory)], mainDirectory: mainDirectory,
                            includeDirectories: includeDirectories, stubs: stubs)
    }

    static func checkDirectives(files: [(text: String, file: String, directory: String)], mainDirectory: String,
                                includeDirectories: [String], stubs: String) throws {
        // The main file's own folder holds only the source (a folder per run).
        let roots = Roots(includeDirectories: includeDirectories + [mainDirectory], stubs: stubs)
        var pending = files
        var seen = Set<String>()
        while let (text, file, directory) = pending.popLast() {
            for d in directives(text) {
                let place = file == MSLTranslator.sourceName ? "MSL line \(d.line)" : "\(file) line \(d.line)"
                if let why = refusedDirectives[d.name] {
                    throw SoftMetalError.compile("\(place): `\(d.text)`: \(why)")
                }
                // The preprocessor acts on some pragmas itself (`GCC dependency` reads a file's
                // time stamp): refused here already, as in the text clang++ compiles.
                if d.name == "pragma", let words = d.operand?.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "(" }),
                   let bad = refusedPragma(words) {
                    throw SoftMetalError.compile("\(place): `#pragma \(bad)` is refused: it changes what is linked, loaded or placed, reads a file or runs a compiler command; MSL has no such pragma")
                }
                guard d.name == "include" || d.name == "__has_include" else { continue }
                guard let operand = d.operand else {
                    if d.name == "__has_include" {
                        throw SoftMetalError.compile("\(place): `\(d.text)`: `__has_include` of a name made by a macro; SoftMetal takes only a literal \"x.h\" or <x.h> there, so that it can tell the file lies in the include folders")
                    }
                    continue  // a computed #include: checkPreprocessed sees where it went
                }
                let path = String(operand.dropFirst().dropLast())
                if path.hasPrefix("/") {
                    throw SoftMetalError.compile("\(place): `\(d.text)`: an absolute path; SoftMetal resolves #include only inside the include folders (as Apple's compiler has no host files to include)")
                }
                // Where the preprocessor will find it: the first that exists of the including
                // file's folder (quoted form), the include folders, the stand-in headers.
                var candidates = operand.hasPrefix("\"") ? [directory + "/" + path] : []
                candidates += (includeDirectories + [stubs]).map { $0 + "/" + path }
                guard let found = candidates.first(where: { access($0, F_OK) == 0 }) else { continue }
                let real = realPath(found) ?? normalize(found)
                if !roots.contains(real) {
                    let why = path.split(separator: "/").contains("..") ? "`..` leaves the include folders" : "it names a file outside the include folders (a symbolic link or the like)"
                    throw SoftMetalError.compile("\(place): `\(d.text)`: \(why); SoftMetal resolves #include only inside them")
                }
                if d.name == "include", seen.insert(real).inserted, let included = try? SMFile.read(real) {
                    let dir = String(found[..<(found.lastIndex(of: "/") ?? found.endIndex)])
                    pending.append((included, found, dir))
                }
            }
        }
    }

    /// After `clang -E` (markers still in its `# N "file" flags` form): every file entered
    /// (flag 1) is the source or lies in the include folders, whatever macro named it.
    /// Every included file is then scanned as the source was (a file reached through a
    /// macro-made `#include` was not, and its `#embed` leaves no trace in the output).
    static func checkPreprocessed(_ text: String, mainFile: String, includeDirectories: [String], stubs: String) throws {
        let roots = Roots(includeDirectories: includeDirectories, stubs: stubs)
        let stubRoot = realPath(stubs) ?? stubs
        var entered: [String] = []
        var file = MSLTranslator.sourceName, line = 0
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            guard raw.hasPrefix("# "), let marker = MSLTranslator.lineMarker(Array(raw.utf8)[...]) else {
                line += 1
                continue
            }
            let flags = raw.split(separator: " ").dropFirst(3)
            let named = marker.file == mainFile ? MSLTranslator.sourceName : marker.file
            if flags.contains("1") && !named.hasPrefix("<") && named != MSLTranslator.sourceName && !roots.contains(named) {
                // The directive's own line prints nothing: it is the one after the last printed.
                let place = file == MSLTranslator.sourceName ? "MSL line \(line + 1)" : "\(file) line \(line + 1)"
                throw SoftMetalError.compile("\(place): #include of \(named), which is outside the include folders; SoftMetal resolves #include only inside them")
            }
            if flags.contains("1") && !named.hasPrefix("<") && named != MSLTranslator.sourceName
                && !(realPath(named) ?? named).hasPrefix(stubRoot + "/") && !entered.contains(named) {
                entered.append(named)
            }
            file = named
            line = marker.line - 1
        }
        let mainDirectory = String(mainFile[..<(mainFile.lastIndex(of: "/") ?? mainFile.endIndex)])
        let files = entered.compactMap { path -> (text: String, file: String, directory: String)? in
            guard let text = try? SMFile.read(path) else { return nil }
            return (text, path, String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)]))
        }
        try checkDirectives(files: files, mainDirectory: mainDirectory, includeDirectories: includeDirectories, stubs: stubs)
    }

    /// The preprocessor's messages, with the text of any diagnostic located in a file
    /// outside the include folders withheld (only its path is named).
    static func sanitize(_ messages: String, includeDirectories: [String], stubs: String) -> String {
        let roots = Roots(includeDirectories: includeDirectories, stubs: stubs)
        return messages.split(separator: "\n", omittingEmptySubsequences: false).map { line -> String in
            let parts = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3, Int(parts[1]) != nil else { return String(line) }
            let file = String(parts[0])
            if file == MSLTranslator.sourceName || file.hasPrefix("<") || roots.contains(file) { return String(line) }
            return "\(file):\(parts[1]): (a message about a file outside the include folders, not shown)"
        }.joined(separator: "\n")
    }

    // MARK: the translated text

    /// Where each line of translated text comes from, by its `#line` markers.
    struct Locator {
        private var places: [(file: String, line: Int)?] = []

        init(_ text: String) {
            var current: (file: String, line: Int)?
            for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
                if let marker = MSLTranslator.lineMarker(Array(raw.utf8)[...]) {
                    places.append(nil)
                    current = (marker.file, marker.line)
                    continue
                }
                places.append(current)
                if let c = current { current = (c.file, c.line + 1) }
            }
        }

        /// "MSL line N", "file line N" or "SoftMetal's generated code" for a 0-based line index.
        func describe(_ index: Int) -> String {
            guard index < places.count, let p = places[index] else { return "SoftMetal's generated code" }
            if p.file == MSLTranslator.sourceName { return "MSL line \(p.line)" }
            if p.file == "softmetal-generated.cpp" { return "SoftMetal's generated code" }
            return "\(p.file) line \(p.line)"
        }

        func isGenerated(_ index: Int) -> Bool {
            guard index < places.count, let p = places[index] else { return true }
            return p.file == "softmetal-generated.cpp"
        }
    }

    /// Pragmas that change what is linked or loaded, place code, run clang's debugging
    /// commands or read files; the others only tune code generation or diagnostics.
    static let refusedPragmas: [String] = [
        "comment", "weak", "redefine_extname", "init_seg", "section", "code_seg", "data_seg", "bss_seg",
        "const_seg", "detect_mismatch", "GCC dependency", "clang __debug", "clang section", "clang attribute",
        "clang module", "GCC visibility", "clang include_instead",
    ]

    /// The refused pragma that `words` (after `pragma`) begin with, if any.
    static func refusedPragma<S: Sequence>(_ words: S) -> String? where S.Element: StringProtocol {
        let pragma = Array(words).prefix(2).map { String($0) }.joined(separator: " ")
        return refusedPragmas.first { pragma == $0 || pragma.hasPrefix($0 + " ") }
    }

    /// Attributes (GNU or `[[gnu::...]]`) that run code when the library loads or unloads,
    /// make the loader run a resolver (IFUNC, function multiversioning), place code in a
    /// named section (`.init` runs at load), or bind a name to another symbol.
    static let refusedAttributes: Set<String> = [
        "constructor", "destructor", "section", "ifunc", "alias", "weakref", "init_priority", "naked",
        "symver", "target_clones", "target_version", "cpu_dispatch", "cpu_specific", "code_seg",
    ]

    /// The checks on the text clang++ compiles (the runtime header is not part of it).
    static func checkTranslated(_ text: String) throws {
        let locator = Locator(text)
        var index = 0
        var sawMarker = false
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            defer { index += 1 }
            var line = raw.drop { $0 == " " || $0 == "\t" }
            if line.hasPrefix("%:") { line = Substring("#" + line.dropFirst(2)) }  // the digraph of `#`
            guard line.hasPrefix("#") else { continue }
            if MSLTranslator.lineMarker(Array(line.utf8)[...]) != nil { sawMarker = true; continue }
            let body = line.dropFirst().drop { $0 == " " || $0 == "\t" }
            let words = body.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "(" })
            if !sawMarker && body.hasPrefix("define __SM_FC") { continue }  // the function-constant prefix
            if body.isEmpty { continue }  // the null directive (the translator leaves `#` of a pragma it drops)
            if words.first == "pragma" {
                if let bad = refusedPragma(words.dropFirst()) {
                    throw SoftMetalError.compile("\(locator.describe(index)): `#pragma \(bad)` is refused: it changes what is linked, loaded or placed, or runs a compiler command; MSL has no such pragma")
                }
                continue
            }
            throw SoftMetalError.compile("\(locator.describe(index)): a macro expands to the directive `\(String(line.prefix(80)).trimmingSpaces)`; a directive cannot come from a macro in MSL, and SoftMetal resolves includes only in the preprocessor")
        }
        try scanTokens(text, locator: locator)
    }

    /// Inline assembly and refused attributes, token by token (string and character
    /// literals skipped, raw strings included).
    static func scanTokens(_ text: String, locator: Locator) throws {
        let bytes = Array(text.utf8)
        var i = 0, line = 0
        var attributeDepth = 0  // > 0 inside __attribute__((...)) or [[...]]
        var parens = 0
        var inBrackets = false
        while i < bytes.count {
            let c = bytes[i]
            if c == UInt8(ascii: "\n") { line += 1; i += 1; continue }
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                i += 1
                while i < bytes.count, bytes[i] != c, bytes[i] != UInt8(ascii: "\n") { i += bytes[i] == UInt8(ascii: "\\") ? 2 : 1 }
                i += 1; continue
            }
            if isIdentifierStart(c) {
                let start = i
                while i < bytes.count, isIdentifierByte(bytes[i]) { i += 1 }
                let word = String(decoding: bytes[start..<i], as: UTF8.self)
                // R"delim( ... )delim", also u8R, LR, uR, UR.
                if word.hasSuffix("R"), ["R", "u8R", "LR", "uR", "UR"].contains(word), i < bytes.count, bytes[i] == UInt8(ascii: "\"") {
                    var j = i + 1
                    while j < bytes.count, bytes[j] != UInt8(ascii: "(") { j += 1 }
                    let delimiter = [UInt8(ascii: ")")] + Array(bytes[(i + 1)..<min(j, bytes.count)]) + [UInt8(ascii: "\"")]
                    var k = j + 1
                    while k + delimiter.count <= bytes.count, Array(bytes[k..<(k + delimiter.count)]) != delimiter {
                        if bytes[k] == UInt8(ascii: "\n") { line += 1 }
                        k += 1
                    }
                    i = k + delimiter.count
                    continue
                }
                if word == "asm" || word == "__asm" || word == "__asm__" {
                    throw SoftMetalError.compile("\(locator.describe(line)): inline assembly (`\(word)`) is refused: MSL has none, and it would run as host code")
                }
                if word == "__attribute__" || word == "__attribute" || word == "__declspec" {
                    attributeDepth = max(attributeDepth, 1)
                    parens = 0
                    continue
                }
                if attributeDepth > 0 {
                    var name = Substring(word)
                    while name.hasPrefix("_") { name = name.dropFirst() }
                    while name.hasSuffix("_") { name = name.dropLast() }
                    if refusedAttributes.contains(String(name)) {
                        throw SoftMetalError.compile("\(locator.describe(line)): the attribute `\(word)` is refused: it runs code when the library is loaded, places code or binds symbols, which MSL cannot")
                    }
                }
                continue
            }
            if c == UInt8(ascii: "["), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "[") {
                inBrackets = true; attributeDepth = 1; i += 2; continue
            }
            if inBrackets, c == UInt8(ascii: "]"), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "]") {
                inBrackets = false; attributeDepth = 0; i += 2; continue
            }
            if attributeDepth > 0 && !inBrackets {
                if c == UInt8(ascii: "(") { parens += 1 }
                if c == UInt8(ascii: ")") {
                    parens -= 1
                    if parens <= 0 { attributeDepth = 0 }
                }
            }
            i += 1
        }
    }

    // MARK: the shared object

    /// What dlopen would act on, read from the ELF file (section headers and the dynamic
    /// section; the linker wrote both, nothing in the source controls their layout).
    struct ELFFacts: Equatable {
        var undefined: [String] = []      // undefined dynamic symbols (imports)
        var needed: [String] = []         // DT_NEEDED
        var runPaths: [String] = []       // DT_RPATH / DT_RUNPATH
        var initArray = 0, finiArray = 0, preinitArray = 0   // entries
        var initSize = 0, finiSize = 0    // .init / .fini code bytes
        var ctors = 0, dtors = 0          // .ctors / .dtors bytes
        var ifuncs: [String] = []         // STT_GNU_IFUNC symbols, and IRELATIVE relocations
    }

    struct ELFError: Error { var message: String }

    static func readELF(_ path: String) throws -> ELFFacts {
        guard let bytes = SMFile.readBytes(path) else { throw ELFError(message: "cannot read \(path)") }
        return try parseELF(bytes)
    }

    static func parseELF(_ b: [UInt8]) throws -> ELFFacts {
        func fail(_ why: String) -> ELFError { ELFError(message: "not a shared object SoftMetal can check (\(why))") }
        func u(_ off: Int, _ size: Int) throws -> Int {
            guard off >= 0, size <= 8, off + size <= b.count else { throw fail("truncated") }
            var v: UInt64 = 0
            for k in (0..<size).reversed() { v = v << 8 | UInt64(b[off + k]) }
            guard v <= UInt64(Int.max) else { throw fail("offset out of range") }
            return Int(v)
        }
        func cstring(_ off: Int, limit: Int) throws -> String {
            guard off >= 0, off < limit, limit <= b.count else { throw fail("bad string offset") }
            var end = off
            while end < limit, b[end] != 0 { end += 1 }
            return String(decoding: b[off..<end], as: UTF8.self)
        }
        guard b.count >= 64, b[0] == 0x7F, b[1] == 0x45, b[2] == 0x4C, b[3] == 0x46 else { throw fail("no ELF header") }
        guard b[4] == 2, b[5] == 1 else { throw fail("not 64-bit little-endian") }
        let machine = try u(18, 2)
        let irelative = machine == 62 ? 37 : machine == 183 ? 1032 : -1
        let shoff = try u(0x28, 8), shentsize = try u(0x3A, 2), shnum = try u(0x3C, 2), shstrndx = try u(0x3E, 2)
        guard shentsize >= 64, shnum > 0, shstrndx < shnum else { throw fail("no section headers") }
        struct Section { var name = 0, type = 0, offset = 0, size = 0, link = 0, entsize = 0 }
        var sections: [Section] = []
        for k in 0..<shnum {
            let h = shoff + k * shentsize
            sections.append(Section(name: try u(h, 4), type: try u(h + 4, 4), offset: try u(h + 24, 8),
                                    size: try u(h + 32, 8), link: try u(h + 40, 4), entsize: try u(h + 56, 8)))
        }
        for s in sections where s.type != 8 {  // NOBITS has no bytes in the file
            guard s.offset + s.size <= b.count else { throw fail("section past the end") }
        }
        let names = sections[shstrndx]
        var facts = ELFFacts()
        for s in sections {
            let name = try cstring(names.offset + s.name, limit: names.offset + names.size)
            switch name {
            case ".init": facts.initSize = s.size
            case ".fini": facts.finiSize = s.size
            case ".ctors": facts.ctors = s.size
            case ".dtors": facts.dtors = s.size
            default: break
            }
            switch s.type {
            case 2, 11:  // SYMTAB, DYNSYM
                guard s.link < sections.count else { throw fail("bad string table") }
                let strings = sections[s.link]
                let count = s.size / 24
                for k in 0..<count {
                    let e = s.offset + k * 24
                    let info = try u(e + 4, 1), shndx = try u(e + 6, 2)
                    let symbolName = try cstring(strings.offset + (try u(e, 4)), limit: strings.offset + strings.size)
                    if info & 0xF == 10 { facts.ifuncs.append(symbolName) }
                    if s.type == 11 && shndx == 0 && !symbolName.isEmpty { facts.undefined.append(symbolName) }
                }
            case 4:  // RELA
                for k in 0..<(s.size / 24) {
                    if try u(s.offset + k * 24 + 8, 4) == irelative { facts.ifuncs.append("an IRELATIVE relocation") }
                }
            case 6:  // DYNAMIC
                guard s.link < sections.count else { throw fail("bad string table") }
                let strings = sections[s.link]
                for k in 0..<(s.size / 16) {
                    let tag = try u(s.offset + k * 16, 8), value = try u(s.offset + k * 16 + 8, 8)
                    switch tag {
                    case 1: facts.needed.append(try cstring(strings.offset + value, limit: strings.offset + strings.size))
                    case 15, 29: facts.runPaths.append(try cstring(strings.offset + value, limit: strings.offset + strings.size))
                    case 27: facts.initArray = value / 8
                    case 28: facts.finiArray = value / 8
                    case 33: facts.preinitArray = value / 8
                    default: break
                    }
                }
            default: break
            }
        }
        return facts
    }

    /// Imports that the runtime header's own code, clang's lowering (memcpy/memset for
    /// copies, half/bfloat conversions, 128-bit division) and MSL's math library (libm, the
    /// float and double forms) may need. Everything else a kernel library imports is a call
    /// MSL does not have. (The imports of a library of no kernels are allowed as well: the C
    /// runtime's startup files and what the runtime header calls.)
    static let allowedImports: Set<String> = {
        var names: Set<String> = [
            "memcpy", "memmove", "memset", "memcmp", "bcmp",
            "__extendhfsf2", "__extendhfdf2", "__truncsfhf2", "__truncdfhf2", "__extendbfsf2", "__truncsfbf2", "__truncdfbf2",
            "__divti3", "__udivti3", "__modti3", "__umodti3", "__muloti4", "__popcountdi2", "__popcountsi2",
            // Guards of function-local statics; not __cxa_atexit, which would run code at unload.
            "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
            "__cxa_finalize", "__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable",
            "clock_gettime", "snprintf",
        ]
        let math = [
            "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "copysign", "cos", "cosh",
            "erf", "erfc", "exp", "exp2", "exp10", "expm1", "fabs", "fdim", "floor", "fma", "fmax", "fmin", "fmod",
            "frexp", "hypot", "ilogb", "ldexp", "lgamma", "llrint", "llround", "log", "log10", "log1p", "log2", "logb",
            "lrint", "lround", "modf", "nan", "nearbyint", "nextafter", "pow", "remainder", "remquo", "rint", "round",
            "roundeven", "scalbn", "scalbln", "sin", "sincos", "sinh", "sqrt", "tan", "tanh", "tgamma", "trunc",
        ]
        for f in math { names.insert(f); names.insert(f + "f") }
        return names
    }()

    /// A mangled C++ name's first identifier (`_Z6systemPKc` -> `system`), for messages.
    static func plainName(_ symbol: String) -> String {
        var s = Substring(symbol)
        if let at = s.firstIndex(of: "@") { s = s[..<at] }
        guard s.hasPrefix("_Z") else { return String(s) }
        s = s.dropFirst(2)
        if s.hasPrefix("N") { s = s.dropFirst() }
        while s.hasPrefix("L") || s.hasPrefix("K") { s = s.dropFirst() }
        let digits = s.prefix { $0.isNumber }
        guard let n = Int(digits), n > 0 else { return symbol }
        return String(s.dropFirst(digits.count).prefix(n))
    }

    /// Checks a compiled library against `baseline` (a library of no kernels, same flags).
    /// `translated`: the text it was compiled from, to name the MSL line of an import.
    static func checkLibrary(_ facts: ELFFacts, baseline: ELFFacts, translated: String) throws {
        let baseImports = Set(baseline.undefined)
        let refused = facts.undefined.filter { !allowedImports.contains($0) && !baseImports.contains($0) }
        if !refused.isEmpty {
            let named = refused.prefix(5).map { symbol -> String in
                let name = plainName(symbol)
                let place = firstUse(of: name, in: translated).map { " (\($0))" } ?? ""
                return "`\(name)`\(name == symbol ? "" : " [\(symbol)]")\(place)"
            }
            throw SoftMetalError.compile("the kernel library calls \(named.joined(separator: ", "))\(refused.count > 5 ? " and \(refused.count - 5) more" : ""), which MSL does not have: a kernel may call only the Metal standard library (SoftMetal refuses host functions such as system, fopen, dlsym or syscall, before loading the library)")
        }
        if !facts.ifuncs.isEmpty {
            throw SoftMetalError.compile("the kernel library has an IFUNC resolver (\(facts.ifuncs[0])), which the loader would run as host code; MSL has none")
        }
        if facts.initArray > baseline.initArray || facts.preinitArray > baseline.preinitArray || facts.ctors > baseline.ctors
            || facts.initSize != baseline.initSize {
            throw SoftMetalError.compile("the kernel library runs code when it is loaded: a constructor (`__attribute__((constructor))`), a program-scope variable whose initializer is not a constant expression, or code placed in an initialisation section. MSL program-scope variables are `constant` and constant-initialized; SoftMetal refuses the library before loading it")
        }
        if facts.finiArray > baseline.finiArray || facts.dtors > baseline.dtors || facts.finiSize != baseline.finiSize {
            throw SoftMetalError.compile("the kernel library runs code when it is unloaded (a destructor or a finalisation section), which MSL cannot; SoftMetal refuses the library before loading it")
        }
        if let extra = facts.needed.first(where: { !baseline.needed.contains($0) }) ?? facts.runPaths.first(where: { !baseline.runPaths.contains($0) }) {
            throw SoftMetalError.compile("the kernel library depends on \(extra), which a library of no kernels does not; SoftMetal refuses it before loading it")
        }
    }

    /// Where the translated text first names `name` outside SoftMetal's generated code.
    static func firstUse(of name: String, in text: String) -> String? {
        let locator = Locator(text)
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() where !locator.isGenerated(index) {
            var rest = line[...]
            while let r = rest.firstRange(of: name) {
                let before = r.lowerBound == line.startIndex ? nil : line[line.index(before: r.lowerBound)]
                let after = r.upperBound == line.endIndex ? nil : line[r.upperBound]
                let boundary: (Character?) -> Bool = { c in c.map { !($0.isLetter || $0.isNumber || $0 == "_") } ?? true }
                if boundary(before) && boundary(after) { return locator.describe(index) }
                rest = line[r.upperBound...]
            }
        }
        return nil
    }
}
#endif
