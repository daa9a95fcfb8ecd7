#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CMoESwift

/// Memory that weights are read from in place instead of being copied: a file mapped by the
/// checkpoint loader, or the caller's own memory. Whoever holds this object keeps the
/// memory alive (a layer made from `WeightData.mapped` holds it for as long as it lives);
/// the memory is released when the last holder lets go.
///
/// Its start and length are whole pages of `pageSize` bytes: that is Metal's rule for
/// `makeBuffer(bytesNoCopy:length:options:deallocator:)` on Apple silicon, whose pages are
/// 16 KiB (SoftMetal enforces the same), and it lets the Metal backends wrap the region
/// once and bind each tensor at its offset.
public final class WeightMemory: @unchecked Sendable {
    /// Apple silicon's page: the alignment bytesNoCopy buffers need there.
    public static let pageSize = Int(MOE_MAPPED_ALIGNMENT)

    public let base: UnsafeRawPointer
    /// Bytes, a multiple of `pageSize`.
    public let length: Int
    private let release: () -> Void
    /// A mapped file: a descriptor of our own for it, the bytes mapped and its name. A read
    /// of a mapped page past the file's end raises SIGBUS, so each call checks first that
    /// the file still holds them (`checkFile`).
    private let file: (fd: Int32, size: Int, what: String)?

    /// Borrows `length` bytes at `base`, both multiples of `pageSize`; `release` runs once
    /// nothing holds this object any more (a layer made from it included).
    public init(base: UnsafeRawPointer, length: Int, release: @escaping @Sendable () -> Void = {}) throws {
        guard Int(bitPattern: base) % Self.pageSize == 0, length > 0, length % Self.pageSize == 0 else {
            throw MoEError.invalidArgument(
                "weight memory to read in place must start on a \(Self.pageSize)-byte page boundary and span whole "
                + "pages (Metal's rule for buffers made without a copy); got \(length) bytes at \(base)")
        }
        self.base = base
        self.length = length
        self.release = release
        file = nil
    }

    /// Where a file's mapping starts, on Linux: a transparent huge page's boundary (the
    /// one AlignedBuffer's copies use), so that file offset 0 and every 2 MiB after it fall
    /// on huge-page boundaries. The kernel maps the page cache's 2 MiB folios (which
    /// readahead makes for a mapping advised MADV_HUGEPAGE, on filesystems with large folios:
    /// XFS, and ext4 since Linux 6.16) only at such addresses: one TLB entry and one fault
    /// per 2 MiB instead of 512. A decode step streams its experts' weights from many places
    /// at once, and 4 KiB pages' TLB misses and faults cost those reads a measurable part of
    /// their bandwidth (benchmarks/bench_gguf_file.py runs on a mapped file).
    static var fileMappingAlignment: Int {
        #if os(Linux)
        return AlignedBuffer<UInt8>.hugePageSize
        #else
        return pageSize
        #endif
    }

    /// The file `fd` (of `size` bytes) mapped read-only at a `fileMappingAlignment` boundary,
    /// its length rounded up to whole `pageSize` pages and followed by at least one
    /// inaccessible page, so that a read past the mapping faults instead of reading whatever
    /// memory comes next.
    init(file fd: Int32, size: Int, what: String) throws {
        let page = Self.pageSize, align = Self.fileMappingAlignment
        let length = Swift.max(1, (size + page - 1) / page) * page
        // Reserved first (no access, no memory), so that the file can be placed at an
        // aligned address inside; what is left of the reservation stays inaccessible.
        let span = length + align + page
        guard let reserved = mmap(nil, span, PROT_NONE, MAP_PRIVATE | MAP_ANON, -1, 0), reserved != MAP_FAILED else {
            throw MoEError.outOfMemory("cannot reserve \(span) bytes of address space to map \(what): \(String(cString: strerror(errno)))")
        }
        let aligned = UnsafeMutableRawPointer(bitPattern: (Int(bitPattern: reserved) + align - 1) / align * align)!
        // MAP_PRIVATE + PROT_READ: the pages are the page cache's, shared with other readers.
        guard size == 0 || mmap(aligned, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == aligned else {
            let why = String(cString: strerror(errno))
            munmap(reserved, span)
            throw MoEError.outOfMemory("cannot map \(what) (\(size) bytes): \(why)")
        }
        #if os(Linux)
        // Advice only: a kernel or filesystem without huge page cache folios maps 4 KiB pages.
        if size > 0 { _ = madvise(aligned, size, MADV_HUGEPAGE) }
        #endif
        base = UnsafeRawPointer(aligned)
        self.length = length
        // The caller closes `fd`; a duplicate stays open for the size checks (none when the
        // process has no descriptor left: then no check, as before).
        let own = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        file = own >= 0 ? (own, size, what) : nil
        release = {
            munmap(reserved, span)
            if own >= 0 { close(own) }
        }
    }

    deinit { release() }

    /// Throws if this memory maps a file that no longer holds the bytes mapped (truncated
    /// since): reading them would raise SIGBUS and end the process. One fstat; a file
    /// truncated between this check and the reads still faults, as with any mapping.
    func checkFile() throws {
        guard let file else { return }
        var info = stat()
        guard fstat(file.fd, &info) == 0 else { return }
        if Int(info.st_size) < file.size {
            throw MoEError.invalidArgument(
                "\(file.what) was truncated to \(info.st_size) bytes after it was mapped (\(file.size) bytes): the layer's "
                + "weights in it are gone, and reading them would crash the process. Close the layer and load the file "
                + "again")
        }
    }

    /// Whether `bytes` lie inside this memory.
    func contains(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let start = bytes.baseAddress else { return bytes.isEmpty }
        return start >= base && start + bytes.count <= base + length
    }

    /// The byte offset of `pointer` from `base`.
    func offset(of pointer: UnsafeRawPointer) -> Int { pointer - base }
}
