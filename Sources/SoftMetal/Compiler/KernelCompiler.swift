#if os(Linux)
import CSoftMetal
import Dispatch
import Glibc

/// Compiles translated MSL with clang++ into a shared object, cached on disk by a hash of
/// the translated source, the flags and the runtime header, and dlopens it.
///
/// Cache directory: $SOFTMETAL_CACHE_DIR, else $XDG_CACHE_HOME/moe-swift/softmetal, else
/// ~/.cache/moe-swift/softmetal. Files are written under a temporary name and renamed, so
/// concurrent processes never see half-written files. Compiler: $SOFTMETAL_CXX, else
/// clang++ on PATH.
final class KernelCompiler: @unchecked Sendable {
    static let shared = KernelCompiler()

    static let runtimeHeader: String = String(decoding: PackageResources.softmetal_runtime_h, as: UTF8.self)
    static let runtimeHash: String = Hash128.of([runtimeHeader])

    static let flags = [
        "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-exceptions", "-fno-rtti", "-fvisibility=hidden",
        "-Xclang", "-ffloat16-excess-precision=none", "-fno-math-errno",
        "-Wno-unused-variable", "-Wno-unused-parameter", "-Wno-unknown-pragmas", "-Wno-unknown-attributes",
        "-Wno-unused-function", "-Wno-duplicate-decl-specifier", "-fstack-clash-protection", "-ferror-limit=20", "-fno-color-diagnostics", "-fno-caret-diagnostics",
    ]

    /// Added for the memory check's build of a library: every load and store calls the
    /// runtime (sanitizer coverage's trace-loads/stores); no vectorizing and no builtins, so
    /// that no access is merged into a wider one or becomes a memset/memcpy call the
    /// instrumentation cannot see; line tables to name the MSL lines in reports.
    static let checkedFlags = [
        "-DSM_CHECK_MEMORY=1", "-fsanitize-coverage=func,trace-loads,trace-stores", "-fno-vectorize",
        "-fno-slp-vectorize", "-fno-builtin", "-gline-tables-only",
    ]

    private let lock = SMLock()
    private var loaded: [String: (handle: UnsafeMutableRawPointer, path: String)] = [:]
    private(set) var compilations = 0
    private(set) var cacheHits = 0

    struct Stats { var compilations: Int; var cacheHits: Int }
    var stats: Stats { lock.withLock { Stats(compilations: compilations, cacheHits: cacheHits) } }

    static var cacheDirectory: String {
        let env = SMEnv.self
        if let dir = env.get("SOFTMETAL_CACHE_DIR"), !dir.isEmpty { return dir }
        if let xdg = env.get("XDG_CACHE_HOME"), !xdg.isEmpty { return xdg + "/moe-swift/softmetal" }
        if let home = env.get("HOME"), !home.isEmpty { return home + "/.cache/moe-swift/softmetal" }
        return "/tmp/moe-swift-softmetal-\(getuid())"
    }

    static func findCompiler() throws -> String {
        if let cxx = SMEnv.get("SOFTMETAL_CXX"), !cxx.isEmpty {
            guard access(cxx, X_OK) == 0 || !cxx.contains("/") else {
                throw SoftMetalError.compile("SOFTMETAL_CXX=\(cxx) is not an executable")
            }
            return cxx
        }
        for dir in (SMEnv.get("PATH") ?? "/usr/bin:/bin").split(separator: ":") {
            let candidate = String(dir) + "/clang++"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        throw SoftMetalError.compile(
            "SoftMetal compiles MSL with clang++, which is not on PATH: install clang (the Swift toolchain ships one in its usr/bin) or set SOFTMETAL_CXX")
    }

    /// Drops the in-process map from key to handle, so the next load goes to the disk cache
    /// (the handles stay open). For tests.
    func forgetLoadedLibraries() { lock.withLock { loaded = [:] } }

    /// Returns the dlopen handle of the compiled source and the shared object's path;
    /// `checked`: the memory check's instrumented build.
    func load(translated: String, checked: Bool = false) throws -> (handle: UnsafeMutableRawPointer, path: String) {
        let compiler = try KernelCompiler.findCompiler()
        let flags = KernelCompiler.flags + (checked ? KernelCompiler.checkedFlags : [])
        let key = Hash128.of([translated, flags.joined(separator: " "), KernelCompiler.runtimeHash, compiler])
        if let known = lock.withLock({ loaded[key] }) { return known }
        let dir = KernelCompiler.cacheDirectory
        try SMFile.makeDirectories(dir)
        let so = "\(dir)/\(key).so"
        if access(so, R_OK) == 0 {
            lock.withLock { cacheHits += 1 }
        } else {
            try compile(translated, key: key, dir: dir, compiler: compiler, flags: flags, output: so)
            lock.withLock { compilations += 1 }
        }
        guard let handle = dlopen(so, RTLD_NOW | RTLD_LOCAL) else {
            let message = dlerror().map { String(cString: $0) } ?? "unknown error"
            throw SoftMetalError.compile("cannot load the compiled kernels \(so): \(message)")
        }
        lock.withLock { loaded[key] = (handle, so) }
        return (handle, so)
    }

    /// `load(translated:)` and the language check of the same text (see MSLLanguageCheck),
    /// the two clang++ runs side by side when neither is cached.
    func loadChecked(translated: String) throws -> (handle: UnsafeMutableRawPointer, path: String, findings: [MSLLanguageCheck.Finding]) {
        var loaded: Result<(handle: UnsafeMutableRawPointer, path: String), Error>!
        var findings: [MSLLanguageCheck.Finding] = []
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            if i == 0 {
                loaded = Result { try self.load(translated: translated) }
            } else {
                findings = self.languageFindings(translated: translated)
            }
        }
        let (handle, path) = try loaded.get()
        return (handle, path, findings)
    }

