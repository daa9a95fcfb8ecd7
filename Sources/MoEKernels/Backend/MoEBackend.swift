/// A device that runs MoE layers. A backend is created once per layer with the layer's
/// weights (copied into its own layout and memory, or read in place from a mapping where its
/// kernels read the stored layout) and then runs any number of forwards, from several
/// threads at once.
protocol MoEBackend: AnyObject, Sendable {
    var kind: MoEBackendKind { get }

    /// Starts one forward (or routing) pass over `tokens` rows of `input` (tokens, H).
    /// `input` must stay valid until the pass finishes. With `inputNorm`, every stage reads
    /// the normalised rows (made by `route`), never `input` itself.
    func makePass(input: UnsafePointer<Float>, tokens: Int, inputNorm: RMSNorm?) throws -> any MoEPass

    /// Starts a stack of layers in one call (run_layers) on `tokens` rows of `input`, whose
    /// result goes to `output` at `finish()` (the two may alias). Every layer added must run
    /// on this backend's kind. Default: a host loop of passes (HostStackSession).
    func makeStackSession(input: UnsafePointer<Float>, tokens: Int, hiddenSize: Int,
                          output: UnsafeMutablePointer<Float>) throws -> any MoEStackSession
}

extension MoEBackend {
    func makeStackSession(input: UnsafePointer<Float>, tokens: Int, hiddenSize: Int,
                          output: UnsafeMutablePointer<Float>) throws -> any MoEStackSession {
        HostStackSession(input: input, tokens: tokens, hiddenSize: hiddenSize, output: output)
    }
}

/// Layers run one after another in one call, `x ← x + layer_i(norm_i(x))`: a backend may
/// run each pass as it comes (the host loop) or record them all and run them at `finish`
/// (Metal: one command buffer, x kept on the device).
protocol MoEStackSession: AnyObject {
    /// The next layer's pass (its stages still to be run) and where it reads x (its input
    /// and residual) and writes the next x.
    func nextPass(_ backend: any MoEBackend, inputNorm: RMSNorm?) throws
        -> (pass: any MoEPass, x: UnsafePointer<Float>, next: UnsafeMutablePointer<Float>)
    /// Completes every pass and writes the last x to the output.
    func finish() throws
}

/// One pass through the layer, as the stages of the spec. A backend may run each stage
/// as it is called (CPU) or record it and run everything at `finish()` (Metal: one command
/// buffer). The order is fixed: `route` (or `setRouting`), then for a forward `groupPairsByExpert`,
/// `gateUp`, `down`, `combine`, and always `finish` last.
protocol MoEPass: AnyObject {
    /// The input norm (if any), router logits, scores, top-k ids and weights, and the shared
    /// expert's gate factor.
    func route()
    /// Instead of `route()`: the given routing, (tokens, k) valid expert ids and their
    /// weights; the pass then computes the routed experts only (no shared expert).
    func setRouting(ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>) throws
    /// Buckets the (token, slot) pairs by expert, once for both expert matmuls.
    func groupPairsByExpert()
    /// Gate and up projections of every selected expert (and the shared expert) with the
    /// activation applied.
    func gateUp()
    /// Down projections, each pair's result multiplied by its routing weight.
    func down()
    /// `output[t] = sum_j pair(t, j) + factor(t) * shared(t) + residual[t]`, in that order,
    /// then `next.output[t] = next.norm(output[t])`. `residual` may alias `output` or the
    /// pass's input.
    func combine(residual: UnsafePointer<Float>?, output: UnsafeMutablePointer<Float>, next: NextNorm?)
    /// Copies the routing decision out (tokens, k) each.
    func readRouting(ids: UnsafeMutablePointer<Int32>, weights: UnsafeMutablePointer<Float>)
    /// Completes all recorded work; results are valid after it returns.
    func finish() throws
}

extension MoEPass {
    /// The stages of one layer in the spec's order — the one place this sequence is
    /// written: routing (the router's, or `given` ids and weights for the experts-only
    /// call), the routed experts grouped by expert, then the combine. `finish()` is the
    /// caller's (a stack session runs several layers before it).
    func runLayer(given: (ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>)? = nil,
                  residual: UnsafePointer<Float>?, output: UnsafeMutablePointer<Float>, next: NextNorm?) throws {
        if let given { try setRouting(ids: given.ids, weights: given.weights) } else { route() }
        groupPairsByExpert()
        gateUp()
        down()
        combine(residual: residual, output: output, next: next)
    }

    func setRouting(ids: UnsafePointer<Int32>, weights: UnsafePointer<Float>) throws {
        throw MoEError.unavailable("the experts-only call (given routing) is not implemented on this backend yet")
    }
}
