#if os(Linux)
/// The bytes the translator looks for, by name. MSL source is handled as UTF-8 bytes: every
/// character the translator acts on is ASCII, and offsets into the byte array are what the
/// edits and the `#line` bookkeeping count.
enum Byte {
    static let newline = UInt8(ascii: "\n")
    static let carriageReturn = UInt8(ascii: "\r")
    static let tab = UInt8(ascii: "\t")
    static let verticalTab: UInt8 = 0x0B
    static let formFeed: UInt8 = 0x0C
    static let space = UInt8(ascii: " ")
    static let quote = UInt8(ascii: "\"")
    static let apostrophe = UInt8(ascii: "'")
    static let backslash = UInt8(ascii: "\\")
    static let hash = UInt8(ascii: "#")
    static let slash = UInt8(ascii: "/")
    static let star = UInt8(ascii: "*")
    static let percent = UInt8(ascii: "%")
    static let plus = UInt8(ascii: "+")
    static let minus = UInt8(ascii: "-")
    static let bang = UInt8(ascii: "!")
    static let tilde = UInt8(ascii: "~")
    static let equals = UInt8(ascii: "=")
    static let ampersand = UInt8(ascii: "&")
    static let dot = UInt8(ascii: ".")
    static let comma = UInt8(ascii: ",")
    static let colon = UInt8(ascii: ":")
    static let semicolon = UInt8(ascii: ";")
    static let openParen = UInt8(ascii: "(")
    static let closeParen = UInt8(ascii: ")")
    static let openBracket = UInt8(ascii: "[")
    static let closeBracket = UInt8(ascii: "]")
    static let openBrace = UInt8(ascii: "{")
    static let closeBrace = UInt8(ascii: "}")
    static let less = UInt8(ascii: "<")
    static let greater = UInt8(ascii: ">")
    static let underscore = UInt8(ascii: "_")
    static let digitZero = UInt8(ascii: "0")
    static let digitNine = UInt8(ascii: "9")
    static let lowerA = UInt8(ascii: "a")
    static let lowerZ = UInt8(ascii: "z")
    static let upperA = UInt8(ascii: "A")
    static let upperZ = UInt8(ascii: "Z")
    static let lowerE = UInt8(ascii: "e")
    static let upperE = UInt8(ascii: "E")
    static let lowerX = UInt8(ascii: "x")
    static let upperX = UInt8(ascii: "X")
    static let lowerT = UInt8(ascii: "t")

    static func isDigit(_ c: UInt8) -> Bool { c >= digitZero && c <= digitNine }
    static func isLetter(_ c: UInt8) -> Bool { (c >= lowerA && c <= lowerZ) || (c >= upperA && c <= upperZ) }
    static func isIdentStart(_ c: UInt8) -> Bool { isLetter(c) || c == underscore }
    static func isIdent(_ c: UInt8) -> Bool { isIdentStart(c) || isDigit(c) }
    static func isSpace(_ c: UInt8) -> Bool {
        c == space || c == tab || c == newline || c == carriageReturn || c == formFeed || c == verticalTab
    }
    static func isQuote(_ c: UInt8) -> Bool { c == quote || c == apostrophe }
    /// `;`, `{` or `}`: where a declaration or statement ends.
    static func endsStatement(_ c: UInt8) -> Bool { c == semicolon || c == openBrace || c == closeBrace }
}

/// A run of bytes of one kind. The tokens of a text cover it without gaps, so spaces and
/// newlines stay where they are and an edit can be made by byte range.
struct MSLToken {
    enum Kind { case space, comment, literal, number, identifier, punctuation }
    var kind: Kind
    var start: Int
    var end: Int
}

/// Splits MSL into tokens. Two modes, because the translator reads the source twice over:
/// `.source` finds comments (to blank them) in the text as written; `.code` reads the text
/// once comments are blanks, and tells numbers and identifiers apart.
///
/// The two modes end an unterminated literal differently, as the two readings always have:
/// `.source` stops a literal at a newline even after a backslash, `.code` lets a backslash
/// carry it over the newline. After preprocessing no literal spans lines, so this matters only
/// for malformed text, where it must not change what the translator produces.
enum MSLLexer {
    enum Mode { case source, code }

