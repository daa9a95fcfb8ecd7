#if os(Linux)
/// Conversions MSL makes and C++ does not: vector constructors (`float4(a.xy, b, c)`,
/// `float2(int2)`, `float4(x)`) become `metal::__sm::vmake<float4>(...)` (C++ has no such
/// constructors for clang vectors, and a cast would bit-cast); casts to a vector type or to a
/// template's type parameter convert element-wise; `1.0h` becomes `((half)(1.0))`.
extension MSLTranslator {
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
    /// Keywords after which `(T) x` or `T(x)` starts an expression (elsewhere a name before
    /// the parenthesis makes it a call or a declaration: `sizeof(float4)`, `f(float4)`).
    static let expressionKeywords: Set<String> = ["return", "case", "else", "do"]

    /// Words other passes own: a template type parameter cannot be named so in valid MSL,
    /// and in broken MSL these stay theirs.
    static let wordsOfOtherPasses: Set<String> = [
        "kernel", "template", "device", "thread", "constant", "threadgroup", "is_function_constant_defined",
    ]

    /// Scalar types between which MSL converts and clang does not (`__bf16` and `_Float16`):
    /// their casts go through `metal::__sm::scalar_cast`, which converts through float.
    static let halfAndBfloat: Set<String> = ["half", "bfloat", "bfloat16_t"]

    mutating func conversions() throws {
        try walk { t, v in
            guard let word = t.word(v) else { return nil }
            if MSLTranslator.vectorTypes.contains(word) {
                t.vectorConstructor(at: v.start, end: v.end, word: word)
            } else if MSLTranslator.halfAndBfloat.contains(word) {
                t.templateTypeConversion(at: v.start, end: v.end, word: word)
            } else if word == "static_cast" {
                t.staticCast(at: v.start, end: v.end)
            } else if !v.inDirective && t.templateTypeNames.contains(word) && !MSLTranslator.wordsOfOtherPasses.contains(word) {
                t.templateTypeConversion(at: v.start, end: v.end, word: word)
            }
            return nil
        }
    }

    /// `float4(a, b)` and `metal::float4(...)`, `(float4) x`, and `short2 offset(a * n, b);`.
    private mutating func vectorConstructor(at i: Int, end: Int, word: String) {
        let next = skipSpace(end)
        if vectorCast(at: i, end: end, word: word) { return }
        // A declaration with constructor arguments, `short2 offset(a * n, b);` (MLX): becomes
        // `short2 offset = vmake<short2>(a * n, b);`. Not a function declaration: no argument
        // is a parameter declaration (`T name`), and `;` or `,` follows.
        if let (_, nameEnd) = identifier(at: next) {
            let open = skipSpace(nameEnd)
            if open < text.count, text[open] == Byte.openParen, let close = matching(open) {
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
                if after < text.count, text[after] == Byte.semicolon || text[after] == Byte.comma, !declaresParameters, !args.isEmpty {
                    edits.append((nameEnd, nameEnd, " = ::metal::__sm::vmake<::metal::\(word)>"))
                }
            }
            return
        }
        guard next < text.count, text[next] == Byte.openParen else { return }
        var start = i
        let p = skipSpaceBack(i - 1)
        if p >= 0 && (text[p] == Byte.dot || text[p] == Byte.greater) { return }
        if p >= 1 && text[p] == Byte.colon && text[p - 1] == Byte.colon {  // metal::float4(
            let (namespace, k) = identifier(endingAt: skipSpaceBack(p - 2))
            if namespace == "metal" { start = k } else { return }
        } else if p >= 0 && Byte.isIdent(text[p]) {
            if identifier(endingAt: p).word == "operator" { return }
        }
        edits.append((start, end, "::metal::__sm::vmake<::metal::\(word)>"))
    }

    /// The names of the type parameters of every template (`template <typename T, class U>`):
    /// a C-style cast to one of them, `(T) x`, may convert vectors (see vectorCast).
    mutating func collectTemplateTypeNames() {
        var names = Set<String>()
        var k = 0
        while k < text.count {
            guard text[k] == Byte.lowerT, k == 0 || !Byte.isIdent(text[k - 1]),
                  let (word, end) = identifier(at: k) else { k += 1; continue }
            k = end
            guard word == "template" else { continue }
            let open = skipSpace(end)
            guard open < text.count, text[open] == Byte.less, let close = matchingAngle(open) else { continue }
            for part in MSLTranslator.splitTopLevel(string(open + 1, close - 1)) {
                let words = part.prefix { $0 != "=" }.splitWords
                if words.count == 2, words[0] == "typename" || words[0] == "class" { names.insert(words[1]) }
            }
        }
        templateTypeNames = names
    }

