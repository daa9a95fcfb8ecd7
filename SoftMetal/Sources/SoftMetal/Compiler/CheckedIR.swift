#if os(Linux)
/// The memory check's build in two clang++ runs, with the LLVM IR rewritten between them:
/// sanitizer coverage traces load and store instructions but not the memory intrinsics, and
/// clang copies a struct of 32 bytes or more (steel's tile loads in MLX) with `llvm.memcpy`
/// and zeroes one with `llvm.memset`, so the check would see neither the writes nor the
/// reads. In every traced function (not `no_sanitize("coverage")`: the runtime's own code),
/// `llvm.memcpy`/`llvm.memmove`/`llvm.memset` become calls of the runtime's
/// `__sm_memcpy_checked`/`__sm_memmove_checked`/`__sm_memset_checked`, which check the
/// bytes (as the traced loads and stores do, from the call's MSL line) and then copy; the
/// runtime defines them in every checked build (`used`), so the IR already declares them.
/// The second run only generates code (`-disable-llvm-optzns`): the instrumented IR's
/// attributes describe it before the rewrite, so it must not be optimized again.
enum CheckedIR {
    /// The rewritten IR, and how many intrinsic calls it rewrote.
    static func rewriteMemoryIntrinsics(_ ir: String) -> (text: String, rewritten: Int) {
        let lines = ir.split(separator: "\n", omittingEmptySubsequences: false)
        // Attribute groups of functions that are not traced: `attributes #3 = { ... nosanitize_coverage ... }`.
        var untracedGroups = Set<Substring>()
        for line in lines where line.hasPrefix("attributes #") && line.contains("nosanitize_coverage") {
            let id = line.dropFirst("attributes ".count).prefix { $0 != " " }
            untracedGroups.insert(id)
        }
        var out: [Substring] = []
        out.reserveCapacity(lines.count + 4)
        var traced = false
        var rewritten = 0
        for line in lines {
            if line.hasPrefix("define ") {
                traced = !line.contains("nosanitize_coverage") && !line.split(separator: " ").contains { untracedGroups.contains($0) }
                out.append(line)
                continue
            }
            if line.hasPrefix("}") { traced = false }
            guard traced, line.contains("@llvm.mem"), let replaced = rewriteCall(line) else {
                out.append(line)
                continue
            }
            out.append(Substring(replaced))
            rewritten += 1
        }
        return (out.joined(separator: "\n"), rewritten)
    }

    /// What the rewrite does, in every cache key (KernelCompiler.runtimeHash): a checked
    /// build that another rewrite made is not served for this one.
    static let signature = "notail " + intrinsics.map { $0.name + $0.replacement }.joined(separator: " ")

    private static let intrinsics: [(name: String, replacement: String)] = [
        ("@llvm.memcpy.p0.p0.i64(", "@__sm_memcpy_checked("),
        ("@llvm.memmove.p0.p0.i64(", "@__sm_memmove_checked("),
        ("@llvm.memset.p0.i64(", "@__sm_memset_checked("),
    ]

    /// `call void @llvm.memcpy.p0.p0.i64(ptr ... %a, ptr ... %b, i64 32, i1 false), !dbg !7`
    /// becomes `call void @__sm_memcpy_checked(ptr ... %a, ptr ... %b, i64 32), !dbg !7`
    /// (the volatile flag dropped; the debug location kept, which names the MSL line).
    private static func rewriteCall(_ line: Substring) -> String? {
        for (name, replacement) in intrinsics {
            guard let r = line.firstRange(of: name) else { continue }
            let args = line[r.upperBound...]
            guard let flag = args.firstRange(of: ", i1 false)") ?? args.firstRange(of: ", i1 true)") else { return nil }
            var operands = String(args[..<flag.lowerBound])
            // memset's value is the runtime's uint8_t parameter, which the x86-64 ABI widens.
            if replacement == "@__sm_memset_checked(", let value = operands.firstRange(of: ", i8 ") {
                operands.replaceSubrange(value, with: ", i8 zeroext ")
            }
            // Not a tail call: the check names the copy by its return address, which a copy
            // ending the kernel would otherwise take from the kernel's caller.
            var head = String(line[..<r.lowerBound])
            if !head.contains("notail "), let tail = head.firstRange(of: "tail call ") { head.replaceSubrange(tail, with: "notail call ") }
            return head + replacement + operands + ")" + String(args[flag.upperBound...])
        }
        return nil
    }
}
#endif
