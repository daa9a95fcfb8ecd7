import CMoESwift

/// How one of llama.cpp's architectures (GGUF's `general.architecture`) names the options
/// of its MoE block, and what llama.cpp assumes where a key is absent. Facts from
/// llama.cpp's `src/llama-model.cpp` / `src/models/*.cpp` (each architecture's hparams and
/// its `build_moe_ffn` call) and `gguf-py/gguf/constants.py`.
struct GGUFArchitecture {
    /// Where the experts' width I comes from.
    enum ExpertWidth {
        /// `<arch>.expert_feed_forward_length`, required.
        case expertLength
        /// `<arch>.expert_feed_forward_length`, else `feed_forward_length / expert_used_count`.
        case expertLengthOrShare
        /// `<arch>.feed_forward_length` (Mixtral, OLMoE: their experts are the FFN).
        case feedForward
    }

    enum Shared {
        case none
        /// `expert_shared_count` experts of width I, as one of width count * I (DeepSeek, GLM).
        case count
        /// `expert_shared_feed_forward_length` (else feed_forward_length) wide, scaled by
        /// sigmoid(x · ffn_gate_inp_shexp) (Qwen2-MoE).
        case gatedLength
    }

    var width = ExpertWidth.expertLength
    /// llama_expert_gating_func_type: 1 softmax, 2 sigmoid, 3 softmax over the k selected
    /// logits; `gatingKey`: whether `<arch>.expert_gating_func` may replace it.
    var gating = 1
    var gatingKey = false
    /// Whether the k weights are divided by their sum, and whether `expert_weights_norm` says.
    var normalize = false
    var normalizeKey = false
    /// Whether `expert_weights_scale` scales the weights (0 and absent: not scaled).
    var scaleKey = false
    /// Whether `leading_dense_block_count` layers come first as dense MLPs.
    var leadingDense = false
    var shared = Shared.none
    /// `blk.N.exp_probs_b.bias`, the selection bias: read if present, or required.
    var selectionBias = false
    var selectionBiasRequired = false
    /// gpt-oss: biases on the router and every expert projection, swiglu_oai.
    var gptOSS = false

    static let supported = ["deepseek2", "glm4moe", "gpt-oss", "llama", "olmoe", "qwen2moe", "qwen3moe"]

    static func named(_ arch: String) -> GGUFArchitecture? {
        var a = GGUFArchitecture()
        switch arch {
        case "llama":  // Mixtral and other llama files with experts
            a.width = .feedForward
            a.normalize = true
        case "qwen2moe":
            a.width = .expertLengthOrShare
            a.shared = .gatedLength
        case "qwen3moe":
            a.width = .expertLengthOrShare
            a.normalize = true
        case "olmoe":
            a.width = .feedForward
        case "deepseek2", "glm4moe":
            a.gatingKey = true
            a.normalizeKey = true
            a.scaleKey = true
            a.leadingDense = true
            a.shared = .count
            a.selectionBias = true
            if arch == "glm4moe" {
                a.gating = 2  // sigmoid where the key is absent; DeepSeek-V2's softmax otherwise
                a.selectionBiasRequired = true
            }
        case "gpt-oss":
            a.gating = 3
            a.gptOSS = true
        default:
            return nil
        }
        return a
    }
}

/// The MoE layers of GGUF files: one file, the splits `name-0000k-of-0000n.gguf` of one
/// model, or a folder that holds either. Tensors are borrowed from the files' mappings in
/// their stored ggml type; the metadata of the first file says what the layers are.
final class GGUFCheckpoint {
    let display: String
    let architecture: String
    let numLayers: Int
    let moeLayers: [Int]
    let files: [GGUFFile]
    private let metadata: [String: GGUFValue]
    private let tensors: [String: GGUFTensor]
    private let arch: GGUFArchitecture
    private let denseLead: Int

    /// The GGUF files `path` names, or nil when it is a checkpoint folder without them
    /// (config.json and safetensors: not for this reader).
    static func open(_ path: [UInt8]) throws -> GGUFCheckpoint? {
        guard let (folder, names) = try locate(path) else { return nil }
        return try GGUFCheckpoint(folder: folder, names: names)
    }

