#if os(Linux)
/// The C++ features that MSL allows only from some language version on, which clang++
/// accepts in any case: found in the LLVM IR of the translated source at -O0 (before
/// inlining or tail-call elimination could hide a call), among the functions that the MSL
/// files define. The Metal Shading Language Specification (version 4, 2025-06-05),
/// section 1.5.4 "Restrictions", allows lambda expressions from Metal 3.2 on, function
/// pointers from Metal 2.3 on, and recursive calls in a compute context from Metal 2.4 on;
/// older language versions exclude them, so with `MTLCompileOptions.languageVersion`
/// below those versions each is a compile error naming the MSL line.
enum MSLLanguageCheck {
    struct Finding: Equatable {
        enum Kind: String { case recursion, functionPointer = "function-pointer", lambda }
        var kind: Kind
        var file: String
        var line: Int
        var message: String

        /// `__METAL_VERSION__` from which MSL allows it.
        var allowedFrom: Int {
            switch kind {
            case .lambda: return 320
            case .functionPointer: return 230
            case .recursion: return 240
            }
        }

        var serialized: String { "\(kind.rawValue)\t\(file)\t\(line)\t\(message)" }
        init(kind: Kind, file: String, line: Int, message: String) {
            self.kind = kind; self.file = file; self.line = line; self.message = message
        }
        init?(serialized: Substring) {
            let parts = serialized.split(separator: "\t", maxSplits: 3, omittingEmptySubsequences: false)
            guard parts.count == 4, let kind = Kind(rawValue: String(parts[0])), let line = Int(parts[2]) else { return nil }
            self.init(kind: kind, file: String(parts[1]), line: line, message: String(parts[3]))
        }
    }

    /// The errors for `findings` under `metalVersion` (310 = MSL 3.1), as clang formats
    /// errors (`file:line: error: ...`), so that the library's error explanation quotes the
    /// MSL lines. `SOFTMETAL_STRICT_CPP=1` applies every restriction whatever the version.
    static func errors(_ findings: [Finding], metalVersion: Int) -> String? {
        let strict = SMEnv.get("SOFTMETAL_STRICT_CPP") == "1"
        let refused = findings.filter { strict || metalVersion < $0.allowedFrom }
        guard !refused.isEmpty else { return nil }
        let version = "\(metalVersion / 100).\(metalVersion % 100 / 10)"
        return refused.prefix(8).map { f in
            let from = "\(f.allowedFrom / 100).\(f.allowedFrom % 100 / 10)"
            let why = strict && metalVersion >= f.allowedFrom
                ? "MSL before \(from) does not allow \(f.message) (SOFTMETAL_STRICT_CPP=1)"
                : "MSL \(version) does not allow \(f.message) (MSL \(from) and later do)"
            return "\(f.file):\(f.line): error: \(why)"
        }.joined(separator: "\n")
    }

    /// The findings in the IR of `translated` (`ir`: clang's `-O0 -S -emit-llvm
    /// -gline-tables-only` output). Only functions whose definition lies in a file that the
    /// translated text names in a `#line` directive (the MSL source and its includes) count.
    static func findings(ir: String, translated: String) -> [Finding] {
        var mslFiles = Set<String>()
        for line in translated.split(separator: "\n") where line.hasPrefix("#line ") {
            if let q = line.firstIndex(of: "\""), let e = line.lastIndex(of: "\""), q < e {
                mslFiles.insert(String(line[line.index(after: q)..<e]))
            }
        }
        mslFiles.remove("softmetal-generated.cpp")

        var files: [String: String] = [:]                                   // !N -> file name
        var subprograms: [String: (name: String, file: String, line: Int)] = [:]
        var locations: [String: Int] = [:]                                  // !N -> line
        struct Function { var symbol: String; var dbg: String; var calls: [(callee: String?, dbg: String?)] }
        var functions: [Function] = []
        var current: Function?
        for raw in ir.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = raw
            if current != nil {
                if line == "}" { functions.append(current!); current = nil; continue }
                guard line.contains("call "), !line.contains(" asm ") else { continue }
                current!.calls.append((callee(in: line), attachment(line, "!dbg ")))
                continue
            }
            if line.hasPrefix("define ") {
                guard let at = line.firstIndex(of: "@") else { continue }
                let symbol = name(from: line[line.index(after: at)...])
                current = Function(symbol: symbol, dbg: attachment(line, "!dbg ") ?? "", calls: [])
            } else if line.hasPrefix("!") {
                guard let eq = line.firstRange(of: " = ") else { continue }
                let id = String(line[..<eq.lowerBound])
                let rest = line[eq.upperBound...]
                if rest.contains("!DIFile(") {
                    files[id] = field(rest, "filename") ?? ""
                } else if rest.contains("!DISubprogram(") {
                    subprograms[id] = (field(rest, "name") ?? "?", field(rest, "file", quoted: false) ?? "",
                                       Int(field(rest, "line", quoted: false) ?? "") ?? 0)
                } else if rest.contains("!DILocation(") {
                    locations[id] = Int(field(rest, "line", quoted: false) ?? "") ?? 0
                }
            }
        }

