#if os(Linux)
// The subset of Apple's Metal Swift API that a compute backend needs, with Apple's names
// and Swift signatures, so that the same backend source builds with `import Metal` on
// Apple platforms and `import SoftMetal` here. Each declaration names the page of
// Apple's documentation it was checked against (developer.apple.com/documentation/metal/...).
// Protocol requirements cannot have default arguments; Apple's defaults (from the
// Objective-C importer) are provided by the extensions at the end.
// Nothing SoftMetal-specific is declared on these types: see SoftMetalOptions.swift.

/// documentation/metal/mtlsize: `struct MTLSize { var width, height, depth: Int }`
public struct MTLSize {  // not Equatable: Apple's (a C struct) is not either
    public var width: Int
    public var height: Int
    public var depth: Int
    /// documentation/metal/mtlsize/init()
    public init() { (width, height, depth) = (0, 0, 0) }
    /// documentation/metal/mtlsize/init(width:height:depth:)
    public init(width: Int, height: Int, depth: Int) {
        self.width = width
        self.height = height
        self.depth = depth
    }
}

/// documentation/metal/mtlresourceoptions (an OptionSet of UInt; raw values as in Metal).
public struct MTLResourceOptions: OptionSet {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let cpuCacheModeWriteCombined = MTLResourceOptions(rawValue: 1)
    public static let storageModeShared = MTLResourceOptions([])
    public static let storageModeManaged = MTLResourceOptions(rawValue: 1 << 4)
    public static let storageModePrivate = MTLResourceOptions(rawValue: 2 << 4)
    public static let hazardTrackingModeDefault = MTLResourceOptions([])
    public static let hazardTrackingModeUntracked = MTLResourceOptions(rawValue: 1 << 8)
    public static let hazardTrackingModeTracked = MTLResourceOptions(rawValue: 2 << 8)
}

/// documentation/metal/mtlhazardtrackingmode: `enum MTLHazardTrackingMode: UInt` (raw values as
/// in Metal). A buffer made with the default is tracked.
public enum MTLHazardTrackingMode: UInt {
    case `default` = 0, untracked = 1, tracked = 2
}

/// documentation/metal/mtlcommandbufferstatus: `enum MTLCommandBufferStatus: UInt`
public enum MTLCommandBufferStatus: UInt {
    case notEnqueued = 0, enqueued = 1, committed = 2, scheduled = 3, completed = 4, error = 5
}

/// documentation/metal/mtldispatchtype: `enum MTLDispatchType: UInt`
public enum MTLDispatchType: UInt {
    case serial = 0, concurrent = 1
}

/// documentation/metal/mtlbarrierscope: `struct MTLBarrierScope: OptionSet` (raw values as in Metal).
public struct MTLBarrierScope: OptionSet {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let buffers = MTLBarrierScope(rawValue: 1)
    public static let textures = MTLBarrierScope(rawValue: 2)
    public static let renderTargets = MTLBarrierScope(rawValue: 4)
}

/// documentation/metal/mtldispatchthreadgroupsindirectarguments:
/// `struct MTLDispatchThreadgroupsIndirectArguments { var threadgroupsPerGrid: (UInt32, UInt32, UInt32) }`
public struct MTLDispatchThreadgroupsIndirectArguments {
    public var threadgroupsPerGrid: (UInt32, UInt32, UInt32)
    public init() { threadgroupsPerGrid = (0, 0, 0) }
    public init(threadgroupsPerGrid: (UInt32, UInt32, UInt32)) { self.threadgroupsPerGrid = threadgroupsPerGrid }
}

// Availability: each name carries the macOS and iOS releases of Apple's documentation page
// (for a reader, and for code that must build with Apple's SDK too). Swift checks these
// attributes only when it compiles for an Apple platform, which SoftMetal never is: here
// `#available(macOS 15, *)` is true, so code takes its newest-SDK branch on Linux, and a
// macOS 15 member used without `#if compiler(>=6.0)` + `#available` is caught by the macOS
// CI job (.github/workflows/macos.yml), not by this build.

