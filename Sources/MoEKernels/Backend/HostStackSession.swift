/// run_layers as a host loop: each layer's pass runs to completion before the next starts,
/// x alternating between two host buffers (so that the call's input and output may alias).
final class HostStackSession: MoEStackSession {
    private var x: UnsafeMutablePointer<Float>
    private var next: UnsafeMutablePointer<Float>
    private let tokens: Int, count: Int
    private let output: UnsafeMutablePointer<Float>
    private var running: (any MoEPass)?

    init(input: UnsafePointer<Float>, tokens: Int, hiddenSize: Int, output: UnsafeMutablePointer<Float>) {
        self.tokens = tokens
        count = tokens * hiddenSize
        x = .allocate(capacity: count)
        x.initialize(from: input, count: count)
        next = .allocate(capacity: count)
        next.initialize(repeating: 0, count: count)
        self.output = output
    }

    deinit {
        x.deallocate()
        next.deallocate()
    }

    func nextPass(_ backend: any MoEBackend, inputNorm: RMSNorm?) throws
        -> (pass: any MoEPass, x: UnsafePointer<Float>, next: UnsafeMutablePointer<Float>) {
        try completeRunning()
        let pass = try backend.makePass(input: x, tokens: tokens, inputNorm: inputNorm)
        running = pass
        return (pass, UnsafePointer(x), next)
    }

    func finish() throws {
        try completeRunning()
        output.update(from: x, count: count)
    }

    private func completeRunning() throws {
        guard let pass = running else { return }
        running = nil
        try pass.finish()
        swap(&x, &next)
    }
}
