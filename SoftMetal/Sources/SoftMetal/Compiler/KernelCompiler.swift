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

    /// The runtime header's parts (Runtime/, embedded whole by the manifests) in the order
    /// they are joined: each one uses only what the parts before it declare.
    static let runtimeParts: [(name: String, text: [UInt8])] = [
        ("prelude.h", PackageResources.prelude_h),            // macros Apple's headers define
        ("abi.h", PackageResources.abi_h),                    // sm_dispatch; csoftmetal.h includes it too
        ("scalars.h", PackageResources.scalars_h),            // half, bfloat
        ("vectors.h", PackageResources.vectors_h),            // vectors, matrices, vmake, as_type
        ("math.h", PackageResources.math_h),
        ("atomics.h", PackageResources.atomics_h),            // memory flags, atomics
        ("fibers.h", PackageResources.fibers_h),              // lanes, groups, the context switch
        ("messages.h", PackageResources.messages_h),          // error messages and failing
        ("memory_check.h", PackageResources.memory_check_h),  // SM_CHECK_MEMORY builds
        ("scheduler.h", PackageResources.scheduler_h),        // round robin, run-ahead, threadgroup memory
        ("arguments.h", PackageResources.arguments_h),        // binding kernel parameters
        ("simd.h", PackageResources.simd_h),                  // barriers, simd and quad operations
        ("simdgroup_matrix.h", PackageResources.simdgroup_matrix_h),
        ("builtins.h", PackageResources.builtins_h),          // Apple's __metal_* compiler builtins
        ("language_version.h", PackageResources.language_version_h),  // names of later MSL versions withdrawn
    ]
    /// The folder the parts' `#line` directives name (see Runtime/prelude.h).
    static let runtimePartFolder = "softmetal_runtime/"
    static let runtimeHeader: String = runtimeParts.map {
        "#line 1 \"\(runtimePartFolder)\($0.name)\"\n" + String(decoding: $0.text, as: UTF8.self)
    }.joined()
    static let runtimeHash: String = Hash128.of([runtimeHeader, CheckedIR.signature])

    static let flags = [
        "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-exceptions", "-fno-rtti", "-fvisibility=hidden",
        "-Xclang", "-ffloat16-excess-precision=none", "-Xclang", "-fbfloat16-excess-precision=none", "-fno-math-errno",
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
    /// Open shared objects by key, each with the number of LoadedLibrary objects using it:
    /// counted by hand under `lock` (not weak references), so that a library going away on
    /// one thread can never be handed out again by a load on another.
    private var loaded: [String: LoadedLibrary.Record] = [:]
    /// The imports, initialisers and dependencies of a library of no kernels, per flags.
    private var baselines: [String: MSLSandbox.ELFFacts] = [:]
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

    /// Drops the in-process map from key to library, so the next load goes to the disk cache
    /// (libraries in use stay open). For tests.
    func forgetLoadedLibraries() { lock.withLock { loaded = [:] } }

    /// Seconds one clang++ run may take: `SOFTMETAL_COMPILE_TIMEOUT` (default 600; 0 = none).
    static var defaultCompileTimeout: Double {
        guard let text = SMEnv.get("SOFTMETAL_COMPILE_TIMEOUT"), let value = Double(text), value >= 0 else { return 600 }
        return value
    }

    /// Runs `body` in an interrupt scope (csm_interrupt_scope_begin): SIGINT while it runs
    /// kills the clang++ runs it started or starts, and they throw.
    static func interruptible<R>(_ body: () throws -> R) rethrows -> R {
        csm_interrupt_scope_begin()
        defer { csm_interrupt_scope_end() }
        return try body()
    }

    /// The loaded library of the compiled source; `checked`: the memory check's
    /// instrumented build. The shared object is checked (MSLSandbox.checkLibrary) before it
    /// is dlopened, also when it comes from the disk cache.
    func load(translated: String, checked: Bool = false, timeout: Double? = nil) throws -> LoadedLibrary {
        let compiler = try KernelCompiler.findCompiler()
        let flags = KernelCompiler.flags + (checked ? KernelCompiler.checkedFlags : [])
        let key = Hash128.of([translated, flags.joined(separator: " "), KernelCompiler.runtimeHash, compiler])
        if let known = lock.withLock({ () -> LoadedLibrary? in
            guard let record = loaded[key] else { return nil }
            record.users += 1
            return LoadedLibrary(record)
        }) { return known }
        let dir = KernelCompiler.cacheDirectory
        try SMFile.makeDirectories(dir)
        // dlopen goes by the path, not /proc/self/fd/N: glibc matches an object already
        // loaded by its name first, so a reused descriptor number would return another library.
        var so = try sharedObject(translated, key: key, dir: dir, compiler: compiler, flags: flags, timeout: timeout)
        var fd = open(so, O_RDONLY | O_CLOEXEC)
        if fd < 0 && errno == ENOENT {  // evicted by another process since it was found
            so = try sharedObject(translated, key: key, dir: dir, compiler: compiler, flags: flags, timeout: timeout)
            fd = open(so, O_RDONLY | O_CLOEXEC)
        }
        guard fd >= 0 else { throw SoftMetalError.compile("cannot read \(so): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let facts: MSLSandbox.ELFFacts
        do {
            guard let bytes = SMFile.readBytes(fd: fd) else { throw MSLSandbox.ELFError(message: "cannot read it") }
            facts = try MSLSandbox.parseELF(bytes)
        } catch let e as MSLSandbox.ELFError {
            throw SoftMetalError.compile("\(so): \(e.message)")
        }
        try MSLSandbox.checkLibrary(facts, baseline: try baseline(compiler: compiler, flags: flags, dir: dir, timeout: timeout),
                                    translated: translated)
        guard let handle = dlopen(so, RTLD_NOW | RTLD_LOCAL) else {
            let message = dlerror().map { String(cString: $0) } ?? "unknown error"
            throw SoftMetalError.compile("cannot load the compiled kernels \(so): \(message)")
        }
        return lock.withLock {
            // Another thread may have loaded it meanwhile: dlopen counted both opens, and
            // each record closes its own.
            let record = LoadedLibrary.Record(handle: handle, path: so, key: key)
            if loaded[key] == nil { loaded[key] = record }
            return LoadedLibrary(record)
        }
    }

    /// The cached shared object of `translated`, compiled first if the cache has none.
    /// `baseline`: SoftMetal's own reference library (named apart, not counted in `stats`).
    private func sharedObject(_ translated: String, key: String, dir: String, compiler: String, flags: [String], timeout: Double?,
                              baseline: Bool = false) throws -> String {
        let so = baseline ? "\(dir)/\(key).baseline.so" : "\(dir)/\(key).so"
        if access(so, R_OK) == 0 {
            // The cache evicts the least recently used: a hit counts as a use.
            utimensat(AT_FDCWD, so, nil, 0)
            if !baseline { lock.withLock { cacheHits += 1 } }
        } else {
            try compile(translated, key: key, dir: dir, compiler: compiler, flags: flags, output: so,
                        timeout: timeout ?? KernelCompiler.defaultCompileTimeout)
            if !baseline { lock.withLock { compilations += 1 } }
            SoftMetalCache.evictIfNeeded(dir, keep: so)
        }
        return so
    }

    /// What a library of no kernels imports and initialises with these flags (the C runtime's
    /// startup files, the runtime header): a kernel library may have that and no more.
    private func baseline(compiler: String, flags: [String], dir: String, timeout: Double?) throws -> MSLSandbox.ELFFacts {
        let text = "// SoftMetal: a library of no kernels, what every library has\n"
        let key = Hash128.of([text, flags.joined(separator: " "), KernelCompiler.runtimeHash, compiler])
        if let known = lock.withLock({ baselines[key] }) { return known }
        let so = try sharedObject(text, key: key, dir: dir, compiler: compiler, flags: flags, timeout: timeout, baseline: true)
        let facts: MSLSandbox.ELFFacts
        do { facts = try MSLSandbox.readELF(so) } catch let e as MSLSandbox.ELFError {
            throw SoftMetalError.compile("\(so): \(e.message)")
        }
        lock.withLock { baselines[key] = facts }
        return facts
    }

    /// Called by a LoadedLibrary going away: the last user of a shared object closes it.
    fileprivate func release(_ record: LoadedLibrary.Record) {
        let close = lock.withLock { () -> Bool in
            record.users -= 1
            guard record.users == 0 else { return false }
            if loaded[record.key] === record { loaded[record.key] = nil }
            return true
        }
        if close { dlclose(record.handle) }
    }

    /// `load(translated:)` and the language check of the same text (see MSLLanguageCheck),
    /// the two clang++ runs side by side when neither is cached.
    /// And the address-space check's clang output (see MSLAddressSpaceCheck), a third run.
    func loadChecked(translated: String, timeout: Double? = nil)
        throws -> (library: LoadedLibrary, findings: [MSLLanguageCheck.Finding], addressSpaceLog: String) {
        var loaded: Result<LoadedLibrary, Error>!
        var findings: [MSLLanguageCheck.Finding] = []
        var addressSpaceLog = ""
        DispatchQueue.concurrentPerform(iterations: 3) { i in
            if i == 0 {
                loaded = Result { try self.load(translated: translated, timeout: timeout) }
            } else if i == 1 {
                findings = self.languageFindings(translated: translated, timeout: timeout)
            } else {
                addressSpaceLog = self.addressSpaceLog(translated: translated, timeout: timeout)
            }
        }
        return (try loaded.get(), findings, addressSpaceLog)
    }

    /// clang's diagnostics for the translated text with address spaces as types (empty when
    /// it has none, or the check could not run), cached on disk beside the shared objects.
    func addressSpaceLog(translated: String, timeout: Double? = nil) -> String {
        let flags = MSLAddressSpaceCheck.flags
        return Self.cachedCheck(translated: translated, flags: flags, tag: "address-space-check-1", ext: "asp") { compiler, dir, source, base in
            let log = "\(base).asp.log"
            defer { unlink(log) }
            let status = SMFile.spawn([compiler] + flags + ["-I", dir, source], output: log,
                                      timeout: timeout ?? KernelCompiler.defaultCompileTimeout)
            return status >= 0 ? try? SMFile.read(log) : nil
        } ?? ""
    }

    static let languageCheckFlags = [
        "-std=c++17", "-O0", "-S", "-emit-llvm", "-gline-tables-only", "-fno-exceptions", "-fno-rtti",
        "-Xclang", "-ffloat16-excess-precision=none", "-Xclang", "-fbfloat16-excess-precision=none", "-fno-math-errno", "-w", "-ferror-limit=1",
    ]

    /// The language check's findings for a translated source, cached on disk beside the
    /// shared objects. A source that clang++ rejects has none (the build reports the error).
    func languageFindings(translated: String, timeout: Double? = nil) -> [MSLLanguageCheck.Finding] {
        let flags = KernelCompiler.languageCheckFlags
        let text = Self.cachedCheck(translated: translated, flags: flags, tag: "language-check-2", ext: "lang") { compiler, dir, source, base in
            Self.llvmIR(compiler: compiler, flags: flags, dir: dir, source: source, base: base, ext: "lang", timeout: timeout)
                .map { MSLLanguageCheck.findings(ir: $0, translated: translated).map { $0.serialized + "\n" }.joined() }
        }
        return (text ?? "").split(separator: "\n").compactMap { MSLLanguageCheck.Finding(serialized: $0) }
    }

    /// A check's source compiled to LLVM IR (`flags` say so) inside `cachedCheck`'s `run`:
    /// the IR's text, or nil when clang++ failed (a timeout also removes the run's files).
    static func llvmIR(compiler: String, flags: [String], dir: String, source: String, base: String, ext: String,
                       timeout: Double?) -> String? {
        let ir = "\(base).\(ext).ll"
        let log = "\(base).\(ext).log"
        defer { unlink(ir); unlink(log) }
        let status = SMFile.spawn([compiler] + flags + ["-I", dir, source, "-o", ir], output: log,
                                  timeout: timeout ?? KernelCompiler.defaultCompileTimeout)
        if status < 0 { SMFile.removeFiles(in: dir, prefix: String(base.dropFirst(dir.count + 1))) }
        guard status == 0 else { return nil }
        return try? SMFile.read(ir)
    }

    /// A check's clang++ run on a translated text (beside the build), cached on disk beside the
    /// shared objects as `<key>.<ext>`: the cached text, else what `run` returns (given the
    /// compiler, the cache directory, the source file written for it — `sourceText` of the
    /// file clang++ compiles for the build — and the path prefix for its temporary files;
    /// nil: nothing to cache), else nil when the check cannot run.
    static func cachedCheck(translated: String, flags: [String], tag: String, ext: String,
                            sourceText: (String) -> String = { $0 },
                            _ run: (_ compiler: String, _ dir: String, _ source: String, _ base: String) -> String?) -> String? {
        guard let compiler = try? KernelCompiler.findCompiler() else { return nil }
        let key = Hash128.of([translated, flags.joined(separator: " "), KernelCompiler.runtimeHash, compiler, tag])
        let dir = KernelCompiler.cacheDirectory
        let cached = "\(dir)/\(key).\(ext)"
        if let text = try? SMFile.read(cached), access(cached, R_OK) == 0 {
            utimensat(AT_FDCWD, cached, nil, 0)  // a use, for the cache's eviction order
            return text
        }
        guard (try? SMFile.makeDirectories(dir)) != nil else { return nil }
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        let header = "\(dir)/softmetal_runtime-\(KernelCompiler.runtimeHash).h"
        if access(header, R_OK) != 0 {
            guard (try? SMFile.writeAtomically(header, KernelCompiler.runtimeHeader, unique: unique)) != nil else { return nil }
        }
        let base = "\(dir)/\(key).\(unique)"
        let source = "\(base).\(ext).cpp"
        defer { unlink(source) }
        guard (try? SMFile.writeAtomically(source, sourceText(KernelCompiler.sourceFile(translated)), unique: unique)) != nil,
              let text = run(compiler, dir, source, base) else { return nil }
        try? SMFile.writeAtomically(cached, text, unique: unique)
        SoftMetalCache.evictIfNeeded(dir, keep: cached)
        return text
    }

    /// The file clang++ compiles: the runtime header, after the `#define` lines the text
    /// starts with (the MSL version, `__SM_METAL_VERSION`, which the runtime's version-gated
    /// declarations read, and the function constants' values), then the rest of the text.
    static func sourceFile(_ translated: String) -> String {
        var defines = Substring(translated)
        var rest = defines[...]
        while rest.hasPrefix("#define "), let newline = rest.firstIndex(of: "\n") {
            rest = rest[rest.index(after: newline)...]
        }
        defines = defines[..<rest.startIndex]
        return defines + "#include \"softmetal_runtime-\(KernelCompiler.runtimeHash).h\"\n" + rest
    }

    private func compile(_ translated: String, key: String, dir: String, compiler: String, flags: [String], output: String,
                         timeout: Double) throws {
        let unique = "\(getpid()).\(UInt64.random(in: 0..<UInt64.max))"
        let header = "\(dir)/softmetal_runtime-\(KernelCompiler.runtimeHash).h"
        if access(header, R_OK) != 0 {
            try SMFile.writeAtomically(header, KernelCompiler.runtimeHeader, unique: unique)
        }
        // A source file per compilation, so that concurrent compilers of the same key never
        // see each other's files; kept as <key>.failed.cpp when the compilation fails and
        // SOFTMETAL_KEEP_FAILED=1 (for debugging), else removed.
        let source = "\(dir)/\(key).\(unique).cpp"
        try SMFile.writeAtomically(source, KernelCompiler.sourceFile(translated), unique: unique)
        defer {
            if access(output, R_OK) != 0 && SMEnv.get("SOFTMETAL_KEEP_FAILED") == "1" {
                rename(source, "\(dir)/\(key).failed.cpp")
            } else {
                unlink(source)
            }
        }
        let temporary = "\(output).\(unique).tmp"
        let log = "\(dir)/\(key).\(unique).log"
        func run(_ argv: [String]) throws {
            let status = SMFile.spawn(argv, output: log, timeout: timeout)
            let messages = (try? SMFile.read(log)) ?? ""
            unlink(log)
            guard status == 0 else {
                unlink(temporary)
                // A stopped clang++ leaves its own temporary files (named after the output).
                if status < 0 { SMFile.removeFiles(in: dir, prefix: "\(key).so.\(unique)") }
                throw SMFile.spawnError(status, compiler: compiler, timeout: timeout) ?? SoftMetalError.compile(messages)
            }
        }
        if flags.contains(KernelCompiler.checkedFlags[0]) {
            // The memory check's build: to instrumented IR, the memory intrinsics rewritten
            // (CheckedIR), then to the shared object without optimizing again.
            let ir = "\(output).\(unique).ll"
            defer { unlink(ir) }
            try run([compiler] + flags.filter { $0 != "-shared" } + ["-S", "-emit-llvm", "-I", dir, source, "-o", ir])
            let rewritten = CheckedIR.rewriteMemoryIntrinsics(try SMFile.read(ir)).text
            try SMFile.writeAtomically(ir, rewritten, unique: unique)
            try run([compiler, "-x", "ir", ir, "-O2", "-Xclang", "-disable-llvm-optzns", "-fPIC", "-shared",
                     "-Wno-unused-command-line-argument", "-o", temporary])
        } else {
            try run([compiler] + flags + ["-I", dir, source, "-o", temporary])
        }
        guard rename(temporary, output) == 0 else {
            unlink(temporary)
            throw SoftMetalError.compile("cannot write \(output): \(String(cString: strerror(errno)))")
        }
    }
}

/// A dlopened kernel library, closed (dlclose) when the last kernel, pipeline or library
/// that uses it goes away: code of a closed library must never run again, so whatever
/// holds a launcher of it holds this.
final class LoadedLibrary: @unchecked Sendable {
    /// One dlopen of a shared object; `users` (under KernelCompiler's lock) counts the
    /// LoadedLibrary objects holding it.
    fileprivate final class Record {
        let handle: UnsafeMutableRawPointer
        let path: String
        let key: String
        var users = 1
        init(handle: UnsafeMutableRawPointer, path: String, key: String) {
            self.handle = handle
            self.path = path
            self.key = key
        }
    }

    private let record: Record
    var handle: UnsafeMutableRawPointer { record.handle }
    var path: String { record.path }

    fileprivate init(_ record: Record) { self.record = record }

    deinit { KernelCompiler.shared.release(record) }
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
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        while let entry = readdir(dir) {
            // Read in place up to its NUL: a copy of the whole 256-byte d_name would take in
            // the bytes past the record, which readdir never wrote (valgrind reports them).
            let name = String(cString: (UnsafeRawPointer(entry) + nameOffset).assumingMemoryBound(to: CChar.self))
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    static func read(_ path: String) throws -> String {
        guard let bytes = readBytes(path) else { throw SoftMetalError.compile("cannot read \(path)") }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Runs the compiler (csm_spawn_wait_limited): its exit status, or a CSM_SPAWN_* code.
    static func spawn(_ argv: [String], output: String, timeout: Double) -> Int32 {
        var cStrings: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) }
        cStrings.append(nil)
        defer { for p in cStrings { free(p) } }
        return cStrings.withUnsafeBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buffer.count) {
                csm_spawn_wait_limited($0, output, timeout)
            }
        }
    }

    /// The error for a run that did not end by itself (nil for an exit status).
    static func spawnError(_ status: Int32, compiler: String, timeout: Double) -> SoftMetalError? {
        switch status {
        case Int32(CSM_SPAWN_FAILED): return .compile("cannot run \(compiler): \(String(cString: strerror(errno)))")
        case Int32(CSM_SPAWN_INTERRUPTED): return .compile("the compile was interrupted (SIGINT); clang++ was stopped")
        case Int32(CSM_SPAWN_TIMED_OUT):
            return .compile("clang++ did not finish within \(timeout) s and was stopped (SOFTMETAL_COMPILE_TIMEOUT, or the compile options' time limit)")
        default: return nil
        }
    }

    /// True for the error of a compile stopped by SIGINT or its time limit.
    static func isStopped(_ e: SoftMetalError) -> Bool {
        guard case .compile(let m) = e else { return false }
        return m.contains("the compile was interrupted (SIGINT)") || m.contains("did not finish within")
    }

    static func removeFiles(in dir: String, prefix: String) {
        for name in (try? listDirectory(dir)) ?? [] where name.hasPrefix(prefix) { unlink("\(dir)/\(name)") }
    }

    static func readBytes(fd: Int32) -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { return nil }
            if n == 0 { return bytes }
            bytes += chunk[0..<n]
        }
    }

    static func readBytes(_ path: String) -> [UInt8]? {
        guard let f = fopen(path, "rb") else { return nil }
        defer { fclose(f) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, f) }
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        return bytes
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