/// documentation/metal/mtllanguageversion: `enum MTLLanguageVersion: UInt` (major << 16 | minor).
public enum MTLLanguageVersion: UInt {
    @available(macOS 10.13, iOS 11.0, *) case version2_0 = 131072
    @available(macOS 10.14, iOS 12.0, *) case version2_1 = 131073
    @available(macOS 10.15, iOS 13.0, *) case version2_2 = 131074
    @available(macOS 11.0, iOS 14.0, *) case version2_3 = 131075
    @available(macOS 12.0, iOS 15.0, *) case version2_4 = 131076
    @available(macOS 13.0, iOS 16.0, *) case version3_0 = 196608
    @available(macOS 14.0, iOS 17.0, *) case version3_1 = 196609
    @available(macOS 15.0, iOS 18.0, *) case version3_2 = 196610
}

/// documentation/metal/mtlmathmode: `enum MTLMathMode: Int` (the successor of
/// fastMathEnabled).
@available(macOS 15.0, iOS 18.0, *)
public enum MTLMathMode: Int {
    case safe = 0, relaxed = 1, fast = 2
}

/// documentation/metal/mtlmathfloatingpointfunctions: `enum MTLMathFloatingPointFunctions: Int`.
@available(macOS 15.0, iOS 18.0, *)
public enum MTLMathFloatingPointFunctions: Int {
    case fast = 0, precise = 1
}

/// documentation/metal/mtlcompileoptions: `class MTLCompileOptions` (a subset). Include
/// directories, which Apple's API has no option for, are on `SoftMetalCompileOptions`.
open class MTLCompileOptions {
    /// documentation/metal/mtlcompileoptions/fastmathenabled (deprecated in the macOS 15
    /// SDK for mathMode). As Apple documents it, setting it sets mathMode and
    /// mathFloatingPointFunctions (true: both `.fast`; false: `.safe` and `.precise`).
    /// SoftMetal always computes IEEE float results (see the README).
    @available(macOS, deprecated: 15.0, renamed: "mathMode")
    @available(iOS, deprecated: 18.0, renamed: "mathMode")
    open var fastMathEnabled: Bool {
        get { mode == .fast }
        set { (mode, functions) = newValue ? (.fast, .fast) : (.safe, .precise) }
    }
    /// documentation/metal/mtlcompileoptions/mathmode: `var mathMode: MTLMathMode`. SoftMetal
    /// computes IEEE results in every mode.
    @available(macOS 15.0, iOS 18.0, *)
    open var mathMode: MTLMathMode {
        get { mode }
        set { mode = newValue }
    }
    /// documentation/metal/mtlcompileoptions/mathfloatingpointfunctions: `var
    /// mathFloatingPointFunctions: MTLMathFloatingPointFunctions` (default `.fast`). Honoured
    /// as far as SoftMetal can: it selects what `__METAL_MAYBE_FAST_MATH__` says, the macro
    /// through which Apple's headers (and MLX's bf16_math.h) pick the fast or the precise
    /// variant of a function. SoftMetal has no fast approximations (Apple does not specify
    /// their bits): both variants compute the precise result, so code compiled with
    /// `.fast` is more accurate here than on an Apple GPU.
    @available(macOS 15.0, iOS 18.0, *)
    open var mathFloatingPointFunctions: MTLMathFloatingPointFunctions {
        get { functions }
        set { functions = newValue }
    }
    // The storage of the three properties above: one state, as on Apple's side, where
    // fastMathEnabled sets the other two.
    var mode = MTLMathMode.fast
    var functions = MTLMathFloatingPointFunctions.fast
    /// documentation/metal/mtlcompileoptions/languageversion: `var languageVersion: MTLLanguageVersion`.
    /// Sets `__METAL_VERSION__` (310 for 3.1). SoftMetal's default is 3.1 (bfloat exists).
    open var languageVersion: MTLLanguageVersion = .version3_1
    /// documentation/metal/mtlcompileoptions/preprocessormacros: Apple's type is
    /// `[String: NSObject]?` (NSString or NSNumber values). This module does not import
    /// Foundation, so the values are `any CustomStringConvertible`: Apple-style code
    /// (`["BITS": NSNumber(value: 4), "T": "half" as NSString]`, or a `[String: NSObject]`
    /// variable) converts implicitly; each value's `description` is the macro's text (a
    /// Bool, also a boolean NSNumber, is 1 or 0).
    open var preprocessorMacros: [String: any CustomStringConvertible]?
    public init() {}
}

/// documentation/metal/mtldatatype: `enum MTLDataType: UInt` (the scalar cases function
/// constants use; raw values as in Metal).
public enum MTLDataType: UInt {
    case none = 0, float = 3, half = 16, int = 29, uint = 33, short = 37, ushort = 41, char = 45, uchar = 49
    case bool = 53, long = 81, ulong = 85, bfloat = 121

