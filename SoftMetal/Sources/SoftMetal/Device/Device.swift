#if os(Linux)
import CSoftMetal
import Glibc

/// The software device: MTLCreateSystemDefaultDevice() returns its one instance.
public final class SoftMetalDevice: MTLDevice, @unchecked Sendable {
    public static let shared = SoftMetalDevice()

    public let name = "SoftMetal (CPU)"
    public let maxThreadsPerThreadgroup = MTLSize(width: 1024, height: 1024, depth: 1024)
    public let maxThreadgroupMemoryLength = 32768
    /// SoftMetalOptions.maxBufferLength (settable, for tests).
    public var maxBufferLength: Int { SoftMetalOptions.maxBufferLength }

    /// SoftMetal stands in for an Apple silicon GPU of the M3/M4 generation (Apple 9, which
    /// includes every earlier Apple family, Mac 2 and Metal 3).
    public func supportsFamily(_ gpuFamily: MTLGPUFamily) -> Bool { true }

    public func makeCommandQueue() -> (any MTLCommandQueue)? { SoftMetalCommandQueue(device: self) }

    /// nil for a length of 0 or past maxBufferLength, as on Metal (code that works here must work there).
    public func makeBuffer(length: Int, options: MTLResourceOptions) -> (any MTLBuffer)? {
        guard length > 0, length <= maxBufferLength else { return nil }
        return SoftMetalBuffer(device: self, length: length, options: options)
    }

    public func makeBuffer(bytes pointer: UnsafeRawPointer, length: Int, options: MTLResourceOptions) -> (any MTLBuffer)? {
        guard length > 0, length <= maxBufferLength, let buffer = SoftMetalBuffer(device: self, length: length, options: options) else {
            return nil
        }
        buffer.contents().copyMemory(from: pointer, byteCount: length)
        return buffer
    }

    /// The memory is the caller's, so it cannot be given guard pages: out-of-bounds
    /// accesses to such a buffer are not detected. Like Metal on Apple silicon, the
    /// pointer and the length must be multiples of its 16 KiB page (else nil), even where
    /// this machine's pages are smaller.
    public func makeBuffer(bytesNoCopy pointer: UnsafeMutableRawPointer, length: Int, options: MTLResourceOptions,
                           deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)?) -> (any MTLBuffer)? {
        let page = Swift.max(Int(csm_page_size()), 16384)
        guard length > 0, length <= maxBufferLength, Int(bitPattern: pointer) % page == 0, length % page == 0 else {
            return nil
        }
        return SoftMetalBuffer(device: self, noCopy: pointer, length: length, options: options, deallocator: deallocator)
    }

    public func makeLibrary(source: String, options: MTLCompileOptions?) throws -> any MTLLibrary {
        try SoftMetalLibrary(device: self, source: source, options: MSLPreprocessor.Options(options))
    }

    public func makeComputePipelineState(function: any MTLFunction) throws -> any MTLComputePipelineState {
        guard let f = function as? SoftMetalFunction else {
            throw SoftMetalError.invalidUsage("makeComputePipelineState: the function was not made by SoftMetal")
        }
        return try SoftMetalComputePipelineState(function: f)
    }

    public func makeFence() -> (any MTLFence)? { SoftMetalFence(device: self) }
    public func makeEvent() -> (any MTLEvent)? { SoftMetalEvent(device: self) }
    public func makeSharedEvent() -> (any MTLSharedEvent)? { SoftMetalEvent(device: self) }
}

