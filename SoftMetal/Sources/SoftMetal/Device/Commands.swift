#if os(Linux)
import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// Command buffers of one queue run in commit order on a serial Dispatch queue; each
/// dispatch spreads its threadgroups over the machine's cores.
public final class SoftMetalCommandQueue: MTLCommandQueue, @unchecked Sendable {
    public let device: any MTLDevice
    public var label: String?
    let serial = DispatchQueue(label: "softmetal.commandqueue")
    private let lock = SMLock()
    private var made = 0
    /// The hazard records of command buffers committed and not yet completed.
    private var inFlight: [(buffer: ObjectIdentifier, items: [HazardItem])] = []

    init(device: any MTLDevice) { self.device = device }

    /// A number for the name of the next command buffer.
    func nextNumber() -> Int { lock.withLock { made += 1; return made } }

    /// `items` of `buffer`, committed now, against the command buffers still in flight
    /// (HazardCheck); they stay in flight until `completed(_:)`.
    func commit(_ buffer: SoftMetalCommandBuffer, items: [HazardItem]) -> SoftMetalError? {
        lock.withLock {
            var all: [(item: HazardItem, buffer: Int)] = []
            for (k, entry) in inFlight.enumerated() { all += entry.items.map { ($0, k) } }
            let firstNew = all.count
            all += items.map { ($0, inFlight.count) }
            inFlight.append((ObjectIdentifier(buffer), items))
            return HazardCheck.check(all, firstNew: firstNew)
        }
    }

    func completed(_ buffer: SoftMetalCommandBuffer) {
        lock.withLock { inFlight.removeAll { $0.buffer == ObjectIdentifier(buffer) } }
    }

    public func makeCommandBuffer() -> (any MTLCommandBuffer)? { SoftMetalCommandBuffer(queue: self, retainedReferences: true) }

    public func makeCommandBufferWithUnretainedReferences() -> (any MTLCommandBuffer)? {
        SoftMetalCommandBuffer(queue: self, retainedReferences: false)
    }
}

public final class SoftMetalCommandBuffer: MTLCommandBuffer, @unchecked Sendable {
    public var device: any MTLDevice { queue.device }
    public var commandQueue: any MTLCommandQueue { queue }
    public var label: String?
    let queue: SoftMetalCommandQueue
    private let lock = SMLock()
    private var _status = MTLCommandBufferStatus.notEnqueued
    private var _error: (any Error)?
    private var handlers: [MTLCommandBufferHandler] = []
    private var commands: [DispatchCommand] = []
    private let done = DispatchSemaphore(value: 0)
    private var finished = false
    private var waiters = 0
    public let retainedReferences: Bool
    /// The app's objects the commands use (buffers, pipelines): held until the command
    /// buffer completes (retained references), or only watched (unretained): one released
    /// before then fails the command buffer, where a GPU would read freed memory. The
    /// commands themselves hold the memory (BufferMemory), so the host's never is.
    private var held: [ObjectIdentifier: AnyObject] = [:]
    private var watched: [ObjectIdentifier: (object: WeakObject, what: String)] = [:]

    /// The passes, event signals and waits recorded, for the hazard check at commit.
    private var hazards: [HazardItem] = []
    private var encoders = 0
    private let number: Int

    init(queue: SoftMetalCommandQueue, retainedReferences: Bool) {
        self.queue = queue
        self.retainedReferences = retainedReferences
        number = queue.nextNumber()
    }

    /// "command buffer 'label'" (or its number).
    var name: String { "command buffer " + (lock.withLock { label }.map { "'\($0)'" } ?? "#\(number)") }

    /// The name of the next encoder's pass.
    func nextPassName() -> String { lock.withLock { encoders += 1; return "encoder \(encoders)" } + " of " + name }

    func record(_ item: HazardItem) { lock.withLock { hazards.append(item) } }

    public func encodeWaitForEvent(_ event: any MTLEvent, value: UInt64) { encodeEvent(event, value: value, signal: false) }

    public func encodeSignalEvent(_ event: any MTLEvent, value: UInt64) { encodeEvent(event, value: value, signal: true) }

