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

/// A page's copies to make again (after a server that held some rejoined empty): from
/// `bits` (bit r: copy r holds the page's current content), `replicas` copies wanted,
/// and which copies' servers are live now. Returns the copy to read it from (the first
/// live one that holds it) and the live copies that lack it, or None when there is
/// nothing to copy or nothing to copy from. A copy whose server is down waits for it.
pub fn repair(bits: u8, replicas: usize, live: impl Fn(usize) -> bool) -> Option<(usize, u8)> {
    let from = (0..replicas).find(|&r| bits & (1 << r) != 0 && live(r))?;
    let missing = (0..replicas)
        .filter(|&r| bits & (1 << r) == 0 && live(r))
        .fold(0u8, |m, r| m | 1 << r);
    (missing != 0).then_some((from, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_reads_a_live_copy_and_fills_the_live_ones_that_lack_it() {
        // (bits, replicas, live copies, expected)
        let rows: &[(u8, usize, u8, Option<(usize, u8)>)] = &[
            (0b01, 2, 0b11, Some((0, 0b10))), // copy 1 rejoined empty
            (0b10, 2, 0b11, Some((1, 0b01))), // copy 0 rejoined empty
            (0b11, 2, 0b11, None),            // both hold it
            (0b01, 2, 0b01, None),            // copy 1's server still down
            (0b10, 2, 0b01, None),            // its only holder is down: nothing to read
            (0b00, 2, 0b11, None),            // not stored (or discarded)
            (0b001, 3, 0b111, Some((0, 0b110))),
            (0b100, 3, 0b011, None), // holder down
            (0b110, 3, 0b101, Some((2, 0b001))),
            (0b01, 1, 0b01, None), // one copy: nothing to repair
            (0b10, 1, 0b11, None), // a bit beyond the copies wanted is ignored
        ];
        for &(bits, replicas, live, want) in rows {
            let got = repair(bits, replicas, |r| live & (1 << r) != 0);
            assert_eq!(got, want, "bits {bits:b}, {replicas} copies, live {live:b}");
        }
    }

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
