#if os(Linux)
/// MSL source -> C++17 source that includes softmetal_runtime.h.
///
/// The rewrite keeps every line where it was (replacements never add or remove newlines),
/// so a `#line 1` directive maps the compiler's line numbers back to the MSL source:
/// - comments are blanked; `#include <metal_*>` / `<simd/*>` lines are blanked;
/// - `kernel void f(...)` becomes `static void f(...)`; the parameters' attributes
///   (`[[buffer(0)]]`, `[[thread_position_in_grid]]`, ...) are recorded and blanked;
/// - address spaces: `device` and `thread` are dropped, `constant` becomes `const`,
///   `threadgroup` on a pointer or reference is dropped, and `threadgroup T x[N];` in a
///   kernel body becomes a reference to storage the whole threadgroup shares
///   (`metal::__sm::tg_var`);
/// - vector constructors `float4(a.xy, b, c)` become `metal::__sm::vmake<float4>(...)`
///   (C++ has no such constructors for clang vectors; a cast would bit-cast);
/// - half literals `1.0h` become `((half)(1.0))`;
/// then, per kernel, a body thunk that binds arguments and built-ins, an `extern "C"`
/// launcher `__sm_launch_<name>` and a reflection table `__sm_info_<name>`.
struct MSLTranslator {
    struct Parameter: Equatable {
        enum Kind: Equatable { case buffer(Int), threadgroup(Int), builtin(String) }
        var kind: Kind
        var type: String
        var name: String
        /// `[[buffer(2), function_constant(has_bias)]]`: the parameter exists only when the
        /// (bool) function constant is true; otherwise it is null and need not be bound.
        var condition: String? = nil
    }

    struct Kernel: Equatable {
        /// The name makeFunction(name:) finds: the function's name, or its [[host_name]].
        var name: String
        var parameters: [Parameter]
        var maxTotalThreadsPerThreadgroup: Int
        /// A constant expression instead of a literal (`[[max_total_threads_per_threadgroup(BM * BN * 32)]]`,
        /// template parameters replaced by the instance's arguments): C++ evaluates it.
        var maxThreadsExpression: String? = nil
        /// Where the kernel (or instantiation) is written, for errors in that expression.
        var declaredAt = SourceLocation(file: MSLTranslator.sourceName, line: 1)
        /// What the launcher calls: the C++ function, with template arguments for an
        /// instance of a kernel template (`qmv<half, 4>`).
        var callee: String = ""
        /// Where an instance was instantiated (`#line` for the launcher, so that errors while
        /// instantiating point at the MSL instantiation); nil for plain kernels.
        var instantiatedAt: SourceLocation? = nil
        /// Buffer and threadgroup parameters whose names the body never mentions: as in Metal,
        /// they need not be bound (kind 0 in the reflection table).
        var unusedParameters: Set<String> = []

        init(name: String, parameters: [Parameter], maxTotalThreadsPerThreadgroup: Int,
             callee: String? = nil, instantiatedAt: SourceLocation? = nil) {
            self.name = name
            self.parameters = parameters
            self.maxTotalThreadsPerThreadgroup = maxTotalThreadsPerThreadgroup
            self.callee = callee ?? name
            self.instantiatedAt = instantiatedAt
        }

        var isTemplateInstance: Bool { instantiatedAt != nil }

        /// The C symbol suffix of the launcher and reflection table (`__sm_launch_<symbol>`):
        /// the name itself when it is an identifier, else a hex encoding.
        var symbol: String { MSLTranslator.symbol(for: name) }
    }

    struct SourceLocation: Equatable {
        var file: String
        var line: Int
    }

    /// `template <...> [[kernel]] void f(...)`: not a function by itself; its explicit
    /// instantiations with [[host_name]] are.
    struct KernelTemplate {
        var name: String
        var templateParameters: [String]
        var parameters: [Parameter]
        var maxThreads: MaxThreads
        var unusedParameters: Set<String> = []
    }

    /// `[[max_total_threads_per_threadgroup(x)]]`: a literal, or an expression for C++.
    struct MaxThreads {
        var literal = 0
        var expression: String?
    }

    struct Output {
        var source: String
        var kernels: [Kernel]
        var functionConstants: [FunctionConstant] = []
        /// `source` without the launchers, and each kernel's launcher (parallel to `kernels`):
        /// a large library is compiled kernel by kernel (see SoftMetalLibrary).
        var body: String = ""
        var launchers: [String] = []
    }

    /// `constant T name [[function_constant(index)]];`: becomes
    /// `static constexpr T name = __SM_FC_<index>;` (plus `__sm_fc_defined_<name>`), with the
    /// macros defined per specialisation by the library (see `constantsPrefix`).
    struct FunctionConstant: Equatable {
        var name: String
        var type: String
        var index: Int
    }

    /// The types a function constant may have, by their MTLDataType raw values.
    static let functionConstantTypes: [String: UInt] = [
        "bool": 53, "int": 29, "int32_t": 29, "uint": 33, "uint32_t": 33, "unsigned int": 33, "float": 3, "half": 16,
        "short": 37, "int16_t": 37, "ushort": 41, "uint16_t": 41, "char": 45, "int8_t": 45, "uchar": 49, "uint8_t": 49,
        "long": 81, "int64_t": 81, "ulong": 85, "uint64_t": 85,
    ]

    /// C++ that the Metal Shading Language specification excludes (its "C++ restrictions"),
    /// which clang++ would accept here.
    static let forbiddenKeywords: [String: String] = [
        "new": "new and delete", "delete": "new and delete", "goto": "goto statements",
        "throw": "exceptions", "try": "exceptions", "catch": "exceptions", "noexcept": "noexcept specifications",
        "virtual": "virtual functions", "dynamic_cast": "dynamic_cast and type identification",
        "typeid": "dynamic_cast and type identification", "thread_local": "thread_local and register storage",
        "register": "thread_local and register storage",
    ]

    static let sourceName = "source.metal"

