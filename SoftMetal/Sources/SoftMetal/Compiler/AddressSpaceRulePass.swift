#if os(Linux)
/// Apple's compiler refuses a pointer or reference type whose pointee names no address space
/// (`error: pointer type must have explicit address space qualifier`, `reference type ...`)
/// wherever the type is written: parameters of helpers, locals, struct members, return
/// types, casts (`(float*)p`, `static_cast<float*>`), template arguments. Here every pointer
/// reaches all memory, so without this rule a helper `float first(const float* p)` called
/// with a `device` pointer would run here and fail on every Mac.
///
/// Not refused, as on Apple: a pointee whose type is deduced or dependent (`auto&`, `T*` with
/// `T` a template's type parameter, which carries the address space of its argument,
/// `decltype(x)&`, `typename X::type*`), pointers to functions (`void (*f)(...)`), `this`
/// (its address space is the member function's qualifier, `thread` by default), and what is
/// not a type at all (`a * b`, `&x`, `*p`). Kernel parameters are the kernel-signature
/// pass's (it names the kernel). Also here: `coherent(device)`, an MSL 3.2 qualifier.
extension MSLTranslator {
    static let scalarTypeNames: Set<String> = [
        "bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "float", "bfloat",
        "void", "size_t", "ptrdiff_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
        "uint32_t", "uint64_t", "unsigned", "signed", "mem_flags", "memory_order", "thread_scope",
    ]
    /// Words of a type that are not its name.
    static let typeWords: Set<String> = ["const", "volatile", "struct", "class", "enum", "union", "typename", "unsigned", "signed", "auto"]
    /// Class templates of MSL whose instances are types (`vec<float, 4>& v`).
    static let typeTemplateNames: Set<String> = ["vec", "array", "matrix", "atomic", "packed_vec", "simdgroup_matrix", "uniform"]
    static let vectorElementNames = ["bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "float", "bfloat"]

    /// MSL's own type names: scalars, vectors (`float4`, `packed_half3`), matrices
    /// (`float4x4`), simdgroup matrices and atomics.
    static func isMSLTypeName(_ w: String) -> Bool {
        if scalarTypeNames.contains(w) { return true }
        var s = Substring(w)
        if s.hasPrefix("atomic_") { return vectorElementNames.contains(String(s.dropFirst(7))) }
        if s.hasPrefix("simdgroup_") { s = s.dropFirst(10); return ["float8x8", "half8x8", "bfloat8x8"].contains(String(s)) }
        if s.hasPrefix("packed_") { s = s.dropFirst(7) }
        guard let element = vectorElementNames.first(where: { s.hasPrefix($0) }) else { return false }
        let rest = s.dropFirst(element.count)
        if ["2", "3", "4", "8", "16"].contains(String(rest)) { return true }
        let dims = rest.split(separator: "x", omittingEmptySubsequences: false)
        return dims.count == 2 && dims.allSatisfy { ["2", "3", "4"].contains(String($0)) }
    }

    /// Names the source declares as types: structs, classes, unions and enums (by their
    /// definitions or declarations), `typedef ... name;` and `using name = ...;`.
    func declaredTypeNames() -> Set<String> {
        var names = Set<String>()
        var k = 0
        while k < text.count {
            guard Byte.isIdentStart(text[k]), k == 0 || !Byte.isIdent(text[k - 1]), let (word, end) = identifier(at: k) else {
                k += 1
                continue
            }
            k = end
            switch word {
            case "struct", "class", "union", "enum":
                var q = skipSpace(end)
                if let (w, e) = identifier(at: q), w == "class" || w == "struct" { q = skipSpace(e) }
                guard let (name, e) = identifier(at: q) else { continue }
                let after = skipSpace(e)
                // `template <class T>`: a parameter, followed by `>`, `,` or `=`.
                if after < text.count, [Byte.openBrace, Byte.colon, Byte.semicolon, Byte.less].contains(text[after])
                    || identifier(at: after)?.0 == "final" {
                    names.insert(name)
                }
            case "using":
                let q = skipSpace(end)
                if let (name, e) = identifier(at: q), name != "namespace", skipSpace(e) < text.count, text[skipSpace(e)] == Byte.equals {
                    names.insert(name)
                }
            case "typedef":
                var j = end
                var depth = 0
                while j < text.count {
                    let c = text[j]
                    if c == Byte.openBrace || c == Byte.openParen || c == Byte.openBracket { depth += 1 }
                    else if c == Byte.closeBrace || c == Byte.closeParen || c == Byte.closeBracket { depth -= 1 }
                    else if c == Byte.semicolon && depth <= 0 { break }
                    j += 1
                }
                let p = skipSpaceBack(j - 1)
                if p >= 0 && Byte.isIdent(text[p]) { names.insert(identifier(endingAt: p).word) }
            default:
                break
            }
        }
        return names
    }

    /// The `<` that opens the template argument list closed by the `>` at `close`, or nil.
    private func matchingAngleBack(_ close: Int) -> Int? {
        var depth = 0
        var parens = 0
        var k = close
        while k >= 0 {
            switch text[k] {
            case Byte.closeParen, Byte.closeBracket: parens += 1
            case Byte.openParen, Byte.openBracket: parens -= 1; if parens < 0 { return nil }
            case Byte.greater where parens == 0: depth += 1
            case Byte.less where parens == 0:
                depth -= 1
                if depth == 0 { return k }
            case Byte.semicolon, Byte.openBrace, Byte.closeBrace: return nil
            default: break
            }
            k -= 1
        }
        return nil
    }

    /// `coherent(device)` (MSL 3.2: device memory whose writes other threadgroups of the
    /// dispatch see) is blanked in place, every pointer here being coherent; where it was is
    /// kept, so that a library compiled for an older MSL version is refused as Apple's
    /// compiler refuses it (`versionErrors`).
    mutating func blankCoherent() {
        let tokens = MSLLexer.tokens(text, mode: .code)
        for (t, token) in tokens.enumerated() where token.kind == .identifier && string(token.start, token.end) == "coherent" {
            let open = skipSpace(token.end)
            guard open < text.count, text[open] == Byte.openParen, let close = matching(open),
                  string(open + 1, close - 1).trimmingSpaces == "device", t == 0 || !isMember(token.start) else { continue }
            versionGated.append((token.start, "coherent(device)", 320))
            coherentAt.append(token.start)
            blankInPlace(token.start, close)
        }
    }

    /// Errors for what the source uses that `metalVersion` does not have, earliest first.
    static func versionErrors(_ gated: [Output.VersionGated], metalVersion: Int) -> String? {
        let refused = gated.filter { metalVersion < $0.allowedFrom }
        guard !refused.isEmpty else { return nil }
        let version = "\(metalVersion / 100).\(metalVersion % 100 / 10)"
        return refused.prefix(8).map { g in
            "\(g.location.file):\(g.location.line): error: MSL \(version) does not have \(g.what) (MSL \(g.allowedFrom / 100).\(g.allowedFrom % 100 / 10) and later do)"
        }.joined(separator: "\n")
    }

    mutating func addressSpaceRule() throws {
        let declared = declaredTypeNames()
        let deduced: Set<String> = ["auto", "decltype", "typename", "this"]
        try walk { t, v in
            guard !v.inDirective, v.token.kind == .punctuation else { return nil }
            let c = t.text[v.start]
            guard c == Byte.star || c == Byte.ampersand else { return nil }
            let next = v.start + 1 < t.text.count ? t.text[v.start + 1] : 0
            let prev = v.start > 0 ? t.text[v.start - 1] : 0
            // `&&`, `*=`, `&=`, `->*`, `.*`: operators (and rvalue references, forwarding ones in templates).
            if next == Byte.equals || next == Byte.ampersand || prev == Byte.ampersand || prev == Byte.minus || prev == Byte.dot { return nil }
            // The type before it, nearest first: words and `<...>` groups (as "<>", their
            // template's name after them), across `::`. A word belongs to the type if it is a
            // qualifier or a type's name, or names the scope (`metal::`) or the template
            // (`vec<...>`) after it; `static`, `return`, `METAL_FUNC` or any other word ends it.
            var words: [String] = []
            var typeStart = v.start
            var k = t.skipSpaceBack(v.start - 1)
            var qualifies = false
            while k >= 0 {
                let ch = t.text[k]
                if Byte.isIdent(ch) {
                    let (w, s) = t.identifier(endingAt: k)
                    guard !w.isEmpty, Byte.isIdentStart(t.text[s]) else { break }
                    guard qualifies || MSLTranslator.typeWords.contains(w) || MSLTranslator.addressSpaceNames.contains(w)
                            || MSLTranslator.isMSLTypeName(w) || declared.contains(w) || t.templateTypeNames.contains(w) else { break }
                    words.append(w)
                    typeStart = s
                    qualifies = false
                    k = t.skipSpaceBack(s - 1)
                } else if ch == Byte.greater, let open = t.matchingAngleBack(k) {
                    words.append("<>")
                    qualifies = true
                    k = t.skipSpaceBack(open - 1)
                } else if ch == Byte.colon && k > 0 && t.text[k - 1] == Byte.colon {
                    qualifies = true
                    k = t.skipSpaceBack(k - 2)
                } else {
                    break
                }
            }
            // The type the `*`/`&` applies to: the nearest word that is not a cv-qualifier.
            guard let nearest = words.first(where: { $0 != "const" && $0 != "volatile" }) else { return nil }
            let isType: Bool
            if nearest == "<>" {
                guard let i = words.firstIndex(of: "<>"), i + 1 < words.count else { return nil }
                let name = words[i + 1]
                isType = MSLTranslator.typeTemplateNames.contains(name) || declared.contains(name)
            } else {
                isType = MSLTranslator.isMSLTypeName(nearest) || declared.contains(nearest)
            }
            guard isType else { return nil }
            if words.contains(where: { MSLTranslator.addressSpaceNames.contains($0) }) { return nil }
            if words.contains(where: { deduced.contains($0) || t.templateTypeNames.contains($0) }) { return nil }
            let kind = c == Byte.star ? "pointer" : "reference"
            let type = t.string(typeStart, v.end).split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" }).joined(separator: " ")
            throw t.fail(v.start, "\(kind) type must have explicit address space qualifier: `\(type)` (write device, constant, threadgroup or thread before the type it \(c == Byte.star ? "points to" : "refers to"), as Apple's compiler requires)")
        }
    }
}
#endif
