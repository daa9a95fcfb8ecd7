#if os(Linux)
/// Threadgroup memory: `threadgroup` as an address space becomes `__sm_threadgroup` (see
/// `addressSpaces`), and a variable declared
/// `threadgroup` in a kernel body becomes a reference to storage its threadgroup shares
/// (`metal::__sm::tg_var(slot, sizeof, alignof)`, one slot per declaration).
extension MSLTranslator {
    mutating func threadgroupMemory() throws {
        try walk { t, v in
            guard t.word(v) == "threadgroup", !t.isMember(v.start) else { return nil }
            let end = try t.threadgroup(at: v.start, end: v.end)
            t.claims[v.start] = end
            return end
        }
    }

    /// `threadgroup` as an address space becomes `__sm_threadgroup`; `threadgroup T name[N]...;` declares a
    /// variable the threadgroup shares.
    private mutating func threadgroup(at i: Int, end: Int) throws -> Int {
        // Find the end of the statement or parameter.
        var j = end
        var depth = 0
        while j < text.count {
            let c = text[j]
            if c == Byte.openParen || c == Byte.openBracket || c == Byte.openBrace { depth += 1 }
            if c == Byte.closeParen || c == Byte.closeBracket || c == Byte.closeBrace { if depth == 0 { break }; depth -= 1 }
            if depth == 0 && (c == Byte.semicolon || c == Byte.comma || c == Byte.equals) { break }
            j += 1
        }
        let declaration = string(end, j)
        // `threadgroup T x[N] = {0};` (MLX's layer_norm): Apple's compiler accepts an
        // initializer, but neither the MSL specification nor Metal promises that it runs
        // (an empty initializer leaves threadgroup memory as it was; see README), so it is
        // dropped: the variable starts poisoned like any other until a thread writes it.
        var initializer: (start: Int, end: Int)?
        if j < text.count && text[j] == Byte.equals {
            var k = j + 1
            var nesting = 0
            while k < text.count {
                let c = text[k]
                if c == Byte.openParen || c == Byte.openBracket || c == Byte.openBrace { nesting += 1 }
                if c == Byte.closeParen || c == Byte.closeBracket || c == Byte.closeBrace { if nesting == 0 { break }; nesting -= 1 }
                if nesting == 0 && (c == Byte.semicolon || c == Byte.comma) { break }
                k += 1
            }
            if k < text.count && text[k] == Byte.semicolon { initializer = (j, k) }
        }
        let isStatement = j < text.count && (text[j] == Byte.semicolon || initializer != nil)
        let previous = skipSpaceBack(i - 1)
        let atStatementStart = previous < 0 || Byte.endsStatement(text[previous])
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
                        let arrayType = "\(type) \(dims)"
            let replacement: String
            // A C-style cast: it may change the address space (for the address-space check).
            if dims.isEmpty {
                replacement = "__sm_threadgroup \(type)& \(name) = *(__sm_threadgroup \(type)*)(::metal::__sm::tg_var(\(slot), sizeof(\(type)), alignof(\(type))))"
            } else {
                replacement = "__sm_threadgroup \(type) (&\(name))\(dims) = *(__sm_threadgroup \(type) (*)\(dims))(::metal::__sm::tg_var(\(slot), sizeof(\(arrayType)), alignof(\(type))))"
            }
            edits.append((i, j, replacement + newlines(i, j)))
            if let initializer {
                edits.append((initializer.start, initializer.end, MSLTranslator.blank(text[initializer.start..<initializer.end])))
                return initializer.end
            }
            return j
        }
        if j < text.count && text[j] == Byte.comma && atStatementStart && isVariable {
            throw fail(i, "declare one threadgroup variable per statement")
        }
        edits.append((i, end, "__sm_threadgroup"))
        return end
    }

}
#endif