    static let builtins: Set<String> = [
        "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
        "threads_per_threadgroup", "dispatch_threads_per_threadgroup", "threadgroups_per_grid",
        "threads_per_grid", "grid_size", "grid_origin", "thread_index_in_threadgroup",
        "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
        "dispatch_simdgroups_per_threadgroup", "threads_per_simdgroup", "thread_execution_width",
        "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    ]

    static let vectorTypes: Set<String> = {
        var s = Set<String>()
        for base in ["float", "half", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong", "bool", "bfloat"] {
            for n in [2, 3, 4] { s.insert("\(base)\(n)") }
        }
        for base in ["float", "half", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong", "bool"] {
            for n in [8, 16] { s.insert("\(base)\(n)") }
        }
        return s
    }()

    // MARK: lexing helpers

    private var text: [UInt8]        // comments blanked
    private var edits: [(start: Int, end: Int, replacement: String)] = []
    private var kernels: [Kernel] = []
    private var functionConstants: [FunctionConstant] = []
    private var templateTypeNames: Set<String> = []
    private var templates: [String: KernelTemplate] = [:]
    private var tgSlot = 0

    init(source: String) {
        text = MSLTranslator.blankComments(Array(source.utf8))
    }

    static func isIdentStart(_ c: UInt8) -> Bool { (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c == 95 }
    static func isIdent(_ c: UInt8) -> Bool { isIdentStart(c) || (c >= 48 && c <= 57) }
    static func isSpace(_ c: UInt8) -> Bool { c == 32 || c == 9 || c == 10 || c == 13 || c == 12 || c == 11 }

    /// Comments -> spaces (newlines kept); string and character literals untouched.
    static func blankComments(_ s: [UInt8]) -> [UInt8] {
        var out = s
        var i = 0
        let n = s.count
        while i < n {
            let c = s[i]
            if c == 34 || c == 39 {  // " or '
                i += 1
                while i < n && s[i] != c {
                    if s[i] == 92 { i += 1 }
                    if i < n && s[i] == 10 { break }
                    i += 1
                }
                i += 1
            } else if c == 47 && i + 1 < n && s[i + 1] == 47 {  // //
                while i < n && s[i] != 10 { out[i] = 32; i += 1 }
            } else if c == 47 && i + 1 < n && s[i + 1] == 42 {  // /*
                out[i] = 32; out[i + 1] = 32
                i += 2
                while i < n && !(s[i] == 42 && i + 1 < n && s[i + 1] == 47) {
                    if s[i] != 10 { out[i] = 32 }
                    i += 1
                }
                if i < n { out[i] = 32; if i + 1 < n { out[i + 1] = 32 } }
                i += 2
            } else {
                i += 1
            }
        }
        return out
    }

    /// Text between a and b; empty for an empty or inverted range, so that no malformed
    /// source can make a slice trap.
    private func string(_ a: Int, _ b: Int) -> String {
        let a = Swift.max(0, a), b = Swift.min(text.count, b)
        return a < b ? String(decoding: text[a..<b], as: UTF8.self) : ""
    }

    private func skipSpace(_ i: Int) -> Int {
        var i = i
        while i < text.count && MSLTranslator.isSpace(text[i]) { i += 1 }
        return i
    }

    private func skipSpaceBack(_ i: Int) -> Int {  // index of the previous non-space char, or -1
        var i = i
        while i >= 0 && MSLTranslator.isSpace(text[i]) { i -= 1 }
        return i
    }

    private func identifier(at i: Int) -> (String, Int)? {
        guard i < text.count, MSLTranslator.isIdentStart(text[i]) else { return nil }
        var j = i
        while j < text.count && MSLTranslator.isIdent(text[j]) { j += 1 }
        return (string(i, j), j)
    }

    /// Index just past the bracket that closes the one at `open`.
    private func matching(_ open: Int) -> Int? {
        let o = text[open]
        let c: UInt8 = o == 40 ? 41 : (o == 91 ? 93 : 125)
        var depth = 0
        var i = open
        while i < text.count {
            let ch = text[i]
            if ch == 34 || ch == 39 {
                i += 1
                while i < text.count && text[i] != ch { if text[i] == 92 { i += 1 }; i += 1 }
            } else if ch == o { depth += 1 } else if ch == c {
                depth -= 1
                if depth == 0 { return i + 1 }
            }
            i += 1
        }
        return nil
    }

    /// The MSL file and line of a position, following the `# N "file"` / `#line N "file"`
    /// markers that the preprocessor leaves (without markers: source.metal, counted lines).
    static func location(in text: [UInt8], at index: Int) -> SourceLocation {
        var location = SourceLocation(file: sourceName, line: 1)
        var lineStart = 0
        for i in 0..<min(index, text.count) where text[i] == 10 {
            if let marker = lineMarker(text[lineStart..<i]) {
                location = marker
            } else {
                location.line += 1
            }
            lineStart = i + 1
        }
        return location
    }

    /// `# 12 "file" 1` or `#line 12 "file"`: the location of the next line.
    static func lineMarker(_ line: ArraySlice<UInt8>) -> SourceLocation? {
        let s = String(decoding: line, as: UTF8.self).trimmingSpaces
        guard s.hasPrefix("#") else { return nil }
        var rest = s.dropFirst().trimmingSpacesSub
        if rest.hasPrefix("line") { rest = rest.dropFirst(4).trimmingSpacesSub }
        let digits = rest.prefix { $0.isNumber }
        guard !digits.isEmpty, let n = Int(digits) else { return nil }
        rest = rest.dropFirst(digits.count).trimmingSpacesSub
        guard rest.hasPrefix("\""), let close = rest.dropFirst().firstIndex(of: "\"") else { return nil }
        return SourceLocation(file: String(rest[rest.index(after: rest.startIndex)..<close]), line: n)
    }

    private func fail(_ at: Int, _ message: String) -> SoftMetalError {
        let l = MSLTranslator.location(in: text, at: at)
        return .compile("\(l.file):\(l.line): error: \(message)")
    }

    static func symbol(for name: String) -> String {
        let bytes = Array(name.utf8)
        if let first = bytes.first, isIdentStart(first), bytes.allSatisfy(isIdent) { return name }
        return "x" + bytes.map { String($0, radix: 16) }.joined()
    }

    /// Same length, newlines kept.
    private static func blank(_ s: ArraySlice<UInt8>) -> String {
        String(decoding: s.map { $0 == 10 ? 10 : 32 }, as: UTF8.self)
    }

    // MARK: translation

    static func translate(_ source: String) throws -> Output {
        var t = MSLTranslator(source: source)
        try t.run()
        return t.output()
    }

    private mutating func run() throws {
        blankIncludes()
        memberAddressSpaces()
        addressSpaceOverloads()
        templateTypeNames = collectTemplateTypeNames()
        // One pass over identifiers and numbers outside string literals.
        var i = 0
        var lineStart = true
        var inDirective = false
        while i < text.count {
            let c = text[i]
            if c == 10 { lineStart = true; inDirective = false; i += 1; continue }
            if c == 35 && lineStart { inDirective = true }  // #
            if !MSLTranslator.isSpace(c) { lineStart = false }
            if c == 34 || c == 39 {
                var j = i + 1
                while j < text.count && text[j] != c && text[j] != 10 { if text[j] == 92 { j += 1 }; j += 1 }
                i = j + 1
                continue
            }
            if c == 91 && i + 1 < text.count && text[i + 1] == 91 {  // [[attribute]]: handled by kernel()
                var j = i + 2
                while j + 1 < text.count && !(text[j] == 93 && text[j + 1] == 93) { j += 1 }
                if !inDirective, let after = try kernelDeclaration(at: i) {
                    i = after  // `[[kernel]] void f(...)`, `[[max_total_threads_per_threadgroup(n)]] kernel void f(...)`
                    continue
                }
                i = j + 2
                continue
            }
            if (c >= 48 && c <= 57) || (c == 46 && i + 1 < text.count && text[i + 1] >= 48 && text[i + 1] <= 57) {
                if i > 0 && MSLTranslator.isIdent(text[i - 1]) { i += 1; continue }
                i = number(at: i)
                continue
            }
            guard MSLTranslator.isIdentStart(c), i == 0 || !MSLTranslator.isIdent(text[i - 1]) else { i += 1; continue }
            let (word, end) = identifier(at: i)!
            if inDirective && word == "pragma", let (next, after) = identifier(at: skipSpace(end)),
               next == "unroll" || next == "nounroll" {
                // A hint (`#pragma unroll(MIN(DK8/2, 4*NSG))` names macros the separate
                // preprocessing step has already dropped): blanked.
                var e = after
                while e < text.count && text[e] != 10 { e += 1 }
                edits.append((i, e, MSLTranslator.blank(text[i..<e])))
                i = e
                continue
            }
            if inDirective && (word == "include" || word == "pragma") { i = end; continue }
            switch word {
            case "kernel", "template":
                if !inDirective, let after = try kernelDeclaration(at: i) { i = after; continue }
            case "device", "thread":
                if !isMember(i) { edits.append((i, end, String(repeating: " ", count: end - i))) }
            case "constant":
                if !inDirective, !isMember(i), let after = try functionConstant(at: i) { i = after; continue }
                if !isMember(i) { edits.append((i, end, "const   ")) }
            case "double" where !inDirective:
                throw fail(i, "MSL has no `double`: Apple's compiler rejects it (use float)")
            case _ where !inDirective && !isMember(i) && MSLTranslator.forbiddenKeywords[word] != nil
                && !(word == "delete" && { let p = skipSpaceBack(i - 1); return p >= 0 && text[p] == 61 }()):  // `= delete` is fine
                throw fail(i, "`\(word)`: \(MSLTranslator.forbiddenKeywords[word]!) are not part of MSL (Apple's compiler rejects them)")
            case "is_function_constant_defined":
                if !inDirective { i = try functionConstantDefined(at: i, end: end); continue }
            case "threadgroup":
                if !isMember(i) { i = try threadgroup(at: i, end: end); continue }
            default:
                if MSLTranslator.vectorTypes.contains(word) { vectorConstructor(at: i, end: end, word: word) }
                else if !inDirective && templateTypeNames.contains(word) { templateTypeConversion(at: i, end: end, word: word) }
            }
            i = end
        }
        try checkUniqueNames()
    }

    /// `constant T name [[function_constant(i)]];` at `start` (nil: another `constant`).
    private mutating func functionConstant(at start: Int) throws -> Int? {
        var end = start
        while end < text.count && ![59, 123, 125].contains(text[end]) { end += 1 }  // ; { }
        guard end < text.count, text[end] == 59 else { return nil }
        let declaration = Substring(string(start, end))
        guard let open = declaration.firstRange(ofPlain: "[[") else { return nil }
        let attribute = declaration[open.upperBound...].prefix { $0 != "]" }.trimmingSpaces
        guard attribute.hasPrefix("function_constant") else { return nil }
        let argument = attribute.drop { $0 != "(" }.dropFirst().trimmingSpaces
        let words = declaration[..<open.lowerBound].splitWords.dropFirst()  // `constant`
        // The index is an integer constant expression (ggml: `FC_UNARY + 0`, a macro made `1200 + 0`).
        guard argument.hasSuffix(")"), let index = MSLTranslator.integerExpression(argument.dropLast()), index >= 0, index < 65536, words.count >= 2, let name = words.last else {
            throw fail(start, "cannot parse the function constant `\(declaration.trimmingSpaces)`: SoftMetal expects `constant T name [[function_constant(index)]];`")
        }
        let type = words.dropLast().joined(separator: " ")
        guard MSLTranslator.functionConstantTypes[type] != nil else {
            throw fail(start, "function constant \(name): the type \(type) is not supported by SoftMetal (scalars: bool, int, uint, float, half, short, ushort, char, uchar, long, ulong)")
        }
        if let other = functionConstants.first(where: { $0.index == index && $0.name != name }) {
            throw fail(start, "function constants \(other.name) and \(name) have the same index \(index)")
        }
        functionConstants.append(FunctionConstant(name: name, type: type, index: index))
        let newlines = String(repeating: "\n", count: text[start..<end].filter { $0 == 10 }.count)
        edits.append((start, end, "static constexpr \(type) \(name) = __SM_FC_\(index); "
                      + "static constexpr bool __sm_fc_defined_\(name) = __SM_FCD_\(index)" + newlines))
        return end
    }

    /// The value of an integer constant expression of literals, `+ - * / %` and parentheses
    /// (nil for anything else).
    static func integerExpression(_ text: Substring) -> Int? {
        let chars = Array(text.utf8)
        var i = 0
        func space() { while i < chars.count && (chars[i] == 32 || chars[i] == 9 || chars[i] == 10) { i += 1 } }
        func primary() -> Int? {
            space()
            guard i < chars.count else { return nil }
            if chars[i] == 40 {  // (
                i += 1
                guard let v = sum() else { return nil }
                space()
                guard i < chars.count, chars[i] == 41 else { return nil }
                i += 1
                return v
            }
            if chars[i] == 45 { i += 1; return primary().map { -$0 } }  // unary -
            if chars[i] == 43 { i += 1; return primary() }  // unary +
            let start = i
            while i < chars.count && ((chars[i] >= 48 && chars[i] <= 57) || (chars[i] | 0x20 >= 97 && chars[i] | 0x20 <= 122)) { i += 1 }
            var digits = String(decoding: chars[start..<i], as: UTF8.self).lowercased()
            while let last = digits.last, last == "u" || last == "l" { digits.removeLast() }  // 1u, 2ul
            if digits.hasPrefix("0x") { return Int(digits.dropFirst(2), radix: 16) }
            return Int(digits)
        }
        func product() -> Int? {
            guard var v = primary() else { return nil }
            while true {
                space()
                guard i < chars.count, [42, 47, 37].contains(chars[i]) else { return v }
                let op = chars[i]
                i += 1
                guard let r = primary() else { return nil }
                if op == 42 { v = v.multipliedReportingOverflow(by: r).overflow ? Int.max : v * r }
                else if r == 0 { return nil }
                else { v = op == 47 ? v / r : v % r }
            }
        }
        func sum() -> Int? {
            guard var v = product() else { return nil }
            while true {
                space()
                guard i < chars.count, chars[i] == 43 || chars[i] == 45 else { return v }
                let op = chars[i]
                i += 1
                guard let r = product() else { return nil }
                v = op == 43 ? v &+ r : v &- r
            }
        }
        guard let v = sum() else { return nil }
        space()
        return i == chars.count ? v : nil
    }

    /// `is_function_constant_defined(name)` -> `__sm_fc_defined_name`.
    private mutating func functionConstantDefined(at start: Int, end: Int) throws -> Int {
        let open = skipSpace(end)
        guard open < text.count, text[open] == 40, let close = matching(open),
              let (name, after) = identifier(at: skipSpace(open + 1)), skipSpace(after) == close - 1 else {
            throw fail(start, "is_function_constant_defined needs the name of a function constant")
        }
        guard functionConstants.contains(where: { $0.name == name }) else {
            throw fail(start, "is_function_constant_defined(\(name)): \(name) is not a function constant declared before this line")
        }
        edits.append((start, close, "__sm_fc_defined_\(name)"))
        return close
    }

    /// Two functions of a library cannot share a name (Apple's compiler rejects it too).
    private func checkUniqueNames() throws {
        var seen = Set<String>()
        for k in kernels where !seen.insert(k.name).inserted {
            throw SoftMetalError.compile("\(MSLTranslator.sourceName): error: two kernels are named \(k.name) (function names and [[host_name]]s must be unique)")
        }
    }

    private func isMember(_ i: Int) -> Bool {
        let p = skipSpaceBack(i - 1)
        return p >= 0 && (text[p] == 46 || (text[p] == 62 && p > 0 && text[p - 1] == 45))  // . or ->
    }

    private mutating func blankIncludes() {
        var start = 0
        while start < text.count {
            var end = start
            while end < text.count && text[end] != 10 { end += 1 }
            let line = string(start, end).trimmingSpaces
            if line.hasPrefix("#") {
                let rest = line.dropFirst().trimmingSpacesSub
                if rest.hasPrefix("include") {
                    let target = rest.dropFirst("include".count).trimmingSpacesSub
                    if target.hasPrefix("<metal_") || target.hasPrefix("<simd/") {
                        for k in start..<end { text[k] = 32 }
                    }
                }
            }
            start = end + 1
        }
    }

    /// The start of the declaration whose text ends at `p` (back over balanced brackets to
    /// `;`, `{`, `}` or an access label `public:`), and the `(` of its last top-level
    /// parenthesized group (the parameter list when `p` is its `)`; -1 if none).
    private func declarationStart(before p: Int) -> (start: Int, open: Int) {
        var s = p
        var depth = 0
        var open = -1
        while s >= 0 {
            let ch = text[s]
            if ch == 41 || ch == 93 { depth += 1 } else if ch == 40 || ch == 91 {
                depth -= 1
                if depth == 0 && ch == 40 && open < 0 { open = s }
            } else if depth == 0 && (ch == 59 || ch == 123 || ch == 125) { break }
            else if depth == 0 && ch == 58 && s > 0 && text[s - 1] != 58 && (s + 1 >= text.count || text[s + 1] != 58) {
                let w = skipSpaceBack(s - 1)
                var ws = w
                while ws >= 0 && MSLTranslator.isIdent(text[ws]) { ws -= 1 }
                if ["public", "private", "protected"].contains(string(ws + 1, w + 1)) { break }
            }
            s -= 1
        }
        return (s + 1, open)
    }

    /// Member functions qualified by the address space of `this` (`void f() const thread`,
    /// `complex_t() threadgroup : re(0) {}`), as MLX writes them: MSL overloads on it, C++
    /// cannot, and here every object is ordinary memory. The qualifier is dropped; of the
    /// overloads of one member that then coincide (same head and cv-qualifiers), the first is
    /// kept and the others are blanked (lines kept). `f() constant` without `const` becomes
    /// `const` (a `constant` object is a const one here), except on a constructor.
    private mutating func memberAddressSpaces() {
        let spaces: Set<String> = ["thread", "threadgroup", "device", "constant"]
        var seen = Set<String>()
        var i = 0
        func blankRange(_ a: Int, _ b: Int) { for k in a..<b where text[k] != 10 { text[k] = 32 } }
        while i < text.count {
            let c = text[i]
            if c == 34 || c == 39 {  // string or character literal
                var j = i + 1
                while j < text.count && text[j] != c && text[j] != 10 { if text[j] == 92 { j += 1 }; j += 1 }
                i = j + 1
                continue
            }
            guard MSLTranslator.isIdentStart(c), i == 0 || !MSLTranslator.isIdent(text[i - 1]),
                  let (word, end) = identifier(at: i) else { i += 1; continue }
            guard spaces.contains(word) else { i = end; continue }
            // Qualifier position: `) [const] SPACE [const]` followed by `{ : ; =`.
            var p = skipSpaceBack(i - 1)
            var cv: [String] = []
            if p >= 4, string(p - 4, p + 1) == "const", p < 5 || !MSLTranslator.isIdent(text[p - 5]) {
                cv.append("const")
                p = skipSpaceBack(p - 5)
            }
            guard p >= 0, text[p] == 41 else { i = end; continue }  // )
            var q = skipSpace(end)
            if let (next, after) = identifier(at: q), next == "const" { cv.append("const"); q = skipSpace(after) }
            guard q < text.count, [123, 58, 59, 61].contains(text[q]),
                  !(text[q] == 58 && q + 1 < text.count && text[q + 1] == 58) else { i = end; continue }
            let (declStart, _) = declarationStart(before: p)
            // The enclosing scope (its `{`) and, for a constructor, the class name.
            var e = declStart - 1
            var depth = 0
            while e >= 0 {
                if text[e] == 125 { depth += 1 } else if text[e] == 123 { if depth == 0 { break }; depth -= 1 }
                e -= 1
            }
            var className = ""
            if e > 0 {  // `struct NAME ... {` (no `;` `{` `}` between the keyword and the brace)
                var w = e - 1
                while w >= 0 && ![59, 123, 125].contains(text[w]) {
                    if MSLTranslator.isIdentStart(text[w]), w == 0 || !MSLTranslator.isIdent(text[w - 1]),
                       let (kw, after) = identifier(at: w), kw == "struct" || kw == "class",
                       let (name, _) = identifier(at: skipSpace(after)) {
                        className = name
                        break
                    }
                    w -= 1
                }
            }
            // The function's name: the identifier before its parameter list.
            var open = p
            depth = 0
            while open >= 0 {
                if text[open] == 41 { depth += 1 } else if text[open] == 40 { depth -= 1; if depth == 0 { break } }
                open -= 1
            }
            let ne = skipSpaceBack(open - 1)
            var ns = ne
            while ns >= 0 && MSLTranslator.isIdent(text[ns]) { ns -= 1 }
            let isConstructor = !className.isEmpty && string(ns + 1, ne + 1) == className
            // The declaration's end: `;`, or the body after a constructor's initializers.
            var k = q
            if text[k] == 58 {  // member initializers: `name(...)`, `name{...}`, `Base<T>(...)`, ...
                k += 1
                while k < text.count {
                    k = skipSpace(k)
                    while k < text.count && (MSLTranslator.isIdent(text[k]) || text[k] == 58 || MSLTranslator.isSpace(text[k]) || text[k] == 60) {
                        if text[k] == 60 { guard let m = matchingAngle(k) else { break }; k = m } else { k += 1 }
                    }
                    guard k < text.count, text[k] == 40 || text[k] == 123, let m = matching(k) else { break }
                    k = skipSpace(m)
                    if k < text.count && text[k] == 44 { k += 1; continue }
                    break
                }
            }
            var declEnd = k
            if k < text.count && text[k] == 123, let m = matching(k) { declEnd = m }
            else { while declEnd < text.count && text[declEnd] != 59 { declEnd += 1 }; declEnd += 1 }
            declEnd = Swift.min(declEnd, text.count)
            let key = "\(e)|" + MSLTranslator.compact(string(declStart, p + 1)) + "|" + cv.joined(separator: " ")
                + (word == "constant" && cv.isEmpty && !isConstructor ? "const" : "")
            if seen.contains(key) {
                blankRange(declStart, declEnd)
                i = declEnd
                continue
            }
            seen.insert(key)
            blankRange(i, end)
            if word == "constant" && cv.isEmpty && !isConstructor {
                text.replaceSubrange(i..<i + 5, with: Array("const".utf8))
            }
            i = end
        }
    }

    /// Functions overloaded on the address space of a parameter (`operator+=(thread
    /// complex_t<T>& a, ...)`, `threadgroup`, `device` versions, MLX's complex.h): without
    /// address spaces their heads coincide, which C++ rejects. The first definition of each
    /// head (per scope) is kept; later ones whose head differs only in address spaces are
    /// blanked (lines kept). Every pointer and reference reaches all memory here.
    private mutating func addressSpaceOverloads() {
        let spaces: Set<String> = ["thread", "threadgroup", "device", "constant"]
        let statements: Set<String> = ["if", "for", "while", "switch", "catch", "return", "else", "do"]
        var seen = Set<String>()
        var stack: [Int] = []
        var i = 0
        while i < text.count {
            let c = text[i]
            if c == 34 || c == 39 {
                var j = i + 1
                while j < text.count && text[j] != c && text[j] != 10 { if text[j] == 92 { j += 1 }; j += 1 }
                i = j + 1
                continue
            }
            if c == 125 { _ = stack.popLast(); i += 1; continue }
            guard c == 123 else { i += 1; continue }
            let p = skipSpaceBack(i - 1)
            guard p >= 0, text[p] == 41 else { stack.append(i); i += 1; continue }
            let (declStart, open) = declarationStart(before: p)
            // A function: an identifier (not a statement keyword) or an operator before `(`.
            var isFunction = false
            if open > 0 {
                let ne = skipSpaceBack(open - 1)
                var ns = ne
                while ns >= 0 && MSLTranslator.isIdent(text[ns]) { ns -= 1 }
                let name = string(ns + 1, ne + 1)
                if !name.isEmpty { isFunction = !statements.contains(name) && !(text[ns + 1] >= 48 && text[ns + 1] <= 57) }
                else { isFunction = string(declStart, open).contains("operator") }
            }
            var words: [String] = []
            var k = declStart
            var hasSpace = false
            while k < i {
                if MSLTranslator.isIdentStart(text[k]), k == 0 || !MSLTranslator.isIdent(text[k - 1]), let (w, e) = identifier(at: k) {
                    if spaces.contains(w) { hasSpace = true } else { words.append(w) }
                    k = e
                } else {
                    if !MSLTranslator.isSpace(text[k]) { words.append(String(UnicodeScalar(text[k]))) }
                    k += 1
                }
            }
            guard isFunction, hasSpace, let first = words.first, !statements.contains(first), let end = matching(i) else {
                stack.append(i); i += 1; continue
            }
            let key = "\(stack.last ?? -1)|" + words.joined(separator: " ")
            if seen.contains(key) {
                for b in declStart..<end where text[b] != 10 { text[b] = 32 }
            } else {
                seen.insert(key)
            }
            i = end  // the body: no overloads inside a function
        }
    }

    /// Numbers: a literal with an `h` suffix becomes a half.
    private mutating func number(at i: Int) -> Int {
        var j = i
        var isHex = false
        if text[j] == 48 && j + 1 < text.count && (text[j + 1] == 120 || text[j + 1] == 88) { isHex = true; j += 2 }
        while j < text.count {
            let c = text[j]
            if MSLTranslator.isIdent(c) || c == 46 {
                if !isHex && (c == 101 || c == 69) && j + 1 < text.count && (text[j + 1] == 43 || text[j + 1] == 45) { j += 2; continue }
                j += 1
            } else { break }
        }
        let literal = string(i, j)
        if !isHex, let last = literal.last, last == "h" || last == "H" {
            edits.append((i, j, "((half)(\(literal.dropLast())))"))
        }
        return j
    }

    private mutating func vectorConstructor(at i: Int, end: Int, word: String) {
        let next = skipSpace(end)
        if vectorCast(at: i, end: end, word: word) { return }
        // A declaration with constructor arguments, `short2 offset(a * n, b);` (MLX): becomes
        // `short2 offset = vmake<short2>(a * n, b);`. Not a function declaration: no argument
        // is a parameter declaration (`T name`), and `;` or `,` follows.
        if let (_, nameEnd) = identifier(at: next) {
            let open = skipSpace(nameEnd)
            if open < text.count, text[open] == 40, let close = matching(open) {
                let after = skipSpace(close)
                let args = MSLTranslator.splitTopLevel(string(open + 1, close - 1))
                let declaresParameters = args.contains { arg in
                    if arg.contains(" * ") || arg.contains(" & ") { return false }  // a product, as formatted
                    let scalars: Set<String> = ["float", "half", "bfloat", "int", "uint", "short", "ushort", "char",
                                                "uchar", "long", "ulong", "bool", "size_t", "void"]
                    let bare = arg.trimmingSpaces
                    if scalars.contains(bare) || MSLTranslator.vectorTypes.contains(bare) { return true }  // `f(float)`
                    let words = arg.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "*" || $0 == "&" })
                    return words.count >= 2 && words.allSatisfy { w in w.allSatisfy { $0.isLetter || $0.isNumber || $0 == "_" || $0 == ":" } }
                }
                if after < text.count, text[after] == 59 || text[after] == 44, !declaresParameters, !args.isEmpty {
                    edits.append((nameEnd, nameEnd, " = ::metal::__sm::vmake<::metal::\(word)>"))
                }
            }
            return
        }
        guard next < text.count, text[next] == 40 else { return }  // (
        var start = i
        let p = skipSpaceBack(i - 1)
        if p >= 0 && (text[p] == 46 || text[p] == 62) { return }
        if p >= 1 && text[p] == 58 && text[p - 1] == 58 {  // metal::float4(
            let q = skipSpaceBack(p - 2)
            var k = q
            while k >= 0 && MSLTranslator.isIdent(text[k]) { k -= 1 }
            if string(k + 1, q + 1) == "metal" { start = k + 1 } else { return }
        } else if p >= 0 && MSLTranslator.isIdent(text[p]) {
            var k = p
            while k >= 0 && MSLTranslator.isIdent(text[k]) { k -= 1 }
            if string(k + 1, p + 1) == "operator" { return }
        }
        edits.append((start, end, "::metal::__sm::vmake<::metal::\(word)>"))
    }

