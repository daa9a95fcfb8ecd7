/// A JSON value: what safetensors headers, config.json and the shard index need. Parsed
/// here rather than with Foundation, which the library does not link (it would add more
/// than 10 MB of runtime to the Python package for three small files).
enum JSON: Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    subscript(key: String) -> JSON? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    var object: [String: JSON]? { if case .object(let o) = self { return o }; return nil }
    var array: [JSON]? { if case .array(let a) = self { return a }; return nil }
    var string: String? { if case .string(let s) = self { return s }; return nil }
    var bool: Bool? { if case .bool(let b) = self { return b }; return nil }
    var double: Double? { if case .number(let n) = self { return n }; return nil }
    /// An integral number (Python's json writes 64 as `64`, never `64.0`, but accept both).
    var int: Int? {
        guard case .number(let n) = self, n.rounded() == n, abs(n) < 9.0e15 else { return nil }
        return Int(n)
    }
    var isNull: Bool { self == .null }

    /// Parses one JSON text (UTF-8); `what` names the source in error messages.
    static func parse(_ bytes: UnsafeRawBufferPointer, what: String) throws -> JSON {
        var parser = Parser(bytes: bytes.bindMemory(to: UInt8.self), what: what)
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.at == parser.bytes.count else { throw parser.error("trailing characters") }
        return value
    }

    private struct Parser {
        let bytes: UnsafeBufferPointer<UInt8>
        let what: String
        var at = 0

        init(bytes: UnsafeBufferPointer<UInt8>, what: String) {
            self.bytes = bytes
            self.what = what
        }

        func error(_ message: String) -> MoEError {
            .invalidArgument("\(what) is not valid JSON: \(message) at byte \(at)")
        }

        mutating func skipSpace() {
            while at < bytes.count, [0x20, 0x0A, 0x0D, 0x09].contains(bytes[at]) { at += 1 }
        }

        mutating func expect(_ literal: String) throws {
            for c in literal.utf8 {
                guard at < bytes.count, bytes[at] == c else { throw error("expected \(literal)") }
                at += 1
            }
        }

        mutating func value(depth: Int) throws -> JSON {
            guard depth < 64 else { throw error("nested too deeply") }
            skipSpace()
            guard at < bytes.count else { throw error("unexpected end") }
            switch bytes[at] {
            case UInt8(ascii: "{"):
                at += 1
                var members: [String: JSON] = [:]
                skipSpace()
                if at < bytes.count, bytes[at] == UInt8(ascii: "}") { at += 1; return .object(members) }
                while true {
                    skipSpace()
                    let key = try string()
                    skipSpace()
                    try expect(":")
                    members[key] = try value(depth: depth + 1)
                    skipSpace()
                    guard at < bytes.count else { throw error("unterminated object") }
                    at += 1
                    if bytes[at - 1] == UInt8(ascii: "}") { return .object(members) }
                    guard bytes[at - 1] == UInt8(ascii: ",") else { throw error("expected , or }") }
                }
            case UInt8(ascii: "["):
                at += 1
                var elements: [JSON] = []
                skipSpace()
                if at < bytes.count, bytes[at] == UInt8(ascii: "]") { at += 1; return .array(elements) }
                while true {
                    elements.append(try value(depth: depth + 1))
                    skipSpace()
                    guard at < bytes.count else { throw error("unterminated array") }
                    at += 1
                    if bytes[at - 1] == UInt8(ascii: "]") { return .array(elements) }
                    guard bytes[at - 1] == UInt8(ascii: ",") else { throw error("expected , or ]") }
                }
            case UInt8(ascii: "\""):
                return .string(try string())
            case UInt8(ascii: "t"):
                try expect("true"); return .bool(true)
            case UInt8(ascii: "f"):
                try expect("false"); return .bool(false)
            case UInt8(ascii: "n"):
                try expect("null"); return .null
            default:
                return .number(try number())
            }
        }

        mutating func number() throws -> Double {
            // Python's json also writes these for non-finite floats.
            for (word, value) in [("NaN", Double.nan), ("Infinity", .infinity), ("-Infinity", -.infinity)] {
                let w = Array(word.utf8)
                if at + w.count <= bytes.count, Array(bytes[at..<at + w.count]) == w {
                    at += w.count
                    return value
                }
            }
            let start = at
            while at < bytes.count, "+-0123456789.eE".utf8.contains(bytes[at]) { at += 1 }
            guard at > start, let n = Double(String(decoding: bytes[start..<at], as: UTF8.self)) else {
                at = start
                throw error("expected a value")
            }
            return n
        }

        mutating func hex4() throws -> UInt32 {
            guard at + 4 <= bytes.count,
                  let v = UInt32(String(decoding: bytes[at..<at + 4], as: UTF8.self), radix: 16) else {
                throw error("bad \\u escape")
            }
            at += 4
            return v
        }

        mutating func string() throws -> String {
            guard at < bytes.count, bytes[at] == UInt8(ascii: "\"") else { throw error("expected a string") }
            at += 1
            var utf8: [UInt8] = []
            while true {
                guard at < bytes.count else { throw error("unterminated string") }
                let c = bytes[at]
                at += 1
                if c == UInt8(ascii: "\"") { break }
                guard c == UInt8(ascii: "\\") else { utf8.append(c); continue }
                guard at < bytes.count else { throw error("unterminated string") }
                let e = bytes[at]
                at += 1
                switch e {
                case UInt8(ascii: "n"): utf8.append(0x0A)
                case UInt8(ascii: "t"): utf8.append(0x09)
                case UInt8(ascii: "r"): utf8.append(0x0D)
                case UInt8(ascii: "b"): utf8.append(0x08)
                case UInt8(ascii: "f"): utf8.append(0x0C)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800..<0xDC00).contains(scalar), at + 1 < bytes.count, bytes[at] == UInt8(ascii: "\\"),
                       bytes[at + 1] == UInt8(ascii: "u") {
                        at += 2
                        let low = try hex4()
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low &- 0xDC00) & 0x3FF
                    }
                    utf8.append(contentsOf: String(Unicode.Scalar(scalar) ?? "\u{FFFD}").utf8)
                default: utf8.append(e)  // \" \\ \/
                }
            }
            return String(decoding: utf8, as: UTF8.self)
        }
    }
}
