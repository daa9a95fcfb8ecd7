#if os(Linux)
import CSoftMetal
import Dispatch
import Glibc

// Fences, events and hazard tracking. SoftMetal runs a queue's command buffers one after
// another and each encoder's dispatches in order, so nothing it runs can overlap; a GPU
// overlaps encoders (passes) whose resources Metal does not track. So SoftMetal checks
// instead of overlapping: when a command buffer is committed, every two passes that use a
// buffer made with `.hazardTrackingModeUntracked`, one of them writing it, must be ordered —
// by a fence the earlier pass updates and the later one waits for (directly or through a
// chain of passes), by an event the earlier pass's command buffer signals after it and the
// later one waits for before it, or by a tracked buffer both use, one writing (Metal then
// delays the later pass until the earlier one is done). Passes of command buffers that had
// completed when this one was committed are ordered by the app's wait. A pair that nothing
// orders fails the command buffer with SoftMetalError.race, where a GPU would race.
//
// Buffers are compared whole, as Metal's own tracking does: two passes that use disjoint
// ranges of one untracked buffer are reported too. A buffer parameter writes unless its
// type is `const` (or in the `constant` address space, which the translator makes const).

/// documentation/metal/mtlfence
public final class SoftMetalFence: MTLFence, @unchecked Sendable {
    public let device: any MTLDevice
    public var label: String?
    init(device: any MTLDevice) { self.device = device }
}

/// documentation/metal/mtlevent and mtlsharedevent: a value the GPU (a command buffer's
/// encodeSignalEvent) or, for a shared event, the host sets, and that command buffers wait for.
public final class SoftMetalEvent: MTLSharedEvent, @unchecked Sendable {
    public let device: (any MTLDevice)?
    public var label: String?
    private let condition = SMCondition()
    private var value: UInt64 = 0

    init(device: any MTLDevice) { self.device = device }

    public var signaledValue: UInt64 {
        get { condition.withLock { value } }
        set { condition.withLock { value = newValue; condition.broadcast() } }
    }

    /// Blocks until the value is at least `target`, or `seconds` pass (false).
    func wait(until target: UInt64, seconds: Double) -> Bool {
        condition.withLock {
            var deadline = timespec()
            clock_gettime(CLOCK_REALTIME, &deadline)
            let whole = Int(seconds), nanos = Int((seconds - Double(whole)) * 1e9)
            deadline.tv_sec += whole
            deadline.tv_nsec += nanos
            if deadline.tv_nsec >= 1_000_000_000 { deadline.tv_sec += 1; deadline.tv_nsec -= 1_000_000_000 }
            while value < target {
                if !condition.wait(until: &deadline) { return value >= target }
            }
            return true
        }
    }
}

/// A mutex and a condition variable.
final class SMCondition: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var cond = pthread_cond_t()
    init() {
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&cond, nil)
    }
    deinit {
        pthread_cond_destroy(&cond)
        pthread_mutex_destroy(&mutex)
    }
    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return try body()
    }
    func broadcast() { pthread_cond_broadcast(&cond) }
    /// With the lock held: false once `deadline` (CLOCK_REALTIME) has passed.
    func wait(until deadline: inout timespec) -> Bool { pthread_cond_timedwait(&cond, &mutex, &deadline) == 0 }
}

/// What a command buffer records for the hazard check, in encoding order.
enum HazardItem {
    /// One encoder's pass.
    case pass(PassRecord)
    /// encodeSignalEvent / encodeWaitForEvent.
    case signal(ObjectIdentifier, UInt64)
    case wait(ObjectIdentifier, UInt64)
}

/// The buffers one pass uses, and the fences it waits for and updates.
struct PassRecord {
    struct Access {
        /// Held so that its identity is not reused while the record lives.
        let memory: BufferMemory
        let tracked: Bool
        let writes: Bool
        let what: String
    }
    var name: String
    var kernels: [String] = []
    var accesses: [Access] = []
    var waits: [ObjectIdentifier] = []
    var updates: [ObjectIdentifier] = []

