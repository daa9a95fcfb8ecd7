#if os(Linux)
/// MSL's address spaces (`device`, `constant`, `thread`, `threadgroup`). Here every pointer
/// reaches all memory, so they are dropped (`constant` becomes `const`), and where C++ would
/// then see two declarations of one thing, the first is kept. `threadgroup` variables in
/// kernel bodies are the threadgroup-memory pass's.
extension MSLTranslator {
    static let addressSpaceNames: Set<String> = ["thread", "threadgroup", "device", "constant"]

    /// Member functions qualified by the address space of `this` (`void f() const thread`,
    /// `complex_t() threadgroup : re(0) {}`), as MLX writes them: MSL overloads on it, C++
    /// cannot, and here every object is ordinary memory. The qualifier is dropped; of the
    /// overloads of one member that then coincide (same head and cv-qualifiers), the first is
    /// kept and the others are blanked (lines kept). `f() constant` without `const` becomes
    /// `const` (a `constant` object is a const one here), except on a constructor.
    mutating func memberAddressSpaces() {
        let tokens = MSLLexer.tokens(text, mode: .code)
        var seen = Set<String>()
        var t = 0
        while t < tokens.count {
            let token = tokens[t]
            t += 1
            guard token.kind == .identifier else { continue }
            let (i, end) = (token.start, token.end)
            let word = string(i, end)
            guard MSLTranslator.addressSpaceNames.contains(word) else { continue }
            // Qualifier position: `) [const] SPACE [const]` followed by `{ : ; =`.
            var p = skipSpaceBack(i - 1)
            var cv: [String] = []
            if p >= 4, string(p - 4, p + 1) == "const", p < 5 || !Byte.isIdent(text[p - 5]) {
                cv.append("const")
                p = skipSpaceBack(p - 5)
            }
            guard p >= 0, text[p] == Byte.closeParen else { continue }
            var q = skipSpace(end)
            if let (next, after) = identifier(at: q), next == "const" { cv.append("const"); q = skipSpace(after) }
            guard q < text.count, [Byte.openBrace, Byte.colon, Byte.semicolon, Byte.equals].contains(text[q]),
                  !(text[q] == Byte.colon && q + 1 < text.count && text[q + 1] == Byte.colon) else { continue }
            let (declStart, _) = declarationStart(before: p)
            // The enclosing scope (its `{`) and, for a constructor, the class name.
            var e = declStart - 1
            var depth = 0
            while e >= 0 {
                if text[e] == Byte.closeBrace { depth += 1 } else if text[e] == Byte.openBrace { if depth == 0 { break }; depth -= 1 }
                e -= 1
            }
            var className = ""
            if e > 0 {  // `struct NAME ... {` (no `;` `{` `}` between the keyword and the brace)
                var w = e - 1
                while w >= 0 && !Byte.endsStatement(text[w]) {
                    if Byte.isIdentStart(text[w]), w == 0 || !Byte.isIdent(text[w - 1]),
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
                if text[open] == Byte.closeParen { depth += 1 } else if text[open] == Byte.openParen { depth -= 1; if depth == 0 { break } }
                open -= 1
            }
            let isConstructor = !className.isEmpty && identifier(endingAt: skipSpaceBack(open - 1)).word == className
            // The declaration's end: `;`, or the body after a constructor's initializers.
            var k = q
            if text[k] == Byte.colon {  // member initializers: `name(...)`, `name{...}`, `Base<T>(...)`, ...
                k += 1
                while k < text.count {
                    k = skipSpace(k)
                    while k < text.count && (Byte.isIdent(text[k]) || text[k] == Byte.colon || Byte.isSpace(text[k]) || text[k] == Byte.less) {
                        if text[k] == Byte.less { guard let m = matchingAngle(k) else { break }; k = m } else { k += 1 }
                    }
                    guard k < text.count, text[k] == Byte.openParen || text[k] == Byte.openBrace, let m = matching(k) else { break }
                    k = skipSpace(m)
                    if k < text.count && text[k] == Byte.comma { k += 1; continue }
                    break
                }
            }
            var declEnd = k
            if k < text.count && text[k] == Byte.openBrace, let m = matching(k) { declEnd = m }
            else { while declEnd < text.count && text[declEnd] != Byte.semicolon { declEnd += 1 }; declEnd += 1 }
            declEnd = Swift.min(declEnd, text.count)
            let key = "\(e)|" + MSLTranslator.compact(string(declStart, p + 1)) + "|" + cv.joined(separator: " ")
                + (word == "constant" && cv.isEmpty && !isConstructor ? "const" : "")
            if seen.contains(key) {
                blankInPlace(declStart, declEnd)
                t = MSLLexer.index(in: tokens, atOrAfter: declEnd, from: t - 1)
                continue
            }
            seen.insert(key)
            blankInPlace(i, end)
            if word == "constant" && cv.isEmpty && !isConstructor {
                text.replaceSubrange(i..<i + 5, with: Array("const".utf8))
            }
        }
    }

    /// Functions overloaded on the address space of a parameter (`operator+=(thread
    /// complex_t<T>& a, ...)`, `threadgroup`, `device` versions, MLX's complex.h): without
    /// address spaces their heads coincide, which C++ rejects. The first definition of each
    /// head (per scope) is kept; later ones whose head differs only in address spaces are
    /// blanked (lines kept). Every pointer and reference reaches all memory here.
    mutating func addressSpaceOverloads() {
        let statements: Set<String> = ["if", "for", "while", "switch", "catch", "return", "else", "do"]
        let tokens = MSLLexer.tokens(text, mode: .code)
        var seen = Set<String>()
        var stack: [Int] = []
        var t = 0
        while t < tokens.count {
            let token = tokens[t]
            t += 1
            guard token.kind == .punctuation else { continue }
            let i = token.start
            if text[i] == Byte.closeBrace { _ = stack.popLast(); continue }
            guard text[i] == Byte.openBrace else { continue }
            let p = skipSpaceBack(i - 1)
            // A class template's partial specializations on address spaces (MLX's
            // steel/utils/type_traits.h: `pointer_element<thread T*>`, `<device T*>`...)
            // coincide too: the first is kept, as for functions.
            if p >= 0, text[p] == Byte.greater {
                let declStart = declarationStart(before: p).start
                let (words, hasSpace) = headWords(declStart, i)
                guard hasSpace, words.first == "template", words.contains("struct") || words.contains("class"),
                      let end = matching(i) else { stack.append(i); continue }
                let key = "\(stack.last ?? -1)|" + words.joined(separator: " ")
                if seen.contains(key) { blankInPlace(declStart, end) } else { seen.insert(key) }
                t = MSLLexer.index(in: tokens, atOrAfter: end, from: t - 1)
                continue
            }
            guard p >= 0, text[p] == Byte.closeParen else { stack.append(i); continue }
            let (declStart, open) = declarationStart(before: p)
            // A function: an identifier (not a statement keyword) or an operator before `(`.
            var isFunction = false
            if open > 0 {
                let (name, ns) = identifier(endingAt: skipSpaceBack(open - 1))
                if !name.isEmpty { isFunction = !statements.contains(name) && !Byte.isDigit(text[ns]) }
                else { isFunction = string(declStart, open).contains("operator") }
            }
            let (words, hasSpace) = headWords(declStart, i)
            guard isFunction, hasSpace, let first = words.first, !statements.contains(first), let end = matching(i) else {
                stack.append(i); continue
            }
            let key = "\(stack.last ?? -1)|" + words.joined(separator: " ")
            if seen.contains(key) {
                var name = identifier(endingAt: skipSpaceBack(open - 1)).word
                let head = Substring(MSLTranslator.compact(string(declStart, open)))
                if name.isEmpty, let r = head.firstRange(ofPlain: "operator") { name = "operator" + head[r.upperBound...] }
                addressSpaceOverloadNames.insert(name)
                blankInPlace(declStart, end)
            } else {
                seen.insert(key)
            }
            t = MSLLexer.index(in: tokens, atOrAfter: end, from: t - 1)  // the body: no overloads inside a function
        }
    }

    /// What an address-space word becomes: `thread` (the default address space) is dropped,
    /// `device` and `threadgroup` become the runtime's macros, `constant` also `const`
    /// (prelude.h: empty in the build, clang address spaces in the address-space check).
    static func addressSpaceReplacement(_ word: String) -> String? {
        switch word {
        case "thread": return "      "
        case "device": return "__sm_device"
        case "threadgroup": return "__sm_threadgroup"
        case "constant": return "const __sm_constant"
        default: return nil
        }
    }

    /// The words of a declaration's head in [a, b) without its address spaces, and whether it had any.
    private func headWords(_ a: Int, _ b: Int) -> (words: [String], hasSpace: Bool) {
        var words: [String] = []
        var k = a
        var hasSpace = false
        while k < b {
            if Byte.isIdentStart(text[k]), k == 0 || !Byte.isIdent(text[k - 1]), let (w, e) = identifier(at: k) {
                if MSLTranslator.addressSpaceNames.contains(w) { hasSpace = true } else { words.append(w) }
                k = e
            } else {
                if !Byte.isSpace(text[k]) { words.append(String(UnicodeScalar(text[k]))) }
                k += 1
            }
        }
        return (words, hasSpace)
    }

    /// `device`, `thread` and `constant` replaced (a function constant's `constant` is that
    /// pass's, `threadgroup` the threadgroup-memory pass's), outside member names (`x.device`).
    mutating func addressSpaces() throws {
        try walk { t, v in
            guard let word = t.word(v), word != "threadgroup", let replacement = MSLTranslator.addressSpaceReplacement(word),
                  !t.isMember(v.start) else { return nil }
            t.edits.append((v.start, v.end, replacement))
            t.arrayParameterToPointer(after: v.end)
            return nil
        }
    }

    /// A parameter declared as an array in an address space (`constant const int64_t
    /// strides[2]`, MLX's): C++ adjusts it to a pointer, `constant const int64_t* strides`,
    /// which is what this writes, since clang refuses an address space on an array parameter
    /// ("parameter may not be qualified with an address space") in the address-space check.
    /// `end`: just past the address-space word of the parameter.
    mutating func arrayParameterToPointer(after end: Int) {
        // A parameter: `(` or `,` before its specifiers.
        var p = skipSpaceBack(end - 1)
        while p >= 0 && (Byte.isIdent(text[p]) || text[p] == Byte.colon || Byte.isSpace(text[p])) { p -= 1 }
        guard p >= 0, text[p] == Byte.openParen || text[p] == Byte.comma else { return }
        // Its end: `,` or `)` outside brackets; attribute lists `[[...]]` stepped over.
        var k = end
        var depth = 0
        var last = -1  // the last non-space byte of the declarator, outside attributes
        while k < text.count {
            let c = text[k]
            if c == Byte.openBracket && k + 1 < text.count && text[k + 1] == Byte.openBracket && depth == 0 {
                k = attributeEnd(k)
                continue
            }
            if c == Byte.openParen || c == Byte.openBracket || c == Byte.less { depth += 1 }
            else if c == Byte.closeParen || c == Byte.closeBracket || c == Byte.greater {
                if depth == 0 { break }
                depth -= 1
            } else if depth == 0 && (c == Byte.comma || Byte.endsStatement(c) || c == Byte.equals) { break }
            if !Byte.isSpace(c) { last = k }
            k += 1
        }
        guard last > end, text[last] == Byte.closeBracket, k < text.count, text[k] == Byte.comma || text[k] == Byte.closeParen else { return }
        var open = last
        while open > end && text[open] != Byte.openBracket { open -= 1 }
        let nameEnd = skipSpaceBack(open - 1)
        guard text[open] == Byte.openBracket, nameEnd > end, Byte.isIdent(text[nameEnd]) else { return }
        let name = identifier(endingAt: nameEnd)
        guard !name.word.isEmpty, !string(end, name.start).contains("*"), !string(end, name.start).contains("&") else { return }
        edits.append((name.start, name.start, "*"))
        edits.append((open, last + 1, MSLTranslator.blank(text[open...last])))
    }

    /// The address-space words replaced in [a, b): for the parameter list of a kernel
    /// template's head, which the walk steps over.
    mutating func dropAddressSpaces(_ a: Int, _ b: Int) {
        var k = a
        while k < b {
            guard Byte.isIdentStart(text[k]), k == 0 || !Byte.isIdent(text[k - 1]),
                  let (word, end) = identifier(at: k) else { k += 1; continue }
            if let replacement = MSLTranslator.addressSpaceReplacement(word) {
                edits.append((k, end, replacement))
            }
            k = end
        }
    }
}
#endif
