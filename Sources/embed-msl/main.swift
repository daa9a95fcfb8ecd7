// embed-msl: writes the Metal library's MSL source as a Swift string literal, for the
// EmbedMSL build plugin (Plugins/EmbedMSL).
//
//     embed-msl <library.txt> <package directory> <output.swift>
//
// The kernel files of the list, in order, each `#include "x.h"` replaced by the file it
// names (found next to the including file, then in the list's include folders; pasted
// at every include, as a preprocessor would, so include guards drop repeats), with
// `#line` markers so that the Metal compiler's messages name the original file and line.
// Apple's makeLibrary(source:) cannot resolve includes, so this is the one place they are
// pasted. Paths in the markers are relative to the package directory, so the output
// does not depend on where the checkout lies.
//
// The output is rewritten only when its text changes, so that a build that ran this
// command (an edited header elsewhere in an include folder) recompiles nothing.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

struct Failure: Error, CustomStringConvertible {
    let description: String
}

func readFile(_ path: String) throws -> String {
    guard let file = fopen(path, "rb") else { throw Failure(description: "cannot read \(path)") }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = fread(&buffer, 1, buffer.count, file)
        if n > 0 { bytes += buffer[0..<n] }
        if n < buffer.count {
            if ferror(file) != 0 { throw Failure(description: "cannot read \(path)") }
            break
        }
    }
    return String(decoding: bytes, as: UTF8.self)
}

func writeFile(_ path: String, _ text: String) throws {
    guard let file = fopen(path, "wb") else { throw Failure(description: "cannot write \(path)") }
    let bytes = Array(text.utf8)
    let written = fwrite(bytes, 1, bytes.count, file)
    guard fclose(file) == 0, written == bytes.count else { throw Failure(description: "cannot write \(path)") }
}

func isFile(_ path: String) -> Bool {
    var info = stat()
    return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG
}

func folder(of path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return String(path[..<slash])
}

/// `a/./b/../c` -> `a/c`, lexically.
func normalized(_ path: String) -> String {
    var parts: [Substring] = []
    for part in path.split(separator: "/") where part != "." {
        if part == "..", let last = parts.last, last != ".." { parts.removeLast() } else { parts.append(part) }
    }
    return (path.hasPrefix("/") ? "/" : "") + parts.joined(separator: "/")
}

/// library.txt: `include <folder>` and `kernels <file>` lines, paths relative to its folder.
struct LibraryList {
    var includeFolders: [String] = []
    var kernelFiles: [String] = []

    init(path: String) throws {
        let base = folder(of: path)
        for (index, raw) in try readFile(path).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.drop { $0 == " " || $0 == "\t" }
            if line.isEmpty || line.hasPrefix("#") { continue }
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.count == 2 else { throw Failure(description: "\(path):\(index + 1): expected `include <folder>` or `kernels <file>`") }
            let value = normalized(base + "/" + words[1])
            switch words[0] {
            case "include": includeFolders.append(value)
            case "kernels": kernelFiles.append(value)
            default: throw Failure(description: "\(path):\(index + 1): unknown entry `\(words[0])`")
            }
        }
    }
}

/// The name of `#include "name"` on this line, if it is one.
func quotedInclude(_ line: Substring) -> Substring? {
    var rest = line.drop { $0 == " " || $0 == "\t" }
    guard rest.first == "#" else { return nil }
    rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
    guard rest.hasPrefix("include") else { return nil }
    rest = rest.dropFirst(7).drop { $0 == " " || $0 == "\t" }
    guard rest.first == "\"", let end = rest.dropFirst().firstIndex(of: "\"") else { return nil }
    return rest[rest.index(after: rest.startIndex)..<end]
}

struct Assembler {
    let list: LibraryList
    let packageDirectory: String
    var out: [Substring] = []

    func shown(_ path: String) -> String {
        let root = normalized(packageDirectory)
        return path.hasPrefix(root + "/") ? String(path.dropFirst(root.count + 1)) : path
    }

    func marker(_ line: Int, _ path: String) -> Substring {
        Substring("#line \(line) \"\(shown(path))\"")
    }

    mutating func paste(_ path: String, depth: Int) throws {
        guard depth < 32 else { throw Failure(description: "\(shown(path)): includes nested 32 deep (a header that includes itself without a guard?)") }
        out.append(marker(1, path))
        let lines = try readFile(path).split(separator: "\n", omittingEmptySubsequences: false)
        // A file's final newline ends its last line; it does not start another one.
        let count = lines.last == "" ? lines.count - 1 : lines.count
        for (index, line) in lines[0..<count].enumerated() {
            guard let name = quotedInclude(line) else {
                out.append(line)
                continue
            }
            let candidates = ([folder(of: path)] + list.includeFolders).map { normalized($0 + "/" + name) }
            guard let found = candidates.first(where: isFile) else {
                let folders = list.includeFolders.map(shown).joined(separator: ", ")
                throw Failure(description: "\(shown(path)):\(index + 1): #include \"\(name)\" is in none of \(shown(folder(of: path))), \(folders)")
            }
            try paste(found, depth: depth + 1)
            out.append(marker(index + 2, path))
        }
    }

    static func source(list: LibraryList, packageDirectory: String) throws -> String {
        var assembler = Assembler(list: list, packageDirectory: packageDirectory)
        for file in list.kernelFiles { try assembler.paste(file, depth: 0) }
        return assembler.out.joined(separator: "\n") + "\n"
    }
}

/// A Swift raw multi-line string literal holding `text` exactly.
func literal(_ text: String) -> String {
    var hashes = "#"
    while text.contains("\"" + hashes) || text.contains("\\" + hashes) { hashes += "#" }
    // A multi-line literal drops the newline before its closing delimiter: one more keeps
    // the text's own final newline.
    return "\(hashes)\"\"\"\n\(text)\n\"\"\"\(hashes)"
}

func main() throws {
    let arguments = CommandLine.arguments
    guard arguments.count == 4 else { throw Failure(description: "usage: embed-msl <library.txt> <package directory> <output.swift>") }
    let list = try LibraryList(path: arguments[1])
    let assembler = Assembler(list: list, packageDirectory: arguments[2])
    let source = try Assembler.source(list: list, packageDirectory: arguments[2])
    let text = """
        // Generated at build time by Plugins/EmbedMSL from \(assembler.shown(normalized(arguments[1]))): not kept in the repository.

        enum MetalSources {
            /// The Metal library's source (see embed-msl).
            static let library = \(literal(source))

            /// Its kernel files, in order.
            static let kernelFiles = [\(list.kernelFiles.map { "\"\(assembler.shown($0))\"" }.joined(separator: ", "))]
        }

        """
    if isFile(arguments[3]), (try? readFile(arguments[3])) == text { return }
    try writeFile(arguments[3], text)
}

do {
    try main()
} catch {
    fputs("embed-msl: error: \(error)\n", stderr)
    exit(1)
}