    /// The names of the type parameters of every template (`template <typename T, class U>`):
    /// a C-style cast to one of them, `(T) x`, may convert vectors (see vectorCast).
    private func collectTemplateTypeNames() -> Set<String> {
        var names = Set<String>()
        var k = 0
        while k < text.count {
            guard text[k] == 116, k == 0 || !MSLTranslator.isIdent(text[k - 1]),  // t
                  let (word, end) = identifier(at: k) else { k += 1; continue }
            k = end
            guard word == "template" else { continue }
            let open = skipSpace(end)
            guard open < text.count, text[open] == 60, let close = matchingAngle(open) else { continue }
            for part in MSLTranslator.splitTopLevel(string(open + 1, close - 1)) {
                let words = part.prefix { $0 != "=" }.splitWords
                if words.count == 2, words[0] == "typename" || words[0] == "class" { names.insert(words[1]) }
            }
        }
        return names
    }

    /// `device`/`thread`/`threadgroup` dropped and `constant` made `const` in [a, b).
    private mutating func addressSpaces(_ a: Int, _ b: Int) {
        var k = a
        while k < b {
            guard MSLTranslator.isIdentStart(text[k]), k == 0 || !MSLTranslator.isIdent(text[k - 1]),
                  let (word, end) = identifier(at: k) else { k += 1; continue }
            if ["device", "thread", "threadgroup"].contains(word) {
                edits.append((k, end, String(repeating: " ", count: end - k)))
            } else if word == "constant" {
                edits.append((k, end, "const   "))
            }
            k = end
        }
    }

