#if os(Linux)
import Glibc

/// How the GPU threads of a threadgroup take turns between threadgroup barriers. A GPU
/// gives no order between simdgroups: code that needs one simdgroup's writes to be seen by
/// another needs a threadgroup barrier, and a schedule that lets one simdgroup run far
/// ahead of another shows where one is missing.
public enum SoftMetalSchedule: Sendable, Equatable {
    /// Threads take turns at every blocking point (barrier, simd operation): simdgroups
    /// advance in near lockstep, one simd operation per turn.
    case roundRobin
    /// The dispatch runs twice from the same inputs: each simdgroup runs to its next
    /// threadgroup barrier (through its simd operations) before the next one starts, first
    /// in forward simdgroup order, then in reverse; if any bound buffer differs the command
    /// buffer fails with SoftMetalError.race. The buffers keep the reverse run's result.
    case runAhead
    /// One run, simdgroups run ahead in forward order (0 first after every barrier).
    case runAheadForward
    /// One run, simdgroups run ahead in reverse order (the last simdgroup first).
    case runAheadReverse

    /// The names of SOFTMETAL_SCHEDULE and of the Python harness's `schedule=`.
    public init?(environment name: String?) {
        switch name {
        case "round-robin": self = .roundRobin
        case "run-ahead": self = .runAhead
        case "run-ahead-forward": self = .runAheadForward
        case "run-ahead-reverse": self = .runAheadReverse
        default: return nil
        }
    }
}

/// SoftMetal-only switches and measurements; none of this exists in Apple's Metal, so
/// code shared with the Metal backend must not use it (tests and harnesses may).
public enum SoftMetalOptions {
    private static let lock = SMLock()
    nonisolated(unsafe) private static var _checkRaces = SMEnv.get("SOFTMETAL_CHECK_RACES") == "1"
    nonisolated(unsafe) private static var _checkOrder = SMEnv.get("SOFTMETAL_CHECK_ORDER") == "1"
    nonisolated(unsafe) private static var _poison = SMEnv.get("SOFTMETAL_POISON") != "0"
    nonisolated(unsafe) private static var _checkMemory = SMEnv.get("SOFTMETAL_CHECK_MEMORY") == "1" || allFromEnvironment
    nonisolated(unsafe) private static var _schedule = SoftMetalSchedule(environment: SMEnv.get("SOFTMETAL_SCHEDULE"))
        ?? (allFromEnvironment ? .runAhead : .roundRobin)
    nonisolated(unsafe) private static var _checkDivision = SMEnv.get("SOFTMETAL_CHECK_DIVISION") == "1" || allFromEnvironment
    nonisolated(unsafe) private static var _staleReads = SMEnv.get("SOFTMETAL_STALE_READS") == "1"
    /// SOFTMETAL_CHECKS=all.
    private static var allFromEnvironment: Bool { SMEnv.get("SOFTMETAL_CHECKS") == "all" }

