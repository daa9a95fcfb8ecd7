/// A checkpoint to build MoE layers from: a Hugging Face / mlx-lm folder (config.json and
/// safetensors files) or llama.cpp's GGUF files (one `.gguf`, the splits
/// `-0000k-of-0000n.gguf` of one model, or a folder that holds them), its files
/// memory-mapped while this object (or a layer that reads them in place) lives.
/// `MoELayer(checkpoint:layer:backend:)` builds a layer from it: tensors are handed over
/// mapped, in their stored format, and the layer reads them in place where its backend's
/// kernels read that layout (Metal: every format; CPU: all but 4-bit codes, which it
/// repacks); restacked tensors (per-expert tensors stacked, gpt-oss's interleaved gate/up
/// rows split) go through a temporary in their own format, copied by the layer and freed
/// right after.
public final class Checkpoint {
    /// The folder or file as given (GGUF splits: the first, and how many more).
    public let path: String
    /// config.json's `model_type`, or GGUF's `general.architecture` (llama.cpp's name).
    public let modelType: String
    /// The decoder layers: `num_hidden_layers`, or GGUF's `block_count` less the
    /// next-token-prediction layers llama.cpp does not run.
    public let numLayers: Int
    /// The indices of the layers that have an MoE block, ascending (those with tensors in
    /// the files that the configuration makes MoE layers).
    public let moeLayers: [Int]

    enum Source {
        case folder(SafeTensorsCheckpoint)
        case gguf(GGUFCheckpoint)
    }
    let source: Source

    public convenience init(path: String) throws {
        try self.init(pathBytes: Array(path.utf8))
    }

    /// The checkpoint named by `pathBytes` (a file-system path in any encoding).
    init(pathBytes: [UInt8]) throws {
        if let gguf = try GGUFCheckpoint.open(pathBytes) {
            source = .gguf(gguf)
            (path, modelType, numLayers, moeLayers) = (gguf.display, gguf.architecture, gguf.numLayers, gguf.moeLayers)
        } else {
            let folder = try SafeTensorsCheckpoint(pathBytes: pathBytes)
            source = .folder(folder)
            (path, modelType, numLayers, moeLayers) = (folder.path, folder.modelType, folder.numLayers, folder.moeLayers)
        }
    }

    /// The configuration of MoE layer `layer` with `overrides` applied, or an error saying
    /// why it is not an MoE layer.
    func configuration(layer: Int, overrides: [String: Double]) throws -> MoEConfiguration {
        switch source {
        case .folder(let folder): return try folder.configuration(layer: layer, overrides: overrides)
        case .gguf(let gguf):
            var c = try gguf.configuration(layer: layer)
            try Self.apply(overrides, to: &c)
            try c.validate()
            return c
        }
    }

    /// The weights of layer `layer`, and the reader that owns their temporaries (joined
    /// biases) until the layer has copied them. Per-expert tensors come as
    /// `WeightData.experts`, each read where it lies.
    func weights(layer: Int, configuration: MoEConfiguration, map: Bool) throws -> (weights: MoEWeights, reader: AnyObject) {
        switch source {
        case .folder(let folder):
            let reader = LayerReader(folder, layer: layer, configuration: configuration, map: map)
            return (try reader.weights(), reader)
        case .gguf(let gguf):
            let reader = GGUFLayerReader(gguf, layer: layer, configuration: configuration, map: map)
            return (try reader.weights(), reader)
        }
    }

    /// The options a caller may override after config.json, by their Python names.
    public static let overridableOptions = ["top_k", "norm_topk_prob", "routed_scaling_factor", "scoring",
                                            "n_group", "topk_group", "activation", "swiglu_alpha", "swiglu_limit",
                                            "activation_quantization"]

    /// Sets options by name (numbers; booleans 0/1; scoring, activation and
    /// activation_quantization as their enum codes).
    static func apply(_ overrides: [String: Double], to c: inout MoEConfiguration) throws {
        for (name, value) in overrides.sorted(by: { $0.key < $1.key }) {
            func integer() throws -> Int {
                guard value.rounded() == value, abs(value) < 1e9 else {
                    throw MoEError.invalidArgument("override \(name) must be an integer, got \(value)")
                }
                return Int(value)
            }
            switch name {
            case "top_k": c.topK = try integer()
            case "norm_topk_prob": c.normTopKProb = value != 0
            case "routed_scaling_factor": c.routedScalingFactor = Float(value)
            case "n_group": c.nGroup = try integer()
            case "topk_group": c.topKGroup = try integer()
            case "swiglu_alpha": c.swigluAlpha = Float(value)
            case "swiglu_limit": c.swigluLimit = Float(value)
            case "scoring": c.scoring = try .decoded(Int32(clamping: try integer()), field: name, prefix: "override ")
            case "activation": c.activation = try .decoded(Int32(clamping: try integer()), field: name, prefix: "override ")
            case "activation_quantization":
                c.activationQuantization = try .decoded(Int32(clamping: try integer()), field: name, prefix: "override ")
            default:
                throw MoEError.invalidArgument(
                    "unknown override \"\(name)\"; overridable: \(overridableOptions.joined(separator: ", "))")
            }
        }
    }
}