    /// `kernel` dispatched with `bindings` (the app's buffers only).
    mutating func dispatch(_ kernel: CompiledKernel, _ bindings: [(index: Int, buffer: SoftMetalBuffer)]) {
        if !kernels.contains(kernel.name) { kernels.append(kernel.name) }
        for (index, buffer) in bindings {
            guard let param = kernel.params.first(where: { $0.kind == SM_PARAM_BUFFER && $0.index == index }) else { continue }
            let words = param.type.split { !($0.isLetter || $0.isNumber || $0 == "_") }
            accesses.append(Access(memory: buffer.memory, tracked: buffer.hazardTrackingMode != .untracked,
                                   writes: !words.contains("const") && !words.contains("constant"),
                                   what: "buffer(\(index))\(buffer.label.map { " ('\($0)')" } ?? "")"))
        }
    }

    var description: String { "\(name) (kernels \(kernels.joined(separator: ", ")))" }
}

/// The hazard check over the passes of the command buffers in flight on a queue, in queue
/// order (earlier command buffers' items first); `firstNew` is the index of the newly
/// committed command buffer's first item. Returns the first unordered pair as an error.
enum HazardCheck {
    static func check(_ items: [(item: HazardItem, buffer: Int)], firstNew: Int) -> SoftMetalError? {
        // Only a new pass that uses an untracked buffer can race: without one (buffers are
        // tracked unless made otherwise, so almost every commit), no graph is built.
        let untracked = items[firstNew...].contains {
            if case .pass(let p) = $0.item { return p.accesses.contains { !$0.tracked } }
            return false
        }
        guard untracked else { return nil }
        // Nodes: the passes, and every signal and wait (an event's edges go through them).
        var edges = [[Int]](repeating: [], count: items.count)
        var passes: [(node: Int, record: PassRecord)] = []
        for (n, entry) in items.enumerated() {
            if case .pass(let record) = entry.item { passes.append((n, record)) }
        }
        for (n, entry) in items.enumerated() {
            switch entry.item {
            case .pass(let record):
                // A fence: the latest pass before this one that updates it.
                for fence in record.waits {
                    if let updater = (0..<n).last(where: {
                        if case .pass(let p) = items[$0].item { return p.updates.contains(fence) }
                        return false
                    }) {
                        edges[updater].append(n)
                    }
                }
            case .signal(let event, let value):
                // After every earlier pass of its command buffer; before every wait it satisfies.
                for m in 0..<n where items[m].buffer == entry.buffer { edges[m].append(n) }
                for m in (n + 1)..<items.count {
                    if case .wait(let e, let w) = items[m].item, e == event, w <= value { edges[n].append(m) }
                }
            case .wait:
                for m in (n + 1)..<items.count where items[m].buffer == entry.buffer { edges[n].append(m) }
            }
        }
        // A tracked buffer that both use, one writing: Metal delays the later pass.
        for (i, a) in passes.enumerated() {
            for b in passes[(i + 1)...] where conflict(a.record, b.record, tracked: true) != nil {
                edges[a.node].append(b.node)
            }
        }
        func reaches(_ from: Int, _ to: Int) -> Bool {
            var seen = Set([from]), stack = [from]
            while let n = stack.popLast() {
                if n == to { return true }
                for m in edges[n] where seen.insert(m).inserted { stack.append(m) }
            }
            return false
        }
        for (i, a) in passes.enumerated() {
            for b in passes[(i + 1)...] where b.node >= firstNew {
                guard let (what, writer) = conflict(a.record, b.record, tracked: false), !reaches(a.node, b.node) else { continue }
                return .race("\(b.record.description) and the earlier \(a.record.description) both use the untracked "
                             + "\(what), \(writer) writing it, and nothing orders the two passes: on a GPU they may run "
                             + "at the same time. Order them with a fence (updateFence(_:) in the earlier, "
                             + "waitForFence(_:) in the later), an event (encodeSignalEvent / encodeWaitForEvent), or "
                             + "a buffer Metal tracks. (SoftMetal compares whole buffers, as Metal's tracking does.)")
            }
        }
        return nil
    }

    /// The first buffer of `tracked`-ness that both passes use with one writing: its name in
    /// the later pass, and which pass writes.
    private static func conflict(_ a: PassRecord, _ b: PassRecord, tracked: Bool) -> (String, String)? {
        for x in b.accesses where x.tracked == tracked {
            for y in a.accesses where y.memory === x.memory && y.tracked == tracked && (x.writes || y.writes) {
                return ("\(x.what) of the later pass", x.writes ? "the later pass" : "the earlier pass")
            }
        }
        return nil
    }
}
#endif
