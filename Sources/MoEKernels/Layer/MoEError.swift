/// Why a layer could not be created or run. Each case maps to one `moe_status` of the C ABI.
public enum MoEError: Error, Equatable, CustomStringConvertible {
    /// A size, option, array or handle is wrong; the message names it.
    case invalidArgument(String)
    /// The requested backend cannot run in this process.
    case unavailable(String)
    /// Memory for weights or scratch could not be allocated.
    case outOfMemory(String)
    /// A bug in this library.
    case internalError(String)

    public var description: String {
        switch self {
        case .invalidArgument(let m), .unavailable(let m), .outOfMemory(let m), .internalError(let m):
            return m
        }
    }
}
