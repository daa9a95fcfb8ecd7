// swift-tools-version:5.9
// SoftMetal on its own: `swift build --package-path SoftMetal`, `swift test --package-path SoftMetal`.
// The repository's root Package.swift declares these targets again by path (a package added by
// URL may not depend on a local one): a change to a target here is made there too.
import PackageDescription

let package = Package(
    name: "SoftMetal",
    platforms: [.macOS(.v13)],
    products: [
        // Apple's Metal API names on the CPU (Linux; empty on Apple platforms).
        .library(name: "SoftMetal", targets: ["SoftMetal"]),
    ],
    targets: [
        // Guarded memory, the SIGSEGV handler, fiber stacks, running the compiler.
        .target(name: "CSoftMetal"),
        .target(
            name: "SoftMetal",
            dependencies: ["CSoftMetal"],
            // The parts of the stand-in for <metal_stdlib>, joined in KernelCompiler.runtimeParts.
            resources: [.embedInCode("Runtime")]
        ),
        .testTarget(
            name: "SoftMetalTests",
            dependencies: [.target(name: "SoftMetal", condition: .when(platforms: [.linux]))],
            path: "tests/swift/SoftMetalTests"
        ),
    ]
)