/// A Hugging Face / mlx-lm checkpoint folder: config.json and `*.safetensors`, sharded
/// through `model.safetensors.index.json` or one `model.safetensors`.
final class SafeTensorsCheckpoint {
    let path: String
    let modelType: String
    let numLayers: Int
    let moeLayers: [Int]

    let config: ConfigReader
    let family: ModelFamily
    let configuration: MoEConfiguration
    private let denseReason: (Int) -> String?
    private let files: [SafeTensorsFile]
    private let fileOfTensor: [String: Int]

    /// The folder named by `pathBytes` (a file-system path in any encoding).
    init(pathBytes: [UInt8]) throws {
        let folder = try CheckpointFolder(path: pathBytes)
        path = folder.display
        let configPath = path + "/config.json"
        let raw = try folder.readJSON("config.json", limit: CheckpointFolder.configLimit)
        guard raw.object != nil else { throw MoEError.invalidArgument("\(configPath) is not a JSON object") }
        config = ConfigReader(raw: raw, path: configPath)
        guard let modelType = raw["model_type"]?.string else {
            throw MoEError.invalidArgument("\(configPath) has no \"model_type\"")
        }
        self.modelType = modelType
        family = try ModelFamily.named(modelType)
        // Everything config.json says is checked here, before a tensor is looked at.
        configuration = try family.configure(config)
        do {
            try configuration.validate()
        } catch MoEError.invalidArgument(let why) {
            throw MoEError.invalidArgument("\(configPath): \(why)")
        }
        numLayers = try config.int("num_hidden_layers", in: 0...Int(Int32.max))
        denseReason = try family.denseLayers(config)

        var names: [String]
        let indexName = "model.safetensors.index.json"
        if folder.contains(indexName) {
            let index = try folder.readJSON(indexName, limit: CheckpointFolder.indexLimit)
            let indexPath = path + "/" + indexName
            guard let map = index["weight_map"]?.object else {
                throw MoEError.invalidArgument("\(indexPath) has no \"weight_map\" object")
            }
            guard !map.isEmpty else {
                throw MoEError.invalidArgument("\(indexPath): \"weight_map\" is empty: it lists no tensor")
            }
            var shards = Set<String>()
            for (tensor, file) in map {
                guard let file = file.string else {
                    throw MoEError.invalidArgument("\(indexPath): \"weight_map\" gives tensor "
                                                   + "\(CheckpointFolder.quoted(tensor)) a file name that is not a string")
                }
                try folder.checkName(file, what: "\(indexPath) (tensor \(CheckpointFolder.quoted(tensor)))")
                shards.insert(file)
            }
            names = shards.sorted()
        } else if folder.contains("model.safetensors") {
            names = ["model.safetensors"]
        } else {
            throw MoEError.invalidArgument(
                "\(path) has neither model.safetensors.index.json nor model.safetensors (nor GGUF files)")
        }
        files = try names.map { try SafeTensorsFile($0, in: folder) }
        // The headers, not the index, say where each tensor is.
        var fileOfTensor: [String: Int] = [:]
        for (i, file) in files.enumerated() {
            for name in file.tensors.keys { fileOfTensor[name] = i }
        }
        self.fileOfTensor = fileOfTensor
        moeLayers = Self.blockLayers(fileOfTensor.keys, blockNames: family.blockNames)
            .filter { [numLayers, denseReason] in $0 < numLayers && denseReason($0) == nil }
    }

