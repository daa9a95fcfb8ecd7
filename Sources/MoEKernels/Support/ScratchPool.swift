/// Reusable scratch memory: a forward checks an arena out, carves its arrays from it and
/// gives it back, so steady-state calls allocate nothing. Concurrent calls get distinct
/// arenas.
final class ScratchPool: @unchecked Sendable {
    private let lock = Lock()
    private var free: [ScratchArena] = []

    func checkOut(bytes: Int) throws -> ScratchArena {
        let reusable = lock.withLock { () -> ScratchArena? in
            if let index = free.firstIndex(where: { $0.capacity >= bytes }) { return free.remove(at: index) }
            return free.popLast()  // too small: dropped and replaced below
        }
        if let arena = reusable, arena.capacity >= bytes { return arena }
        return try ScratchArena(capacity: bytes)
    }

    func checkIn(_ arena: ScratchArena) {
        lock.withLock { free.append(arena) }
    }
}

/// One block of scratch memory, handed out in 64-byte aligned pieces.
final class ScratchArena {
    let capacity: Int
    private let storage: AlignedBuffer<UInt8>
    private var used = 0

    init(capacity: Int) throws {
        self.capacity = capacity
        storage = try AlignedBuffer(count: capacity, what: "\(capacity) bytes of scratch memory")
    }

    /// Bytes that `counts` arrays of the given strides take, with padding.
    static func bytes(for arrays: [(count: Int, stride: Int)]) -> Int {
        arrays.reduce(0) { $0 + align($1.count * $1.stride) }
    }

    func reset() { used = 0 }

    func take<T>(_ type: T.Type, _ count: Int) -> UnsafeMutablePointer<T> {
        let size = Self.align(count * MemoryLayout<T>.stride)
        precondition(used + size <= capacity, "scratch arena overrun")
        let pointer = UnsafeMutableRawPointer(storage.pointer + used).bindMemory(to: T.self, capacity: count)
        used += size
        return pointer
    }

    private static func align(_ bytes: Int) -> Int { (bytes + 63) & ~63 }
}
