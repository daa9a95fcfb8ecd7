#if os(Linux)
/// Preprocessor lines the translation acts on. Most directives are gone by the time the
/// translator runs (the preprocessor step has expanded them); what is left are its line
/// markers, which stay, and these.
extension MSLTranslator {
    /// `#include <metal_*>` and `<simd/*>` lines are blanked: the runtime header, included
    /// first, stands in for them.
    mutating func blankMetalIncludes() {
        var start = 0
        while start < text.count {
            var end = start
            while end < text.count && text[end] != Byte.newline { end += 1 }
            let line = string(start, end).trimmingSpaces
            if line.hasPrefix("#") {
                let rest = line.dropFirst().trimmingSpacesSub
                if rest.hasPrefix("include") {
                    let target = rest.dropFirst("include".count).trimmingSpacesSub
                    if target.hasPrefix("<metal_") || target.hasPrefix("<simd/") {
                        for k in start..<end { text[k] = Byte.space }
                    }
                }
            }
            start = end + 1
        }
    }

    /// `#pragma unroll` / `nounroll` is a hint, and its argument may name macros the
    /// separate preprocessing step has already dropped (`#pragma unroll(MIN(DK8/2, 4*NSG))`,
    /// ggml): the rest of the line is blanked.
    mutating func blankLoopPragmas() throws {
        try walk { t, v in
            guard v.inDirective, t.word(v) == "pragma", let (next, _) = t.identifier(at: t.skipSpace(v.end)),
                  next == "unroll" || next == "nounroll" else { return nil }
            var e = v.end
            while e < t.text.count && t.text[e] != Byte.newline { e += 1 }
            t.edits.append((v.start, e, MSLTranslator.blank(t.text[v.start..<e])))
            t.claims[v.start] = e
            return e
        }
    }
}
#endif
