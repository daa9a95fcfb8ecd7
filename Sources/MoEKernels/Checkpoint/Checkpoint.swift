/// A Hugging Face / mlx-lm checkpoint folder (`config.json` and `*.safetensors`, sharded
/// through `model.safetensors.index.json` or one `model.safetensors`), its files
/// memory-mapped while this object lives. `MoELayer(checkpoint:layer:backend:)` builds a
/// layer from it: tensors are borrowed from the mapping in their stored format (copied
/// only where the layout needs it: per-expert tensors stacked, gpt-oss's interleaved
/// gate/up rows split, each into a temporary in its own format that is freed right after
/// the layer has taken its copy).
public final class Checkpoint {
    public let path: String
    public let modelType: String
    /// `num_hidden_layers` of config.json.
    public let numLayers: Int
    /// The indices of the layers that have an MoE block, ascending.
    public let moeLayers: [Int]

    let config: ConfigReader
    let family: ModelFamily
    let configuration: MoEConfiguration
    private let files: [SafeTensorsFile]
    private let fileOfTensor: [String: Int]

    public init(path: String) throws {
        self.path = path
        let configPath = path + "/config.json"
        let configBytes = try readFile(configPath)
        let raw = try configBytes.withUnsafeBytes { try JSON.parse($0, what: configPath) }
        config = ConfigReader(raw: raw, path: configPath)
        guard let modelType = raw["model_type"]?.string else {
            throw MoEError.invalidArgument("\(configPath) has no \"model_type\"")
        }
        self.modelType = modelType
        family = try ModelFamily.named(modelType)
        configuration = try family.configure(config)
        numLayers = try config.int("num_hidden_layers")
        moeLayers = (0..<numLayers).filter { [family, config] in family.denseReason(config, $0) == nil }

        var names: [String]
        let indexPath = path + "/model.safetensors.index.json"
        if fileExists(indexPath) {
            let index = try readFile(indexPath).withUnsafeBytes { try JSON.parse($0, what: indexPath) }
            guard let map = index["weight_map"]?.object else {
                throw MoEError.invalidArgument("\(indexPath) has no \"weight_map\" object")
            }
            names = Array(Set(map.values.compactMap(\.string))).sorted()
        } else if fileExists(path + "/model.safetensors") {
            names = ["model.safetensors"]
        } else {
            throw MoEError.invalidArgument(
                "\(path) has neither model.safetensors.index.json nor model.safetensors")
        }
        files = try names.map { try SafeTensorsFile(path: path + "/" + $0) }
        // The headers, not the index, say where each tensor is.
        var fileOfTensor: [String: Int] = [:]
        for (i, file) in files.enumerated() {
            for name in file.tensors.keys { fileOfTensor[name] = i }
        }
        self.fileOfTensor = fileOfTensor
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
        if let why = family.denseReason(config, layer) {
            throw MoEError.invalidArgument("layer \(layer) of this \(modelType) checkpoint is a dense MLP layer, not MoE: "
                                           + "\(why); its MoE layers are \(moeLayers)")
        }
        var c = configuration
        try Self.apply(overrides, to: &c)
        return c
    }

    /// The options a caller may override after config.json, by their Python names.
    public static let overridableOptions = ["top_k", "norm_topk_prob", "routed_scaling_factor", "scoring",
                                            "n_group", "topk_group", "activation", "swiglu_alpha", "swiglu_limit"]

    /// Sets options by name (numbers; booleans 0/1; scoring and activation as their enum codes).
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
            case "scoring":
                guard let s = MoEScoring(rawValue: Int32(clamping: try integer())) else {
                    throw MoEError.invalidArgument("override scoring \(value) is not a moe_scoring value")
                }
                c.scoring = s
            case "activation":
                guard let a = MoEActivation(rawValue: Int32(clamping: try integer())) else {
                    throw MoEError.invalidArgument("override activation \(value) is not a moe_activation value")
                }
                c.activation = a
            default:
                throw MoEError.invalidArgument(
                    "unknown override \"\(name)\"; overridable: \(overridableOptions.joined(separator: ", "))")
            }
        }
    }
}

extension MoELayer {
    /// Layer `layer` of the checkpoint folder at `path` (see `Checkpoint`). The files are
    /// mapped only during this call.
    public convenience init(checkpoint path: String, layer: Int, backend: MoEBackendKind = .auto) throws {
        try self.init(checkpoint: try Checkpoint(path: path), layer: layer, backend: backend)
    }

    /// Layer `layer` of an open checkpoint; `overrides` replace options of config.json
    /// (`Checkpoint.overridableOptions`).
    public convenience init(checkpoint: Checkpoint, layer: Int, backend: MoEBackendKind = .auto,
                            overrides: [String: Double] = [:]) throws {
        let configuration = try checkpoint.configuration(layer: layer, overrides: overrides)
        let reader = LayerReader(checkpoint, layer: layer, configuration: configuration)
        let weights = try reader.weights()
        try self.init(configuration: configuration, weights: weights, backend: backend)
        withExtendedLifetime(reader) {}  // its temporaries until the backend has copied them
    }
}