    private func encodeEvent(_ event: any MTLEvent, value: UInt64, signal: Bool) {
        let call = signal ? "encodeSignalEvent(_:value:)" : "encodeWaitForEvent(_:value:)"
        guard let e = event as? SoftMetalEvent else {
            return append(.failing(.invalidUsage("\(call): the event was not made by SoftMetal")))
        }
        guard status == .notEnqueued else { return }
        if let busy = encoding() {
            return append(.failing(.invalidUsage("\(call) while \(busy) is still encoding: events go between "
                                                 + "encoders; end it first")))
        }
        append(DispatchCommand.event(signal ? .signal(e, value) : .wait(e, value)))
        record(signal ? .signal(ObjectIdentifier(e), value) : .wait(ObjectIdentifier(e), value))
    }

    /// `object` is used by a recorded command; `what` names it for the report.
    func use(_ object: AnyObject, _ what: @autoclosure () -> String) {
        let id = ObjectIdentifier(object)
        lock.withLock {
            if retainedReferences {
                held[id] = object
            } else if watched[id] == nil {
                watched[id] = (WeakObject(object), what())
            }
        }
    }

    /// The first watched object the app has released, as an error.
    private func released() -> SoftMetalError? {
        lock.withLock {
            guard let gone = watched.values.filter({ $0.object.object == nil }).map(\.what).min() else { return nil }
            return .invalidUsage("\(gone) was released before the command buffer completed. A command buffer with "
                                 + "unretained references (makeCommandBufferWithUnretainedReferences()) does not keep "
                                 + "what its commands use alive: on a GPU the kernel would read freed memory. Keep a "
                                 + "strong reference until the command buffer has completed (e.g. in a completed handler)")
        }
    }

    public var status: MTLCommandBufferStatus { lock.withLock { _status } }
    public var error: (any Error)? { lock.withLock { _error } }

    public func makeComputeCommandEncoder() -> (any MTLComputeCommandEncoder)? {
        makeComputeCommandEncoder(dispatchType: .serial)
    }

    public func makeComputeCommandEncoder(dispatchType: MTLDispatchType) -> (any MTLComputeCommandEncoder)? {
        guard lock.withLock({ _status == .notEnqueued }) else { return nil }
        if let busy = encoding() {
            // Metal's validation layer stops the program here; SoftMetal fails the command buffer.
            append(.failing(.invalidUsage("makeComputeCommandEncoder: \(busy) is still encoding; end it (endEncoding()) "
                                          + "before making another: a command buffer has one encoder at a time (Metal's "
                                          + "validation: \"A command encoder is already encoding to this command buffer\")")))
        }
        let made = SoftMetalComputeCommandEncoder(commandBuffer: self, dispatchType: dispatchType)
        lock.withLock { open = WeakObject(made) }
        return made
    }

    /// The encoder still encoding (made, not ended), by its pass's name.
    private var open: WeakObject?
    private func encoding() -> String? {
        guard let encoder = lock.withLock({ open?.object }) as? SoftMetalComputeCommandEncoder, !encoder.isEnded else {
            return nil
        }
        return encoder.passName
    }

    func append(_ command: DispatchCommand) { lock.withLock { commands.append(command) } }

    public func addCompletedHandler(_ block: @escaping MTLCommandBufferHandler) {
        lock.withLock { handlers.append(block) }
    }