    static let languageCheckFlags = [
        "-std=c++17", "-O0", "-S", "-emit-llvm", "-gline-tables-only", "-fno-exceptions", "-fno-rtti",
        "-Xclang", "-ffloat16-excess-precision=none", "-fno-math-errno", "-w", "-ferror-limit=1",
    ]

    /// The language check's findings for a translated source, cached on disk beside the
    /// shared objects. A source that clang++ rejects has none (the build reports the error).
    func languageFindings(translated: String) -> [MSLLanguageCheck.Finding] {
        guard let compiler = try? KernelCompiler.findCompiler() else { return [] }
        let flags = KernelCompiler.languageCheckFlags
        let key = Hash128.of([translated, flags.joined(separator: " "), KernelCompiler.runtimeHash, compiler, "language-check-2"])
        let dir = KernelCompiler.cacheDirectory
        let cached = "\(dir)/\(key).lang"
        if let text = try? SMFile.read(cached), access(cached, R_OK) == 0 {
            return text.split(separator: "\n").compactMap { MSLLanguageCheck.Finding(serialized: $0) }
        }
        guard (try? SMFile.makeDirectories(dir)) != nil else { return [] }
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        let header = "\(dir)/softmetal_runtime-\(KernelCompiler.runtimeHash).h"
        if access(header, R_OK) != 0 {
            guard (try? SMFile.writeAtomically(header, KernelCompiler.runtimeHeader, unique: unique)) != nil else { return [] }
        }
        let source = "\(dir)/\(key).\(unique).lang.cpp"
        let ir = "\(dir)/\(key).\(unique).ll"
        let log = "\(dir)/\(key).\(unique).lang.log"
        defer { unlink(source); unlink(ir); unlink(log) }
        guard (try? SMFile.writeAtomically(source, "#include \"softmetal_runtime-\(KernelCompiler.runtimeHash).h\"\n" + translated, unique: unique)) != nil,
              SMFile.spawn([compiler] + flags + ["-I", dir, source, "-o", ir], output: log) == 0,
              let text = try? SMFile.read(ir) else { return [] }
        let findings = MSLLanguageCheck.findings(ir: text, translated: translated)
        try? SMFile.writeAtomically(cached, findings.map { $0.serialized + "\n" }.joined(), unique: unique)
        return findings
    }

    private func compile(_ translated: String, key: String, dir: String, compiler: String, flags: [String], output: String) throws {
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        let header = "\(dir)/softmetal_runtime-\(KernelCompiler.runtimeHash).h"
        if access(header, R_OK) != 0 {
            try SMFile.writeAtomically(header, KernelCompiler.runtimeHeader, unique: unique)
        }
        // A source file per compilation, so that concurrent compilers of the same key never
        // see each other's files; kept as <key>.failed.cpp when the compilation fails (for debugging).
        let source = "\(dir)/\(key).\(unique).cpp"
        try SMFile.writeAtomically(source, "#include \"softmetal_runtime-\(KernelCompiler.runtimeHash).h\"\n" + translated, unique: unique)
        defer {
            if access(output, R_OK) == 0 { unlink(source) } else { rename(source, "\(dir)/\(key).failed.cpp") }
        }
        let temporary = "\(output).\(unique).tmp"
        let log = "\(dir)/\(key).\(unique).log"
        let argv = [compiler] + flags + ["-I", dir, source, "-o", temporary]
        let status = SMFile.spawn(argv, output: log)
        let messages = (try? SMFile.read(log)) ?? ""
        unlink(log)
        guard status == 0 else {
            unlink(temporary)
            if status < 0 {
                throw SoftMetalError.compile("cannot run \(compiler): \(String(cString: strerror(errno)))")
            }
            throw SoftMetalError.compile(messages)
        }
        guard rename(temporary, output) == 0 else {
            unlink(temporary)
            throw SoftMetalError.compile("cannot write \(output): \(String(cString: strerror(errno)))")
        }
    }
}

/// Small file helpers on Glibc (the library avoids Foundation).
enum SMFile {
    static func makeDirectories(_ path: String) throws {
        var current = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            current += "/" + part
            if mkdir(current, 0o755) != 0 && errno != EEXIST {
                throw SoftMetalError.compile("cannot create the cache directory \(current): \(String(cString: strerror(errno)))")
            }
        }
    }

    static func writeAtomically(_ path: String, _ text: String, unique: String) throws {
        let temporary = "\(path).\(unique).tmp"
        guard let f = fopen(temporary, "wb") else {
            throw SoftMetalError.compile("cannot write \(temporary): \(String(cString: strerror(errno)))")
        }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, f) }
        fclose(f)
        guard written == bytes.count, rename(temporary, path) == 0 else {
            unlink(temporary)
            throw SoftMetalError.compile("cannot write \(path): \(String(cString: strerror(errno)))")
        }
    }

    static func listDirectory(_ path: String) throws -> [String] {
        guard let dir = opendir(path) else { throw SoftMetalError.compile("cannot list \(path)") }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    static func read(_ path: String) throws -> String {
        guard let f = fopen(path, "rb") else { throw SoftMetalError.compile("cannot read \(path)") }
        defer { fclose(f) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, f) }
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func spawn(_ argv: [String], output: String) -> Int32 {
        var cStrings: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) }
        cStrings.append(nil)
        defer { for p in cStrings { free(p) } }
        return cStrings.withUnsafeBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buffer.count) {
                csm_spawn_wait($0, output)
            }
        }
    }
}

enum SMEnv {
    static func get(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        return String(cString: value)
    }
}

/// A pthread mutex (works on Swift 6.0 and every platform).
final class SMLock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    init() {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }
    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }
    func withLock<R>(_ body: () throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }
}
#endif