    /// `(T) x` and `T(x)` with T a template's type parameter: when T is a vector type in an
    /// instance, MSL converts element-wise (`T(x > 0)`, `s2_t(half2v)` with s2_t = float2),
    /// which clang's vectors do not; `::metal::__sm::construct<T>(x)` does (other types: `T(x)`).
    private mutating func templateTypeConversion(at i: Int, end: Int, word: String) {
        if vectorCast(at: i, end: end, word: word, qualified: false) { return }
        let next = skipSpace(end)
        guard next < text.count, text[next] == 40 else { return }  // (
        let p = skipSpaceBack(i - 1)
        if p >= 0 && (text[p] == 46 || text[p] == 62 || text[p] == 58 || text[p] == 60) { return }  // . -> :: <
        if p >= 0 && MSLTranslator.isIdent(text[p]) {
            var k = p
            while k >= 0 && MSLTranslator.isIdent(text[k]) { k -= 1 }
            guard ["return", "case", "else", "do"].contains(string(k + 1, p + 1)) else { return }
        }
        edits.append((i, end, "::metal::__sm::construct<\(word)>"))
    }

    /// `(half4) x`: MSL converts element-wise (C would bit-cast, or reject vectors of
    /// different sizes). Becomes `::metal::__sm::vcast<::metal::half4>() ->* x`: `->*` binds
    /// tighter than every binary operator and looser than the unary ones, as the cast does.
    private mutating func vectorCast(at i: Int, end: Int, word: String, qualified: Bool = true) -> Bool {
        let open = skipSpaceBack(i - 1)
        let close = skipSpace(end)
        guard open >= 0, text[open] == 40, close < text.count, text[close] == 41 else { return false }
        let operand = skipSpace(close + 1)
        guard operand < text.count else { return false }
        let c = text[operand]
        // An operand follows: a name, a number, `(`, or a unary operator.
        let startsOperand = MSLTranslator.isIdent(c) || c == 40 || c == 46 || c == 45 || c == 43 || c == 33 || c == 126 || c == 42
        guard startsOperand else { return false }
        let before = skipSpaceBack(open - 1)
        if before >= 0 && MSLTranslator.isIdent(text[before]) {
            var k = before
            while k >= 0 && MSLTranslator.isIdent(text[k]) { k -= 1 }
            // `sizeof(float4)`, `f(float4)`...: only keywords that precede an expression.
            guard ["return", "case", "else", "do"].contains(string(k + 1, before + 1)) else { return false }
        }
        if before >= 0 && (text[before] == 41 || text[before] == 93) { return false }  // `) (` `] (`
        edits.append((open, close + 1, "::metal::__sm::vcast<\(qualified ? "::metal::" : "")\(word)>() ->*"
                      + MSLTranslator.blank(text[open..<(close + 1)]).filter { $0 == "\n" }))
        return true
    }

