#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CMoESwift

/// The one Metal device, command queue and set of pipelines of the process: the MSL is
/// compiled once, from the source embedded in the binary, the first time a Metal layer is
/// made (SoftMetal also caches the compiled kernels on disk).
final class MetalContext: @unchecked Sendable {
    let device: any MTLDevice
    let queue: any MTLCommandQueue
    let library: any MTLLibrary
    let bucket: any MTLComputePipelineState
    let combine: any MTLComputePipelineState
    /// The decode router's second dispatch (format-independent).
    let routerTopK: any MTLComputePipelineState
    /// The conversions between a caller's activation rows and float32 (the encode API), by
    /// dtype: made with the context, so that no encode call builds a pipeline.
    private let loads, stores: [ScalarType: any MTLComputePipelineState]
    /// Pipelines of the per-format kernel instances, made the first time a layer needs
    /// them (a process that reads one format does not build the others').
    private var pipelines: [String: any MTLComputePipelineState] = [:]
    private let lock = Lock()
    /// Bound where an optional array is absent (the kernels do not read it then).
    let placeholder: any MTLBuffer

    private static let made: Result<MetalContext, MoEError> = {
        do {
            return .success(try MetalContext())
        } catch let error as MoEError {
            return .failure(error)
        } catch {
            return .failure(.unavailable("the \(metalDeviceKind.name) backend cannot start: \(error)"))
        }
    }()

    /// The process's context, or why there is none (MoEError.unavailable).
    static func shared() throws -> MetalContext { try made.get() }

    static var isAvailable: Bool {
        if case .success = made { return true }
        return false
    }

    private init() throws {
        let name = metalDeviceKind.name
        guard let device = metalSystemDevice() else {
            throw MoEError.unavailable("the \(name) backend found no Metal device")
        }
        // simdgroup matrices (the prefill GEMMs) and the simd reductions need Apple GPU
        // family 7 (M1, A14) or later: on an Intel or AMD Mac say so here, not through a
        // pipeline error.
        guard device.supportsFamily(.apple7) else {
            throw MoEError.unavailable("the \(name) backend needs an Apple silicon GPU (MTLGPUFamily.apple7: M1, A14 "
                                       + "or later); \(device.name) is not one. Use backend=\"cpu\"")
        }
        guard let queue = device.makeCommandQueue(), let placeholder = device.makeBuffer(length: 16, options: .storageModeShared) else {
            throw MoEError.unavailable("the \(name) backend could not create a command queue")
        }
        let library: any MTLLibrary
        if let precompiled = Self.precompiledLibrary(device) {
            library = precompiled
        } else {
            do {
                library = try device.makeLibrary(source: MetalKernels.source, options: Self.compileOptions())
            } catch {
                throw MoEError.unavailable("the \(name) backend's kernels did not compile: \(error)")
            }
        }
        self.device = device
        self.queue = queue
        self.placeholder = placeholder
        self.library = library
        bucket = try Self.makePipeline(device, library, MetalKernels.bucket, threads: MOE_BUCKET_THREADS)
        combine = try Self.makePipeline(device, library, MetalKernels.combine, threads: MOE_COMBINE_THREADS)
        routerTopK = try Self.makePipeline(device, library, MetalKernels.routerTopK, threads: MOE_SIMD_WIDTH)
        func conversions(_ name: (ScalarType) -> String) throws -> [ScalarType: any MTLComputePipelineState] {
            try Dictionary(uniqueKeysWithValues: ScalarType.allCases.map {
                ($0, try Self.makePipeline(device, library, name($0), threads: MOE_CONVERT_THREADS))
            })
        }
        loads = try conversions(MetalKernels.loadActivations)
        stores = try conversions(MetalKernels.storeActivations)
    }

    /// Where a metallib built ahead of time (scripts/build-metallib.sh) is looked for:
    /// $MOE_SWIFT_METALLIB, then `moe_swift.metallib` beside the binary that holds this code
    /// (libMoESwift in the Python package, or an app's executable).
    static var precompiledLibraryPaths: [String] {
        var paths: [String] = []
        if let given = getenv("MOE_SWIFT_METALLIB") { paths.append(String(cString: given)) }
        #if canImport(Darwin)
        // Only Metal loads file libraries (metalLibraryFile): on Linux there is nothing to find.
        var info = Dl_info()
        if dladdr(unsafeBitCast(binaryAnchor, to: UnsafeRawPointer.self), &info) != 0, let file = info.dli_fname {
            let binary = String(cString: file)
            if let slash = binary.lastIndex(of: "/") { paths.append(binary[..<slash] + "/moe_swift.metallib") }
        }
        #endif
        return paths
    }

    /// A C function of this binary, whose address dladdr maps to the binary's file.
    private static let binaryAnchor: @convention(c) () -> Void = {}