    private static func locate(_ path: [UInt8]) throws -> (CheckpointFolder, [String])? {
        let display = String(decoding: path, as: UTF8.self)
        if display.lowercased().hasSuffix(".gguf") && !CheckpointFolder.isFolder(path) {
            var parts = path.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
            let name = String(decoding: parts.removeLast(), as: UTF8.self)
            let parent: [UInt8] = parts.isEmpty ? Array(".".utf8)
                : parts == [[]] ? Array("/".utf8) : Array(parts.joined(separator: [UInt8(ascii: "/")]))
            guard !name.isEmpty, !path.contains(0) else {
                throw MoEError.invalidArgument("\(display) does not name a GGUF file")
            }
            let folder = try CheckpointFolder(path: parent, what: "the folder of \(display)")
            guard folder.contains(name) else {
                throw MoEError.invalidArgument("cannot open \(display): no such file")
            }
            return (folder, splitSet(of: name) ?? [name])
        }
        guard CheckpointFolder.isFolder(path) else { return nil }
        let folder = try CheckpointFolder(path: path)
        if folder.contains("config.json") { return nil }
        let ggufs = try folder.names(withSuffix: ".gguf")
        guard !ggufs.isEmpty else { return nil }
        // One model: a single file, or the splits of one.
        var models: [String: [String]] = [:]
        for name in ggufs { models[splitSet(of: name)?.first ?? name, default: []].append(name) }
        guard models.count == 1, let first = models.keys.first else {
            throw MoEError.invalidArgument(
                "\(folder.display) holds the GGUF files of \(models.count) models ("
                + models.keys.sorted().prefix(8).joined(separator: ", ") + (models.count > 8 ? ", ..." : "")
                + "); pass the path of the one to load")
        }
        return (folder, splitSet(of: first) ?? [first])
    }

    /// The names of every split of the model whose split `name` is
    /// (`<prefix>-<k>-of-<n>.gguf`, k and n five digits with 1 <= k <= n, as llama.cpp's
    /// gguf-split writes them; the extension in any letter case, kept), or nil for a name
    /// that is not a split's.
    static func splitSet(of name: String) -> [String]? {
        let chars = Array(name.utf8)
        let tail = 20  // "-00001-of-00003.gguf"
        guard chars.count > tail else { return nil }
        let t = Array(chars[(chars.count - tail)...])
        let digits = { (r: Range<Int>) in t[r].allSatisfy { (48...57).contains($0) } }
        let number = { (r: Range<Int>) in Int(String(decoding: t[r], as: UTF8.self)) }
        let extensionText = String(decoding: t[15...], as: UTF8.self)
        guard t[0] == UInt8(ascii: "-"), digits(1..<6), t[6...9].elementsEqual("-of-".utf8), digits(10..<15),
              extensionText.lowercased() == ".gguf", let k = number(1..<6), let n = number(10..<15), 1 <= k, k <= n
        else { return nil }
        let prefix = String(decoding: chars[..<(chars.count - tail)], as: UTF8.self)
        func pad(_ i: Int) -> String { String(repeating: "0", count: 5 - String(i).count) + String(i) }
        return (1...n).map { "\(prefix)-\(pad($0))-of-\(pad(n))\(extensionText)" }
    }

    private init(folder: CheckpointFolder, names: [String]) throws {
        for name in names where !folder.contains(name) {
            throw MoEError.invalidArgument("\(name) is missing from \(folder.display): the model is split into "
                                           + "\(names.count) files (\(names.first!) ... \(names.last!))")
        }
        files = try names.map { try GGUFFile($0, in: folder) }
        display = names.count == 1 ? files[0].path : "\(folder.display)/\(names[0]) (and \(names.count - 1) more splits)"
        metadata = files[0].metadata
        if names.count > 1 {
            for (i, file) in files.enumerated() {
                if let no = file.metadata["split.no"]?.integer, no != i {
                    throw MoEError.invalidArgument("\(file.path): split.no is \(no), its name makes it split \(i)")
                }
                if let count = file.metadata["split.count"]?.integer, count != names.count {
                    throw MoEError.invalidArgument("\(file.path): split.count is \(count), the names say \(names.count)")
                }
            }
        }
        var tensors: [String: GGUFTensor] = [:]
        for file in files {
            for t in file.tensors {
                if let other = tensors.updateValue(t, forKey: t.name) {
                    throw MoEError.invalidArgument("tensor \(CheckpointFolder.quoted(t.name)) is in both \(other.file) and \(t.file)")
                }
            }
        }
        if let total = metadata["split.tensors.count"]?.integer, names.count > 1, total != tensors.count {
            throw MoEError.invalidArgument("\(files[0].path): split.tensors.count is \(total), the splits hold \(tensors.count) tensors")
        }
        self.tensors = tensors

        guard let name = metadata["general.architecture"]?.string else {
            throw MoEError.invalidArgument("\(files[0].path) has no general.architecture string")
        }
        architecture = name
        guard let arch = GGUFArchitecture.named(name) else {
            throw MoEError.invalidArgument("\(files[0].path): architecture \(CheckpointFolder.quoted(name)) is not supported; "
                                           + "supported: \(GGUFArchitecture.supported.joined(separator: ", "))")
        }
        self.arch = arch
        let blocks = try Self.int(metadata, files[0].path, "\(name).block_count", in: 1...Int(Int32.max))
        let nextn = try Self.int(metadata, files[0].path, "\(name).nextn_predict_layers", default: 0, in: 0...(blocks - 1))
        // llama.cpp loads the next-token-prediction layers but does not run them.
        numLayers = blocks - nextn
        denseLead = arch.leadingDense
            ? try Self.int(metadata, files[0].path, "\(name).leading_dense_block_count", default: 0, in: 0...Int(Int32.max)) : 0
        let experts = try Self.int(metadata, files[0].path, "\(name).expert_count", default: 0, in: 0...Int(Int32.max))
        if name == "llama" && experts == 0 {
            throw MoEError.invalidArgument("\(files[0].path) is a llama model without experts (llama.expert_count is "
                                           + "absent or 0): a dense model has no MoE layer")
        }
        let routers = Set(tensors.keys.compactMap { key -> Int? in
            guard key.hasPrefix("blk."), key.hasSuffix(".ffn_gate_inp.weight") else { return nil }
            return Int(key.dropFirst(4).dropLast(".ffn_gate_inp.weight".count))
        })
        // From the routers the file holds, not from 0..<numLayers: block_count is the file's
        // word (up to 2^31), and a loop over it would be the hostile file's to size.
        moeLayers = routers.filter { [denseLead, numLayers] in $0 >= denseLead && $0 < numLayers }.sorted()
    }

