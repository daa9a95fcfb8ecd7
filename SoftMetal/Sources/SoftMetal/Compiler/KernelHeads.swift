#if os(Linux)
/// Kernels: `kernel void f(...)`, `[[kernel]] void f(...)`, kernel templates
/// (`template <...> [[kernel]] void f(...)`) and their explicit instantiations
/// (`template [[host_name("n")]] [[kernel]] void f<A>(...);`). This pass finds them and
/// rewrites their heads; `KernelSignatures.swift` reads their parameters once the function
/// constants they may name are known.
extension MSLTranslator {
    /// A kernel found in the text: a definition (of a kernel or a kernel template) with its
    /// parameter list, or an explicit instantiation of a template.
    struct KernelDeclaration {
        enum Form {
            case definition(name: String, open: Int, close: Int)
            case instantiation(template: String, arguments: String)
        }
        var head: KernelHead
        var form: Form
    }

    /// One attribute of a `[[a, b(c)]]` list, with where its list starts (for errors).
    struct Attribute {
        var name: String
        var argument: String?
        var at: Int
    }

    /// The head of a kernel declaration: `template <...>` (or `template` alone: an explicit
    /// instantiation), then attribute lists and the `kernel` keyword in any order.
    struct KernelHead {
        var start: Int
        var templateParameters: [String]?     // nil: not a template definition
        var templateEnd: Int                   // just past `template <...>` (or `start`)
        var isInstantiation = false
        var attributes: [Attribute] = []
        var hasKernel = false
        var end = 0                            // where the declaration proper starts

        var hostName: Attribute? { attributes.first { $0.name == "host_name" } }
    }

    /// A kernel, a kernel template or an explicit instantiation of one, starting at `start`
    /// (`kernel`, `[[` or `template`), outside directives. The head of a definition becomes
    /// `static` and is claimed up to its `(`; an instantiation is blanked and claimed whole
    /// (the launcher's call instantiates the template).
    mutating func findKernelHeads() throws {
        try walk(attributes: true) { t, v in
            guard !v.inDirective, t.text[v.start] == Byte.openBracket || ["kernel", "template"].contains(t.word(v) ?? "") else {
                return nil
            }
            return try t.kernelDeclaration(at: v.start)
        }
    }

    /// Where scanning continues after the kernel at `start`, or nil when the declaration is
    /// not a kernel (scanning goes on as for any other code).
    private mutating func kernelDeclaration(at start: Int) throws -> Int? {
        guard let head = try kernelHead(at: start), head.hasKernel else { return nil }
        for a in head.attributes where !["kernel", "host_name", "max_total_threads_per_threadgroup"].contains(a.name) {
            throw fail(a.at, "the kernel attribute [[\(a.name)\(a.argument.map { "(\($0))" } ?? "")]] is not supported by SoftMetal")
        }
        let resume = head.isInstantiation ? try kernelInstantiation(head) : try kernelDefinition(head)
        if let resume { claims[start] = resume }
        return resume
    }

    func kernelHead(at start: Int) throws -> KernelHead? {
        var head = KernelHead(start: start, templateParameters: nil, templateEnd: start)
        var k = start
        if let (word, after) = identifier(at: k), word == "template" {
            k = skipSpace(after)
            if k < text.count && text[k] == Byte.less {
                guard let close = matchingAngle(k) else { return nil }
                head.templateParameters = MSLTranslator.templateParameterNames(string(k + 1, close - 1))
                k = close
            } else {
                head.isInstantiation = true
            }
            head.templateEnd = k
        }
        while true {
            k = skipSpace(k)
            if k + 1 < text.count && text[k] == Byte.openBracket && text[k + 1] == Byte.openBracket {
                var e = k + 2
                while e + 1 < text.count && !(text[e] == Byte.closeBracket && text[e + 1] == Byte.closeBracket) { e += 1 }
                for item in MSLTranslator.splitTopLevel(string(k + 2, e)) where !item.trimmingSpaces.isEmpty {
                    let name = String(item.prefix { $0 != "(" }).trimmingSpaces
                    var argument: String?
                    if let p = item.firstIndex(of: "("), let q = item.lastIndex(of: ")"), p < q {
                        argument = String(item[item.index(after: p)..<q]).trimmingSpaces
                    }
                    head.attributes.append(Attribute(name: name, argument: argument, at: k))
                    if name == "kernel" { head.hasKernel = true }
                }
                k = e + 2
            } else if let (word, after) = identifier(at: k), word == "kernel" {
                head.hasKernel = true
                k = after
            } else {
                break
            }
        }
        head.end = k
        return head
    }