    /// Bytes of one value.
    var size: Int {
        switch self {
        case .none: return 0
        case .bool, .char, .uchar: return 1
        case .half, .short, .ushort, .bfloat: return 2
        case .float, .int, .uint: return 4
        case .long, .ulong: return 8
        }
    }
}

/// documentation/metal/mtlfunctionconstantvalues: `class MTLFunctionConstantValues` (values
/// for `[[function_constant(i)]]` declarations, by index or by name).
open class MTLFunctionConstantValues {
    struct Value: Equatable {
        var type: MTLDataType
        var bytes: [UInt8]
    }
    var byIndex: [Int: Value] = [:]
    var byName: [String: Value] = [:]

    public init() {}

    /// documentation/metal/mtlfunctionconstantvalues/setconstantvalue(_:type:index:):
    /// `func setConstantValue(_ value: UnsafeRawPointer, type: MTLDataType, index: Int)`
    open func setConstantValue(_ value: UnsafeRawPointer, type: MTLDataType, index: Int) {
        byIndex[index] = Value(type: type, bytes: Array(UnsafeRawBufferPointer(start: value, count: type.size)))
    }

    /// documentation/metal/mtlfunctionconstantvalues/setconstantvalue(_:type:withname:):
    /// `func setConstantValue(_ value: UnsafeRawPointer, type: MTLDataType, withName name: String)`
    open func setConstantValue(_ value: UnsafeRawPointer, type: MTLDataType, withName name: String) {
        byName[name] = Value(type: type, bytes: Array(UnsafeRawBufferPointer(start: value, count: type.size)))
    }

    /// documentation/metal/mtlfunctionconstantvalues/setconstantvalues(_:type:range:):
    /// `func setConstantValues(_ values: UnsafeRawPointer, type: MTLDataType, range: Range<Int>)`
    open func setConstantValues(_ values: UnsafeRawPointer, type: MTLDataType, range: Range<Int>) {
        for (k, index) in range.enumerated() {
            setConstantValue(values + k * type.size, type: type, index: index)
        }
    }

    /// documentation/metal/mtlfunctionconstantvalues/reset()
    open func reset() {
        byIndex = [:]
        byName = [:]
    }
}

/// documentation/metal/mtlcommandbufferhandler:
/// `typealias MTLCommandBufferHandler = @Sendable (any MTLCommandBuffer) -> Void`
public typealias MTLCommandBufferHandler = @Sendable (any MTLCommandBuffer) -> Void

/// documentation/metal/mtldevice: `protocol MTLDevice : NSObjectProtocol, Sendable`
public protocol MTLDevice: AnyObject, Sendable {
    /// documentation/metal/mtldevice/name
    var name: String { get }
    /// documentation/metal/mtldevice/maxthreadsperthreadgroup
    var maxThreadsPerThreadgroup: MTLSize { get }
    /// documentation/metal/mtldevice/maxbufferlength: `var maxBufferLength: Int { get }` (at least 256 MB)
    var maxBufferLength: Int { get }
    /// documentation/metal/mtldevice/maxthreadgroupmemorylength
    var maxThreadgroupMemoryLength: Int { get }
    /// documentation/metal/mtldevice/supportsfamily(_:): `func supportsFamily(_ gpuFamily: MTLGPUFamily) -> Bool`
    func supportsFamily(_ gpuFamily: MTLGPUFamily) -> Bool
    /// documentation/metal/mtldevice/makecommandqueue(): `func makeCommandQueue() -> (any MTLCommandQueue)?`
    func makeCommandQueue() -> (any MTLCommandQueue)?
    /// documentation/metal/mtldevice/makebuffer(length:options:):
    /// `func makeBuffer(length: Int, options: MTLResourceOptions = []) -> (any MTLBuffer)?`
    func makeBuffer(length: Int, options: MTLResourceOptions) -> (any MTLBuffer)?
    /// documentation/metal/mtldevice/makebuffer(bytes:length:options:):
    /// `func makeBuffer(bytes pointer: UnsafeRawPointer, length: Int, options: MTLResourceOptions = []) -> (any MTLBuffer)?`
    func makeBuffer(bytes pointer: UnsafeRawPointer, length: Int, options: MTLResourceOptions) -> (any MTLBuffer)?
    /// documentation/metal/mtldevice/makebuffer(bytesnocopy:length:options:deallocator:):
    /// `func makeBuffer(bytesNoCopy pointer: UnsafeMutableRawPointer, length: Int, options: MTLResourceOptions = [],
    ///  deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)? = nil) -> (any MTLBuffer)?`
    func makeBuffer(bytesNoCopy pointer: UnsafeMutableRawPointer, length: Int, options: MTLResourceOptions,
                    deallocator: (@Sendable (UnsafeMutableRawPointer, Int) -> Void)?) -> (any MTLBuffer)?
    /// documentation/metal/mtldevice/makelibrary(source:options:):
    /// `func makeLibrary(source: String, options: MTLCompileOptions?) throws -> any MTLLibrary`
    func makeLibrary(source: String, options: MTLCompileOptions?) throws -> any MTLLibrary
    /// documentation/metal/mtldevice/makecomputepipelinestate(function:):
    /// `func makeComputePipelineState(function: any MTLFunction) throws -> any MTLComputePipelineState`
    func makeComputePipelineState(function: any MTLFunction) throws -> any MTLComputePipelineState
    /// documentation/metal/mtldevice/makefence(): `func makeFence() -> (any MTLFence)?`
    func makeFence() -> (any MTLFence)?
    /// documentation/metal/mtldevice/makeevent(): `func makeEvent() -> (any MTLEvent)?`
    func makeEvent() -> (any MTLEvent)?
    /// documentation/metal/mtldevice/makesharedevent(): `func makeSharedEvent() -> (any MTLSharedEvent)?`
    func makeSharedEvent() -> (any MTLSharedEvent)?
}

