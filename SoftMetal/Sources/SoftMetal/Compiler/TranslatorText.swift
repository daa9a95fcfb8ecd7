#if os(Linux)
/// Reading around a position of the translator's text: the passes find a token with the
/// lexer's walk, then look back and ahead from it (the name before a `(`, the bracket that
/// closes one, the start of the declaration) with these.
extension MSLTranslator {
    /// Text between a and b; empty for an empty or inverted range, so that no malformed
    /// source can make a slice trap.
    func string(_ a: Int, _ b: Int) -> String {
        let a = Swift.max(0, a), b = Swift.min(text.count, b)
        return a < b ? String(decoding: text[a..<b], as: UTF8.self) : ""
    }

    func skipSpace(_ i: Int) -> Int {
        var i = i
        while i < text.count && Byte.isSpace(text[i]) { i += 1 }
        return i
    }

    /// The index of the previous non-space byte, or -1.
    func skipSpaceBack(_ i: Int) -> Int {
        var i = i
        while i >= 0 && Byte.isSpace(text[i]) { i -= 1 }
        return i
    }

    func identifier(at i: Int) -> (String, Int)? {
        guard i < text.count, Byte.isIdentStart(text[i]) else { return nil }
        var j = i
        while j < text.count && Byte.isIdent(text[j]) { j += 1 }
        return (string(i, j), j)
    }

    /// The identifier that ends at `last` (inclusive) and where it starts: the word before a
    /// `(` or a `::`.
    func identifier(endingAt last: Int) -> (word: String, start: Int) {
        var k = last
        while k >= 0 && Byte.isIdent(text[k]) { k -= 1 }
        return (string(k + 1, last + 1), k + 1)
    }

    /// Index just past the bracket that closes the one at `open` (`(`, `[` or `{`).
    func matching(_ open: Int) -> Int? {
        let o = text[open]
        let c = o == Byte.openParen ? Byte.closeParen : (o == Byte.openBracket ? Byte.closeBracket : Byte.closeBrace)
        var depth = 0
        var i = open
        while i < text.count {
            let ch = text[i]
            if Byte.isQuote(ch) {
                i += 1
                while i < text.count && text[i] != ch { if text[i] == Byte.backslash { i += 1 }; i += 1 }
            } else if ch == o { depth += 1 } else if ch == c {
                depth -= 1
                if depth == 0 { return i + 1 }
            }
            i += 1
        }
        return nil
    }

    /// Index just past the `>` that closes the `<` at `open` (parentheses nest; `a > b` in a
    /// template argument must be parenthesised, as in C++).
    func matchingAngle(_ open: Int) -> Int? {
        var depth = 0
        var parens = 0
        var i = open
        while i < text.count {
            switch text[i] {
            case Byte.openParen, Byte.openBracket: parens += 1
            case Byte.closeParen, Byte.closeBracket: parens -= 1
            case Byte.less where parens == 0: depth += 1
            case Byte.greater where parens == 0:
                depth -= 1
                if depth == 0 { return i + 1 }
            case Byte.semicolon, Byte.openBrace, Byte.closeBrace: return nil
            default: break
            }
            i += 1
        }
        return nil
    }

    /// `name<args>` at i: the name, the arguments' text and the index past `>`.
    func templateId(_ i: Int) -> (String, String, Int)? {
        guard let (name, after) = identifier(at: i) else { return nil }
        let open = skipSpace(after)
        guard open < text.count, text[open] == Byte.less, let close = matchingAngle(open) else { return nil }
        return (name, string(open + 1, close - 1).trimmingSpaces, close)
    }

    /// After `.` or `->`: a member's name, not a keyword.
    func isMember(_ i: Int) -> Bool {
        let p = skipSpaceBack(i - 1)
        return p >= 0 && (text[p] == Byte.dot || (text[p] == Byte.greater && p > 0 && text[p - 1] == Byte.minus))
    }

