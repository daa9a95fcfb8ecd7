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
        .library(name: "MoESwift", type: .dynamic, targets: ["MoEKernels"]),
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
        .target(
            name: "MoEKernels",
            dependencies: [
                "CMoESwift",
                .target(name: "COpenBLAS", condition: .when(platforms: [.linux])),
            ],
            path: "Sources/MoEKernels",
            exclude: ["Metal"]
        ),
        .testTarget(
            name: "MoEKernelsTests",
            dependencies: ["MoEKernels", "CMoESwift"],
            path: "tests/swift/MoEKernelsTests"
        ),
    ]
)