    // MARK: Metadata

    private var path: String { files[0].path }

    private static func int(_ metadata: [String: GGUFValue], _ path: String, _ key: String, default value: Int? = nil,
                            in range: ClosedRange<Int>) throws -> Int {
        guard let v = metadata[key] else {
            guard let value else { throw MoEError.invalidArgument("\(path) has no \(key)") }
            return value
        }
        guard let n = v.integer else {
            if v.type == .uint64 {  // an integer, above Int.max
                throw MoEError.invalidArgument("\(path): \(key) must be in \(range.lowerBound)...\(range.upperBound), "
                                               + "got \(v.description)")
            }
            throw MoEError.invalidArgument("\(path): \(key) must be an integer, got \(v.type.name) \(v.description)")
        }
        guard range.contains(n) else {
            throw MoEError.invalidArgument("\(path): \(key) must be in \(range.lowerBound)...\(range.upperBound), got \(n)")
        }
        return n
    }

    private func int(_ key: String, default value: Int? = nil, in range: ClosedRange<Int> = 1...Int(Int32.max)) throws -> Int {
        try Self.int(metadata, path, "\(architecture).\(key)", default: value, in: range)
    }

    /// A key that is one integer or an array of one per layer (llama.cpp's get_key_or_arr).
    private func perLayer(_ key: String, layer: Int) throws -> Int? {
        let full = "\(architecture).\(key)"
        guard let v = metadata[full] else { return nil }
        if v.type != .array { return try int(key) }
        guard let values = v.integers, values.count > layer else {
            throw MoEError.invalidArgument("\(path): \(full) must be an integer or an array of integers with one per layer, got "
                                           + v.description)
        }
        guard values[layer] >= 1 && values[layer] <= Int(Int32.max) else {
            throw MoEError.invalidArgument("\(path): \(full)[\(layer)] must be in 1...\(Int32.max), got \(values[layer])")
        }
        return values[layer]
    }

    private func number(_ key: String) throws -> Double? {
        let full = "\(architecture).\(key)"
        guard let v = metadata[full] else { return nil }
        guard let x = v.number, x.isFinite else {
            throw MoEError.invalidArgument("\(path): \(full) must be a finite number, got \(v.type.name) \(v.description)")
        }
        return x
    }

    private func flag(_ key: String) throws -> Bool? {
        let full = "\(architecture).\(key)"
        guard let v = metadata[full] else { return nil }
        guard let b = v.bool else { throw MoEError.invalidArgument("\(path): \(full) must be a bool, got \(v.type.name)") }
        return b
    }

    /// The vocabulary size, for llama.cpp's one guess by it (GLM-4.7 Lite's gating).
    private var vocabularySize: Int? {
        metadata["\(architecture).vocab_size"]?.integer ?? metadata["tokenizer.ggml.tokens"].map(\.count)
    }

    // MARK: Layers

