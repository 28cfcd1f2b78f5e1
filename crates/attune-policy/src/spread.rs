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

/// The servers of each unit's copies at the start: `place[s * replicas + r]` is the
/// server of copy r of the units server `s` owns, the owner and the next ones along, so
/// each unit's copies are on distinct servers and each server holds as many as another.
pub fn first_place(n: usize, replicas: usize) -> Vec<usize> {
    (0..n)
        .flat_map(|s| (0..replicas).map(move |r| (s + r) % n))
        .collect()
}

/// Where the copies placed on server `lost` go when it is given up on (`place` as in
/// [`first_place`], `n` servers, `live`: which answer now). Each of its slots moves to the
/// live server that holds no other copy of the same owner's units (copies of a unit stay
/// on distinct servers), the one with the fewest slots, the lowest number on a tie (the
/// load stays even). A slot with no such server stays: its copies wait for `lost` to
/// rejoin. Returns the slots moved (index into `place`, new server), in index order.
pub fn rehome(
    place: &[usize],
    n: usize,
    replicas: usize,
    lost: usize,
    live: impl Fn(usize) -> bool,
) -> Vec<(usize, usize)> {
    let mut p = place.to_vec();
    let mut load = vec![0usize; n];
    for &x in &p {
        if x < n {
            load[x] += 1;
        }
    }
    let mut moved = Vec::new();
    for i in 0..p.len() {
        if p[i] != lost {
            continue;
        }
        let row = i / replicas.max(1) * replicas.max(1);
        let taken = &p[row..(row + replicas).min(p.len())];
        let to = (0..n)
            .filter(|&x| x != lost && live(x) && !taken.contains(&x))
            .min_by_key(|&x| (load[x], x));
        if let Some(x) = to {
            p[i] = x;
            load[x] += 1;
            moved.push((i, x));
        }
    }
    moved
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

    #[test]
    fn first_place_puts_each_units_copies_on_distinct_servers_evenly() {
        assert_eq!(first_place(3, 2), vec![0, 1, 1, 2, 2, 0]);
        assert_eq!(first_place(2, 2), vec![0, 1, 1, 0]);
        assert_eq!(first_place(3, 1), vec![0, 1, 2]);
        for n in 1..=6 {
            for r in 1..=n {
                let p = first_place(n, r);
                for row in p.chunks(r) {
                    let mut d = row.to_vec();
                    d.sort();
                    d.dedup();
                    assert_eq!(d.len(), r, "n {n} r {r}: {row:?}");
                }
                for x in 0..n {
                    assert_eq!(p.iter().filter(|&&y| y == x).count(), r);
                }
            }
        }
    }

    #[test]
    fn rehome_moves_a_lost_servers_slots_to_the_least_loaded_server_not_in_the_row() {
        // (servers, copies, place, lost, live servers, expected moves)
        type Row = (usize, usize, Vec<usize>, usize, u8, Vec<(usize, usize)>);
        let rows: Vec<Row> = vec![
            // 3 servers, 2 copies: row 0 {0,1} takes 2, row 1 {1,2} takes 0.
            (3, 2, first_place(3, 2), 1, 0b101, vec![(1, 2), (2, 0)]),
            // 2 servers, 2 copies: every row holds both; the copies wait.
            (2, 2, first_place(2, 2), 1, 0b01, vec![]),
            // 4 servers: server 2's two slots go to 0 (tie with 3, lower number) and to 1.
            (4, 2, first_place(4, 2), 2, 0b1011, vec![(3, 0), (4, 1)]),
            // A second server down too: only what a live server can take moves.
            (3, 2, first_place(3, 2), 1, 0b001, vec![(2, 0)]),
            // One copy: the lost server's units go to the least loaded live one.
            (3, 1, first_place(3, 1), 1, 0b101, vec![(1, 0)]),
            // Given up on already: nothing of it left to move.
            (3, 2, vec![0, 2, 0, 2, 2, 0], 1, 0b101, vec![]),
        ];
        for (n, r, place, lost, live, want) in rows {
            let got = rehome(&place, n, r, lost, |x| live & (1 << x) != 0);
            assert_eq!(got, want, "n {n} r {r} place {place:?} lost {lost}");
            let mut p = place.clone();
            for &(i, x) in &got {
                p[i] = x;
            }
            for row in p.chunks(r) {
                let mut d = row.to_vec();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), r, "copies on distinct servers: {p:?}");
            }
        }
    }
}
