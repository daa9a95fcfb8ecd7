#if os(Linux)
import Glibc

/// The disk cache's size bound. Without one, every distinct source (a fuzzer, a sweep over
/// macro values, each of ggml's ~650 kernels) adds a shared object for good.
///
/// Least recently used goes first: a cache hit touches its shared object
/// (KernelCompiler.sharedObject), and each new one written runs this. Above
/// `SOFTMETAL_CACHE_MAX_MB` (default 1024) the oldest entries are removed until the cache
/// is at 90% of it, so that writes do not evict one entry each. Leftovers of processes that
/// died mid-compile (temporary files, preprocessor folders) are removed once an hour old.
enum SoftMetalCache {
    static var maxBytes: Int {
        guard let text = SMEnv.get("SOFTMETAL_CACHE_MAX_MB"), let mb = Double(text), mb >= 0 else { return 1024 << 20 }
        return Int(mb * 1048576)
    }

    /// Files whose loss costs at most a compile. The stand-in headers and the current
    /// runtime header are not among them (compiles in progress read them).
    static func isEvictable(_ name: String) -> Bool {
        if name.hasPrefix("softmetal_runtime-") { return !name.contains(KernelCompiler.runtimeHash) && name.hasSuffix(".h") }
        // The sandbox's reference libraries (a few, small) are read at every first load.
        if name.hasSuffix(".baseline.so") { return false }
        return name.hasSuffix(".so") || name.hasSuffix(".lang") || name.hasSuffix(".failed.cpp")
    }

    /// Temporary files of one compile or preprocessor run; stale when an hour old.
    static func isTemporary(_ name: String) -> Bool {
        name.hasSuffix(".tmp") || name.hasSuffix(".cpp") || name.hasSuffix(".log") || name.hasSuffix(".ll")
            || name.hasPrefix("pp.") || name.hasPrefix("symbolize.")
    }

    static func evictIfNeeded(_ dir: String, keep: String) {
        let limit = maxBytes
        guard let names = try? SMFile.listDirectory(dir) else { return }
        let now = time(nil)
        var entries: [(path: String, bytes: Int, used: Int)] = []
        var total = 0
        for name in names {
            let path = "\(dir)/\(name)"
            var st = stat()
            guard lstat(path, &st) == 0 else { continue }
            let isDirectory = st.st_mode & S_IFMT == S_IFDIR
            if isTemporary(name) && !isEvictable(name) {
                if now - st.st_mtim.tv_sec > 3600 {
                    if isDirectory { removeTree(path) } else { unlink(path) }
                }
                continue
            }
            guard !isDirectory, isEvictable(name) || path == keep else { continue }
            let bytes = Int(st.st_blocks) * 512
            total += bytes
            // The entry just written counts, but is never the one to go.
            if path != keep { entries.append((path, bytes, Int(st.st_mtim.tv_sec) * 1_000_000_000 + Int(st.st_mtim.tv_nsec))) }
        }
        guard total > limit else { return }
        let target = limit / 10 * 9
        for e in entries.sorted(by: { $0.used < $1.used }) {
            if total <= target { break }
            if unlink(e.path) == 0 { total -= e.bytes }
        }
    }

    /// A preprocessor folder left by a process that died: its few files, then itself.
    static func removeTree(_ path: String) {
        for name in (try? SMFile.listDirectory(path)) ?? [] { unlink("\(path)/\(name)") }
        rmdir(path)
    }
}
#endif