        // The library's own functions: symbol -> (MSL name, file, line).
        var own: [String: (name: String, file: String, line: Int)] = [:]
        for f in functions {
            guard let s = subprograms[f.dbg], let file = files[s.file], mslFiles.contains(file) else { continue }
            own[f.symbol] = (s.name, file, s.line)
        }
        var found: [Finding] = []
        var edges: [String: [(callee: String, line: Int)]] = [:]
        for f in functions {
            guard let me = own[f.symbol] else { continue }
            if me.name == "operator()" && f.symbol.contains("clE") && (f.symbol.contains("$_") || f.symbol.contains("Ul")) {
                found.append(Finding(kind: .lambda, file: me.file, line: me.line,
                                     message: "lambda expressions: the lambda at line \(me.line)"))
            }
            for call in f.calls {
                let line = call.dbg.flatMap { locations[$0] } ?? me.line
                guard let callee = call.callee else {
                    found.append(Finding(kind: .functionPointer, file: me.file, line: line,
                                         message: "function pointers: \(me.name) calls through one (line \(line))"))
                    continue
                }
                if own[callee] != nil { edges[f.symbol, default: []].append((callee, line)) }
            }
        }
        found += cycles(edges, own)
        // One finding per place (a template's instances repeat its body's findings).
        var seen = Set<String>()
        return found.filter { seen.insert($0.serialized).inserted }
    }

    /// Recursion: every strongly connected component of the call graph with a cycle
    /// (Tarjan), reported as one cycle through it from its first-defined function.
    private static func cycles(_ edges: [String: [(callee: String, line: Int)]],
                               _ own: [String: (name: String, file: String, line: Int)]) -> [Finding] {
        var index: [String: Int] = [:], low: [String: Int] = [:], onStack = Set<String>()
        var stack: [String] = [], next = 0
        var components: [[String]] = []
        func connect(_ v: String) {  // call depth is bounded by the library's call graph
            index[v] = next; low[v] = next; next += 1
            stack.append(v); onStack.insert(v)
            for e in edges[v] ?? [] {
                if index[e.callee] == nil {
                    connect(e.callee); low[v] = min(low[v]!, low[e.callee]!)
                } else if onStack.contains(e.callee) {
                    low[v] = min(low[v]!, index[e.callee]!)
                }
            }
            if low[v] == index[v] {
                var component: [String] = []
                while let w = stack.popLast() { onStack.remove(w); component.append(w); if w == v { break } }
                components.append(component)
            }
        }
        for v in edges.keys.sorted() where index[v] == nil { connect(v) }

        var found: [Finding] = []
        for component in components {
            let members = Set(component)
            guard component.count > 1 || (edges[component[0]] ?? []).contains(where: { $0.callee == component[0] }) else { continue }
            let start = component.min { (own[$0]!.line, $0) < (own[$1]!.line, $1) }!
            // A shortest way back to `start` inside the component (breadth first).
            var previous: [String: (from: String, line: Int)] = [:]
            var queue = [start], head = 0, closing: (from: String, line: Int)?
            search: while head < queue.count {
                let v = queue[head]; head += 1
                for e in edges[v] ?? [] where members.contains(e.callee) {
                    if e.callee == start { closing = (v, e.line); break search }
                    if previous[e.callee] == nil { previous[e.callee] = (v, e.line); queue.append(e.callee) }
                }
            }
            guard let last = closing else { continue }
            var steps: [(from: String, to: String, line: Int)] = [(last.from, start, last.line)]
            var v = last.from
            while v != start, let p = previous[v] { steps.insert((p.from, v, p.line), at: 0); v = p.from }
            let s = own[start]!
            let message: String
            if steps.count == 1 {
                message = "recursion: \(s.name) calls itself (line \(steps[0].line))"
            } else {
                message = "recursion: "
                    + steps.map { "\(own[$0.from]!.name) calls \(own[$0.to]!.name) (line \($0.line))" }.joined(separator: ", ")
            }
            found.append(Finding(kind: .recursion, file: s.file, line: steps[0].line, message: message))
        }
        return found
    }

    /// The callee of a `call`/`invoke` line: a global's symbol, or nil for a call through a
    /// pointer (`call void %5(...)`); intrinsics count as no call.
    private static func callee(in line: Substring) -> String? {
        guard let c = line.firstRange(of: "call ") else { return "" }
        var i = c.upperBound
        while i < line.endIndex {
            let ch = line[i]
            if ch == "@" || ch == "%" {
                let start = line.index(after: i)
                let symbol = name(from: line[start...])
                var end = start
                if line[start] == "\"" {
                    end = line[line.index(after: start)...].firstIndex(of: "\"").map { line.index(after: $0) } ?? line.endIndex
                } else {
                    while end < line.endIndex, isSymbolChar(line[end]) { end = line.index(after: end) }
                }
                if end < line.endIndex, line[end] == "(" {
                    if ch == "%" { return nil }
                    return symbol.hasPrefix("llvm.") ? "" : symbol
                }
                i = end
                continue
            }
            i = line.index(after: i)
        }
        return ""
    }

    private static func isSymbolChar(_ c: Character) -> Bool {
        c.isLetter || c.isNumber || c == "_" || c == "." || c == "$" || c == "-"
    }

    private static func name(from s: Substring) -> String {
        if s.first == "\"" {
            let rest = s.dropFirst()
            return String(rest.prefix { $0 != "\"" })
        }
        return String(s.prefix(while: isSymbolChar))
    }

    private static func attachment(_ line: Substring, _ key: String) -> String? {
        guard let r = line.ranges(of: key).last else { return nil }
        return String(line[r.upperBound...].prefix { $0 == "!" || $0.isNumber })
    }

    private static func field(_ s: Substring, _ key: String, quoted: Bool = true) -> String? {
        guard let r = s.firstRange(of: quoted ? "\(key): \"" : "\(key): ") else { return nil }
        let rest = s[r.upperBound...]
        return String(quoted ? rest.prefix { $0 != "\"" } : rest.prefix { $0 != "," && $0 != ")" })
    }
}

#endif