/// documentation/metal/mtlresource (the part buffers need)
public protocol MTLResource: AnyObject {
    /// documentation/metal/mtlresource/device
    var device: any MTLDevice { get }
    /// documentation/metal/mtlresource/label
    var label: String? { get set }
    /// documentation/metal/mtlresource/hazardtrackingmode: `var hazardTrackingMode: MTLHazardTrackingMode { get }`
    var hazardTrackingMode: MTLHazardTrackingMode { get }
}

/// documentation/metal/mtlfence: `protocol MTLFence : NSObjectProtocol, Sendable`
public protocol MTLFence: AnyObject, Sendable {
    /// documentation/metal/mtlfence/device
    var device: any MTLDevice { get }
    /// documentation/metal/mtlfence/label
    var label: String? { get set }
}

/// documentation/metal/mtlevent: `protocol MTLEvent : NSObjectProtocol, Sendable`
public protocol MTLEvent: AnyObject, Sendable {
    /// documentation/metal/mtlevent/device: `var device: (any MTLDevice)? { get }`
    var device: (any MTLDevice)? { get }
    /// documentation/metal/mtlevent/label
    var label: String? { get set }
}

/// documentation/metal/mtlsharedevent: `protocol MTLSharedEvent : MTLEvent`
public protocol MTLSharedEvent: MTLEvent {
    /// documentation/metal/mtlsharedevent/signaledvalue: `var signaledValue: UInt64 { get set }`
    var signaledValue: UInt64 { get set }
}

/// documentation/metal/mtlbuffer
public protocol MTLBuffer: MTLResource {
    /// documentation/metal/mtlbuffer/length
    var length: Int { get }
    /// documentation/metal/mtlbuffer/contents(): `func contents() -> UnsafeMutableRawPointer`
    func contents() -> UnsafeMutableRawPointer
}

/// documentation/metal/mtllibrary: `protocol MTLLibrary : NSObjectProtocol, Sendable`
public protocol MTLLibrary: AnyObject, Sendable {
    var device: any MTLDevice { get }
    var label: String? { get set }
    /// documentation/metal/mtllibrary/functionnames: `var functionNames: [String] { get }`
    var functionNames: [String] { get }
    /// documentation/metal/mtllibrary/makefunction(name:): `func makeFunction(name functionName: String) -> (any MTLFunction)?`
    func makeFunction(name functionName: String) -> (any MTLFunction)?
    /// documentation/metal/mtllibrary/makefunction(name:constantvalues:):
    /// `func makeFunction(name: String, constantValues: MTLFunctionConstantValues) throws -> any MTLFunction`
    func makeFunction(name: String, constantValues: MTLFunctionConstantValues) throws -> any MTLFunction
}