    /// `threadgroup` as an address space is dropped; `threadgroup T name[N]...;` declares a
    /// variable the threadgroup shares.
    private mutating func threadgroup(at i: Int, end: Int) throws -> Int {
        // Find the end of the statement or parameter.
        var j = end
        var depth = 0
        while j < text.count {
            let c = text[j]
            if c == 40 || c == 91 || c == 123 { depth += 1 }
            if c == 41 || c == 93 || c == 125 { if depth == 0 { break }; depth -= 1 }
            if depth == 0 && (c == 59 || c == 44 || c == 61) { break }  // ; , =
            j += 1
        }
        let declaration = string(end, j)
        // `threadgroup T x[N] = {0};` (MLX's layer_norm): Apple's compiler accepts an
        // initializer, but neither the MSL specification nor Metal promises that it runs
        // (an empty initializer leaves threadgroup memory as it was; see README), so it is
        // dropped: the variable starts poisoned like any other until a thread writes it.
        var initializer: (start: Int, end: Int)?
        if j < text.count && text[j] == 61 {
            var k = j + 1
            var nesting = 0
            while k < text.count {
                let c = text[k]
                if c == 40 || c == 91 || c == 123 { nesting += 1 }
                if c == 41 || c == 93 || c == 125 { if nesting == 0 { break }; nesting -= 1 }
                if nesting == 0 && (c == 59 || c == 44) { break }
                k += 1
            }
            if k < text.count && text[k] == 59 { initializer = (j, k) }
        }
        let isStatement = j < text.count && (text[j] == 59 || initializer != nil)
        let previous = skipSpaceBack(i - 1)
        let atStatementStart = previous < 0 || [59, 123, 125].contains(text[previous])
        // A pointer, reference or function declarator shows before the array bounds; inside
        // them `*` and `(` are arithmetic (`threadgroup float t[2 * (N + 1)];`).
        let declarator = declaration.prefix { $0 != "[" }
        let isVariable = !declarator.contains("*") && !declarator.contains("&") && !declarator.contains("(")
        if isStatement && atStatementStart && isVariable {
            // threadgroup TYPE NAME [DIMS] ;
            guard let bracket = declaration.firstIndex(of: "[") ?? Optional(declaration.endIndex) else { return j }
            let head = declaration[..<bracket].trimmingSpacesSub
            let dims = String(declaration[bracket...]).trimmingSpaces
            guard let nameStart = head.lastIndex(where: { !($0.isLetter || $0.isNumber || $0 == "_") }) else {
                throw fail(i, "cannot parse the threadgroup declaration `threadgroup\(declaration);`")
            }
            let name = String(head[head.index(after: nameStart)...])
            let type = String(head[...nameStart]).trimmingSpaces
            if name.isEmpty || type.isEmpty {
                throw fail(i, "cannot parse the threadgroup declaration `threadgroup\(declaration);`")
            }
            let slot = tgSlot
            tgSlot += 1
            let newlines = String(repeating: "\n", count: text[i..<j].filter { $0 == 10 }.count)
            let arrayType = "\(type) \(dims)"
            let replacement: String
            if dims.isEmpty {
                replacement = "\(type)& \(name) = *reinterpret_cast<\(type)*>(::metal::__sm::tg_var(\(slot), sizeof(\(type)), alignof(\(type))))"
            } else {
                replacement = "\(type) (&\(name))\(dims) = *reinterpret_cast<\(type) (*)\(dims)>(::metal::__sm::tg_var(\(slot), sizeof(\(arrayType)), alignof(\(type))))"
            }
            edits.append((i, j, replacement + newlines))
            if let initializer {
                edits.append((initializer.start, initializer.end, MSLTranslator.blank(text[initializer.start..<initializer.end])))
                return initializer.end
            }
            return j
        }
        if j < text.count && text[j] == 44 && atStatementStart && isVariable {
            throw fail(i, "declare one threadgroup variable per statement")
        }
        edits.append((i, end, String(repeating: " ", count: end - i)))
        return end
    }

    /// One attribute of a `[[a, b(c)]]` list, with where its list starts (for errors).
    struct Attribute {
        var name: String
        var argument: String?
        var at: Int
    }

    /// The head of a kernel declaration: `template <...>` (or `template` alone: an explicit
    /// instantiation), then attribute lists and the `kernel` keyword in any order.
    struct KernelHead {
        var start: Int
        var templateParameters: [String]?     // nil: not a template definition
        var templateEnd: Int                   // just past `template <...>` (or `start`)
        var isInstantiation = false
        var attributes: [Attribute] = []
        var hasKernel = false
        var end = 0                            // where the declaration proper starts

        var hostName: Attribute? { attributes.first { $0.name == "host_name" } }
    }

    /// A kernel, a kernel template or an explicit instantiation of one, starting at `start`
    /// (`kernel`, `[[` or `template`). Returns where scanning continues, or nil when the
    /// declaration is not a kernel (scanning goes on as for any other code).
    private mutating func kernelDeclaration(at start: Int) throws -> Int? {
        guard let head = try kernelHead(at: start), head.hasKernel else { return nil }
        for a in head.attributes where !["kernel", "host_name", "max_total_threads_per_threadgroup"].contains(a.name) {
            throw fail(a.at, "the kernel attribute [[\(a.name)\(a.argument.map { "(\($0))" } ?? "")]] is not supported by SoftMetal")
        }
        if head.isInstantiation { return try kernelInstantiation(head) }
        return try kernelDefinition(head)
    }

    private func kernelHead(at start: Int) throws -> KernelHead? {
        var head = KernelHead(start: start, templateParameters: nil, templateEnd: start)
        var k = start
        if let (word, after) = identifier(at: k), word == "template" {
            k = skipSpace(after)
            if k < text.count && text[k] == 60 {  // <
                guard let close = matchingAngle(k) else { return nil }
                head.templateParameters = MSLTranslator.templateParameterNames(string(k + 1, close - 1))
                k = close
            } else {
                head.isInstantiation = true
            }
            head.templateEnd = k
        }
        while true {
            k = skipSpace(k)
            if k + 1 < text.count && text[k] == 91 && text[k + 1] == 91 {
                var e = k + 2
                while e + 1 < text.count && !(text[e] == 93 && text[e + 1] == 93) { e += 1 }
                for item in MSLTranslator.splitTopLevel(string(k + 2, e)) where !item.trimmingSpaces.isEmpty {
                    let name = String(item.prefix { $0 != "(" }).trimmingSpaces
                    var argument: String?
                    if let p = item.firstIndex(of: "("), let q = item.lastIndex(of: ")"), p < q {
                        argument = String(item[item.index(after: p)..<q]).trimmingSpaces
                    }
                    head.attributes.append(Attribute(name: name, argument: argument, at: k))
                    if name == "kernel" { head.hasKernel = true }
                }
                k = e + 2
            } else if let (word, after) = identifier(at: k), word == "kernel" {
                head.hasKernel = true
                k = after
            } else {
                break
            }
        }
        head.end = k
        return head
    }

    private func maxThreads(_ head: KernelHead) throws -> MaxThreads? {
        guard let a = head.attributes.first(where: { $0.name == "max_total_threads_per_threadgroup" }) else { return nil }
        guard let argument = a.argument, !argument.isEmpty else {
            throw fail(a.at, "[[max_total_threads_per_threadgroup]] needs a thread count")
        }
        guard let n = Int(argument) else { return MaxThreads(expression: argument) }
        guard n > 0, n <= 1024 else {
            throw fail(a.at, "bad [[max_total_threads_per_threadgroup(\(argument))]]: the limit is 1...1024")
        }
        return MaxThreads(literal: n)
    }