    public func commit() {
        let committed: Bool = lock.withLock {
            guard _status == .notEnqueued else { return false }
            _status = .committed
            return true
        }
        guard committed else { return }
        let hazard = queue.commit(self, items: lock.withLock { hazards })
        let run: @Sendable () -> Void = { [self] in
            // The commands stay the command buffer's, so that they (and the memory they
            // bind) are let go before anyone waiting is woken.
            var work: [DispatchCommand] = lock.withLock {
                _status = .scheduled
                return commands
            }
            var failure: (any Error)?
            if let hazard { failure = hazard }  // found at commit: nothing runs, as for an encoding error
            for command in work where failure == nil {
                do {
                    if let gone = released() { throw gone }
                    if let event = command.event {
                        try Self.run(event)
                        continue
                    }
                    try Executor.run(command)
                } catch {
                    failure = error  // later commands do not run, as after a GPU fault
                    break
                }
            }
            if failure == nil { failure = released() }
            work = []  // not left to the end of the scope: a debug build would keep it past the wake-up
            let toCall: [MTLCommandBufferHandler] = lock.withLock {
                _status = failure == nil ? .completed : .error
                _error = failure
                commands = []
                hazards = []  // its records hold buffers' memory too
                return handlers
            }
            queue.completed(self)
            for handler in toCall { handler(self) }
            lock.withLock {
                handlers = []
                held = [:]
                watched = [:]
                finished = true
                for _ in 0..<waiters { done.signal() }
                waiters = 0
            }
        }
        // In a child forked after the parent ran command buffers, libdispatch's worker
        // threads are gone and async work would never start (waitUntilCompleted would hang,
        // e.g. under multiprocessing's fork): the child runs its command buffers inline.
        if getpid() == commandQueueProcess {
            queue.serial.async(execute: run)
        } else {
            run()
        }
    }

    public func waitUntilCompleted() {
        let mustWait: Bool = lock.withLock {
            if finished || _status == .notEnqueued { return false }
            waiters += 1
            return true
        }
        if mustWait { done.wait() }
    }
}

extension SoftMetalCommandBuffer {
    /// How long a wait for an event may block before the command buffer fails: nothing but
    /// the host or a command buffer already committed can signal it, and SoftMetal runs a
    /// queue's command buffers in order.
    static let eventTimeout = 60.0

    static func run(_ op: DispatchCommand.EventOp) throws {
        switch op {
        case .signal(let event, let value):
            event.signaledValue = value
        case .wait(let event, let value):
            guard event.wait(until: value, seconds: eventTimeout) else {
                throw SoftMetalError.runtime("encodeWaitForEvent: the event\(event.label.map { " '\($0)'" } ?? "") did not "
                                             + "reach \(value) within \(Int(eventTimeout)) s (it holds \(event.signaledValue)); "
                                             + "only the host or a command buffer committed earlier can signal it")
            }
        }
    }
}

/// A reference that does not keep its object alive.
struct WeakObject {
    weak var object: AnyObject?
    init(_ object: AnyObject) { self.object = object }
}

/// The process that first committed a command buffer (a global is initialised once, so a
/// forked child still sees its parent's id).
let commandQueueProcess = getpid()

/// One recorded dispatch.
struct DispatchCommand {
    enum Size {
        case threadgroups(MTLSize)
        case threads(MTLSize)
        case indirect(BufferMemory, Int)
    }
    enum EventOp {
        case wait(SoftMetalEvent, UInt64)
        case signal(SoftMetalEvent, UInt64)
    }
    var kernel: CompiledKernel?
    var failure: SoftMetalError? = nil
    /// encodeWaitForEvent / encodeSignalEvent, between encoders.
    var event: EventOp? = nil
    var maxThreads: Int
    var buffers: [(buffer: BufferMemory, offset: Int)?]
    var threadgroupLengths: [Int]
    var size: Size
    var threadsPerThreadgroup: MTLSize
    var checkOrder: Bool
    var poison: Bool
    var checkMemory = false
    var checkDivision = false
    var schedule = SoftMetalSchedule.roundRobin
    var staleReads = false
    /// The memory check's build with only its race detection (and bounds) reporting.
    var checkRaces = false
}

public final class SoftMetalComputeCommandEncoder: MTLComputeCommandEncoder, @unchecked Sendable {
    public var device: any MTLDevice { commandBuffer.device }
    public var label: String?
    public let dispatchType: MTLDispatchType
    let commandBuffer: SoftMetalCommandBuffer
    /// A concurrent encoder's dispatches since its last memory barrier. Metal may run them
    /// in any order, overlapped; SoftMetal runs them in reverse order, so that a dispatch
    /// that reads what an earlier one writes without a barrier between them reads stale
    /// data here too instead of passing by luck.
    private var unordered: [DispatchCommand] = []
    private var pipeline: SoftMetalComputePipelineState?
    private var buffers = [(buffer: BufferMemory, offset: Int)?](repeating: nil, count: 31)
    /// The app's buffers bound at each index (nil for setBytes): not kept alive by the
    /// encoder, which with unretained references Metal's does not either.
    private var boundObjects = [WeakObject?](repeating: nil, count: 31)
    private var threadgroupLengths = [Int](repeating: 0, count: 31)
    private var ended = false
    /// Errors found while encoding (Metal's validation layer would stop the program); the
    /// command buffer then fails with it.
    private var encodingError: SoftMetalError?

