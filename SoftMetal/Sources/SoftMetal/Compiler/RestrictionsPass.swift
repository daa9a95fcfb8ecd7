#if os(Linux)
/// What Apple's compiler rejects and clang++ would accept: `double`, and the C++ that the MSL
/// specification excludes. (What depends on the language version, lambdas, recursion and
/// calls through pointers, is found after compiling: `LanguageCheck.swift`.)
extension MSLTranslator {
    /// C++ that the Metal Shading Language specification excludes (its "C++ restrictions"),
    /// which clang++ would accept here. Not `noexcept`: the specification excludes
    /// exceptions, and a `noexcept` specifier throws none; Apple's compiler builds MLX's
    /// `steel/utils/integral_constant.h`, which has it on every member.
    static let forbiddenKeywords: [String: String] = [
        "new": "new and delete", "delete": "new and delete", "goto": "goto statements",
        "throw": "exceptions", "try": "exceptions", "catch": "exceptions",
        "virtual": "virtual functions", "dynamic_cast": "dynamic_cast and type identification",
        "typeid": "dynamic_cast and type identification", "thread_local": "thread_local and register storage",
        "register": "thread_local and register storage",
    ]

    mutating func restrictions() throws {
        try walk { t, v in
            guard !v.inDirective, let word = t.word(v) else { return nil }
            if word == "double" {
                throw t.fail(v.start, "MSL has no `double`: Apple's compiler rejects it (use float)")
            }
            if let what = MSLTranslator.forbiddenKeywords[word], !t.isMember(v.start), !t.isDeletedFunction(v.start, word) {
                throw t.fail(v.start, "`\(word)`: \(what) are not part of MSL (Apple's compiler rejects them)")
            }
            return nil
        }
    }

    /// `= delete` declares a deleted function, which MSL allows.
    private func isDeletedFunction(_ i: Int, _ word: String) -> Bool {
        guard word == "delete" else { return false }
        let p = skipSpaceBack(i - 1)
        return p >= 0 && text[p] == Byte.equals
    }
}
#endif