    static func tokens(_ text: [UInt8], mode: Mode) -> [MSLToken] {
        var tokens: [MSLToken] = []
        tokens.reserveCapacity(text.count / 3)
        let n = text.count
        var i = 0
        while i < n {
            let c = text[i]
            let start = i
            let kind: MSLToken.Kind
            if Byte.isSpace(c) {
                while i < n && Byte.isSpace(text[i]) { i += 1 }
                kind = .space
            } else if Byte.isQuote(c) {
                i = mode == .source ? sourceLiteralEnd(text, start) : codeLiteralEnd(text, start)
                kind = .literal
            } else if mode == .source && c == Byte.slash && i + 1 < n && text[i + 1] == Byte.slash {
                while i < n && text[i] != Byte.newline { i += 1 }
                kind = .comment
            } else if mode == .source && c == Byte.slash && i + 1 < n && text[i + 1] == Byte.star {
                i += 2
                while i < n && !(text[i] == Byte.star && i + 1 < n && text[i + 1] == Byte.slash) { i += 1 }
                i = Swift.min(i + 2, n)
                kind = .comment
            } else if mode == .code && startsNumber(text, i) {
                i = numberEnd(text, i)
                kind = .number
            } else if Byte.isIdentStart(c) {
                while i < n && Byte.isIdent(text[i]) { i += 1 }
                kind = mode == .code ? .identifier : .punctuation
            } else {
                i += 1
                kind = .punctuation
            }
            tokens.append(MSLToken(kind: kind, start: start, end: i))
        }
        return tokens
    }

    /// A literal as the comment reader sees it: up to its closing quote, or up to and
    /// including the newline that ends its line.
    private static func sourceLiteralEnd(_ text: [UInt8], _ start: Int) -> Int {
        let quote = text[start]
        var i = start + 1
        while i < text.count && text[i] != quote {
            if text[i] == Byte.backslash { i += 1 }
            if i < text.count && text[i] == Byte.newline { break }
            i += 1
        }
        return Swift.min(i + 1, text.count)
    }

    /// A literal as the code passes see it: an escaped character is skipped whatever it is.
    private static func codeLiteralEnd(_ text: [UInt8], _ start: Int) -> Int {
        let quote = text[start]
        var i = start + 1
        while i < text.count && text[i] != quote && text[i] != Byte.newline {
            if text[i] == Byte.backslash { i += 1 }
            i += 1
        }
        return Swift.min(i + 1, text.count)
    }

    /// A digit, or `.` before a digit, not inside an identifier (`x2.5` is not a number).
    static func startsNumber(_ text: [UInt8], _ i: Int) -> Bool {
        let c = text[i]
        guard Byte.isDigit(c) || (c == Byte.dot && i + 1 < text.count && Byte.isDigit(text[i + 1])) else { return false }
        return i == 0 || !Byte.isIdent(text[i - 1])
    }

    /// A pp-number, roughly: digits, letters (suffixes, hex digits), dots, and a sign right
    /// after a decimal exponent (`1e-5`).
    static func numberEnd(_ text: [UInt8], _ start: Int) -> Int {
        var j = start
        var isHex = false
        if text[j] == Byte.digitZero && j + 1 < text.count && (text[j + 1] == Byte.lowerX || text[j + 1] == Byte.upperX) {
            isHex = true
            j += 2
        }
        while j < text.count {
            let c = text[j]
            guard Byte.isIdent(c) || c == Byte.dot else { break }
            if !isHex && (c == Byte.lowerE || c == Byte.upperE) && j + 1 < text.count
                && (text[j + 1] == Byte.plus || text[j + 1] == Byte.minus) {
                j += 2
                continue
            }
            j += 1
        }
        return j
    }

    /// The first of `tokens` after token `t` that starts at or after `offset` (a pass goes on
    /// there after rewriting a range).
    static func index(in tokens: [MSLToken], atOrAfter offset: Int, from t: Int) -> Int {
        var t = t + 1
        while t < tokens.count && tokens[t].start < offset { t += 1 }
        return t
    }

    /// Comments become spaces (their newlines stay, so every line keeps its number); string
    /// and character literals are left as they are.
    static func blankComments(_ text: [UInt8]) -> [UInt8] {
        var out = text
        for token in tokens(text, mode: .source) where token.kind == .comment {
            for k in token.start..<token.end where text[k] != Byte.newline { out[k] = Byte.space }
        }
        return out
    }
}
#endif