/// Storage is mmapped so that the last byte touches PROT_NONE guard space (and more guard
/// space precedes the first page): 64 GiB on each side while SoftMetal's budget of address
/// space allows (CSoftMetal's guarded_memory.c), so that any address a 32-bit index of
/// 16-byte elements forms from the buffer faults and is reported instead of landing in the
/// host's memory; else one page. makeBuffer(bytesNoCopy:...) memory is not guarded.
///
/// The app's object and its memory (BufferMemory) are two: recorded commands hold the
/// memory, and a command buffer with retained references holds the object too. One with
/// unretained references holds only the memory, so the app may release the object before
/// the commands ran, as on Metal; SoftMetal then fails that command buffer (a GPU would
/// read freed memory) while the memory itself lives on until the commands are done.
public final class SoftMetalBuffer: MTLBuffer, @unchecked Sendable {
    public let device: any MTLDevice
    public var label: String?
    public var length: Int { memory.length }
    let memory: BufferMemory
    var storage: UnsafeMutableRawPointer { memory.storage }
    /// false for bytesNoCopy buffers, whose memory SoftMetal cannot place next to a guard
    /// page, and beyond the budget of memory mappings for guarded buffers
    /// (CSoftMetal's guarded_memory.c): thousands of live buffers would otherwise exhaust
    /// the process's mappings.
    public var softMetalIsGuarded: Bool { memory.isGuarded }
    /// The PROT_NONE bytes on each side of the buffer's memory: 64 GiB (wide guards), a
    /// page (the budget of address space was spent, or mmap refused the reservation), or 0
    /// (not guarded).
    public var softMetalGuardBytes: Int { softMetalIsGuarded ? Int(csm_guard_width(storage)) : 0 }
    /// Untracked only when made with `.hazardTrackingModeUntracked` (Metal's default for a
    /// device's buffers is tracked); see Synchronization.swift for what SoftMetal checks.
    public let hazardTrackingMode: MTLHazardTrackingMode

    init?(device: any MTLDevice, length: Int, options: MTLResourceOptions = []) {
        guard let memory = BufferMemory(length: length) else { return nil }
        self.device = device
        self.memory = memory
        hazardTrackingMode = Self.tracking(options)
    }

    init(device: any MTLDevice, noCopy: UnsafeMutableRawPointer, length: Int, options: MTLResourceOptions = [],
         deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)?) {
        self.device = device
        memory = BufferMemory(noCopy: noCopy, length: length, deallocator: deallocator)
        hazardTrackingMode = Self.tracking(options)
    }

    private static func tracking(_ options: MTLResourceOptions) -> MTLHazardTrackingMode {
        options.contains(.hazardTrackingModeUntracked) && !options.contains(.hazardTrackingModeTracked) ? .untracked : .tracked
    }

    /// The host may write through the pointer, which nothing here can see: from now on
    /// every byte counts as written (the memory check's rule for device memory).
    public func contents() -> UnsafeMutableRawPointer {
        memory.markAllInitialized()
        return storage
    }
}

/// A buffer's memory: SoftMetal's guarded allocation, or the app's bytesNoCopy memory
/// whose deallocator runs when the last holder (the buffer, or a command that binds it)
/// lets go.
final class BufferMemory: @unchecked Sendable {
    let length: Int
    let storage: UnsafeMutableRawPointer
    let isGuarded: Bool
    /// The memory is SoftMetal's (csm_buffer_alloc), not the caller's (bytesNoCopy).
    private let owned: Bool
    private let deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)?

    init?(length: Int) {
        var guarded: Int32 = 0
        guard length >= 0, let p = csm_buffer_alloc(length, 1, &guarded) else { return nil }
        self.length = length
        storage = p
        isGuarded = guarded != 0
        owned = true
        deallocator = nil
        allInitialized = false
    }

    init(noCopy: UnsafeMutableRawPointer, length: Int, deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)?) {
        self.length = length
        storage = noCopy
        isGuarded = false
        owned = false
        self.deallocator = deallocator
        allInitialized = true
    }

    deinit {
        if owned { csm_buffer_free(storage, length, isGuarded ? 1 : 0) } else { deallocator?(storage, length) }
        initBits?.deallocate()
    }

    // The memory check's record of which bytes hold data, one bit per byte, kept across
    // dispatches: written by checked dispatches' stores; unused (every byte counts as
    // written) once the host took contents(), for makeBuffer(bytes:) and bytesNoCopy
    // buffers, and once an unchecked dispatch bound the buffer (its stores are not seen).
    private let initLock = SMLock()
    private var allInitialized: Bool
    private var initBits: UnsafeMutablePointer<UInt8>?

    func markAllInitialized() { initLock.withLock { allInitialized = true } }

    /// The bitmap for a checked dispatch, or nil when every byte counts as written.
    func initializationBits() -> UnsafeMutablePointer<UInt8>? {
        initLock.withLock {
            if allInitialized { return nil }
            if initBits == nil {
                initBits = .allocate(capacity: (length + 7) / 8)
                initBits!.initialize(repeating: 0, count: (length + 7) / 8)
            }
            return initBits
        }
    }
}