    /// SoftMetal only: the race detector. This encoder's dispatches run in the memory
    /// check's instrumented build reporting data races on shadow memory (SoftMetalError.race
    /// naming both threads and both MSL lines: a missing barrier whatever the output, and a
    /// device-memory read another threadgroup wrote that Apple's memory model does not order)
    /// and out-of-bounds accesses, but not reads of unwritten memory (the memory check adds
    /// those). Default: SoftMetalOptions.checkRaces.
    public var softMetalCheckRaces = SoftMetalOptions.checkRaces
    /// SoftMetal only: run this encoder's dispatches twice, the second time with permuted
    /// thread and threadgroup order, and fail the command buffer with SoftMetalError.race
    /// if any bound buffer differs: finds results that depend on the order of atomics, which
    /// no barrier is missing for. Default: SoftMetalOptions.checkOrder.
    public var softMetalCheckOrder = SoftMetalOptions.checkOrder
    /// SoftMetal only: fill threadgroup memory with 0xFF before each threadgroup.
    /// Default: SoftMetalOptions.poisonThreadgroupMemory.
    public var softMetalPoisonThreadgroupMemory = SoftMetalOptions.poisonThreadgroupMemory
    /// SoftMetal only: run this encoder's dispatches with the memory check — every load and
    /// store of the kernel checked against the buffer or threadgroup allocation it must
    /// fall in, races found on shadow memory, reads of unwritten threadgroup memory
    /// reported (SoftMetalError.outOfBounds, .race, .uninitializedRead). The library is
    /// compiled once more, instrumented; the dispatch runs on one core.
    /// Default: SoftMetalOptions.checkMemory.
    public var softMetalCheckMemory = SoftMetalOptions.checkMemory
    /// SoftMetal only: an integer division or remainder by zero (or INT_MIN / -1) fails the
    /// command buffer (SoftMetalError.runtime naming the kernel, and the MSL line when the
    /// library has line tables, as the memory check's build has). Without it the division
    /// gives a value as a GPU does, which does not trap: x / 0 = 0, x % 0 = x (Apple's CPUs'
    /// results; its GPUs' are not documented). The memory check turns this on too.
    /// Default: SoftMetalOptions.checkDivision.
    public var softMetalCheckDivision = SoftMetalOptions.checkDivision
    /// SoftMetal only: how threads of different simdgroups interleave between threadgroup
    /// barriers (SoftMetalSchedule; `.runAhead` runs each dispatch in forward and reverse
    /// simdgroup order and fails with SoftMetalError.race if the results differ).
    /// Default: SoftMetalOptions.schedule.
    public var softMetalSchedule = SoftMetalOptions.schedule
    /// SoftMetal only: with the memory check, a read of device memory that another
    /// threadgroup of the dispatch wrote and that nothing orders after that write (see
    /// Apple's memory model in the README) gets the bytes the location held when the
    /// dispatch began, as a GPU's stale cache may give, instead of failing: the stale value
    /// shows in the output. Turns the memory check on. Default: SoftMetalOptions.staleReads.
    public var softMetalStaleReads = SoftMetalOptions.staleReads

    /// SoftMetal only: every check at once (SoftMetalOptions.enableAllChecks says which).
    public func softMetalCheckAll() {
        softMetalCheckMemory = true
        softMetalCheckDivision = true
        softMetalSchedule = .runAhead
    }

