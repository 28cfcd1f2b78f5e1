//! How a remote tier spreads its pages over memory servers (docs/design/remote.md): the
//! tier's offset space is cut into units, each unit has one owner server (a hash of its
//! number), and a transfer becomes one request per run of consecutive units of one owner.
//! Pure functions; the mechanism (`attune::tier::remote`) sends what they give.

/// The server that owns unit number `unit` among `n` servers.
pub fn owner(unit: u64, n: usize) -> usize {
    // A multiplicative hash: neighbouring units land on different servers, so a stream
    // is spread over all of them (rMap §IV's interleaving).
    ((unit.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % n as u64) as usize
}

/// The pieces of `[off, off+len)`: (server, offset, length), with units of `unit` bytes,
/// consecutive units of one owner merged, none longer than `max` bytes (the protocol's
/// payload bound; at least one unit).
pub fn pieces(off: u64, len: u64, n: usize, unit: u64, max: u64) -> Vec<(usize, u64, u64)> {
    let mut out: Vec<(usize, u64, u64)> = Vec::new();
    let mut a = off;
    let end = off + len;
    while a < end {
        let b = ((a / unit + 1) * unit).min(end);
        let s = owner(a / unit, n);
        match out.last_mut() {
            Some((ls, lo, ll)) if *ls == s && *lo + *ll == a && *ll + (b - a) <= max => {
                *ll += b - a
            }
            _ => out.push((s, a, b - a)),
        }
        a = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: u64 = 64 << 10;
    const MAX: u64 = 1 << 20;

    #[test]
    fn pieces_cover_the_range_once_and_merge_one_owners_units() {
        for n in 1..=4 {
            for &(off, len) in &[
                (0u64, 4096u64),
                (60 << 10, 8 << 10),
                (0, 2 << 20),
                (4096, 1 << 20),
            ] {
                let p = pieces(off, len, n, UNIT, MAX);
                let mut a = off;
                for &(s, o, l) in &p {
                    assert_eq!(o, a, "contiguous");
                    assert!(s < n && l > 0 && l <= MAX);
                    // Every unit of a piece has the piece's owner.
                    let mut u = o / UNIT;
                    while u * UNIT < o + l {
                        assert_eq!(owner(u, n), s);
                        u += 1;
                    }
                    a += l;
                }
                assert_eq!(a, off + len);
                if n == 1 && len <= MAX {
                    assert_eq!(p.len(), 1, "one server: one request");
                }
            }
        }
    }

    #[test]
    fn a_long_run_of_one_server_is_cut_at_the_payload_bound() {
        let p = pieces(0, 4 << 20, 1, UNIT, MAX);
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|&(s, _, l)| s == 0 && l == MAX));
    }

    #[test]
    fn units_spread_over_every_server() {
        for n in 2..=8 {
            let mut seen = vec![0u32; n];
            for u in 0..(64 * n as u64) {
                seen[owner(u, n)] += 1;
            }
            assert!(seen.iter().all(|&c| c >= 32), "{n}: {seen:?}");
        }
    }
}