/// A kernel of a compiled library: its launcher and its parameter reflection.
final class CompiledKernel: @unchecked Sendable {
    struct Param {
        var kind: Int32
        var index: Int
        var elemSize: Int
        var isReference: Bool
        var type: String
        var name: String
        var attribute: String
        /// A `coherent(device)` buffer: the launcher's table marks it after the attribute.
        var coherent: Bool { attribute.hasSuffix(" coherent(device)") }
        var declaration: String {
            "\(coherent ? "coherent(device) " : "")\(type) \(name) [[\(coherent ? String(attribute.dropLast(" coherent(device)".count)) : attribute)]]"
        }
    }

    let name: String
    let cName: UnsafeMutablePointer<CChar>
    let launcher: sm_launcher
    let params: [Param]
    let maxTotalThreads: Int
    private let symbol: String
    private let build: CheckedBuild
    /// The launcher's code: kept open while this kernel exists.
    private let library: LoadedLibrary

    init(name: String, symbol: String, launcher: sm_launcher, info: UnsafePointer<sm_kernel_info>, build: CheckedBuild,
         library: LoadedLibrary) {
        self.name = name
        self.symbol = symbol
        self.build = build
        self.library = library
        cName = strdup(name)
        self.launcher = launcher
        var params: [Param] = []
        let i = info.pointee
        for k in 0..<Int(i.param_count) {
            let p = i.params[k]
            params.append(Param(kind: p.kind, index: Int(p.index), elemSize: Int(p.elem_size), isReference: p.is_reference != 0,
                                type: String(cString: p.type), name: String(cString: p.name),
                                attribute: String(cString: p.attribute)))
        }
        self.params = params
        // Never above the 1024 threads of every Apple GPU: a larger attribute value would
        // have a launch map a guarded fiber stack per thread before anything refused it.
        maxTotalThreads = i.max_total_threads > 0 ? Swift.min(Int(i.max_total_threads), 1024) : 1024
    }

    deinit { free(cName) }

    /// Whether the compiled kernel uses the argument after specialization (Metal's
    /// `MTLArgument.isActive`): only an active argument must be bound. See ArgumentActivity.
    func isActive(_ p: Param) -> Bool {
        guard let active = build.activeArguments()?[symbol] else { return true }
        return active.contains((p.kind == SM_PARAM_THREADGROUP ? "t" : "b") + "\(p.index)")
    }

    /// The launcher of the memory check's instrumented build, and its shared object.
    func checkedLauncher() throws -> (launcher: sm_launcher, path: String) {
        let built = try build.load()
        guard let launch = dlsym(built.handle, "__sm_launch_\(symbol)") else {
            throw SoftMetalError.compile("kernel \(name): launcher missing from the checked build")
        }
        return (unsafeBitCast(launch, to: sm_launcher.self), built.path)
    }
}

/// The memory check's build of one library (or one set of function-constant values):
/// compiled the first time a checked dispatch needs it.
final class CheckedBuild: @unchecked Sendable {
    private let text: String
    private let timeout: Double?
    private let lock = SMLock()
    private var built: LoadedLibrary?
    private var active: [String: Set<String>]??

