#if os(Linux)
/// FNV-1a with a 128-bit state (offset basis 0x6c62272e07bb014262b821756295c58d, prime
/// 2^88 + 0x13b): the compile-cache key. Not cryptographic; collisions of distinct
/// kernels are not a concern at the sizes of a cache directory.
struct Hash128 {
    private(set) var high: UInt64 = 0x6c62_272e_07bb_0142
    private(set) var low: UInt64 = 0x62b8_2175_6295_c58d

    mutating func update<S: Sequence>(_ bytes: S) where S.Element == UInt8 {
        for byte in bytes {
            low ^= UInt64(byte)
            // (high, low) *= 2^88 + 0x13b, modulo 2^128.
            let (carry, newLow) = low.multipliedFullWidth(by: 0x13b)
            let newHigh = high &* 0x13b &+ carry &+ (low << 24)
            high = newHigh
            low = newLow
        }
    }

    mutating func update(_ string: String) {
        update(string.utf8)
        update([0])  // a separator, so that ("ab", "c") and ("a", "bc") differ
    }

    var hex: String {
        func hex64(_ v: UInt64) -> String {
            let s = String(v, radix: 16)
            return String(repeating: "0", count: 16 - s.count) + s
        }
        return hex64(high) + hex64(low)
    }

    static func of(_ parts: [String]) -> String {
        var h = Hash128()
        for part in parts { h.update(part) }
        return h.hex
    }
}
#endif
