#if os(Linux)
/// Kernel signatures: the parameters of each kernel `KernelHeads.swift` found (buffers,
/// threadgroup memory, built-ins; attributes recorded and blanked), kernel templates kept for
/// their instantiations, and the kernels the library exports.
extension MSLTranslator {
    /// The built-in inputs a kernel parameter may be bound to (`[[thread_position_in_grid]]`).
    static let builtins: Set<String> = [
        "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
        "threads_per_threadgroup", "dispatch_threads_per_threadgroup", "threadgroups_per_grid",
        "threads_per_grid", "grid_size", "grid_origin", "thread_index_in_threadgroup",
        "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
        "dispatch_simdgroups_per_threadgroup", "threads_per_simdgroup", "thread_execution_width",
        "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    ]

    /// Binds each kernel found, in source order (an instantiation needs its template bound
    /// first). An error is reported at the kernel's head, where it used to be found.
    mutating func bindKernels() throws {
        for declaration in kernelDeclarations where declaration.head.start < stopAt {
            do {
                switch declaration.form {
                case .definition(let name, let open, let close):
                    try bindDefinition(declaration.head, name: name, open: open, close: close)
                case .instantiation(let template, let arguments):
                    try bindInstantiation(declaration.head, template: template, arguments: arguments)
                }
            } catch let error as SoftMetalError {
                throw PassFailure(at: declaration.head.start, error: error)
            }
        }
    }

    private mutating func bindDefinition(_ head: KernelHead, name: String, open: Int, close: Int) throws {
        let parameters = try kernelParameters(open, close, kernel: name, at: head.start)
        let unused = unusedParameters(parameters, after: close)
        let maxThreads = try maxThreads(head) ?? MaxThreads()
        if let templateParameters = head.templateParameters {
            if let a = head.hostName {
                throw fail(a.at, "kernel template \(name): put [[host_name]] on its explicit instantiations, not on the template")
            }
            templates[name] = KernelTemplate(name: name, templateParameters: templateParameters,
                                             parameters: parameters, maxThreads: maxThreads, unusedParameters: unused)
        } else {
            var kernel = Kernel(name: try hostName(head) ?? name, parameters: parameters,
                                maxTotalThreadsPerThreadgroup: maxThreads.literal, callee: name)
            kernel.maxThreadsExpression = maxThreads.expression
            kernel.declaredAt = location(at: head.start)
            kernel.unusedParameters = unused
            kernels.append(kernel)
        }
    }

    /// An instantiation is a kernel named by its [[host_name]] that calls f<A, B>, bound by
    /// the template's parameter attributes.
    private mutating func bindInstantiation(_ head: KernelHead, template templateName: String, arguments: String) throws {
        guard let host = try hostName(head) else {
            throw fail(head.start, "the kernel instantiation \(templateName)<\(arguments)> needs [[host_name(\"...\")]]: it is the name makeFunction(name:) looks up")
        }
        guard let template = templates[templateName] else {
            throw fail(head.start, "kernel instantiation \(host): no kernel template named \(templateName) is declared before it (`template <...> [[kernel]] void \(templateName)(...)`)")
        }
        let values = MSLTranslator.splitTopLevel(arguments).map(\.trimmingSpaces)
        let parameters = template.parameters.map { p in
            var q = p
            q.type = MSLTranslator.substitute(p.type, names: template.templateParameters, values: values)
            return q
        }
        let maxThreads = try maxThreads(head) ?? template.maxThreads
        var kernel = Kernel(name: host, parameters: parameters, maxTotalThreadsPerThreadgroup: maxThreads.literal,
                            callee: "\(templateName)<\(arguments)>",
                            instantiatedAt: location(at: head.start))
        kernel.maxThreadsExpression = maxThreads.expression.map {
            MSLTranslator.substitute($0, names: template.templateParameters, values: values)
        }
        kernel.declaredAt = kernel.instantiatedAt!
        kernel.unusedParameters = template.unusedParameters
        kernels.append(kernel)
    }

    func maxThreads(_ head: KernelHead) throws -> MaxThreads? {
        guard let a = head.attributes.first(where: { $0.name == "max_total_threads_per_threadgroup" }) else { return nil }
        guard let argument = a.argument, !argument.isEmpty else {
            throw fail(a.at, "[[max_total_threads_per_threadgroup]] needs a thread count")
        }
        guard let n = Int(argument) else { return MaxThreads(expression: argument) }
        guard n > 0, n <= 1024 else {
            throw fail(a.at, "bad [[max_total_threads_per_threadgroup(\(argument))]]: the limit is 1...1024")
        }
        return MaxThreads(literal: n)
    }

    /// `[[host_name("a" "b")]]` -> "ab" (string literals concatenate, as MLX's macros make them).
    func hostName(_ head: KernelHead) throws -> String? {
        guard let a = head.hostName else { return nil }
        guard let argument = a.argument, let name = MSLTranslator.concatenatedStringLiterals(argument), !name.isEmpty else {
            throw fail(a.at, "[[host_name(\(a.argument ?? ""))]] needs a string literal")
        }
        return name
    }

    /// The buffer and threadgroup parameters whose names do not occur in the body that
    /// follows the parameter list ending at `close` (none without a body).
    func unusedParameters(_ parameters: [Parameter], after close: Int) -> Set<String> {
        let open = skipSpace(close + 1)
        guard open < text.count, text[open] == Byte.openBrace, let end = matching(open) else { return [] }
        var names = Set<String>()
        var i = open
        while i < end {
            if Byte.isIdentStart(text[i]) && (i == 0 || !Byte.isIdent(text[i - 1])),
               let (word, after) = identifier(at: i) {
                names.insert(word)
                i = after
            } else {
                i += 1
            }
        }
        return Set(parameters.compactMap { p -> String? in
            switch p.kind {
            case .buffer, .threadgroup: return names.contains(p.name) ? nil : p.name
            case .builtin: return nil
            }
        })
    }

    /// Parameters of a kernel, split at top-level commas.
    mutating func kernelParameters(_ open: Int, _ close: Int, kernel name: String, at headStart: Int) throws -> [Parameter] {
        var parameters: [Parameter] = []
        var start = open + 1
        var depth = 0
        var k = open + 1
        while k < close {
            let c = text[k]
            if c == Byte.openParen || c == Byte.openBracket || c == Byte.less || c == Byte.openBrace { depth += 1 }
            if c == Byte.closeParen || c == Byte.closeBracket || c == Byte.greater || c == Byte.closeBrace { depth -= 1 }
            if (c == Byte.comma && depth == 0) || k == close - 1 {
                let stop = (c == Byte.comma && depth == 0) ? k : close - 1
                if let p = try parameter(start, stop, kernel: name, at: headStart) { parameters.append(p) }
                start = k + 1
            }
            k += 1
        }
        // Implicit indices: the first index that no parameter of the kind uses, in order.
        var buffers = Set(parameters.compactMap { if case .buffer(let n) = $0.kind, n >= 0 { return n } else { return nil } })
        var groups = Set(parameters.compactMap { if case .threadgroup(let n) = $0.kind, n >= 0 { return n } else { return nil } })
        for i in parameters.indices {
            switch parameters[i].kind {
            case .buffer(-1):
                let n = (0...).first { !buffers.contains($0) }!
                guard n < 31 else { throw fail(open, "kernel \(name): more than 31 buffers") }
                buffers.insert(n)
                parameters[i].kind = .buffer(n)
            case .threadgroup(-1):
                let n = (0...).first { !groups.contains($0) }!
                guard n < 31 else { throw fail(open, "kernel \(name): more than 31 threadgroup parameters") }
                groups.insert(n)
                parameters[i].kind = .threadgroup(n)
            default: break
            }
        }
        return parameters
    }

    mutating func parameter(_ a: Int, _ b: Int, kernel: String, at headStart: Int) throws -> Parameter? {
        let raw = string(a, b)
        if raw.trimmingSpaces.isEmpty || raw.trimmingSpaces == "void" { return nil }
        let coherent = coherentAt.contains { a <= $0 && $0 < b }
        // The attribute [[...]].
        var attribute: String?
        var declaration = ""
        var k = a
        var bytes: [UInt8] = []
        while k < b {
            if text[k] == Byte.openBracket && k + 1 < b && text[k + 1] == Byte.openBracket {
                var e = k + 2
                while e + 1 < b && !(text[e] == Byte.closeBracket && text[e + 1] == Byte.closeBracket) { e += 1 }
                guard e + 1 < b else {
                    throw fail(k, "kernel \(kernel): `[[` without a matching `]]` in the parameter `\(raw.trimmingSpaces)`")
                }
                attribute = string(k + 2, e).trimmingSpaces
                edits.append((k, min(e + 2, b), MSLTranslator.blank(text[k..<min(e + 2, b)])))
                k = e + 2
                continue
            }
            bytes.append(text[k])
            k += 1
        }
        declaration = String(decoding: bytes, as: UTF8.self)
        var condition: String?
        if let list = attribute {
            var items = MSLTranslator.splitTopLevel(list).map(\.trimmingSpaces)
            if let c = items.firstIndex(where: { $0.hasPrefix("function_constant") }) {
                condition = items[c].drop { $0 != "(" }.dropFirst().prefix { $0 != ")" }.trimmingSpaces
                items.remove(at: c)
                guard let name = condition, declaredConstants.contains(where: { $0.at < headStart && $0.constant.name == name && $0.constant.type == "bool" }) else {
                    throw fail(a, "kernel \(kernel): [[\(list)]] needs a bool function constant declared before the kernel")
                }
            }
            attribute = items.joined(separator: ", ")
        }
        // Address spaces out of the type; names are the last identifier.
        var words = declaration.splitWords
        if declaration.contains("*") || declaration.contains("&"),
           !words.contains(where: { ["device", "constant", "threadgroup", "thread"].contains($0) }) {
            throw fail(a, "kernel \(kernel): the pointer or reference `\(raw.trimmingSpaces)` needs an address space (device, constant, threadgroup or thread), as Apple's compiler requires")
        }
        words.removeAll { $0 == "device" || $0 == "thread" || $0 == "threadgroup" }
        words = words.map { $0 == "constant" ? "const" : $0 }
        var joined = words.joined(separator: " ")
        // `constant const int64_t a_strides[2]` (MLX): an array in the device or constant
        // address space is a buffer of its elements, as for `constant const int64_t*` (C++
        // adjusts the array parameter to that pointer). Arrays of pointers (arrays of
        // buffers) and arrays without an address space stay unsupported.
        var isArray = false
        if joined.hasSuffix("]"), let bracket = joined.firstIndex(of: "["), !joined[..<bracket].contains("*"),
           !joined[..<bracket].contains("&"),
           declaration.splitWords.contains(where: { $0 == "device" || $0 == "constant" }) {
            joined = joined[..<bracket].trimmingSpaces
            isArray = true
        }
        guard let nameStart = joined.lastIndex(where: { !($0.isLetter || $0.isNumber || $0 == "_") }) else {
            throw fail(a, "kernel \(kernel): cannot parse the parameter `\(raw.trimmingSpaces)`")
        }
        let name = String(joined[joined.index(after: nameStart)...])
        let type = (String(joined[...nameStart]).trimmingSpaces + (isArray ? "*" : ""))
            .replacingAll(" *", with: "*").replacingAll(" &", with: "&")
        if name.isEmpty || type.isEmpty || type.contains("[") {
            throw fail(a, "kernel \(kernel): the parameter `\(raw.trimmingSpaces)` is not supported by SoftMetal (arrays of buffers and unnamed parameters are not)")
        }
        guard let attribute, !attribute.isEmpty else {
            // Without an attribute a device/constant pointer or reference is a buffer and a
            // threadgroup pointer threadgroup memory, at the first free index (as Apple's
            // compiler assigns them; ggml writes its kernels so); kernelParameters numbers them.
            let spaces = declaration.splitWords
            if declaration.contains("*") || declaration.contains("&") || isArray {
                if spaces.contains("device") || spaces.contains("constant") {
                    return Parameter(kind: .buffer(-1), type: type, name: name, condition: condition, coherent: coherent)
                }
                if spaces.contains("threadgroup") {
                    return Parameter(kind: .threadgroup(-1), type: type, name: name, condition: condition)
                }
            }
            throw fail(a, "kernel \(kernel): the parameter `\(raw.trimmingSpaces)` has no attribute; SoftMetal needs [[buffer(n)]], [[threadgroup(n)]] or a thread-position attribute")
        }
        let attrName = String(attribute.prefix { $0 != "(" }).trimmingSpaces
        var argument: Int?
        if let p = attribute.firstIndex(of: "("), let q = attribute[p...].firstIndex(of: ")") {
            argument = Int(attribute[attribute.index(after: p)..<q].trimmingSpacesSub)
        }
        switch attrName {
        case "buffer":
            guard let n = argument, n >= 0, n < 31 else { throw fail(a, "kernel \(kernel): bad [[\(attribute)]] (indices 0...30)") }
            return Parameter(kind: .buffer(n), type: type, name: name, condition: condition, coherent: coherent)
        case "threadgroup":
            guard let n = argument, n >= 0, n < 31 else { throw fail(a, "kernel \(kernel): bad [[\(attribute)]] (indices 0...30)") }
            return Parameter(kind: .threadgroup(n), type: type, name: name, condition: condition)
        default:
            guard MSLTranslator.builtins.contains(attrName) else {
                throw fail(a, "kernel \(kernel): the attribute [[\(attribute)]] is not supported by SoftMetal")
            }
            return Parameter(kind: .builtin(attrName), type: type, name: name)
        }
    }

    /// Two functions of a library cannot share a name (Apple's compiler rejects it too).
    func checkUniqueNames() throws {
        var seen = Set<String>()
        for k in kernels where !seen.insert(k.name).inserted {
            throw SoftMetalError.compile("\(MSLTranslator.sourceName): error: two kernels are named \(k.name) (function names and [[host_name]]s must be unique)")
        }
    }
}
#endif
