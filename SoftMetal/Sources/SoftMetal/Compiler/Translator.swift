#if os(Linux)
/// MSL source -> C++17 source that includes softmetal_runtime.h.
///
/// `MSLLexer` reads the text into tokens (identifiers, numbers, literals, punctuation and
/// the spaces between them); then passes, one per MSL feature, rewrite it in the order that
/// `passes` writes down. Each edits by byte range and keeps every line where it was
/// (replacements never add or remove newlines), so a `#line 1` directive maps the compiler's
/// line numbers back to the MSL source. Where each rule lives:
/// - `MSLLexer.swift`: comments blanked, tokens;
/// - `DirectivesPass.swift`: `#include <metal_*>` / `<simd/*>` dropped, `#pragma unroll` blanked;
/// - `AddressSpaceRulePass.swift`: `coherent(device)` blanked (where it was kept for the MSL
///   version's check); a pointer or reference type without an address space, rejected;
/// - `AddressSpacesPass.swift`: `device` and `thread` dropped, `constant` made `const`;
///   members qualified by the address space of `this`, functions overloaded on address spaces;
/// - `KernelHeads.swift`: kernels, kernel templates and their explicit instantiations found,
///   heads made `static`, instantiations blanked;
/// - `FunctionConstantsPass.swift`: `constant T x [[function_constant(i)]]`,
///   `is_function_constant_defined`;
/// - `KernelSignatures.swift`: each kernel's parameters (attributes recorded and blanked),
///   the kernels of the library;
/// - `ThreadgroupMemoryPass.swift`: `threadgroup T x[N];` in a body -> `metal::__sm::tg_var`;
/// - `RestrictionsPass.swift`: `double` and the C++ MSL excludes, rejected;
/// - `ConversionsPass.swift`: vector constructors and casts, conversions to a template's
///   type parameter, `1.0h`;
/// - `Launchers.swift`: per kernel, a body thunk that binds arguments and built-ins, an
///   `extern "C"` launcher `__sm_launch_<name>` and a reflection table `__sm_info_<name>`;
/// - `TranslatorText.swift`: looking around a position (brackets, declarations, locations).
struct MSLTranslator {
    struct Parameter: Equatable {
        enum Kind: Equatable { case buffer(Int), threadgroup(Int), builtin(String) }
        var kind: Kind
        var type: String
        var name: String
        /// `[[buffer(2), function_constant(has_bias)]]`: the parameter exists only when the
        /// (bool) function constant is true; otherwise it is null and need not be bound.
        var condition: String? = nil
        /// `coherent(device)` (MSL 3.2): the memory check orders other threadgroups' accesses
        /// after the writer's device-scope fence.
        var coherent = false
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
        /// Language features the source uses that only some MSL versions have (the library
        /// refuses them below `allowedFrom`, a `__METAL_VERSION__`).
        struct VersionGated: Equatable {
            var location: SourceLocation
            var what: String
            var allowedFrom: Int
        }
        var versionGated: [VersionGated] = []
        /// Functions the source overloads on the address spaces of their parameters, of
        /// which the translation keeps one (the address-space check leaves their calls alone).
        var addressSpaceOverloads: Set<String> = []
    }

    /// `constant T name [[function_constant(index)]];`: becomes
    /// `static constexpr T name = __SM_FC_<index>;` (plus `__sm_fc_defined_<name>`), with the
    /// macros defined per specialisation by the library (see `constantsPrefix`).
    struct FunctionConstant: Equatable {
        var name: String
        var type: String
        var index: Int
    }

    static let sourceName = "source.metal"

    // MARK: state the passes share