    /// `kernel void f(...)`, `[[kernel]] void f(...)`, `template <...> [[kernel]] void f(...)`:
    /// the head becomes `static` (the template head stays). Its parameters are the kernel
    /// signatures pass's; the walk resumes inside them.
    private mutating func kernelDefinition(_ head: KernelHead) throws -> Int? {
        guard let (void, afterVoid) = identifier(at: head.end), void == "void" else { return nil }
        guard let (name, afterName) = identifier(at: skipSpace(afterVoid)) else { return nil }
        let open = skipSpace(afterName)
        guard open < text.count, text[open] == Byte.openParen, let close = matching(open) else {
            throw fail(head.start, "cannot parse the parameters of kernel \(name)")
        }
        replaceKeepingLines(skipSpace(head.templateEnd), head.end, with: "static")
        // The template's own parameter list is not walked by the later passes: its address
        // spaces (`void (*deq)(device const q_t *, short, thread float4 &)`, ggml) are edited here.
        if head.templateParameters != nil { dropAddressSpaces(head.start, head.templateEnd) }
        kernelDeclarations.append(KernelDeclaration(head: head, form: .definition(name: name, open: open, close: close)))
        return open + 1
    }

    /// `template [[host_name("n")]] [[kernel]] void f<A, B>(params);` or
    /// `template [[host_name("n")]] [[kernel]] decltype(f<A, B>) f<A, B>;`: blanked, and
    /// recorded as a kernel n that calls f<A, B>.
    private mutating func kernelInstantiation(_ head: KernelHead) throws -> Int? {
        var k = head.end
        guard let (word, afterWord) = identifier(at: k) else {
            throw fail(head.start, "cannot parse this kernel instantiation: SoftMetal expects `void f<...>(...);` or `decltype(f<...>) f<...>;` after the attributes")
        }
        var templateName: String
        var arguments: String
        if word == "decltype" {
            let open = skipSpace(afterWord)
            guard open < text.count, text[open] == Byte.openParen, let close = matching(open),
                  let (name, args, _) = templateId(skipSpace(open + 1)) else {
                throw fail(head.start, "cannot parse this decltype(f<...>) kernel instantiation")
            }
            guard let (name2, args2, after2) = templateId(skipSpace(close)), name2 == name,
                  MSLTranslator.compact(args2) == MSLTranslator.compact(args) else {
                throw fail(head.start, "kernel instantiation decltype(\(name)<\(args)>): the declarator must repeat \(name)<\(args)>")
            }
            (templateName, arguments, k) = (name, args, after2)
        } else if word == "void" {
            guard let (name, args, after) = templateId(skipSpace(afterWord)) else {
                throw fail(head.start, "kernel instantiation: expected f<...>(...) after `void`")
            }
            let open = skipSpace(after)
            guard open < text.count, text[open] == Byte.openParen, let close = matching(open) else {
                throw fail(head.start, "kernel instantiation \(name)<\(args)>: cannot parse its parameters")
            }
            (templateName, arguments, k) = (name, args, close)
        } else if let (name, args, after) = templateId(skipSpace(afterWord)),
                  skipSpace(after) < text.count, text[skipSpace(after)] == Byte.semicolon {
            // `kernel_unary_t f<A>;` with `typedef decltype(f<X>) kernel_unary_t;` (ggml): the
            // type names the function type; the template's parameter attributes bind it.
            (templateName, arguments, k) = (name, args, after)
        } else {
            throw fail(head.start, "cannot parse this kernel instantiation (`\(word) ...`): SoftMetal expects `void f<...>(...);`, `decltype(f<...>) f<...>;` or `function_type f<...>;`")
        }
        k = skipSpace(k)
        guard k < text.count, text[k] == Byte.semicolon else {
            throw fail(head.start, "kernel instantiation \(templateName)<\(arguments)>: expected `;`")
        }
        kernelDeclarations.append(KernelDeclaration(head: head, form: .instantiation(template: templateName, arguments: arguments)))
        edits.append((head.start, k + 1, MSLTranslator.blank(text[head.start...k])))
        return k + 1
    }
}
#endif