/// documentation/metal/mtlfunction
public protocol MTLFunction: AnyObject {
    var device: any MTLDevice { get }
    var label: String? { get set }
    /// documentation/metal/mtlfunction/name
    var name: String { get }
}

/// documentation/metal/mtlcomputepipelinestate
public protocol MTLComputePipelineState: AnyObject {
    var device: any MTLDevice { get }
    var label: String? { get }
    /// documentation/metal/mtlcomputepipelinestate/maxtotalthreadsperthreadgroup
    var maxTotalThreadsPerThreadgroup: Int { get }
    /// documentation/metal/mtlcomputepipelinestate/threadexecutionwidth
    var threadExecutionWidth: Int { get }
    /// documentation/metal/mtlcomputepipelinestate/staticthreadgroupmemorylength
    var staticThreadgroupMemoryLength: Int { get }
}

/// documentation/metal/mtlcommandqueue
public protocol MTLCommandQueue: AnyObject {
    var device: any MTLDevice { get }
    var label: String? { get set }
    /// documentation/metal/mtlcommandqueue/makecommandbuffer(): `func makeCommandBuffer() -> (any MTLCommandBuffer)?`
    func makeCommandBuffer() -> (any MTLCommandBuffer)?
    /// documentation/metal/mtlcommandqueue/makecommandbufferwithunretainedreferences():
    /// `func makeCommandBufferWithUnretainedReferences() -> (any MTLCommandBuffer)?`
    func makeCommandBufferWithUnretainedReferences() -> (any MTLCommandBuffer)?
}

/// documentation/metal/mtlcommandbuffer
public protocol MTLCommandBuffer: AnyObject {
    var device: any MTLDevice { get }
    var commandQueue: any MTLCommandQueue { get }
    var label: String? { get set }
    /// documentation/metal/mtlcommandbuffer/retainedreferences: `var retainedReferences: Bool { get }`
    var retainedReferences: Bool { get }
    /// documentation/metal/mtlcommandbuffer/status
    var status: MTLCommandBufferStatus { get }
    /// documentation/metal/mtlcommandbuffer/error: `var error: (any Error)? { get }`
    var error: (any Error)? { get }
    /// documentation/metal/mtlcommandbuffer/makecomputecommandencoder():
    /// `func makeComputeCommandEncoder() -> (any MTLComputeCommandEncoder)?`
    func makeComputeCommandEncoder() -> (any MTLComputeCommandEncoder)?
    /// documentation/metal/mtlcommandbuffer/makecomputecommandencoder(dispatchtype:):
    /// `func makeComputeCommandEncoder(dispatchType: MTLDispatchType) -> (any MTLComputeCommandEncoder)?`
    func makeComputeCommandEncoder(dispatchType: MTLDispatchType) -> (any MTLComputeCommandEncoder)?
    /// documentation/metal/mtlcommandbuffer/addcompletedhandler(_:):
    /// `func addCompletedHandler(_ block: @escaping MTLCommandBufferHandler)`
    func addCompletedHandler(_ block: @escaping MTLCommandBufferHandler)
    /// documentation/metal/mtlcommandbuffer/encodewaitforevent(_:value:):
    /// `func encodeWaitForEvent(_ event: any MTLEvent, value: UInt64)` (between encoders)
    func encodeWaitForEvent(_ event: any MTLEvent, value: UInt64)
    /// documentation/metal/mtlcommandbuffer/encodesignalevent(_:value:):
    /// `func encodeSignalEvent(_ event: any MTLEvent, value: UInt64)` (between encoders)
    func encodeSignalEvent(_ event: any MTLEvent, value: UInt64)
    /// documentation/metal/mtlcommandbuffer/commit()
    func commit()
    /// documentation/metal/mtlcommandbuffer/waituntilcompleted()
    func waitUntilCompleted()
}

/// documentation/metal/mtlcommandencoder: `protocol MTLCommandEncoder : NSObjectProtocol` (not Sendable)
public protocol MTLCommandEncoder: AnyObject {
    var device: any MTLDevice { get }
    var label: String? { get set }
    /// documentation/metal/mtlcommandencoder/endencoding()
    func endEncoding()
}