    /// Every check on for new encoders, as SOFTMETAL_CHECKS=all does and
    /// SoftMetalComputeCommandEncoder.softMetalCheckAll() does for one: the memory check
    /// (bounds however far out, data races on shadow memory, reads of unwritten memory,
    /// Apple's memory model across threadgroups) and the run-ahead schedule (missing
    /// barriers between simdgroups, by the output of two orders). Guard pages, poison and
    /// barrier divergence are always on.
    public static func enableAllChecks() {
        lock.withLock {
            _checkMemory = true
            _checkDivision = true
            _schedule = .runAhead
        }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalStaleReads for new encoders
    /// (initially: $SOFTMETAL_STALE_READS == 1).
    public static var staleReads: Bool {
        get { lock.withLock { _staleReads } }
        set { lock.withLock { _staleReads = newValue } }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalCheckRaces for new encoders
    /// (initially: $SOFTMETAL_CHECK_RACES == 1): the race detector on shadow memory.
    public static var checkRaces: Bool {
        get { lock.withLock { _checkRaces } }
        set { lock.withLock { _checkRaces = newValue } }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalCheckOrder for new encoders
    /// (initially: $SOFTMETAL_CHECK_ORDER == 1): the rerun in a permuted order.
    public static var checkOrder: Bool {
        get { lock.withLock { _checkOrder } }
        set { lock.withLock { _checkOrder = newValue } }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalCheckMemory for new encoders
    /// (initially: $SOFTMETAL_CHECK_MEMORY == 1).
    public static var checkMemory: Bool {
        get { lock.withLock { _checkMemory } }
        set { lock.withLock { _checkMemory = newValue } }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalCheckDivision for new encoders
    /// (initially: $SOFTMETAL_CHECK_DIVISION == 1).
    public static var checkDivision: Bool {
        get { lock.withLock { _checkDivision } }
        set { lock.withLock { _checkDivision = newValue } }
    }

    /// Default of SoftMetalComputeCommandEncoder.softMetalSchedule for new encoders
    /// (initially from $SOFTMETAL_SCHEDULE: `round-robin`, `run-ahead`, `run-ahead-forward`,
    /// `run-ahead-reverse`; anything else is round-robin).
    public static var schedule: SoftMetalSchedule {
        get { lock.withLock { _schedule } }
        set { lock.withLock { _schedule = newValue } }
    }

    /// Default of softMetalPoisonThreadgroupMemory for new encoders (initially on, unless
    /// $SOFTMETAL_POISON == 0).
    public static var poisonThreadgroupMemory: Bool {
        get { lock.withLock { _poison } }
        set { lock.withLock { _poison = newValue } }
    }

    /// The device's maxBufferLength: makeBuffer of any kind returns nil for a longer buffer,
    /// as Metal does. Initially $SOFTMETAL_MAX_BUFFER_LENGTH (bytes) or, as on an Apple
    /// silicon Mac, about half of the machine's memory (at least Apple's guaranteed 256 MB).
    /// Tests set it small (down to one 16 KiB page, below any real device's) to see code
    /// split what does not fit without files of hundreds of megabytes.
    public static var maxBufferLength: Int {
        get { lock.withLock { _maxBufferLength } }
        set { lock.withLock { _maxBufferLength = Swift.max(newValue, 16384) } }
    }
    nonisolated(unsafe) private static var _maxBufferLength: Int = {
        if let set = SMEnv.get("SOFTMETAL_MAX_BUFFER_LENGTH").flatMap({ Int($0) }) { return Swift.max(set, 16384) }
        let memory = Int(sysconf(Int32(_SC_PHYS_PAGES))) * Int(sysconf(Int32(_SC_PAGESIZE)))
        return Swift.max(memory / 2, 256 << 20)
    }()

    /// The cache directory of compiled kernels.
    public static var cacheDirectory: String { KernelCompiler.cacheDirectory }

    /// What the device ran in this process (dispatches that reached a kernel, failed ones included).
    public struct Statistics {
        public var dispatches = 0
        public var raceCheckedDispatches = 0
        public var orderCheckedDispatches = 0
        public var memoryCheckedDispatches = 0
        public var runAheadCheckedDispatches = 0
        public var threadgroups = 0
        /// GPU threads (partial edge threadgroups counted whole).
        public var threads = 0
        /// Wall time in dispatches, race-check reruns included.
        public var seconds = 0.0
    }

    public static var statistics: Statistics { Executor.stats }

    /// Kernel compilations and compile-cache hits in this process.
    public static var compileCounts: (compilations: Int, cacheHits: Int) {
        let s = KernelCompiler.shared.stats
        return (s.compilations, s.cacheHits)
    }

    /// The cost of one fiber switch in nanoseconds (two fibers switching back and forth
    /// with the runtime's context switch), measured in a compiled library.
    public static func measureFiberSwitchNanoseconds(in library: any MTLLibrary, iterations: Int = 2_000_000) throws -> Double {
        guard let lib = library as? SoftMetalLibrary else { throw SoftMetalError.invalidUsage("not a SoftMetal library") }
        guard let handle = lib.handle, let sym = dlsym(handle, "__sm_bench_switch") else {
            throw SoftMetalError.runtime("the library has no fiber benchmark")
        }
        typealias Bench = @convention(c) (UInt64) -> Double
        return unsafeBitCast(sym, to: Bench.self)(UInt64(iterations))
    }
}
#endif

#if os(Linux)
/// Compile options with what Apple's `MTLCompileOptions` has no way to say: include
/// directories for `#include "x.h"` (Apple compiles a source string without any), and
/// macros as plain strings. Pass it to `makeLibrary(source:options:)` like any
/// `MTLCompileOptions`; code shared with the Metal backend must not name it.
open class SoftMetalCompileOptions: MTLCompileOptions {
    /// `-I` directories, searched after the including file's own directory.
    open var softMetalIncludeDirectories: [String] = []
    /// `-Dname=value` (the value "" defines the macro as empty), applied after the
    /// predefined `__METAL__`, `__METAL_VERSION__`, `__HAVE_BFLOAT__` and after
    /// `preprocessorMacros` (a name in both takes this value).
    open var softMetalPreprocessorMacros: [String: String] = [:]
    /// Seconds each clang++ run of this compile may take before it is stopped and the
    /// compile throws (nil: `SOFTMETAL_COMPILE_TIMEOUT`, default 600).
    open var softMetalCompileTimeout: Double?

    public override init() { super.init() }
}

extension MSLPreprocessor.Options {
    init(_ options: MTLCompileOptions?) {
        let version = options?.languageVersion ?? .version3_1
        metalVersion = Int(version.rawValue >> 16) * 100 + Int(version.rawValue & 0xFFFF) * 10
        var all: [String: String] = [:]
        // Apple's headers pick the fast or precise variant of a math function through this
        // macro; SoftMetal computes both precisely (see mathFloatingPointFunctions). No
        // options: Apple's defaults (fast).
        let precise = options?.functions == .precise
        all["__METAL_MAYBE_FAST_MATH__"] = precise ? "__METAL_PRECISE_MATH__" : "__METAL_FAST_MATH__"
        for (name, value) in options?.preprocessorMacros ?? [:] {
            all[name] = (value as? Bool).map { $0 ? "1" : "0" } ?? value.description
        }
        if let o = options as? SoftMetalCompileOptions {
            includeDirectories = o.softMetalIncludeDirectories
            compileTimeout = o.softMetalCompileTimeout
            all.merge(o.softMetalPreprocessorMacros) { _, new in new }
        }
        // Sorted: the same options give the same argument list (and cache key).
        macros = all.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }
}
#endif