    /// The start of the declaration whose text ends at `p` (back over balanced brackets to
    /// `;`, `{`, `}` or an access label `public:`), and the `(` of its last top-level
    /// parenthesized group (the parameter list when `p` is its `)`; -1 if none).
    func declarationStart(before p: Int) -> (start: Int, open: Int) {
        var s = p
        var depth = 0
        var open = -1
        while s >= 0 {
            let ch = text[s]
            if ch == Byte.closeParen || ch == Byte.closeBracket { depth += 1 } else if ch == Byte.openParen || ch == Byte.openBracket {
                depth -= 1
                if depth == 0 && ch == Byte.openParen && open < 0 { open = s }
            } else if depth == 0 && Byte.endsStatement(ch) { break }
            else if depth == 0 && ch == Byte.colon && s > 0 && text[s - 1] != Byte.colon
                        && (s + 1 >= text.count || text[s + 1] != Byte.colon) {
                let label = identifier(endingAt: skipSpaceBack(s - 1)).word
                if ["public", "private", "protected"].contains(label) { break }
            }
            s -= 1
        }
        return (s + 1, open)
    }

    /// The MSL file and line of a position, following the `# N "file"` / `#line N "file"`
    /// markers that the preprocessor leaves (without markers: source.metal, counted lines).
    static func location(in text: [UInt8], at index: Int) -> SourceLocation {
        var location = SourceLocation(file: sourceName, line: 1)
        var lineStart = 0
        for i in 0..<min(index, text.count) where text[i] == Byte.newline {
            if let marker = lineMarker(text[lineStart..<i]) {
                location = marker
            } else {
                location.line += 1
            }
            lineStart = i + 1
        }
        return location
    }

    /// The MSL file and line of a position (as `location(in:at:)`), from the line table once
    /// tokens are read.
    func location(at index: Int) -> SourceLocation {
        guard !lines.isEmpty else { return MSLTranslator.location(in: text, at: index) }
        var (low, high) = (0, lines.count - 1)  // the last line that starts at or before index
        while low < high {
            let mid = (low + high + 1) / 2
            if lines[mid].start <= index { low = mid } else { high = mid - 1 }
        }
        return lines[low].location
    }

    /// `lineMarker` for a line that starts with `#` (after spaces), without making a String of
    /// every other line.
    static func lineMarkerIfDirective(_ line: ArraySlice<UInt8>) -> SourceLocation? {
        guard let first = line.first(where: { $0 != Byte.space && $0 != Byte.tab && $0 != Byte.newline && $0 != Byte.carriageReturn }),
              first == Byte.hash else { return nil }
        return lineMarker(line)
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

    func fail(_ at: Int, _ message: String) -> SoftMetalError {
        let l = location(at: at)
        return .compile("\(l.file):\(l.line): error: \(message)")
    }

    // MARK: edits that keep lines

    /// Same length, newlines kept.
    static func blank(_ s: ArraySlice<UInt8>) -> String {
        String(decoding: s.map { $0 == Byte.newline ? Byte.newline : Byte.space }, as: UTF8.self)
    }

    /// Blanks [a, b) of the text itself (for the passes that run before tokens are read).
    mutating func blankInPlace(_ a: Int, _ b: Int) {
        for k in a..<b where text[k] != Byte.newline { text[k] = Byte.space }
    }

    /// Replaces [a, b) by `word` and blanks, keeping its newlines (lines stay in place).
    mutating func replaceKeepingLines(_ a: Int, _ b: Int, with word: String) {
        let region = text[a..<b]
        let n = word.utf8.count
        if region.count >= n && !region.prefix(n).contains(Byte.newline) {
            edits.append((a, b, word + MSLTranslator.blank(region.dropFirst(n))))
        } else {
            edits.append((a, b, word + " " + MSLTranslator.blank(region)))
        }
    }

    /// As many newlines as [a, b) holds: appended to a replacement that spans lines.
    func newlines(_ a: Int, _ b: Int) -> String {
        String(repeating: "\n", count: text[a..<b].filter { $0 == Byte.newline }.count)
    }

    // MARK: text of declarations

    static func symbol(for name: String) -> String {
        let bytes = Array(name.utf8)
        if let first = bytes.first, Byte.isIdentStart(first), bytes.allSatisfy(Byte.isIdent) { return name }
        return "x" + bytes.map { String($0, radix: 16) }.joined()
    }

    static func compact(_ s: String) -> String { String(s.filter { !$0.isWhitespace }) }

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