    /// `[[host_name("a" "b")]]` -> "ab" (string literals concatenate, as MLX's macros make them).
    private func hostName(_ head: KernelHead) throws -> String? {
        guard let a = head.hostName else { return nil }
        guard let argument = a.argument, let name = MSLTranslator.concatenatedStringLiterals(argument), !name.isEmpty else {
            throw fail(a.at, "[[host_name(\(a.argument ?? ""))]] needs a string literal")
        }
        return name
    }

    /// `kernel void f(...)`, `[[kernel]] void f(...)`, `template <...> [[kernel]] void f(...)`:
    /// the head becomes `static` (the template head stays) and the parameters are recorded.
    private mutating func kernelDefinition(_ head: KernelHead) throws -> Int? {
        guard let (void, afterVoid) = identifier(at: head.end), void == "void" else { return nil }
        guard let (name, afterName) = identifier(at: skipSpace(afterVoid)) else { return nil }
        let open = skipSpace(afterName)
        guard open < text.count, text[open] == 40, let close = matching(open) else {
            throw fail(head.start, "cannot parse the parameters of kernel \(name)")
        }
        replaceKeepingLines(skipSpace(head.templateEnd), head.end, with: "static")
        // The template's own parameter list is not scanned again: its address spaces
        // (`void (*deq)(device const q_t *, short, thread float4 &)`, ggml) are edited here.
        if head.templateParameters != nil { addressSpaces(head.start, head.templateEnd) }
        let parameters = try kernelParameters(open, close, kernel: name)
        let unused = unusedParameters(parameters, after: close)
        let maxThreads = try maxThreads(head) ?? MaxThreads()
        if let templateParameters = head.templateParameters {
            if let a = head.hostName {
                throw fail(a.at, "kernel template \(name): put [[host_name]] on its explicit instantiations, not on the template")
            }
            templates[name] = KernelTemplate(name: name, templateParameters: templateParameters,
                                             parameters: parameters, maxThreads: maxThreads, unusedParameters: unused)
        } else {
            var kernel = Kernel(name: try hostName(head) ?? name, parameters: parameters,
                                maxTotalThreadsPerThreadgroup: maxThreads.literal, callee: name)
            kernel.maxThreadsExpression = maxThreads.expression
            kernel.declaredAt = MSLTranslator.location(in: text, at: head.start)
            kernel.unusedParameters = unused
            kernels.append(kernel)
        }
        return open + 1  // the address spaces inside the parameters are rewritten by the main pass
    }

    /// The buffer and threadgroup parameters whose names do not occur in the body that
    /// follows the parameter list ending at `close` (none without a body).
    private func unusedParameters(_ parameters: [Parameter], after close: Int) -> Set<String> {
        let open = skipSpace(close + 1)
        guard open < text.count, text[open] == 123, let end = matching(open) else { return [] }
        var names = Set<String>()
        var i = open
        while i < end {
            if MSLTranslator.isIdentStart(text[i]) && (i == 0 || !MSLTranslator.isIdent(text[i - 1])),
               let (word, after) = identifier(at: i) {
                names.insert(word)
                i = after
            } else {
                i += 1
            }
        }
        return Set(parameters.compactMap { p -> String? in
            switch p.kind {
            case .buffer, .threadgroup: return names.contains(p.name) ? nil : p.name
            case .builtin: return nil
            }
        })
    }

    /// `template [[host_name("n")]] [[kernel]] void f<A, B>(params);` or
    /// `template [[host_name("n")]] [[kernel]] decltype(f<A, B>) f<A, B>;`: a kernel named n that
    /// calls f<A, B>, bound by the template's parameter attributes. The statement is blanked
    /// (the launcher's call instantiates the template).
    private mutating func kernelInstantiation(_ head: KernelHead) throws -> Int? {
        var k = head.end
        guard let (word, afterWord) = identifier(at: k) else {
            throw fail(head.start, "cannot parse this kernel instantiation: SoftMetal expects `void f<...>(...);` or `decltype(f<...>) f<...>;` after the attributes")
        }
        var templateName: String
        var arguments: String
        if word == "decltype" {
            let open = skipSpace(afterWord)
            guard open < text.count, text[open] == 40, let close = matching(open),
                  let (name, args, _) = templateId(skipSpace(open + 1)) else {
                throw fail(head.start, "cannot parse this decltype(f<...>) kernel instantiation")
            }
            guard let (name2, args2, after2) = templateId(skipSpace(close)), name2 == name,
                  MSLTranslator.compact(args2) == MSLTranslator.compact(args) else {
                throw fail(head.start, "kernel instantiation decltype(\(name)<\(args)>): the declarator must repeat \(name)<\(args)>")
            }
            (templateName, arguments, k) = (name, args, after2)
        } else if word == "void" {
            guard let (name, args, after) = templateId(skipSpace(afterWord)) else {
                throw fail(head.start, "kernel instantiation: expected f<...>(...) after `void`")
            }
            let open = skipSpace(after)
            guard open < text.count, text[open] == 40, let close = matching(open) else {
                throw fail(head.start, "kernel instantiation \(name)<\(args)>: cannot parse its parameters")
            }
            (templateName, arguments, k) = (name, args, close)
        } else if let (name, args, after) = templateId(skipSpace(afterWord)),
                  skipSpace(after) < text.count, text[skipSpace(after)] == 59 {  // `;`
            // `kernel_unary_t f<A>;` with `typedef decltype(f<X>) kernel_unary_t;` (ggml): the
            // type names the function type; the template's parameter attributes bind it.
            (templateName, arguments, k) = (name, args, after)
        } else {
            throw fail(head.start, "cannot parse this kernel instantiation (`\(word) ...`): SoftMetal expects `void f<...>(...);`, `decltype(f<...>) f<...>;` or `function_type f<...>;`")
        }
        k = skipSpace(k)
        guard k < text.count, text[k] == 59 else {  // ;
            throw fail(head.start, "kernel instantiation \(templateName)<\(arguments)>: expected `;`")
        }
        guard let host = try hostName(head) else {
            throw fail(head.start, "the kernel instantiation \(templateName)<\(arguments)> needs [[host_name(\"...\")]]: it is the name makeFunction(name:) looks up")
        }
        guard let template = templates[templateName] else {
            throw fail(head.start, "kernel instantiation \(host): no kernel template named \(templateName) is declared before it (`template <...> [[kernel]] void \(templateName)(...)`)")
        }
        let values = MSLTranslator.splitTopLevel(arguments).map(\.trimmingSpaces)
        let parameters = template.parameters.map { p in
            var q = p
            q.type = MSLTranslator.substitute(p.type, names: template.templateParameters, values: values)
            return q
        }
        let maxThreads = try maxThreads(head) ?? template.maxThreads
        var kernel = Kernel(name: host, parameters: parameters, maxTotalThreadsPerThreadgroup: maxThreads.literal,
                            callee: "\(templateName)<\(arguments)>",
                            instantiatedAt: MSLTranslator.location(in: text, at: head.start))
        kernel.maxThreadsExpression = maxThreads.expression.map {
            MSLTranslator.substitute($0, names: template.templateParameters, values: values)
        }
        kernel.declaredAt = kernel.instantiatedAt!
        kernel.unusedParameters = template.unusedParameters
        kernels.append(kernel)
        edits.append((head.start, k + 1, MSLTranslator.blank(text[head.start...k])))
        return k + 1
    }

    /// `name<args>` at i: the name, the arguments' text and the index past `>`.
    private func templateId(_ i: Int) -> (String, String, Int)? {
        guard let (name, after) = identifier(at: i) else { return nil }
        let open = skipSpace(after)
        guard open < text.count, text[open] == 60, let close = matchingAngle(open) else { return nil }
        return (name, string(open + 1, close - 1).trimmingSpaces, close)
    }

    /// Index just past the `>` that closes the `<` at `open` (parentheses nest; `a > b` in a
    /// template argument must be parenthesised, as in C++).
    private func matchingAngle(_ open: Int) -> Int? {
        var depth = 0
        var parens = 0
        var i = open
        while i < text.count {
            switch text[i] {
            case 40, 91: parens += 1
            case 41, 93: parens -= 1
            case 60 where parens == 0: depth += 1
            case 62 where parens == 0:
                depth -= 1
                if depth == 0 { return i + 1 }
            case 59, 123, 125: return nil  // ; { }
            default: break
            }
            i += 1
        }
        return nil
    }

    /// Replaces [a, b) by `word` and blanks, keeping its newlines (lines stay in place).
    private mutating func replaceKeepingLines(_ a: Int, _ b: Int, with word: String) {
        let region = text[a..<b]
        let n = word.utf8.count
        if region.count >= n && !region.prefix(n).contains(10) {
            edits.append((a, b, word + MSLTranslator.blank(region.dropFirst(n))))
        } else {
            edits.append((a, b, word + " " + MSLTranslator.blank(region)))
        }
    }

