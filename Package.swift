// swift-tools-version:5.9
// 5.9 rather than 6.x so that Xcode 16 (Swift 6.0) and every later toolchain build it;
// `embedInCode` resources and platform-conditioned dependencies both exist since 5.9.
import PackageDescription

let package = Package(
    name: "moe-swift",
    platforms: [.macOS(.v13)],
    products: [
        // Swift apps: `import MoEKernels`.
        .library(name: "MoEKernels", targets: ["MoEKernels"]),
        // The shared library that the Python package loads (libMoESwift.so / .dylib);
        // its C ABI is Sources/CMoESwift/include/moe_swift.h.
        // SoftMetalHarness adds SoftMetal's kernel harness (SoftMetal/Sources/CSoftMetalHarness/
        // moe_softmetal.h) to this library rather than to one of its own, so that a process has
        // one SoftMetal (one SIGSEGV handler, one guarded-memory registry) for both.
        .library(name: "MoESwift", type: .dynamic, targets: ["MoEKernels", "SoftMetalHarness"]),
        // SoftMetal on its own (Linux; empty on Apple platforms): Apple's Metal API names on
        // the CPU, for running and checking any MSL compute kernels off a Mac.
        .library(name: "SoftMetal", targets: ["SoftMetal"]),
    ],
    targets: [
        // The C ABI header (single source of truth) and the thread-local error slot.
        .target(name: "CMoESwift", path: "Sources/CMoESwift"),
        // OpenBLAS on Linux through pkg-config; Apple platforms use Accelerate instead.
        .systemLibrary(
            name: "COpenBLAS",
            path: "Sources/COpenBLAS",
            pkgConfig: "openblas",
            providers: [.apt(["libopenblas-dev"])]
        ),
        // Small-M matrix products (AVX2 / AVX-512, chosen at run time) where BLAS is slow.
        .target(name: "CMoECPU", dependencies: ["CMoESwift"], path: "Sources/CMoECPU"),
        // SoftMetal (SoftMetal/README.md): a software Metal device so that the Metal backend runs
        // on Linux; empty on Apple platforms. It is a package of its own (SoftMetal/Package.swift,
        // for standalone use and its tests), declared again here by path because SwiftPM refuses
        // a package added by URL that depends on a local package. Keep the two in step.
        .target(name: "CSoftMetal", path: "SoftMetal/Sources/CSoftMetal"),
        .target(
            name: "SoftMetal",
            dependencies: ["CSoftMetal"],
            path: "SoftMetal/Sources/SoftMetal",
            // The parts of the stand-in for <metal_stdlib>, joined in KernelCompiler.runtimeParts.
            resources: [.embedInCode("Runtime")]
        ),
        // The moe_softmetal_* harness (Python's moe_swift.softmetal) builds on the layer's status
        // codes and error slot (moe_swift.h), so only this package declares it.
        .systemLibrary(name: "CSoftMetalHarness", path: "SoftMetal/Sources/CSoftMetalHarness"),
        .target(
            name: "SoftMetalHarness",
            dependencies: [
                "CMoESwift",
                "CSoftMetalHarness",
                .target(name: "SoftMetal", condition: .when(platforms: [.linux])),
            ],
            path: "SoftMetal/Sources/SoftMetalHarness"
        ),
        .target(
            name: "MoEKernels",
            dependencies: [
                "CMoESwift",
                "CMoECPU",
                .target(name: "COpenBLAS", condition: .when(platforms: [.linux])),
                .target(name: "SoftMetal", condition: .when(platforms: [.linux])),
            ],
            path: "Sources/MoEKernels",
            // The MSL files are compiled into the binary as a Swift string literal that the
            // EmbedMSL plugin writes at build time from Metal/library.txt, not as resources:
            // Xcode does not implement embedInCode, and must not compile them into a
            // metallib either. The kernel parameter header is also imported into Swift
            // through CMoESwift's module map.
            exclude: ["Metal"],
            // MTLCreateSystemDefaultDevice() in a process without an app (Python, swift test)
            // finds the GPU only with CoreGraphics linked.
            linkerSettings: [.linkedFramework("CoreGraphics", .when(platforms: [.macOS]))],
            plugins: [.plugin(name: "EmbedMSL")]
        ),
        // The build step above and its tool: the Metal library's MSL, includes pasted, as
        // a Swift source file in the build folder.
        .plugin(name: "EmbedMSL", capability: .buildTool(), dependencies: ["embed-msl"]),
        .executableTarget(name: "embed-msl", path: "Sources/embed-msl"),
        .testTarget(
            name: "MoEKernelsTests",
            // SoftMetal: the encode tests are an app with Metal kernels of its own.
            dependencies: ["MoEKernels", "CMoESwift", "CMoECPU",
                           .target(name: "SoftMetal", condition: .when(platforms: [.linux]))],
            path: "tests/swift/MoEKernelsTests"
        ),
        .testTarget(
            name: "SoftMetalTests",
            dependencies: [.target(name: "SoftMetal", condition: .when(platforms: [.linux]))],
            path: "SoftMetal/tests/swift/SoftMetalTests"
        ),
    ]
)
