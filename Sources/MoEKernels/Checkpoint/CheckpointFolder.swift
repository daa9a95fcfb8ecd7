#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A checkpoint folder as the boundary of what a checkpoint may make us read. The folder's
/// files name other files (the shard index names shards); all of them must be regular
/// files inside the folder once symlinks are resolved, or inside the blob store of a
/// Hugging Face cache when the folder is one of its snapshots or a folder in one
/// (`models--org--name/snapshots/<rev>/x -> ../../blobs/<hash>`). Devices, FIFOs and
/// directories are refused before they are read, so a file can neither block the call nor
/// feed it without end.
///
/// Paths are kept as bytes: a folder whose name is not UTF-8 is still a folder.
struct CheckpointFolder {
    /// The path as given, for messages (invalid UTF-8 shown as U+FFFD).
    let display: String
    private let root: [UInt8]
    private let blobStore: [UInt8]?

    /// JSON files are read whole; their limits are far above any real config or index
    /// (DeepSeek-V3's index, about 92k tensors, is under 10 MB).
    static let configLimit = 16 << 20
    static let indexLimit = 256 << 20

    /// `what` names the folder in errors.
    init(path: [UInt8], what: String = "the checkpoint folder") throws {
        display = String(decoding: path, as: UTF8.self)
        guard !path.isEmpty else { throw MoEError.invalidArgument("the checkpoint path is empty") }
        guard !path.contains(0) else { throw MoEError.invalidArgument("the checkpoint path contains a NUL byte") }
        guard let resolved = Self.realPath(path) else {
            throw MoEError.invalidArgument("cannot open \(what) \(display): \(Self.lastError())")
        }
        guard Self.isFolder(resolved) else {
            throw MoEError.invalidArgument("\(display) is not a folder: from_pretrained takes the folder that holds "
                                           + "config.json and the safetensors files, a .gguf file, or a folder of GGUF files")
        }
        root = resolved
        // A snapshot `snapshots/<rev>`, or a folder inside one (split GGUF quants are often
        // in sub-folders: `snapshots/<rev>/Q8_0/`): its files link to `<repo>/blobs/`.
        let parts = resolved.split(separator: UInt8(ascii: "/"))
        if let at = parts.dropLast().lastIndex(where: { $0.elementsEqual("snapshots".utf8) }), at >= 1,
           parts[at - 1].starts(with: "models--".utf8) {
            let repo = parts[..<at].reduce(into: [UInt8]()) { $0 += [UInt8(ascii: "/")] + $1 }
            blobStore = Self.realPath(repo + Array("/blobs".utf8))
        } else {
            blobStore = nil
        }
    }

    /// `name` relative to the folder: a plain relative path without `..` (index files are
    /// data from anywhere).
    func checkName(_ name: String, what: String) throws {
        let components = name.split(separator: "/", omittingEmptySubsequences: false)
        guard !name.isEmpty, !name.utf8.contains(0), !name.hasPrefix("/"),
              components.allSatisfy({ !$0.isEmpty && $0 != ".." && $0 != "." }) else {
            throw MoEError.invalidArgument("\(what) names \(Self.quoted(name)): a file must be named by a relative "
                                           + "path inside the checkpoint folder")
        }
    }

    /// Whether `path` is a folder (after symlinks).
    static func isFolder(_ path: [UInt8]) -> Bool {
        var info = stat()
        return !path.contains(0) && withCString(path, { stat($0, &info) }) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// The names of the folder's entries that end in `suffix` in any letter case (`.GGUF`
    /// files exist), sorted (what they are is checked when one is opened).
    func names(withSuffix suffix: String) throws -> [String] {
        guard let dir = Self.withCString(root, { opendir($0) }) else {
            throw MoEError.invalidArgument("cannot list \(display): \(Self.lastError())")
        }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.lowercased().hasSuffix(suffix.lowercased()) && !name.hasPrefix(".") { names.append(name) }
        }
        return names.sorted()
    }

    func contains(_ name: String) -> Bool {
        Self.withCString(root + Array(("/" + name).utf8)) { access($0, F_OK) } == 0
    }

    /// Opens `name` for reading after the checks above; returns the descriptor and size.
    func open(_ name: String) throws -> (fd: Int32, size: Int) {
        try checkName(name, what: display)
        let where_ = "\(name) in \(display)"
        guard let resolved = Self.realPath(root + Array(("/" + name).utf8)) else {
            throw MoEError.invalidArgument("cannot open \(where_): \(Self.lastError())")
        }
        let inside = [root, blobStore].contains { store in
            guard let store else { return false }
            return resolved.count > store.count + 1 && resolved.starts(with: store + [UInt8(ascii: "/")])
        }
        guard inside else {
            throw MoEError.invalidArgument("\(where_) is a link to \(String(decoding: resolved, as: UTF8.self)), "
                                           + "outside the checkpoint folder")
        }
        // O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
        let fd = Self.withCString(resolved) { systemOpen($0, O_RDONLY | O_NONBLOCK | O_CLOEXEC) }
        guard fd >= 0 else { throw MoEError.invalidArgument("cannot open \(where_): \(Self.lastError())") }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            close(fd)
            throw MoEError.invalidArgument("cannot stat \(where_): \(Self.lastError())")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            close(fd)
            throw MoEError.invalidArgument("\(where_) is not a regular file")
        }
        return (fd, Int(info.st_size))
    }

    /// A whole JSON file of the folder, at most `limit` bytes.
    func readJSON(_ name: String, limit: Int) throws -> JSON {
        let (fd, size) = try open(name)
        defer { close(fd) }
        guard size <= limit else {
            throw MoEError.invalidArgument("\(name) in \(display) is too large for a JSON file of a checkpoint "
                                           + "(\(size) bytes; the limit is \(limit >> 20) MiB)")
        }
        var bytes = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + done, size - done) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw MoEError.invalidArgument("cannot read \(name) in \(display): \(Self.lastError())") }
            done += n
        }
        return try bytes.withUnsafeBytes { try JSON.parse($0, what: "\(name) in \(display)") }
    }

    /// A name from a file, in quotes, with control characters escaped (never raw bytes).
    static func quoted(_ s: String) -> String {
        "\"" + s.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "\\u{\(String($0.value, radix: 16))}" : String($0) }
            .joined() + "\""
    }

    private static func lastError() -> String { String(cString: strerror(errno)) }

    private static func withCString<R>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        (bytes + [0]).withUnsafeBufferPointer { $0.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) } }
    }

    private static func realPath(_ path: [UInt8]) -> [UInt8]? {
        withCString(path) { p -> [UInt8]? in
            guard let resolved = realpath(p, nil) else { return nil }
            defer { free(resolved) }
            return Array(UnsafeBufferPointer(start: UnsafeRawPointer(resolved).assumingMemoryBound(to: UInt8.self),
                                             count: strlen(resolved)))
        }
    }
}

/// open(2), which `CheckpointFolder.open` hides inside the struct.
private func systemOpen(_ path: UnsafePointer<CChar>, _ flags: Int32) -> Int32 {
    open(path, flags)
}