    /// Parameters of a kernel, split at top-level commas.
    private mutating func kernelParameters(_ open: Int, _ close: Int, kernel name: String) throws -> [Parameter] {
        var parameters: [Parameter] = []
        var start = open + 1
        var depth = 0
        var k = open + 1
        while k < close {
            let c = text[k]
            if c == 40 || c == 91 || c == 60 || c == 123 { depth += 1 }
            if c == 41 || c == 93 || c == 62 || c == 125 { depth -= 1 }
            if (c == 44 && depth == 0) || k == close - 1 {
                let stop = (c == 44 && depth == 0) ? k : close - 1
                if let p = try parameter(start, stop, kernel: name) { parameters.append(p) }
                start = k + 1
            }
            k += 1
        }
        // Implicit indices: the first index that no parameter of the kind uses, in order.
        var buffers = Set(parameters.compactMap { if case .buffer(let n) = $0.kind, n >= 0 { return n } else { return nil } })
        var groups = Set(parameters.compactMap { if case .threadgroup(let n) = $0.kind, n >= 0 { return n } else { return nil } })
        for i in parameters.indices {
            switch parameters[i].kind {
            case .buffer(-1):
                let n = (0...).first { !buffers.contains($0) }!
                guard n < 31 else { throw fail(open, "kernel \(name): more than 31 buffers") }
                buffers.insert(n)
                parameters[i].kind = .buffer(n)
            case .threadgroup(-1):
                let n = (0...).first { !groups.contains($0) }!
                guard n < 31 else { throw fail(open, "kernel \(name): more than 31 threadgroup parameters") }
                groups.insert(n)
                parameters[i].kind = .threadgroup(n)
            default: break
            }
        }
        return parameters
    }

    // MARK: template helpers

    /// "a, f(b, c), d<e, g>" -> ["a", " f(b, c)", " d<e, g>"] (inside brackets `<`/`>` are
    /// comparisons, as in `int N = (4 > 2)`).
    static func splitTopLevel(_ s: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var brackets = 0
        var angles = 0
        var quote: Character?
        for ch in s {
            if let q = quote {
                if ch == q { quote = nil }
            } else if ch == "\"" || ch == "'" {
                quote = ch
            } else if "([{".contains(ch) {
                brackets += 1
            } else if ")]}".contains(ch) {
                brackets -= 1
            } else if ch == "<" && brackets == 0 {
                angles += 1
            } else if ch == ">" && brackets == 0 && angles > 0 {
                angles -= 1
            } else if ch == "," && brackets == 0 && angles == 0 {
                parts.append(current)
                current = ""
                continue
            }
            current.append(ch)
        }
        parts.append(current)
        return parts
    }

    /// `typename T, int BITS = 4, typename... Ts` -> ["T", "BITS", "Ts"]
    static func templateParameterNames(_ list: String) -> [String] {
        splitTopLevel(list).compactMap { part in
            let declaration = splitTopLevel(part.replacingAll("=", with: ",")).first ?? part
            let words = declaration.splitWords.filter { $0.first.map { $0.isLetter || $0 == "_" } ?? false }
            return words.last
        }
    }

    /// Template parameter names -> the instance's arguments, identifier by identifier (for
    /// the type names shown in reflection and errors; the launcher uses the real types).
    static func substitute(_ type: String, names: [String], values: [String]) -> String {
        guard !names.isEmpty else { return type }
        var map: [String: String] = [:]
        for (n, v) in zip(names, values) { map[n] = v }
        var out = ""
        var word = ""
        for ch in type + " " {
            if ch.isLetter || ch.isNumber || ch == "_" {
                word.append(ch)
                continue
            }
            out += map[word] ?? word
            word = ""
            out.append(ch)
        }
        return String(out.dropLast())
    }

    /// `"a" "b"` -> "ab"; nil when the text is not only string literals.
    static func concatenatedStringLiterals(_ s: String) -> String? {
        var result = ""
        var chars = Array(s)[...]
        while true {
            while let c = chars.first, c.isWhitespace { chars = chars.dropFirst() }
            guard let c = chars.first else { return result }
            guard c == "\"" else { return nil }
            chars = chars.dropFirst()
            while true {
                guard let d = chars.first else { return nil }
                chars = chars.dropFirst()
                if d == "\"" { break }
                if d == "\\", let e = chars.first { chars = chars.dropFirst(); result.append(e); continue }
                result.append(d)
            }
        }
    }

    static func compact(_ s: String) -> String { String(s.filter { !$0.isWhitespace }) }

    private mutating func parameter(_ a: Int, _ b: Int, kernel: String) throws -> Parameter? {
        let raw = string(a, b)
        if raw.trimmingSpaces.isEmpty || raw.trimmingSpaces == "void" { return nil }
        // The attribute [[...]].
        var attribute: String?
        var declaration = ""
        var k = a
        var bytes: [UInt8] = []
        while k < b {
            if text[k] == 91 && k + 1 < b && text[k + 1] == 91 {
                var e = k + 2
                while e + 1 < b && !(text[e] == 93 && text[e + 1] == 93) { e += 1 }
                guard e + 1 < b else {
                    throw fail(k, "kernel \(kernel): `[[` without a matching `]]` in the parameter `\(raw.trimmingSpaces)`")
                }
                attribute = string(k + 2, e).trimmingSpaces
                edits.append((k, min(e + 2, b), MSLTranslator.blank(text[k..<min(e + 2, b)])))
                k = e + 2
                continue
            }
            bytes.append(text[k])
            k += 1
        }
        declaration = String(decoding: bytes, as: UTF8.self)
        var condition: String?
        if let list = attribute {
            var items = MSLTranslator.splitTopLevel(list).map(\.trimmingSpaces)
            if let c = items.firstIndex(where: { $0.hasPrefix("function_constant") }) {
                condition = items[c].drop { $0 != "(" }.dropFirst().prefix { $0 != ")" }.trimmingSpaces
                items.remove(at: c)
                guard let name = condition, functionConstants.contains(where: { $0.name == name && $0.type == "bool" }) else {
                    throw fail(a, "kernel \(kernel): [[\(list)]] needs a bool function constant declared before the kernel")
                }
            }
            attribute = items.joined(separator: ", ")
        }
        // Address spaces out of the type; names are the last identifier.
        var words = declaration.splitWords
        if declaration.contains("*") || declaration.contains("&"),
           !words.contains(where: { ["device", "constant", "threadgroup", "thread"].contains($0) }) {
            throw fail(a, "kernel \(kernel): the pointer or reference `\(raw.trimmingSpaces)` needs an address space (device, constant, threadgroup or thread), as Apple's compiler requires")
        }
        words.removeAll { $0 == "device" || $0 == "thread" || $0 == "threadgroup" }
        words = words.map { $0 == "constant" ? "const" : $0 }
        var joined = words.joined(separator: " ")
        // `constant const int64_t a_strides[2]` (MLX): an array in the device or constant
        // address space is a buffer of its elements, as for `constant const int64_t*` (C++
        // adjusts the array parameter to that pointer). Arrays of pointers (arrays of
        // buffers) and arrays without an address space stay unsupported.
        var isArray = false
        if joined.hasSuffix("]"), let bracket = joined.firstIndex(of: "["), !joined[..<bracket].contains("*"),
           !joined[..<bracket].contains("&"),
           declaration.splitWords.contains(where: { $0 == "device" || $0 == "constant" }) {
            joined = joined[..<bracket].trimmingSpaces
            isArray = true
        }
        guard let nameStart = joined.lastIndex(where: { !($0.isLetter || $0.isNumber || $0 == "_") }) else {
            throw fail(a, "kernel \(kernel): cannot parse the parameter `\(raw.trimmingSpaces)`")
        }
        let name = String(joined[joined.index(after: nameStart)...])
        let type = (String(joined[...nameStart]).trimmingSpaces + (isArray ? "*" : ""))
            .replacingAll(" *", with: "*").replacingAll(" &", with: "&")
        if name.isEmpty || type.isEmpty || type.contains("[") {
            throw fail(a, "kernel \(kernel): the parameter `\(raw.trimmingSpaces)` is not supported by SoftMetal (arrays of buffers and unnamed parameters are not)")
        }
        guard let attribute, !attribute.isEmpty else {
            // Without an attribute a device/constant pointer or reference is a buffer and a
            // threadgroup pointer threadgroup memory, at the first free index (as Apple's
            // compiler assigns them; ggml writes its kernels so); kernelParameters numbers them.
            let spaces = declaration.splitWords
            if declaration.contains("*") || declaration.contains("&") || isArray {
                if spaces.contains("device") || spaces.contains("constant") {
                    return Parameter(kind: .buffer(-1), type: type, name: name, condition: condition)
                }
                if spaces.contains("threadgroup") {
                    return Parameter(kind: .threadgroup(-1), type: type, name: name, condition: condition)
                }
            }
            throw fail(a, "kernel \(kernel): the parameter `\(raw.trimmingSpaces)` has no attribute; SoftMetal needs [[buffer(n)]], [[threadgroup(n)]] or a thread-position attribute")
        }
        let attrName = String(attribute.prefix { $0 != "(" }).trimmingSpaces
        var argument: Int?
        if let p = attribute.firstIndex(of: "("), let q = attribute[p...].firstIndex(of: ")") {
            argument = Int(attribute[attribute.index(after: p)..<q].trimmingSpacesSub)
        }
        switch attrName {
        case "buffer":
            guard let n = argument, n >= 0, n < 31 else { throw fail(a, "kernel \(kernel): bad [[\(attribute)]] (indices 0...30)") }
            return Parameter(kind: .buffer(n), type: type, name: name, condition: condition)
        case "threadgroup":
            guard let n = argument, n >= 0, n < 31 else { throw fail(a, "kernel \(kernel): bad [[\(attribute)]] (indices 0...30)") }
            return Parameter(kind: .threadgroup(n), type: type, name: name, condition: condition)
        default:
            guard MSLTranslator.builtins.contains(attrName) else {
                throw fail(a, "kernel \(kernel): the attribute [[\(attribute)]] is not supported by SoftMetal")
            }
            return Parameter(kind: .builtin(attrName), type: type, name: name)
        }
    }

