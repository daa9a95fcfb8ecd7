// The only file of MoEKernels that imports Metal or SoftMetal. The backend is written
// once against Apple's API names; this file decides whose declarations those names are.
//
// Why typealiases rather than an import in every file: `@_exported import` would hand
// Metal (or SoftMetal) to everyone who imports MoEKernels, and `@_exported internal import`
// does not exist. Internal typealiases give the backend files the names without exporting
// a module. They also keep the two branches honest on Linux: a backend file that spells a
// Metal type not aliased here does not build against SoftMetal either, so the Apple branch,
// which no machine of this project can compile, cannot silently fall behind — as long as
// both lists stay the same names in the same order (MetalAPIShimTests compares them).
//
// Five aliases are public: the encode API (MoELayer.encodeForward and its kin) takes
// the caller's command buffer, encoder, buffers, fences and events. An app that imports Metal (or
// SoftMetal) as well sees the same type under both names, which Swift does not call
// ambiguous.
//
// Members need no aliases: a protocol's requirements come with the protocol, and extension
// members (Metal's Swift overlay, SoftMetal's default arguments) are visible module-wide
// while Package.swift does not enable the MemberImportVisibility feature. Names used only
// through type inference (`.storageModeShared`, `.apple7`, `.safe`) need none either.
//
// Supported: macOS (Metal) and Linux (SoftMetal, a dependency only there). A platform with
// neither fails here with "no such module 'SoftMetal'": there is no build without the
// Metal backend.
#if canImport(Metal)
import Foundation
import Metal

/// On Apple platforms the backend runs on the GPU.
let metalDeviceKind = MoEBackendKind.metal

typealias MTLDevice = Metal.MTLDevice
typealias MTLCommandQueue = Metal.MTLCommandQueue
public typealias MTLCommandBuffer = Metal.MTLCommandBuffer
public typealias MTLComputeCommandEncoder = Metal.MTLComputeCommandEncoder
typealias MTLLibrary = Metal.MTLLibrary
typealias MTLCompileOptions = Metal.MTLCompileOptions
typealias MTLComputePipelineState = Metal.MTLComputePipelineState
public typealias MTLBuffer = Metal.MTLBuffer
public typealias MTLFence = Metal.MTLFence
public typealias MTLEvent = Metal.MTLEvent
typealias MTLSize = Metal.MTLSize
#else
import SoftMetal

/// Elsewhere on SoftMetal, the software Metal device.
let metalDeviceKind = MoEBackendKind.softMetal

typealias MTLDevice = SoftMetal.MTLDevice
typealias MTLCommandQueue = SoftMetal.MTLCommandQueue
public typealias MTLCommandBuffer = SoftMetal.MTLCommandBuffer
public typealias MTLComputeCommandEncoder = SoftMetal.MTLComputeCommandEncoder
typealias MTLLibrary = SoftMetal.MTLLibrary
typealias MTLCompileOptions = SoftMetal.MTLCompileOptions
typealias MTLComputePipelineState = SoftMetal.MTLComputePipelineState
public typealias MTLBuffer = SoftMetal.MTLBuffer
public typealias MTLFence = SoftMetal.MTLFence
public typealias MTLEvent = SoftMetal.MTLEvent
typealias MTLSize = SoftMetal.MTLSize
#endif

/// The Metal library at `path` (a metallib built ahead of time, scripts/build-metallib.sh),
/// or nil where there is none or it does not load. SoftMetal has no file libraries of its
/// own: it caches each compiled source on disk instead, so there it is always nil.
func metalLibraryFile(_ device: any MTLDevice, path: String) -> (any MTLLibrary)? {
    #if canImport(Metal)
    return try? device.makeLibrary(URL: URL(fileURLWithPath: path))
    #else
    return nil
    #endif
}

/// The device the backend runs on. A library loaded into a command-line process (Python,
/// `swift test`) may get no default device where an app would; any device of the machine
/// serves. MTLCopyAllDevices exists in Metal on macOS only (and in SoftMetal).
func metalSystemDevice() -> (any MTLDevice)? {
    #if os(macOS) || os(Linux)
    return MTLCreateSystemDefaultDevice() ?? MTLCopyAllDevices().first
    #else
    return MTLCreateSystemDefaultDevice()
    #endif
}