    /// The first precompiled library found that was built from this binary's own source
    /// (it holds MetalKernels.sourceIdentity); nil sends the caller to compile the source.
    static func precompiledLibrary(_ device: any MTLDevice) -> (any MTLLibrary)? {
        for path in precompiledLibraryPaths where access(path, R_OK) == 0 {
            if let library = metalLibraryFile(device, path: path),
               library.functionNames.contains(MetalKernels.sourceIdentity) {
                return library
            }
        }
        return nil
    }

    /// IEEE float math and precise math functions: the router's NaN rules, the spec
    /// tolerance and results that do not change with the OS assume them. Set explicitly,
    /// never left to a default: on macOS 15, `mathMode = .safe` alone would leave
    /// `mathFloatingPointFunctions` at its default `.fast` (exp and tanh would differ from
    /// macOS 14's), and `fastMathEnabled` is deprecated there. Both members exist only in the
    /// macOS 15 / iOS 18 SDKs (Swift 6 compilers), and `#available` does not hide a member
    /// the SDK lacks, hence the compiler check; older SDKs and systems get
    /// `fastMathEnabled = false`, which means the same. MSL 3.1 for bfloat.
    static func compileOptions() -> MTLCompileOptions {
        let options = MTLCompileOptions()
        #if compiler(>=6.0)
        if #available(macOS 15.0, iOS 18.0, *) {
            options.mathMode = .safe
            options.mathFloatingPointFunctions = .precise
        } else {
            options.fastMathEnabled = false
        }
        #else
        options.fastMathEnabled = false
        #endif
        if #available(macOS 14.0, iOS 17.0, *) {
            options.languageVersion = .version3_1
        }
        return options
    }

    /// The pipeline of kernel `name`, which runs `threads` threads per threadgroup; made
    /// once per process.
    func pipeline(_ name: String, threads: Int32) throws -> any MTLComputePipelineState {
        try lock.withLock {
            if let made = pipelines[name] { return made }
            let made = try Self.makePipeline(device, library, name, threads: threads)
            pipelines[name] = made
            return made
        }
    }

    /// The kernel that converts a caller's `dtype` rows to float32 (`load`) or back.
    func activationKernel(_ dtype: ScalarType, load: Bool) -> any MTLComputePipelineState {
        (load ? loads : stores)[dtype]!  // every dtype's, made in init
    }

    private static func makePipeline(_ device: any MTLDevice, _ library: any MTLLibrary, _ kernel: String,
                                     threads: Int32) throws -> any MTLComputePipelineState {
        let name = metalDeviceKind.name
        guard let function = library.makeFunction(name: kernel) else {
            throw MoEError.internalError("kernel \(kernel) is missing from the Metal library")
        }
        let state: any MTLComputePipelineState
        do {
            state = try device.makeComputePipelineState(function: function)
        } catch {
            throw MoEError.unavailable("the \(name) backend could not make the pipeline of \(kernel): \(error)")
        }
        guard state.maxTotalThreadsPerThreadgroup >= Int(threads), state.threadExecutionWidth == Int(MOE_SIMD_WIDTH) else {
            throw MoEError.unavailable(
                "the \(name) backend needs \(threads) threads per threadgroup and simdgroups of \(MOE_SIMD_WIDTH) for \(kernel); "
                + "this device offers \(state.maxTotalThreadsPerThreadgroup) and \(state.threadExecutionWidth)")
        }
        return state
    }

    /// The length of the buffer `makeBuffer(bytes:)` makes for `bytes`.
    static func bufferLength(_ bytes: Int) -> Int { max(16, (bytes + 15) / 16 * 16) }

    /// A shared-storage buffer of at least 16 bytes (Metal returns nil for length 0),
    /// counted in the calling thread's statistics.
    func makeBuffer(floats count: Int, what: String) throws -> any MTLBuffer {
        try makeBuffer(bytes: count * MemoryLayout<Float>.stride, what: what)
    }

    func makeBuffer(bytes: Int, what: String) throws -> any MTLBuffer {
        let length = Self.bufferLength(bytes)
        guard length <= device.maxBufferLength else {
            throw MoEError.outOfMemory("\(what) needs \(length) bytes in one buffer, more than this \(metalDeviceKind.name) "
                                       + "device's maxBufferLength (\(device.maxBufferLength) bytes)")
        }
        guard let buffer = device.makeBuffer(length: length, options: .storageModeShared) else {
            throw MoEError.outOfMemory("cannot allocate \(length) bytes of \(metalDeviceKind.name) device memory for \(what)")
        }
        buffer.label = what  // names it in Xcode's GPU tools and in SoftMetal's reports
        CallStats.allocation(bytes: length)
        return buffer
    }
}
