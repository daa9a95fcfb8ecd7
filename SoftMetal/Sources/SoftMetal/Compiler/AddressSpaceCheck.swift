#if os(Linux)
/// The address-space check: the translated text compiled once more (`-fsyntax-only`, beside
/// the build) with MSL's address spaces as clang address spaces (`__SM_ADDRESS_SPACES`, see
/// prelude.h: device 1, constant 2, threadgroup 3, thread the default), so that clang's type
/// system sees what Apple's sees: a `device` pointer passed to a helper that takes a
/// `thread` one, a `threadgroup` pointer stored in a `device` one, a reference to `thread`
/// memory bound to a device element. Of clang's errors, those that convert between address
/// spaces in the MSL source are reported, in Apple's terms (`device float *`, `thread float *`).
///
/// Not reported, because here they come from SoftMetal and not from the kernel: errors in the
/// runtime or the generated launchers (the runtime's functions take any pointer, as Apple's
/// take every address space they have overloads for), calls whose candidates include a
/// runtime function, constructors (C++'s implicit copy constructor cannot copy an object out
/// of another address space; MSL's can), member calls (`this` qualifiers are erased), and
/// functions the source overloads on address spaces (the translation keeps one overload).
/// Missed: what a template deduces (`thread T&` given a device lvalue deduces T with its
/// address space here), C-style casts between address spaces (clang allows them in C++), and
/// runtime functions given an address space Apple's overloads do not take.
enum MSLAddressSpaceCheck {
    static let flags = [
        "-std=c++17", "-fsyntax-only", "-D__SM_ADDRESS_SPACES=1", "-fno-exceptions", "-fno-rtti",
        "-Xclang", "-ffloat16-excess-precision=none", "-Xclang", "-fbfloat16-excess-precision=none", "-fno-math-errno", "-w", "-ferror-limit=0",
        "-fno-caret-diagnostics", "-fno-color-diagnostics",
    ]

    struct Diagnostic {
        var file: String
        var line: Int
        var severity: String
        var message: String

        /// `file:line:column: severity: message`.
        init?(_ line: Substring) {
            let parts = line.split(separator: ":", maxSplits: 4, omittingEmptySubsequences: false)
            guard parts.count == 5, let l = Int(parts[1]), Int(parts[2]) != nil else { return nil }
            let severity = String(parts[3].trimmingSpacesSub)
            guard ["error", "note", "fatal error"].contains(severity) else { return nil }
            file = String(parts[0])
            self.line = l
            self.severity = severity
            message = parts[4].trimmingSpaces
        }

        var isSoftMetal: Bool {
            file.hasPrefix(KernelCompiler.runtimePartFolder) || file.hasSuffix(".cpp") || file.contains("softmetal_runtime")
        }
    }

    /// Apple's names for the address spaces in a clang message.
    static func appleTerms(_ message: String) -> String {
        var m = message
        for (number, name) in [("1", "device"), ("2", "constant"), ("3", "threadgroup")] {
            m = m.replacingAll("address space '\(number)'", with: "address space '\(name)'")
            m = m.replacingAll("__sm_\(name) ", with: "\(name) ")
        }
        m = m.replacingAll("generic address space", with: "address space 'thread'")
        // A quoted type without an address space is a thread one.
        var out = ""
        var rest = Substring(m)
        while let open = rest.firstIndex(of: "'") {
            out += rest[...open]
            rest = rest[rest.index(after: open)...]
            guard let close = rest.firstIndex(of: "'") else { break }
            let type = rest[..<close]
            let qualified = ["device ", "constant ", "threadgroup "].contains { type.contains($0) }
            if !qualified && (type.contains("*") || type.contains("&") || m.hasPrefix("binding reference")) && !type.contains("(") {
                out += "thread "
            }
            out += type + "'"
            rest = rest[rest.index(after: close)...]
        }
        return out + rest
    }

    /// The errors to report from clang's output `log` (`overloaded`: names of functions the
    /// source overloads on address spaces), one per line, or nil.
    static func errors(_ log: String, overloaded: Set<String>) -> String? {
        var groups: [(error: Diagnostic, notes: [Diagnostic])] = []
        for line in log.split(separator: "\n") {
            guard let d = Diagnostic(line) else { continue }
            if d.severity == "note" {
                if !groups.isEmpty { groups[groups.count - 1].notes.append(d) }
            } else {
                groups.append((d, []))
            }
        }
        var reported: [String] = []
        var seen = Set<String>()
        for (error, notes) in groups where !error.isSoftMetal {
            let m = error.message
            var why: String?
            if m.hasPrefix("cannot initialize a variable of type") || m.hasPrefix("cannot initialize return object of type")
                || m.hasPrefix("cannot initialize a parameter of type") || m.hasPrefix("incompatible operand types") {
                let converts = m.contains("__sm_") && (m.contains("*'") || m.contains("&'"))
                if converts { why = m }
            } else if m.hasPrefix("binding reference of type") && m.hasSuffix("changes address space") {
                why = m
            } else if m.hasPrefix("assigning") && m.hasSuffix("changes address space of pointer") {
                why = m
            } else if m.hasPrefix("no matching function for call to '"), let name = m.split(separator: "'").dropFirst().first,
                      !overloaded.contains(String(name)) {
                let candidates = notes.filter { $0.message.hasPrefix("candidate") }
                if !candidates.isEmpty, candidates.allSatisfy({ !$0.isSoftMetal }),
                   let mismatch = candidates.first(where: { $0.message.contains("address space") }) {
                    let reason = mismatch.message.drop { $0 != ":" }.dropFirst().trimmingSpacesSub
                    why = "\(m): \(reason) (the function at \(mismatch.file):\(mismatch.line))"
                }
            }
            guard let why else { continue }
            let text = "\(error.file):\(error.line): error: \(appleTerms(why))"
            if seen.insert(text).inserted { reported.append(text) }
        }
        return reported.isEmpty ? nil : reported.prefix(8).joined(separator: "\n")
    }
}
#endif