    /// The layers `i` with a tensor `model.layers.{i}.{block}.*` for one of `blockNames`, ascending.
    private static func blockLayers(_ names: Dictionary<String, Int>.Keys, blockNames: [String]) -> [Int] {
        let prefix = "model.layers."
        var layers = Set<Int>()
        for name in names where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            guard let dot = rest.firstIndex(of: "."), let i = Int(rest[..<dot]), i >= 0 else { continue }
            let block = rest[rest.index(after: dot)...]
            if blockNames.contains(where: { block.hasPrefix($0 + ".") }) { layers.insert(i) }
        }
        return layers.sorted()
    }

    func tensor(_ name: String) -> StoredTensor? {
        fileOfTensor[name].flatMap { files[$0].tensors[name] }
    }

    /// "a.safetensors, b.safetensors in /path", for errors about missing tensors.
    var fileSet: String {
        files.map { $0.path.split(separator: "/").last.map(String.init) ?? $0.path }.joined(separator: ", ")
            + " in \(path)"
    }

    func missing(_ names: [String], _ what: String) -> MoEError {
        .invalidArgument("\(what): no tensor " + names.map { "'\($0)'" }.joined(separator: " or ")
                         + " in \(fileSet)")
    }

    /// The configuration of MoE layer `layer` with `overrides` applied, or an error saying
    /// why it is not an MoE layer.
    func configuration(layer: Int, overrides: [String: Double]) throws -> MoEConfiguration {
        guard layer >= 0 && layer < numLayers else {
            throw MoEError.invalidArgument("layer \(layer) is out of range: the checkpoint has \(numLayers) layers (num_hidden_layers)")
        }
        if let why = denseReason(layer) {
            throw MoEError.invalidArgument("layer \(layer) of this \(modelType) checkpoint is a dense MLP layer, not MoE: "
                                           + "\(why); its MoE layers are \(moeLayers)")
        }
        guard moeLayers.contains(layer) else {
            let blocks = family.blockNames.map { "model.layers.\(layer).\($0)" }.joined(separator: " or ")
            throw MoEError.invalidArgument("layer \(layer): no tensor under \(blocks) in \(fileSet); "
                                           + "the MoE layers in the files are \(moeLayers)")
        }
        var c = configuration
        try Checkpoint.apply(overrides, to: &c)
        try c.validate()
        return c
    }
}

extension MoELayer {
    /// Layer `layer` of the checkpoint folder at `path` (see `Checkpoint`). The files stay
    /// mapped after this call only where the layer reads them in place.
    public convenience init(checkpoint path: String, layer: Int, backend: MoEBackendKind = .auto,
                            copyWeights: Bool = false, memoryLimit: Int? = nil) throws {
        try self.init(checkpoint: try Checkpoint(path: path), layer: layer, backend: backend,
                      copyWeights: copyWeights, memoryLimit: memoryLimit)
    }

    /// Layer `layer` of an open checkpoint; `overrides` replace options of config.json
    /// (`Checkpoint.overridableOptions`). `copyWeights` copies every tensor instead of
    /// reading the mapping in place; `memoryLimit` bounds the copies' bytes (see
    /// `init(configuration:weights:backend:memoryLimit:)`). Expert parallelism
    /// (`MoEConfiguration.localExperts`): `localExperts` reads only those experts' tensors
    /// (the router's whole); `sharedExpert: false` leaves the shared expert out (for every
    /// rank of a group but one), and `sharedExpertPart: (index, count)` keeps part `index`
    /// of the shared expert split along its width into `count` (`SharedExpertWeights.part`),
    /// or, where it does not split into whole quantization groups, all of it on part 0 and
    /// none on the others.
    public convenience init(checkpoint: Checkpoint, layer: Int, backend: MoEBackendKind = .auto,
                            overrides: [String: Double] = [:], copyWeights: Bool = false,
                            memoryLimit: Int? = nil, localExperts: ExpertShare? = nil,
                            sharedExpert: Bool = true, sharedExpertPart: (index: Int, count: Int)? = nil) throws {
        var configuration = try checkpoint.configuration(layer: layer, overrides: overrides)
        if let localExperts {
            configuration.localExperts = localExperts
            try configuration.validate()
        }
        if !sharedExpert { configuration.sharedIntermediateSize = 0 }
        var (weights, reader) = try checkpoint.weights(layer: layer, configuration: configuration, map: !copyWeights)
        if let (index, count) = sharedExpertPart, let shared = weights.shared {
            guard count >= 1, index >= 0, index < count else {
                throw MoEError.invalidArgument("shared expert part \(index) of \(count) does not exist")
            }
            if let (part, width) = try shared.part(index, of: count, width: configuration.sharedIntermediateSize) {
                (weights.shared, configuration.sharedIntermediateSize) = (part, width)
            } else if index != 0 {
                (weights.shared, configuration.sharedIntermediateSize) = (nil, 0)
            }
        }
        try self.init(configuration: configuration, weights: weights, backend: backend, memoryLimit: memoryLimit)
        withExtendedLifetime(reader) {}  // its temporaries until the backend has copied them
    }
}
