#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How much memory a layer's copies of its weights may take, checked before anything is
/// allocated: an allocation that the kernel grants lazily would otherwise succeed and the
/// OOM killer end the process later, while its pages are filled.
enum MemoryBudget {
    /// The bytes that can be allocated now and their source: the smallest of `limit` (the
    /// caller's), MemAvailable of /proc/meminfo and what the cgroup (v2 or v1) has left;
    /// nil where none of them is known (macOS without a caller's limit).
    static func available(limit: Int?) -> (bytes: Int, source: String)? {
        var best: (bytes: Int, source: String)?
        func consider(_ bytes: Int?, _ source: String) {
            guard let bytes, bytes >= 0 else { return }
            if best == nil || bytes < best!.bytes { best = (bytes, source) }
        }
        consider(limit, "the memory_limit given")
        #if os(Linux)
        consider(memInfoAvailable(), "MemAvailable of /proc/meminfo")
        if let cgroup = cgroupLeft() { consider(cgroup.bytes, cgroup.source) }
        #endif
        return best
    }

    /// Whether `needed` bytes fit in what `available(limit:)` says.
    static func fits(_ needed: Int, limit: Int?) -> Bool {
        guard let found = available(limit: limit) else { return true }
        return needed <= found.bytes
    }

    static let readInPlaceHint = "Weights loaded with from_pretrained are read in place from the mapped files "
        + "where the backend's kernels can read their stored format"

    /// Throws MoEError.outOfMemory naming `needed` (the bytes `what` would copy) if they
    /// exceed what `available(limit:)` says; `hint` says how to need fewer.
    static func check(needed: Int, limit: Int?, what: String, hint: String = readInPlaceHint) throws {
        guard let found = available(limit: limit), needed > found.bytes else { return }
        let (bytes, source) = found
        throw MoEError.outOfMemory(
            "\(what) needs \(needed) bytes (\(gib(needed))) for its copies of the weights, but only \(bytes) bytes "
            + "(\(gib(bytes))) are available (\(source)); nothing was allocated. \(hint)")
    }

    private static func gib(_ bytes: Int) -> String {
        let g = Double(bytes) / Double(1 << 30)
        return g >= 0.1 ? "\(Double(Int(g * 100)) / 100) GiB" : "\(bytes / 1024) KiB"
    }

    #if os(Linux)
    private static func read(_ path: String) -> String? {
        guard let f = fopen(path, "r") else { return nil }
        defer { fclose(f) }
        var out = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = fread(&chunk, 1, chunk.count, f)
            if n <= 0 { break }
            out += chunk[0..<n]
            if out.count > 1 << 20 { break }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func number(_ path: String) -> Int? {
        read(path).flatMap { Int(String($0.prefix { !$0.isWhitespace })) }
    }

    static func memInfoAvailable() -> Int? {
        guard let text = read("/proc/meminfo") else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("MemAvailable:") {
            let fields = line.split(separator: " ")
            if fields.count >= 2, let kb = Int(fields[1]) { return kb * 1024 }
        }
        return nil
    }

    /// The cgroup's limit minus its usage, for the cgroup of this process (v2's unified
    /// hierarchy, else v1's memory controller); nil without a limit.
    static func cgroupLeft() -> (bytes: Int, source: String)? {
        guard let membership = read("/proc/self/cgroup") else { return nil }
        for line in membership.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            let path = String(fields[2])
            if fields[0] == "0" && fields[1].isEmpty {
                // v2: inside a container the cgroup namespace's root is the mount's root.
                for dir in ["/sys/fs/cgroup" + path, "/sys/fs/cgroup"] {
                    if let max = number(dir + "/memory.max"), let current = number(dir + "/memory.current") {
                        return (max - current, "the cgroup's memory.max less memory.current in \(dir)")
                    }
                    if read(dir + "/memory.max") != nil { return nil }  // "max": no limit
                }
            } else if fields[1].split(separator: ",").contains("memory") {
                for dir in ["/sys/fs/cgroup/memory" + path, "/sys/fs/cgroup/memory"] {
                    // v1 reports "no limit" as a number near Int64.max.
                    if let limit = number(dir + "/memory.limit_in_bytes"), limit < 1 << 60,
                       let usage = number(dir + "/memory.usage_in_bytes") {
                        return (limit - usage, "the cgroup's memory.limit_in_bytes less memory.usage_in_bytes in \(dir)")
                    }
                }
            }
        }
        return nil
    }
    #endif
}
