//! Content hashes of chunks (dirty detection for tiers that keep a copy).

/// xxh3 of a runtime-readable chunk as held by far tier `tier`; 0 is reserved for
/// "unknown". The tier seeds the hash, so that a record made when one tier took or gave
/// the content never says that another tier holds it: with two tiers that keep copies
/// (remote, then file), a chunk whose remote store was refused was skipped as "already
/// in the file", which held an older copy (a checksum failure on the next load, seen in
/// tests/python/test_remote.py's full-server test).
pub fn chunk_hash(addr: usize, len: usize, tier: usize) -> u64 {
    // Callers pass runtime-owned buffers (bounce or staging) holding `len` bytes.
    attune_sys::mem::with_bytes(addr, len, |data| {
        xxhash_rust::xxh3::xxh3_64_with_seed(data, tier as u64 + 1) | 1
    })
}