    /// The source with comments blanked; the first passes blank more in place (lines kept),
    /// the later ones only record edits.
    var text: [UInt8]
    /// The code tokens of `text`, read once the in-place passes are done.
    var tokens: [MSLToken] = []
    /// Where each line starts and its MSL file and line (after the preprocessor's markers),
    /// read with the tokens: errors and kernels are located by a search, not a rescan.
    var lines: [(start: Int, location: SourceLocation)] = []
    var edits: [(start: Int, end: Int, replacement: String)] = []
    /// Byte ranges a pass has taken over (a kernel's head, a function-constant declaration,
    /// a threadgroup variable, a blanked pragma), by start: later passes step over them, as
    /// the rest of the source is not theirs to rewrite.
    var claims: [Int: Int] = [:]
    var kernels: [Kernel] = []
    /// Function constants with where each is declared: a kernel or `is_function_constant_defined`
    /// may only use one declared before it.
    var declaredConstants: [(at: Int, constant: FunctionConstant)] = []
    var templateTypeNames: Set<String> = []
    /// Kernel declarations found by `findKernelHeads`, bound by `bindKernels`.
    var kernelDeclarations: [KernelDeclaration] = []
    var templates: [String: KernelTemplate] = [:]
    var tgSlot = 0
    /// Version-gated features found (offset in `text`, what, from which `__METAL_VERSION__`).
    var versionGated: [(at: Int, what: String, allowedFrom: Int)] = []
    /// Where `coherent(device)` was blanked (a kernel parameter's range holding one is coherent).
    var coherentAt: [Int] = []
    var addressSpaceOverloadNames = Set<String>()
    /// Where the earliest error so far was raised: the passes go no further.
    var stopAt = Int.max

    init(source: String) {
        text = MSLLexer.blankComments(Array(source.utf8))
    }

    // MARK: translation

    static func translate(_ source: String) throws -> Output {
        var t = MSLTranslator(source: source)
        try t.run()
        return t.output()
    }

    /// The passes, in order. The first ones blank text in place, which may change how it
    /// reads, so the code is read into tokens after them; the rest edit by range. A pass that
    /// recognises a declaration claims its range first, so the ones after it leave it alone:
    /// kernel heads before everything that would rewrite inside them, function constants
    /// before address spaces (`constant` there is not an address space), threadgroup
    /// variables before the conversions that would rewrite their types.
    static let passes: [(name: String, run: (inout MSLTranslator) throws -> Void)] = [
        ("includes", { $0.blankMetalIncludes() }),
        ("coherent", { $0.blankCoherent() }),
        ("member address spaces", { $0.memberAddressSpaces() }),
        ("address-space overloads", { $0.addressSpaceOverloads() }),
        ("template type names", { $0.collectTemplateTypeNames() }),
        ("tokens", { $0.readTokens() }),
        ("pragmas", { try $0.blankLoopPragmas() }),
        ("kernel heads", { try $0.findKernelHeads() }),
        ("function constants", { try $0.functionConstants() }),
        ("kernel signatures", { try $0.bindKernels() }),
        ("threadgroup memory", { try $0.threadgroupMemory() }),
        ("address-space rule", { try $0.addressSpaceRule() }),
        ("address spaces", { try $0.addressSpaces() }),
        ("restrictions", { try $0.restrictions() }),
        ("vector conversions", { try $0.conversions() }),
        ("half literals", { try $0.halfLiterals() }),
    ]

    /// An error and the place in the source the pass had reached when it stopped (for a
    /// kernel: its head, where all of its checks are made).
    struct PassFailure: Error {
        var at: Int
        var error: SoftMetalError
    }

    /// Every pass runs even after one fails, and the error reported is the one earliest in
    /// the source: the one a reader meets first, whichever concern it belongs to. A pass stops
    /// at its first error, and the passes after it stop where it did (`stopAt`): what they
    /// would find beyond cannot come first.
    private mutating func run() throws {
        var first: PassFailure?
        for pass in MSLTranslator.passes {
            do {
                try pass.run(&self)
            } catch let failure as PassFailure {
                if first == nil || failure.at < first!.at { first = failure }
                stopAt = first!.at
            }
        }
        if let first { throw first.error }
        try checkUniqueNames()
    }

    /// The code tokens and the line table of the text, once it is final.
    mutating func readTokens() {
        tokens = MSLLexer.tokens(text, mode: .code)
        var location = SourceLocation(file: MSLTranslator.sourceName, line: 1)
        var lineStart = 0
        lines = [(0, location)]
        for i in text.indices where text[i] == Byte.newline {
            if let marker = MSLTranslator.lineMarkerIfDirective(text[lineStart..<i]) {
                location = marker
            } else {
                location.line += 1
            }
            lineStart = i + 1
            lines.append((lineStart, location))
        }
    }

