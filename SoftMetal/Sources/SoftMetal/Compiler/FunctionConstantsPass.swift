#if os(Linux)
/// Function constants: `constant T name [[function_constant(index)]];` becomes
/// `static constexpr T name = __SM_FC_<index>;` (plus `__sm_fc_defined_<name>`), with the
/// macros defined per specialisation by the library (see `constantsPrefix`);
/// `is_function_constant_defined(name)` becomes `__sm_fc_defined_name`.
extension MSLTranslator {
    /// The types a function constant may have, by their MTLDataType raw values.
    static let functionConstantTypes: [String: UInt] = [
        "bool": 53, "int": 29, "int32_t": 29, "uint": 33, "uint32_t": 33, "unsigned int": 33, "float": 3, "half": 16,
        "short": 37, "int16_t": 37, "ushort": 41, "uint16_t": 41, "char": 45, "int8_t": 45, "uchar": 49, "uint8_t": 49,
        "long": 81, "int64_t": 81, "ulong": 85, "uint64_t": 85,
    ]

    mutating func functionConstants() throws {
        try walk { t, v in
            guard !v.inDirective, let word = t.word(v) else { return nil }
            if word == "constant", !t.isMember(v.start), let end = try t.functionConstant(at: v.start) {
                t.claims[v.start] = end
                return end
            }
            if word == "is_function_constant_defined" {
                let end = try t.functionConstantDefined(at: v.start, end: v.end)
                t.claims[v.start] = end
                return end
            }
            return nil
        }
    }

    /// `constant T name [[function_constant(i)]];` at `start` (nil: another `constant`).
    private mutating func functionConstant(at start: Int) throws -> Int? {
        var end = start
        while end < text.count && !Byte.endsStatement(text[end]) { end += 1 }
        guard end < text.count, text[end] == Byte.semicolon else { return nil }
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
        if let other = declaredConstants.map(\.constant).first(where: { $0.index == index && $0.name != name }) {
            throw fail(start, "function constants \(other.name) and \(name) have the same index \(index)")
        }
        declaredConstants.append((start, FunctionConstant(name: name, type: type, index: index)))
        edits.append((start, end, "static constexpr \(type) \(name) = __SM_FC_\(index); "
                      + "static constexpr bool __sm_fc_defined_\(name) = __SM_FCD_\(index)" + newlines(start, end)))
        return end
    }

    /// The value of an integer constant expression of literals, `+ - * / %` and parentheses
    /// (nil for anything else).
    static func integerExpression(_ text: Substring) -> Int? {
        let chars = Array(text.utf8)
        var i = 0
        func space() { while i < chars.count && (chars[i] == Byte.space || chars[i] == Byte.tab || chars[i] == Byte.newline) { i += 1 } }
        func primary() -> Int? {
            space()
            guard i < chars.count else { return nil }
            if chars[i] == Byte.openParen {
                i += 1
                guard let v = sum() else { return nil }
                space()
                guard i < chars.count, chars[i] == Byte.closeParen else { return nil }
                i += 1
                return v
            }
            if chars[i] == Byte.minus { i += 1; return primary().map { -$0 } }
            if chars[i] == Byte.plus { i += 1; return primary() }
            let start = i
            while i < chars.count && (Byte.isDigit(chars[i]) || Byte.isLetter(chars[i])) { i += 1 }
            var digits = String(decoding: chars[start..<i], as: UTF8.self).lowercased()
            while let last = digits.last, last == "u" || last == "l" { digits.removeLast() }  // 1u, 2ul
            if digits.hasPrefix("0x") { return Int(digits.dropFirst(2), radix: 16) }
            return Int(digits)
        }
        func product() -> Int? {
            guard var v = primary() else { return nil }
            while true {
                space()
                guard i < chars.count, [Byte.star, Byte.slash, Byte.percent].contains(chars[i]) else { return v }
                let op = chars[i]
                i += 1
                guard let r = primary() else { return nil }
                if op == Byte.star { v = v.multipliedReportingOverflow(by: r).overflow ? Int.max : v * r }
                else if r == 0 { return nil }
                else { v = op == Byte.slash ? v / r : v % r }
            }
        }
        func sum() -> Int? {
            guard var v = product() else { return nil }
            while true {
                space()
                guard i < chars.count, chars[i] == Byte.plus || chars[i] == Byte.minus else { return v }
                let op = chars[i]
                i += 1
                guard let r = product() else { return nil }
                v = op == Byte.plus ? v &+ r : v &- r
            }
        }
        guard let v = sum() else { return nil }
        space()
        return i == chars.count ? v : nil
    }

    /// `is_function_constant_defined(name)` -> `__sm_fc_defined_name`.
    private mutating func functionConstantDefined(at start: Int, end: Int) throws -> Int {
        let open = skipSpace(end)
        guard open < text.count, text[open] == Byte.openParen, let close = matching(open),
              let (name, after) = identifier(at: skipSpace(open + 1)), skipSpace(after) == close - 1 else {
            throw fail(start, "is_function_constant_defined needs the name of a function constant")
        }
        guard declaredConstants.contains(where: { $0.constant.name == name }) else {
            throw fail(start, "is_function_constant_defined(\(name)): \(name) is not a function constant declared before this line")
        }
        edits.append((start, close, "__sm_fc_defined_\(name)"))
        return close
    }

}
#endif