    init(text: String, timeout: Double?) {
        self.text = text
        self.timeout = timeout
    }

    func load() throws -> LoadedLibrary {
        try lock.withLock {
            if let built { return built }
            let b = try KernelCompiler.interruptible { try KernelCompiler.shared.load(translated: text, checked: true, timeout: timeout) }
            built = b
            return b
        }
    }

    /// The active arguments of the library's kernels, by symbol (nil: not known).
    func activeArguments() -> [String: Set<String>]? {
        lock.withLock { () -> [String: Set<String>]? in
            if case .some(let known) = active { return known }
            let found = ArgumentActivity.activeArguments(translated: text, timeout: timeout)
            active = .some(found)
            return found
        }
    }
}

public final class SoftMetalLibrary: MTLLibrary, @unchecked Sendable {
    public let device: any MTLDevice
    public var label: String?
    public let functionNames: [String]
    let kernels: [String: CompiledKernel]
    /// The C++ that the MSL was translated to (for debugging).
    public let softMetalTranslatedSource: String
    /// The function constants the source declares: name, `[[function_constant(index)]]`,
    /// and MSL type (for tools that take values without a type, like the Python harness).
    public var softMetalFunctionConstants: [(name: String, index: Int, type: String)] {
        translated.functionConstants.map { ($0.name, $0.index, $0.type) }
    }
    /// The MTLDataType of an MSL scalar type that a function constant may have.
    public static func softMetalDataType(ofConstantType type: String) -> MTLDataType? {
        MSLTranslator.functionConstantTypes[type].flatMap { MTLDataType(rawValue: $0) }
    }
    /// The shared object of the whole library (of a lazily compiled one: its code outside
    /// the kernels); each kernel holds its own too.
    private let loadedLibrary: LoadedLibrary?
    var handle: UnsafeMutableRawPointer? { loadedLibrary?.handle }
    private let source: String
    private let translated: MSLTranslator.Output
    /// `__METAL_VERSION__` of the compile options: which C++ restrictions apply.
    private let metalVersion: Int
    /// For messages (files outside them are never quoted) and later compiles.
    private let includeDirectories: [String]
    private let compileTimeout: Double?

    /// Preprocesses, translates, compiles (or finds in the cache) and loads the source.
    init(device: any MTLDevice, source: String, options: MSLPreprocessor.Options = .init()) throws {
        // SIGINT while the source compiles stops its clang++ runs (see KernelCompiler.interruptible).
        csm_interrupt_scope_begin()
        defer { csm_interrupt_scope_end() }
        self.device = device
        self.source = source
        includeDirectories = options.includeDirectories
        compileTimeout = options.compileTimeout
        let context = (source: source, includeDirectories: options.includeDirectories, timeout: options.compileTimeout)
        do {
            let preprocessed = try MSLPreprocessor.run(source, options: options)
            translated = try MSLTranslator.translate(preprocessed)
            if let errors = MSLTranslator.versionErrors(translated.versionGated, metalVersion: options.metalVersion) {
                throw SoftMetalError.compile(errors)
            }
            // Once for every later compile of this library: each compiles parts of this text
            // (the body, a kernel's launcher) after SoftMetal's own function-constant defines.
            try MSLSandbox.checkTranslated(translated.source)
        } catch let SoftMetalError.compile(message) {
            throw SoftMetalError.compile(SoftMetalLibrary.explain(message, source: source, includeDirectories: options.includeDirectories))
        }
        // Without values every function constant is undefined (zero; see the README).
        if translated.kernels.count > SoftMetalLibrary.lazyKernelCount {
            // A large library (ggml-metal.metal instantiates about 650 kernels) compiles
            // kernel by kernel, when makeFunction asks for one; here only its code outside
            // the kernel templates' instances is compiled, which reports the errors there.
            do {
                let built = try KernelCompiler.shared.loadChecked(
                    translated: SoftMetalLibrary.constantsPrefix(translated.functionConstants, [:], metalVersion: options.metalVersion) + translated.body,
                    timeout: options.compileTimeout)
                if let errors = MSLLanguageCheck.errors(built.findings, metalVersion: options.metalVersion)
                    ?? MSLAddressSpaceCheck.errors(built.addressSpaceLog, overloaded: translated.addressSpaceOverloads) {
                    throw SoftMetalError.compile(errors)
                }
                loadedLibrary = built.library
            } catch let SoftMetalError.compile(message) {
                throw SoftMetalError.compile(SoftMetalLibrary.explain(message, source: source, includeDirectories: options.includeDirectories))
            }
            kernels = [:]
        } else {
            (loadedLibrary, kernels) = try SoftMetalLibrary.load(translated, constants: [:], context: context, metalVersion: options.metalVersion)
        }
        metalVersion = options.metalVersion
        functionNames = translated.kernels.map(\.name)
        softMetalTranslatedSource = translated.source
    }

