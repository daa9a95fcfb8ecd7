// The build step that compiles the Metal backend's MSL into the binary: runs embed-msl
// (Sources/embed-msl, a C program) on the target's Metal/library.txt, writing MetalSources.swift into
// the build folder.
//
// A plugin rather than SwiftPM's `embedInCode` resources, which Xcode's build system does
// not implement, and rather than Bundle.module, which fails when the library is loaded
// from Python. The command is rerun only when the list or a file in one of its folders
// changes.
import Foundation
import PackagePlugin

@main
struct EmbedMSL: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) async throws -> [Command] {
        guard let target = target as? SourceModuleTarget else { return [] }
        // The Path API: the URL one needs swift-tools-version 6.0 (Package.swift says why 5.9).
        let list = target.directory.appending(subpath: "Metal/library.txt").string
        let tool = try context.tool(named: "embed-msl").path
        let output = context.pluginWorkDirectory.appending(subpath: "MetalSources.swift")
        return [.buildCommand(displayName: "Embedding the MSL of \(list)", executable: tool,
                              arguments: [list, context.package.directory.string, output.string],
                              environment: toolEnvironment(context),
                              inputFiles: try inputs(of: list).map { Path($0) },
                              outputFiles: [output])]
    }

    /// On Linux, where the toolchain's Swift runtime is: SwiftPM links every executable
    /// against it, even a C one, and a build with `-Xswiftc -no-toolchain-stdlib-rpath`
    /// (the wheel's, hatch_build.py) leaves the tool unable to find it.
    func toolEnvironment(_ context: PluginContext) -> [String: String] {
#if os(Linux)
        guard let swiftc = try? context.tool(named: "swiftc") else { return [:] }
        let bin = URL(fileURLWithPath: swiftc.path.string).resolvingSymlinksInPath().deletingLastPathComponent()
        let runtime = bin.deletingLastPathComponent().appendingPathComponent("lib/swift/linux").path
        let inherited = ProcessInfo.processInfo.environment["LD_LIBRARY_PATH"].map { ":" + $0 } ?? ""
        return ["LD_LIBRARY_PATH": runtime + inherited]
#else
        return [:]
#endif
    }

    /// The list and every file the source can come from: the kernel files and the files
    /// of the include folders and of the kernel files' folders.
    func inputs(of list: String) throws -> [String] {
        let base = URL(fileURLWithPath: list).deletingLastPathComponent()
        var files = [list], folders: [String] = []
        for line in try String(contentsOfFile: list, encoding: .utf8).split(separator: "\n") where !line.hasPrefix("#") {
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.count == 2 else { continue }
            let path = base.appendingPathComponent(String(words[1])).standardized.path
            if words[0] == "kernels" {
                files.append(path)
                folders.append(URL(fileURLWithPath: path).deletingLastPathComponent().path)
            } else if words[0] == "include" {
                folders.append(path)
            }
        }
        for folder in Set(folders).sorted() {
            for name in try FileManager.default.contentsOfDirectory(atPath: folder).sorted() {
                var isDirectory: ObjCBool = false
                let file = folder + "/" + name
                if FileManager.default.fileExists(atPath: file, isDirectory: &isDirectory), !isDirectory.boolValue,
                   !files.contains(file) {
                    files.append(file)
                }
            }
        }
        return files
    }
}