    /// The configuration of MoE layer `layer`, or an error saying why it is not one.
    func configuration(layer: Int) throws -> MoEConfiguration {
        guard layer >= 0 && layer < numLayers else {
            throw MoEError.invalidArgument("layer \(layer) is out of range: \(display) has \(numLayers) layers "
                                           + "(\(architecture).block_count)")
        }
        if layer < denseLead {
            throw MoEError.invalidArgument("layer \(layer) of this \(architecture) model is a dense MLP layer, not MoE: it is "
                                           + "below \(architecture).leading_dense_block_count = \(denseLead); its MoE layers "
                                           + "are \(moeLayers)")
        }
        guard moeLayers.contains(layer) else {
            throw MoEError.invalidArgument("layer \(layer): no tensor blk.\(layer).ffn_gate_inp.weight in \(display); "
                                           + "the MoE layers in the files are \(moeLayers)")
        }
        let experts = try int("expert_count")
        let used = try int("expert_used_count")
        let width: Int
        switch arch.width {
        case .expertLength:
            guard let w = try perLayer("expert_feed_forward_length", layer: layer) else {
                throw MoEError.invalidArgument("\(path) has no \(architecture).expert_feed_forward_length")
            }
            width = w
        case .expertLengthOrShare:
            if let w = try perLayer("expert_feed_forward_length", layer: layer) {
                width = w
            } else {
                guard let ff = try perLayer("feed_forward_length", layer: layer) else {
                    throw MoEError.invalidArgument("\(path) has neither \(architecture).expert_feed_forward_length "
                                                   + "nor \(architecture).feed_forward_length")
                }
                width = ff / used
            }
        case .feedForward:
            guard let ff = try perLayer("feed_forward_length", layer: layer) else {
                throw MoEError.invalidArgument("\(path) has no \(architecture).feed_forward_length")
            }
            width = ff
        }
        var c = MoEConfiguration(hiddenSize: try int("embedding_length"), intermediateSize: width,
                                 numExperts: experts, topK: used)
        var gating = arch.gating
        if arch.gatingKey {
            gating = try int("expert_gating_func", default: 0, in: 0...Int(Int32.max))
            if gating == 0 {
                // llama.cpp's default for files without the key: DeepSeek V2's softmax,
                // except GLM-4.7 Lite, which it knows by its layer count and vocabulary.
                let glmLite = architecture == "deepseek2" && [47, 48].contains(numLayers) && vocabularySize == 154880
                gating = glmLite ? 2 : arch.gating
            }
        }
        c.normTopKProb = arch.normalizeKey ? try flag("expert_weights_norm") ?? arch.normalize : arch.normalize
        switch gating {
        case 1: c.scoring = .softmax
        case 2: c.scoring = .sigmoid
        case 3:
            // Softmax over the k selected logits is the softmax over all, renormalised.
            c.scoring = .softmax
            c.normTopKProb = true
        default:
            throw MoEError.invalidArgument("\(path): \(architecture).expert_gating_func \(gating) is not one this layer "
                                           + "computes (1 softmax, 2 sigmoid, 3 softmax of the selected weights)")
        }
        if arch.scaleKey, let scale = try number("expert_weights_scale"), scale != 0 {
            c.routedScalingFactor = Float(scale)
        }
        let groups = try int("expert_group_count", default: 1, in: 0...Int(Int32.max))
        if groups > 1 {
            c.nGroup = groups
            c.topKGroup = try int("expert_group_used_count", in: 1...groups)
        }
        switch arch.shared {
        case .none: break
        case .count:
            let count = try int("expert_shared_count", in: 0...Int(Int32.max))
            let (w, overflow) = count.multipliedReportingOverflow(by: width)
            guard !overflow && w <= Int(Int32.max) else {
                throw MoEError.invalidArgument("\(path): \(architecture).expert_shared_count (\(count)) times the experts' "
                                               + "width (\(width)) is too large")
            }
            c.sharedIntermediateSize = w
        case .gatedLength:
            guard let w = try perLayer("expert_shared_feed_forward_length", layer: layer)
                    ?? (try perLayer("feed_forward_length", layer: layer)) else {
                throw MoEError.invalidArgument("\(path) has neither \(architecture).expert_shared_feed_forward_length "
                                               + "nor \(architecture).feed_forward_length")
            }
            c.sharedIntermediateSize = w
        }
        if arch.gptOSS { c.activation = .swigluOAI }
        do {
            try c.validate()
        } catch MoEError.invalidArgument(let why) {
            throw MoEError.invalidArgument("\(path): \(why)")
        }
        return c
    }

    func tensor(_ name: String) -> GGUFTensor? { tensors[name] }

    var architectureInfo: GGUFArchitecture { arch }
}