    /// Libraries of more kernels than this compile kernel by kernel, on demand: an error in
    /// a kernel template's instance shows when makeFunction asks for that kernel.
    static let lazyKernelCount = 128
    var isLazy: Bool { translated.kernels.count > SoftMetalLibrary.lazyKernelCount }

    /// What a compile of this library needs besides the translation: for messages and limits.
    private typealias Context = (source: String, includeDirectories: [String], timeout: Double?)
    private var context: Context { (source, includeDirectories, compileTimeout) }

    /// Compiles (or finds in the cache) the translated source specialised for `constants`
    /// (index -> C++ value expression) and finds its kernels (`only`: just that one kernel's).
    private static func load(_ translated: MSLTranslator.Output, constants: [Int: String], context: Context,
                             metalVersion: Int, only: String? = nil) throws
        -> (LoadedLibrary, [String: CompiledKernel]) {
        let library: LoadedLibrary
        var text = constantsPrefix(translated.functionConstants, constants, metalVersion: metalVersion)
        var selected = translated.kernels
        if let only, let i = translated.kernels.firstIndex(where: { $0.name == only }) {
            text += translated.body + translated.launchers[i]
            selected = [translated.kernels[i]]
        } else {
            text += translated.source
        }
        let checked = CheckedBuild(text: text, timeout: context.timeout)
        do {
            let built = try KernelCompiler.shared.loadChecked(translated: text, timeout: context.timeout)
            if let errors = MSLLanguageCheck.errors(built.findings, metalVersion: metalVersion)
                ?? MSLAddressSpaceCheck.errors(built.addressSpaceLog, overloaded: translated.addressSpaceOverloads) {
                throw SoftMetalError.compile(errors)
            }
            library = built.library
        } catch let SoftMetalError.compile(message) {
            throw SoftMetalError.compile(SoftMetalLibrary.explain(message, source: context.source, includeDirectories: context.includeDirectories))
        }
        let handle = library.handle
        var kernels: [String: CompiledKernel] = [:]
        for k in selected {
            guard let launch = dlsym(handle, "__sm_launch_\(k.symbol)"), let info = dlsym(handle, "__sm_info_\(k.symbol)") else {
                throw SoftMetalError.compile("kernel \(k.name): launcher missing from the compiled library")
            }
            let infoFn = unsafeBitCast(info, to: sm_info_fn.self)
            guard let table = infoFn() else { throw SoftMetalError.compile("kernel \(k.name): no reflection") }
            let limit = table.pointee.max_total_threads
            guard limit >= 0, limit <= 1024 else {
                throw SoftMetalError.compile("kernel \(k.name): [[max_total_threads_per_threadgroup]] is \(limit); the limit is 1...1024")
            }
            kernels[k.name] = CompiledKernel(name: k.name, symbol: k.symbol, launcher: unsafeBitCast(launch, to: sm_launcher.self),
                                             info: table, build: checked, library: library)
        }
        return (library, kernels)
    }