    init(commandBuffer: SoftMetalCommandBuffer, dispatchType: MTLDispatchType) {
        self.commandBuffer = commandBuffer
        self.dispatchType = dispatchType
        pass = PassRecord(name: commandBuffer.nextPassName())
    }

    public func updateFence(_ fence: any MTLFence) {
        if ended { return misuse("updateFence(_:) after endEncoding()") }
        guard let f = fence as? SoftMetalFence else { return misuse("updateFence: the fence was not made by SoftMetal") }
        pass.updates.append(ObjectIdentifier(f))
    }

    public func waitForFence(_ fence: any MTLFence) {
        if ended { return misuse("waitForFence(_:) after endEncoding()") }
        guard let f = fence as? SoftMetalFence else { return misuse("waitForFence: the fence was not made by SoftMetal") }
        pass.waits.append(ObjectIdentifier(f))
    }

    /// Metal's validation layer stops the program at a misuse; SoftMetal fails the command
    /// buffer with it instead. Before endEncoding() the first one is kept and recorded at
    /// endEncoding(); after it (an ended encoder used again) it is recorded at once, or the
    /// calls would be dropped with nothing said and the command buffer would complete.
    private func misuse(_ message: String) {
        if ended {
            if !failedAfterEnd { commandBuffer.append(DispatchCommand.failing(.invalidUsage(message))) }
            failedAfterEnd = true
            return
        }
        if encodingError == nil { encodingError = .invalidUsage(message) }
    }
    private var failedAfterEnd = false
    var isEnded: Bool { ended }
    var passName: String { pass.name }
    /// The app's indirect buffer during the dispatch that reads it.
    private var indirectObject: WeakObject?
    /// What this pass uses, waits for and updates (the hazard check at commit).
    private var pass: PassRecord

    public func setComputePipelineState(_ state: any MTLComputePipelineState) {
        if ended { return misuse("setComputePipelineState(_:) after endEncoding()") }
        guard let s = state as? SoftMetalComputePipelineState else { return misuse("the pipeline was not made by SoftMetal") }
        pipeline = s
    }

    public func setBuffer(_ buffer: (any MTLBuffer)?, offset: Int, index: Int) {
        if ended { return misuse("setBuffer(_:offset:index:) after endEncoding()") }
        guard index >= 0 && index < 31 else { return misuse("setBuffer: index \(index) is outside 0...30") }
        guard let buffer else { buffers[index] = nil; boundObjects[index] = nil; return }
        guard let b = buffer as? SoftMetalBuffer else { return misuse("setBuffer: the buffer was not made by SoftMetal") }
        guard offset >= 0 && offset <= b.length else {
            return misuse("setBuffer: offset \(offset) is outside the buffer (\(b.length) bytes) at index \(index)")
        }
        buffers[index] = (b.memory, offset)
        boundObjects[index] = WeakObject(b)
        // Retained references: held from the binding on, so the dispatch finds it.
        if commandBuffer.retainedReferences { commandBuffer.use(b, "") }
    }

    /// The bytes are copied into a new guarded buffer, as Metal copies them at this call.
    public func setBytes(_ bytes: UnsafeRawPointer, length: Int, index: Int) {
        if ended { return misuse("setBytes(_:length:index:) after endEncoding()") }
        guard index >= 0 && index < 31 else { return misuse("setBytes: index \(index) is outside 0...30") }
        guard length > 0, let b = BufferMemory(length: length) else {
            return misuse("setBytes: length \(length) at index \(index)")
        }
        b.storage.copyMemory(from: bytes, byteCount: length)
        b.markAllInitialized()
        buffers[index] = (b, 0)
        boundObjects[index] = nil
    }

    public func setThreadgroupMemoryLength(_ length: Int, index: Int) {
        if ended { return misuse("setThreadgroupMemoryLength(_:index:) after endEncoding()") }
        guard index >= 0 && index < 31 else { return misuse("setThreadgroupMemoryLength: index \(index) is outside 0...30") }
        guard length >= 0 && length % 16 == 0 else {
            return misuse("setThreadgroupMemoryLength: \(length) bytes at index \(index) is not a multiple of 16")
        }
        threadgroupLengths[index] = length
    }