    /// `(T) x` and `T(x)` with T a template's type parameter: when T is a vector type in an
    /// instance, MSL converts element-wise (`T(x > 0)`, `s2_t(half2v)` with s2_t = float2),
    /// which clang's vectors do not; `::metal::__sm::construct<T>(x)` does (other types: `T(x)`).
    private mutating func templateTypeConversion(at i: Int, end: Int, word: String) {
        if vectorCast(at: i, end: end, word: word, qualified: false) { return }
        let next = skipSpace(end)
        guard next < text.count, text[next] == Byte.openParen else { return }
        let p = skipSpaceBack(i - 1)
        if p >= 0 && [Byte.dot, Byte.greater, Byte.colon, Byte.less].contains(text[p]) { return }  // . -> :: <
        if p >= 0 && Byte.isIdent(text[p]) {
            guard MSLTranslator.expressionKeywords.contains(identifier(endingAt: p).word) else { return }
        }
        edits.append((i, end, "::metal::__sm::construct<\(word)>"))
    }

    /// `static_cast<U>(x)` with U half, bfloat or a template's type parameter (MLX's
    /// `cast_to<half>(bfloat)`) becomes `::metal::__sm::scalar_cast<U>(x)`.
    private mutating func staticCast(at i: Int, end: Int) {
        let open = skipSpace(end)
        guard open < text.count, text[open] == Byte.less, let close = matchingAngle(open) else { return }
        let target = string(open + 1, close - 1).trimmingSpaces
        guard MSLTranslator.halfAndBfloat.contains(target) || templateTypeNames.contains(target) else { return }
        edits.append((i, end, "::metal::__sm::scalar_cast"))
    }

    /// `(half4) x`: MSL converts element-wise (C would bit-cast, or reject vectors of
    /// different sizes). Becomes `::metal::__sm::vcast<::metal::half4>() ->* x`: `->*` binds
    /// tighter than every binary operator and looser than the unary ones, as the cast does.
    private mutating func vectorCast(at i: Int, end: Int, word: String, qualified: Bool = true) -> Bool {
        let open = skipSpaceBack(i - 1)
        let close = skipSpace(end)
        guard open >= 0, text[open] == Byte.openParen, close < text.count, text[close] == Byte.closeParen else { return false }
        let operand = skipSpace(close + 1)
        guard operand < text.count else { return false }
        let c = text[operand]
        // An operand follows: a name, a number, `(`, or a unary operator.
        let startsOperand = Byte.isIdent(c) || [Byte.openParen, Byte.dot, Byte.minus, Byte.plus, Byte.bang, Byte.tilde, Byte.star].contains(c)
        guard startsOperand else { return false }
        let before = skipSpaceBack(open - 1)
        if before >= 0 && Byte.isIdent(text[before]) {
            // `sizeof(float4)`, `f(float4)`...: only keywords that precede an expression.
            guard MSLTranslator.expressionKeywords.contains(identifier(endingAt: before).word) else { return false }
        }
        if before >= 0 && (text[before] == Byte.closeParen || text[before] == Byte.closeBracket) { return false }  // `) (` `] (`
        edits.append((open, close + 1, "::metal::__sm::vcast<\(qualified ? "::metal::" : "")\(word)>() ->*"
                      + MSLTranslator.blank(text[open..<(close + 1)]).filter { $0 == "\n" }))
        return true
    }

    /// Numbers: a literal with an `h` suffix becomes a half.
    /// Numbers: a literal with an `h` suffix becomes a half.
    mutating func halfLiterals() throws {
        try walk { t, v in
            guard v.token.kind == .number else { return nil }
            let literal = t.string(v.start, v.end)
            let isHex = literal.hasPrefix("0x") || literal.hasPrefix("0X")
            if !isHex, let last = literal.last, last == "h" || last == "H" {
                t.edits.append((v.start, v.end, "((half)(\(literal.dropLast())))"))
            }
            return nil
        }
    }


}
#endif