    // MARK: output

    private func output() -> Output {
        var result = Array(text)
        for edit in edits.sorted(by: { $0.start > $1.start }) {
            result.replaceSubrange(edit.start..<edit.end, with: Array(edit.replacement.utf8))
        }
        var out = "#line 1 \"\(MSLTranslator.sourceName)\"\n"
        out += String(decoding: result, as: UTF8.self)
        out += "\n#line 1 \"softmetal-generated.cpp\"\n"
        let body = out
        let launchers = kernels.map { MSLTranslator.launcher($0) }
        for l in launchers { out += l }
        return Output(source: out, kernels: kernels, functionConstants: functionConstants, body: body, launchers: launchers)
    }

    static func builtinExpression(_ name: String) -> String {
        let g = "__g", d = "__d", l = "__L"
        switch name {
        case "thread_position_in_grid":
            return "\(g)->gpos[0] * \(d)->tptg[0] + \(l)->pos[0], \(g)->gpos[1] * \(d)->tptg[1] + \(l)->pos[1], \(g)->gpos[2] * \(d)->tptg[2] + \(l)->pos[2]"
        case "thread_position_in_threadgroup": return "\(l)->pos[0], \(l)->pos[1], \(l)->pos[2]"
        case "threadgroup_position_in_grid": return "\(g)->gpos[0], \(g)->gpos[1], \(g)->gpos[2]"
        case "threads_per_threadgroup": return "\(g)->size[0], \(g)->size[1], \(g)->size[2]"
        case "dispatch_threads_per_threadgroup": return "\(d)->tptg[0], \(d)->tptg[1], \(d)->tptg[2]"
        case "threadgroups_per_grid": return "\(d)->threadgroups[0], \(d)->threadgroups[1], \(d)->threadgroups[2]"
        case "threads_per_grid", "grid_size": return "\(d)->grid[0], \(d)->grid[1], \(d)->grid[2]"
        case "grid_origin": return "0, 0, 0"
        case "thread_index_in_threadgroup": return "\(l)->tid, 0, 0"
        case "thread_index_in_simdgroup": return "\(l)->lane, 0, 0"
        case "simdgroup_index_in_threadgroup": return "\(l)->sg, 0, 0"
        case "simdgroups_per_threadgroup": return "\(g)->nsg, 0, 0"
        case "dispatch_simdgroups_per_threadgroup": return "(\(d)->tptg[0] * \(d)->tptg[1] * \(d)->tptg[2] + 31) / 32, 0, 0"
        case "threads_per_simdgroup", "thread_execution_width": return "32, 0, 0"
        case "thread_index_in_quadgroup": return "\(l)->tid % 4, 0, 0"
        case "quadgroup_index_in_threadgroup": return "\(l)->tid / 4, 0, 0"
        case "quadgroups_per_threadgroup": return "(\(g)->n + 3) / 4, 0, 0"
        default: return "0, 0, 0"
        }
    }

    static func cString(_ s: String) -> String {
        "\"" + s.replacingAll("\\", with: "\\\\").replacingAll("\"", with: "\\\"") + "\""
    }

    /// `value`, or null/0 when the parameter's function constant is false (the host then
    /// neither requires nor binds it: kind 0 in the reflection table).
    static func present(_ p: Parameter, _ value: String) -> String {
        guard let c = p.condition else { return value }
        return "(\(c) ? \(value) : 0)"
    }

    static func launcher(_ k: Kernel) -> String {
        var args: [String] = []
        var infos: [String] = []
        let n = k.symbol
        for (index, parameter) in k.parameters.enumerated() {
            var p = parameter
            // A template instance binds by the instantiated parameter types, which C++ knows.
            if k.isTemplateInstance { p.type = "::metal::__sm::param_t<\(index), __sm_fn_\(n)>" }
            switch p.kind {
            case .buffer(let i):
                args.append("::metal::__sm::buf_arg<\(p.type)>(\(present(p, "__d->buffers[\(i)]")))")
                let kind = k.unusedParameters.contains(p.name) ? "0" : present(p, "SM_PARAM_BUFFER")
                infos.append("{\(kind), \(i), ::metal::__sm::elem_size<\(p.type)>(), \(parameter.type.hasSuffix("&") ? 1 : 0), \(cString(parameter.type)), \(cString(p.name)), \"buffer(\(i))\"}")
            case .threadgroup(let i):
                args.append("(\(p.type))\(present(p, "__d->tg_mem[\(i)]"))")
                let kind = k.unusedParameters.contains(p.name) ? "0" : present(p, "SM_PARAM_THREADGROUP")
                infos.append("{\(kind), \(i), ::metal::__sm::elem_size<\(p.type)>(), 0, \(cString(parameter.type)), \(cString(p.name)), \"threadgroup(\(i))\"}")
            case .builtin(let name):
                args.append("::metal::__sm::bi<\(p.type)>(\(builtinExpression(name)))")
                infos.append("{SM_PARAM_BUILTIN, -1, (int64_t)sizeof(\(p.type)), 0, \(cString(parameter.type)), \(cString(p.name)), \(cString(name))}")
            }
        }
        if infos.isEmpty { infos.append("{0, 0, 0, 0, \"\", \"\", \"\"}") }
        // For an instance, the lines that instantiate the template carry the MSL location of
        // the instantiation, so that clang's "in instantiation of ... requested here" points there.
        var instance = ""
        var call = "    \(k.callee)(\(args.joined(separator: ",\n        ")));"
        if let at = k.instantiatedAt {
            let here = "#line \(at.line) \(cString(at.file))\n"
            let back = "\n#line 1 \"softmetal-generated.cpp\"\n"
            instance = here + "using __sm_fn_\(n) = decltype(&\(k.callee));" + back
            call = here + "    \(k.callee)(\(args.joined(separator: ", ")));" + back
        }
        var maxThreads = "\(k.maxTotalThreadsPerThreadgroup)"
        if let expression = k.maxThreadsExpression {
            // Evaluated by C++, on a line that carries the kernel's MSL location.
            instance += "#line \(k.declaredAt.line) \(cString(k.declaredAt.file))\n"
                + "static constexpr int32_t __sm_max_\(n) = (int32_t)(\(expression));\n#line 1 \"softmetal-generated.cpp\"\n"
            maxThreads = "__sm_max_\(n)"
        }
        return """
        \(instance)static void __sm_body_\(n)(::metal::__sm::Lane* __L) {
            ::metal::__sm::Group* __g = __L->g;
            ::sm_dispatch* __d = __g->d;
            (void)__g; (void)__d;
        \(call)
        }
        extern "C" __attribute__((visibility("default"))) int32_t __sm_launch_\(n)(::sm_dispatch* d) {
            return ::metal::__sm::launch(d, &__sm_body_\(n));
        }
        static const ::sm_param_info __sm_params_\(n)[] = {
            \(infos.joined(separator: ",\n    "))
        };
        extern "C" __attribute__((visibility("default"))) const ::sm_kernel_info* __sm_info_\(n)(void) {
            static const ::sm_kernel_info info = {SM_ABI_VERSION, \(k.parameters.count), __sm_params_\(n), \(maxThreads)};
            return &info;
        }

        """
    }
}

extension StringProtocol {
    var trimmingSpaces: String {
        String(trimmingSpacesSub)
    }
    var trimmingSpacesSub: SubSequence {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        guard let first = firstIndex(where: { !isSpace($0) }) else { return self[endIndex...] }
        let last = lastIndex(where: { !isSpace($0) })!
        return self[first...last]
    }
    /// Identifiers and punctuation separated by spaces: "const  float*x" -> ["const", "float", "*", "x"].
    var splitWords: [String] {
        var words: [String] = []
        var current = ""
        for ch in self {
            if ch.isLetter || ch.isNumber || ch == "_" || ch == ":" || ch == "<" || ch == ">" || ch == "," {
                current.append(ch)
            } else {
                if !current.isEmpty { words.append(current); current = "" }
                if !ch.isWhitespace { words.append(String(ch)) }
            }
        }
        if !current.isEmpty { words.append(current) }
        return words
    }
    func replacingAll(_ target: String, with replacement: String) -> String {
        var result = ""
        var rest = Substring(self)
        while let range = rest.firstRange(ofPlain: target) {
            result += rest[..<range.lowerBound]
            result += replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }
}

extension Substring {
    func firstRange(ofPlain target: String) -> Range<Index>? {
        guard !target.isEmpty else { return nil }
        var i = startIndex
        while i < endIndex {
            if self[i...].hasPrefix(target) {
                return i..<index(i, offsetBy: target.count)
            }
            i = index(after: i)
        }
        return nil
    }
}
#endif