    private func record(_ size: DispatchCommand.Size, _ threadsPerThreadgroup: MTLSize) {
        if ended { return misuse("dispatch after endEncoding()") }
        guard let pipeline else { return misuse("dispatch without setComputePipelineState(_:)") }
        let name = pipeline.kernel.name
        commandBuffer.use(pipeline, "the pipeline state of kernel \(name)")
        var used: [(index: Int, buffer: SoftMetalBuffer)] = []
        for (index, bound) in boundObjects.enumerated() {
            guard let bound, buffers[index] != nil else { continue }
            guard let object = bound.object as? SoftMetalBuffer else {
                return misuse("kernel \(name): the buffer bound at index \(index) was released before the dispatch")
            }
            used.append((index, object))
            commandBuffer.use(object, "buffer(\(index))\(object.label.map { " ('\($0)')" } ?? "") of kernel \(name), "
                                      + "\(object.length) bytes,")
        }
        if case .indirect(let memory, _) = size, let object = indirectObject?.object {
            commandBuffer.use(object, "the indirect buffer of kernel \(name), \(memory.length) bytes,")
        }
        pass.dispatch(pipeline.kernel, used)
        let command = DispatchCommand(
            kernel: pipeline.kernel, maxThreads: pipeline.maxTotalThreadsPerThreadgroup, buffers: buffers,
            threadgroupLengths: threadgroupLengths, size: size, threadsPerThreadgroup: threadsPerThreadgroup,
            checkOrder: softMetalCheckOrder, poison: softMetalPoisonThreadgroupMemory,
            checkMemory: softMetalCheckMemory || softMetalStaleReads, checkDivision: softMetalCheckDivision,
            schedule: softMetalSchedule, staleReads: softMetalStaleReads, checkRaces: softMetalCheckRaces)
        if dispatchType == .concurrent {
            unordered.append(command)
        } else {
            commandBuffer.append(command)
        }
    }

    /// Every dispatch encoded before it completes, its writes visible, before any encoded after it starts.
    public func memoryBarrier(scope: MTLBarrierScope) {
        if ended { return misuse("memoryBarrier(scope:) after endEncoding()") }
        if scope.contains(.buffers) { flushUnordered() }
    }

    private func flushUnordered() {
        for command in unordered.reversed() { commandBuffer.append(command) }
        unordered = []
    }

    public func dispatchThreadgroups(_ threadgroupsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize) {
        record(.threadgroups(threadgroupsPerGrid), threadsPerThreadgroup)
    }

    public func dispatchThreadgroups(indirectBuffer: any MTLBuffer, indirectBufferOffset: Int, threadsPerThreadgroup: MTLSize) {
        guard let b = indirectBuffer as? SoftMetalBuffer else { return misuse("indirect buffer not made by SoftMetal") }
        indirectObject = WeakObject(b)
        defer { indirectObject = nil }
        record(.indirect(b.memory, indirectBufferOffset), threadsPerThreadgroup)
    }

    public func dispatchThreads(_ threadsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize) {
        record(.threads(threadsPerGrid), threadsPerThreadgroup)
    }

    public func endEncoding() {
        if ended { return misuse("endEncoding() called twice") }
        flushUnordered()
        ended = true
        if let encodingError { commandBuffer.append(DispatchCommand.failing(encodingError)) }
        commandBuffer.record(.pass(pass))
    }
}

extension DispatchCommand {
    /// A command that fails with `error` when it runs (errors found while encoding).
    static func failing(_ error: SoftMetalError) -> DispatchCommand { noKernel(failure: error) }

    /// encodeWaitForEvent / encodeSignalEvent's command.
    static func event(_ op: EventOp) -> DispatchCommand { noKernel(event: op) }

    private static func noKernel(failure: SoftMetalError? = nil, event: EventOp? = nil) -> DispatchCommand {
        DispatchCommand(kernel: nil, failure: failure, event: event, maxThreads: 0, buffers: [], threadgroupLengths: [],
                        size: .threadgroups(MTLSize()), threadsPerThreadgroup: MTLSize(), checkOrder: false, poison: false)
    }
}
#endif
