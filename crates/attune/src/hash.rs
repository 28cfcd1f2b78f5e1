//! Content hashes of chunks (dirty detection for tiers that keep a copy).

/// xxh3 of a runtime-readable chunk; 0 is reserved for "unknown".
pub fn chunk_hash(addr: usize, len: usize) -> u64 {
    // SAFETY: callers pass runtime-owned buffers (bounce or staging) holding `len` bytes;
    // a hole in staging faults into the internal resolver, which maps a zero page.
    let data = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    xxhash_rust::xxh3::xxh3_64(data) | 1
}