/// documentation/metal/mtlcomputecommandencoder
public protocol MTLComputeCommandEncoder: MTLCommandEncoder {
    /// documentation/metal/mtlcomputecommandencoder/dispatchtype: `var dispatchType: MTLDispatchType { get }`
    var dispatchType: MTLDispatchType { get }
    /// documentation/metal/mtlcomputecommandencoder/memorybarrier(scope:):
    /// `func memoryBarrier(scope: MTLBarrierScope)`
    func memoryBarrier(scope: MTLBarrierScope)
    /// documentation/metal/mtlcomputecommandencoder/updatefence(_:):
    /// `func updateFence(_ fence: any MTLFence)` (once the pass completes)
    func updateFence(_ fence: any MTLFence)
    /// documentation/metal/mtlcomputecommandencoder/waitforfence(_:):
    /// `func waitForFence(_ fence: any MTLFence)` (before the pass starts)
    func waitForFence(_ fence: any MTLFence)
    /// documentation/metal/mtlcomputecommandencoder/setcomputepipelinestate(_:):
    /// `func setComputePipelineState(_ state: any MTLComputePipelineState)`
    func setComputePipelineState(_ state: any MTLComputePipelineState)
    /// documentation/metal/mtlcomputecommandencoder/setbuffer(_:offset:index:):
    /// `func setBuffer(_ buffer: (any MTLBuffer)?, offset: Int, index: Int)`
    func setBuffer(_ buffer: (any MTLBuffer)?, offset: Int, index: Int)
    /// documentation/metal/mtlcomputecommandencoder/setbytes(_:length:index:):
    /// `func setBytes(_ bytes: UnsafeRawPointer, length: Int, index: Int)`
    func setBytes(_ bytes: UnsafeRawPointer, length: Int, index: Int)
    /// documentation/metal/mtlcomputecommandencoder/setthreadgroupmemorylength(_:index:):
    /// `func setThreadgroupMemoryLength(_ length: Int, index: Int)`
    func setThreadgroupMemoryLength(_ length: Int, index: Int)
    /// documentation/metal/mtlcomputecommandencoder/dispatchthreadgroups(_:threadsperthreadgroup:):
    /// `func dispatchThreadgroups(_ threadgroupsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize)`
    func dispatchThreadgroups(_ threadgroupsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize)
    /// documentation/metal/mtlcomputecommandencoder/dispatchthreadgroups(indirectbuffer:indirectbufferoffset:threadsperthreadgroup:):
    /// `func dispatchThreadgroups(indirectBuffer: any MTLBuffer, indirectBufferOffset: Int, threadsPerThreadgroup: MTLSize)`
    func dispatchThreadgroups(indirectBuffer: any MTLBuffer, indirectBufferOffset: Int, threadsPerThreadgroup: MTLSize)
    /// documentation/metal/mtlcomputecommandencoder/dispatchthreads(_:threadsperthreadgroup:):
    /// `func dispatchThreads(_ threadsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize)`
    func dispatchThreads(_ threadsPerGrid: MTLSize, threadsPerThreadgroup: MTLSize)
}

// Apple's default arguments.
extension MTLDevice {
    public func makeBuffer(length: Int) -> (any MTLBuffer)? { makeBuffer(length: length, options: []) }
    public func makeBuffer(bytes pointer: UnsafeRawPointer, length: Int) -> (any MTLBuffer)? {
        makeBuffer(bytes: pointer, length: length, options: [])
    }
    public func makeBuffer(bytesNoCopy pointer: UnsafeMutableRawPointer, length: Int, options: MTLResourceOptions = [])
        -> (any MTLBuffer)? {
        makeBuffer(bytesNoCopy: pointer, length: length, options: options, deallocator: nil)
    }
}

/// documentation/metal/mtlgpufamily: `enum MTLGPUFamily` (raw values as in Metal's headers;
/// the families this project's code asks about).
public enum MTLGPUFamily: Int, Sendable {
    case apple1 = 1001, apple2, apple3, apple4, apple5, apple6, apple7, apple8, apple9
    case mac2 = 2002
    case common1 = 3001, common2, common3
    case metal3 = 5001
}

/// documentation/metal/mtlcopyalldevices(): `func MTLCopyAllDevices() -> [any MTLDevice]` (macOS)
public func MTLCopyAllDevices() -> [any MTLDevice] { [SoftMetalDevice.shared] }

/// documentation/metal/mtlcreatesystemdefaultdevice(): `func MTLCreateSystemDefaultDevice() -> (any MTLDevice)?`
public func MTLCreateSystemDefaultDevice() -> (any MTLDevice)? { SoftMetalDevice.shared }
#endif