    /// The `#define`s before a compile's text: `__SM_METAL_VERSION` (the runtime's
    /// version-gated declarations follow it), then `__SM_FC_<i> <value>` and `__SM_FCD_<i>`
    /// (defined or not) for every function constant.
    static func constantsPrefix(_ declared: [MSLTranslator.FunctionConstant], _ values: [Int: String], metalVersion: Int) -> String {
        "#define __SM_METAL_VERSION \(metalVersion)\n" + declared.map { c in
            let value = values[c.index]
            return "#define __SM_FC_\(c.index) \(value ?? "\(c.type)()")\n#define __SM_FCD_\(c.index) \(value == nil ? 0 : 1)\n"
        }.joined()
    }

    /// A value as a C++ constant expression of the declared type (checked against it).
    static func constantExpression(_ c: MSLTranslator.FunctionConstant, _ v: MTLFunctionConstantValues.Value) throws -> String {
        guard MSLTranslator.functionConstantTypes[c.type] == v.type.rawValue else {
            throw SoftMetalError.compile("function constant \(c.name) (index \(c.index)) is declared \(c.type); the value given is MTLDataType.\(v.type)")
        }
        let bits = v.bytes.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }  // little-endian
        switch v.type {
        case .bool: return bits != 0 ? "true" : "false"
        case .float: return "__builtin_bit_cast(float, (uint32_t)\(bits)u)"
        case .half: return "__builtin_bit_cast(half, (uint16_t)\(bits)u)"
        default: return "((\(c.type))\(bits)ull)"  // two's complement for the signed types
        }
    }

    private let lock = SMLock()
    private var variants: [String: [String: CompiledKernel]] = [:]

    public func makeFunction(name: String, constantValues: MTLFunctionConstantValues) throws -> any MTLFunction {
        guard translated.kernels.contains(where: { $0.name == name }) else {
            throw SoftMetalError.invalidUsage("makeFunction(name:constantValues:): no function named \(name) in the library (functions: \(functionNames.joined(separator: ", ")))")
        }
        var values: [Int: String] = [:]
        for c in translated.functionConstants {
            guard let v = constantValues.byIndex[c.index] ?? constantValues.byName[c.name] else { continue }
            values[c.index] = try SoftMetalLibrary.constantExpression(c, v)
        }
        var key = values.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ";")
        if isLazy { key += "|" + name }
        if let known = lock.withLock({ variants[key] }), let k = known[name] {
            return SoftMetalFunction(device: device, kernel: k)
        }
        let (_, kernels) = try KernelCompiler.interruptible {
            try SoftMetalLibrary.load(translated, constants: values, context: context, metalVersion: metalVersion, only: isLazy ? name : nil)
        }
        lock.withLock { variants[key] = kernels }
        return SoftMetalFunction(device: device, kernel: kernels[name]!)
    }

    /// A kernel of a lazily compiled library (without function-constant values), compiled once.
    private var lazyKernels: [String: Result<CompiledKernel, SoftMetalError>] = [:]
    private func lazyKernel(_ name: String) -> Result<CompiledKernel, SoftMetalError> {
        if let known = lock.withLock({ lazyKernels[name] }) { return known }
        let result: Result<CompiledKernel, SoftMetalError>
        do {
            let (_, kernels) = try KernelCompiler.interruptible {
                try SoftMetalLibrary.load(translated, constants: [:], context: context, metalVersion: metalVersion, only: name)
            }
            result = .success(kernels[name]!)
        } catch let e as SoftMetalError {
            // An interrupted or timed-out compile may succeed when asked again.
            if SMFile.isStopped(e) { return .failure(e) }
            result = .failure(e)
        } catch {
            result = .failure(.compile("\(error)"))
        }
        lock.withLock { lazyKernels[name] = result }
        return result
    }

    /// The compiler's output, plus the MSL lines its errors point at (in the source, or in
    /// an included file of the include folders, which is read again; a `#line` naming any
    /// other file never makes SoftMetal quote that file).
    static func explain(_ message: String, source: String, includeDirectories: [String]) -> String {
        let roots = MSLSandbox.Roots(includeDirectories: includeDirectories, stubs: nil)
        var files: [String: [Substring]] = [MSLTranslator.sourceName: source.split(separator: "\n", omittingEmptySubsequences: false)]
        var out = errorsFirst(message.trimmingSpaces)
        var quoted = Set<String>()
        for line in message.split(separator: "\n") where line.contains(": error:") {
            // `file:line:col: error: ...` or `file:line: error: ...`
            let parts = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3, let n = Int(parts[1]), n >= 1, quoted.count < 5 else { continue }
            let file = String(parts[0])
            if files[file] == nil {
                guard file != "softmetal-generated.cpp", !includeDirectories.isEmpty, roots.contains(file),
                      let text = try? SMFile.read(file) else { continue }
                files[file] = text.split(separator: "\n", omittingEmptySubsequences: false)
            }
            guard let lines = files[file], n <= lines.count, quoted.insert("\(file):\(n)").inserted else { continue }
            let name = file == MSLTranslator.sourceName ? "MSL line \(n)" : "\(file) line \(n)"
            out += "\n  \(name): \(lines[n - 1].trimmingSpaces)"
        }
        return out
    }

    /// The compiler's diagnostics with the errors (and their notes) before the warnings, in
    /// their order otherwise: the first thing a reader sees is what failed.
    static func errorsFirst(_ message: String) -> String {
        var errors: [Substring] = [], others: [Substring] = []
        var inError = false
        for line in message.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.contains(": error:") || line.contains(": fatal error:") { inError = true }
            else if line.contains(": warning:") { inError = false }
            // Notes, source lines and carets stay with the diagnostic before them.
            if inError { errors.append(line) } else { others.append(line) }
        }
        return (errors + others).joined(separator: "\n")
    }

    public func makeFunction(name functionName: String) -> (any MTLFunction)? {
        if isLazy {
            guard translated.kernels.contains(where: { $0.name == functionName }) else { return nil }
            // A compile error of the kernel is thrown by makeComputePipelineState.
            switch lazyKernel(functionName) {
            case .success(let k): return SoftMetalFunction(device: device, kernel: k)
            case .failure(let e): return SoftMetalFunction(device: device, name: functionName, failure: e)
            }
        }
        guard let k = kernels[functionName] else { return nil }
        return SoftMetalFunction(device: device, kernel: k)
    }
}

public final class SoftMetalFunction: MTLFunction, @unchecked Sendable {
    public let device: any MTLDevice
    public var label: String?
    public let name: String
    private let compiled: Result<CompiledKernel, SoftMetalError>

    init(device: any MTLDevice, kernel: CompiledKernel) {
        self.device = device
        name = kernel.name
        compiled = .success(kernel)
    }

    /// A kernel of a lazily compiled library that did not compile: makeComputePipelineState throws.
    init(device: any MTLDevice, name: String, failure: SoftMetalError) {
        self.device = device
        self.name = name
        compiled = .failure(failure)
    }

    func kernel() throws -> CompiledKernel { try compiled.get() }
}

public final class SoftMetalComputePipelineState: MTLComputePipelineState, @unchecked Sendable {
    public let device: any MTLDevice
    public let label: String?
    public var maxTotalThreadsPerThreadgroup: Int { kernel.maxTotalThreads }
    public let threadExecutionWidth = 32
    /// Not known before a run (threadgroup variables are sized by the C++ compiler): 0.
    public let staticThreadgroupMemoryLength = 0
    let kernel: CompiledKernel

    init(function: SoftMetalFunction) throws {
        device = function.device
        label = function.label
        kernel = try function.kernel()
    }
}
#endif