    // MARK: walking the tokens

    /// What a pass's visitor is given: the token (index into `tokens`) and whether it is on a
    /// preprocessor directive line.
    struct Visit {
        var index: Int
        var token: MSLToken
        var inDirective: Bool
        var start: Int { token.start }
        var end: Int { token.end }
    }

    /// Calls `visit` for each token a pass may rewrite, in order: literals, attribute lists
    /// `[[...]]` and claimed ranges are stepped over (`attributes`: the visitor sees an
    /// attribute list's `[[` first, outside directives). `visit` returns where to go on (a byte
    /// offset past the token), or nil for the next token. An error is reported at the token
    /// that raised it.
    mutating func walk(attributes: Bool = false, _ visit: (inout MSLTranslator, Visit) throws -> Int?) throws {
        var t = 0
        var lineStart = true
        var inDirective = false
        while t < tokens.count && tokens[t].start < stopAt {
            let token = tokens[t]
            if let end = claims[token.start] {
                t = tokenIndex(atOrAfter: end, from: t)
                continue
            }
            let c = text[token.start]
            if token.kind == .space {
                if text[token.start..<token.end].contains(Byte.newline) { lineStart = true; inDirective = false }
                t += 1
                continue
            }
            if c == Byte.hash && lineStart { inDirective = true }
            lineStart = false
            if token.kind == .literal { t += 1; continue }
            if c == Byte.openBracket && token.start + 1 < text.count && text[token.start + 1] == Byte.openBracket {
                if attributes && !inDirective {
                    let resume: Int?
                    do { resume = try visit(&self, Visit(index: t, token: token, inDirective: inDirective)) }
                    catch let error as SoftMetalError { throw PassFailure(at: token.start, error: error) }
                    if let resume { t = tokenIndex(atOrAfter: resume, from: t); continue }
                }
                t = tokenIndex(atOrAfter: attributeEnd(token.start), from: t)
                continue
            }
            let resume: Int?
            do { resume = try visit(&self, Visit(index: t, token: token, inDirective: inDirective)) }
            catch let error as SoftMetalError { throw PassFailure(at: token.start, error: error) }
            t = resume.map { tokenIndex(atOrAfter: $0, from: t) } ?? t + 1
        }
    }

    /// Just past the `]]` that closes the `[[` at `start` (or the end of the text).
    func attributeEnd(_ start: Int) -> Int {
        var j = start + 2
        while j + 1 < text.count && !(text[j] == Byte.closeBracket && text[j + 1] == Byte.closeBracket) { j += 1 }
        return j + 2
    }

    func tokenIndex(atOrAfter offset: Int, from t: Int) -> Int {
        MSLLexer.index(in: tokens, atOrAfter: offset, from: t)
    }

    /// The identifier a visit is at, if it is one.
    func word(_ v: Visit) -> String? {
        v.token.kind == .identifier ? string(v.start, v.end) : nil
    }

    // MARK: output

    private func output() -> Output {
        var result = Array(text)
        // From the end, so earlier offsets stay valid; of two edits at one offset the longer
        // goes first, so that an insertion there lands before the text replacing what follows.
        for edit in edits.sorted(by: { $0.start != $1.start ? $0.start > $1.start : $0.end > $1.end }) {
            result.replaceSubrange(edit.start..<edit.end, with: Array(edit.replacement.utf8))
        }
        var out = "#line 1 \"\(MSLTranslator.sourceName)\"\n"
        out += String(decoding: result, as: UTF8.self)
        out += "\n#line 1 \"softmetal-generated.cpp\"\n"
        let body = out
        let launchers = kernels.map { MSLTranslator.launcher($0) }
        for l in launchers { out += l }
        return Output(source: out, kernels: kernels, functionConstants: declaredConstants.map(\.constant),
                      body: body, launchers: launchers,
                      versionGated: versionGated.map { .init(location: location(at: $0.at), what: $0.what, allowedFrom: $0.allowedFrom) },
                      addressSpaceOverloads: addressSpaceOverloadNames)
    }
}
#endif
