//! Tier read-ahead: which windows of its offset space a tier that answers over a link
//! (the remote tier) fetches before any fault asks for them.
//!
//! The fault path's read-ahead ([`crate::readahead`]) grows a stream's run to the tier's
//! `run_max` (256 KiB for tiers that copy), but each run is still one round trip that the
//! faulting thread waits for whole: the link idles while the program places and reads
//! the run, and the program idles while the link moves the next one. Here the tier keeps
//! up to `depth` windows of `window` bytes in flight past the end of a load that
//! continues a stream, so the next fault finds its run on its way or arrived.
//!
//! * A load continues a stream when it starts where one of the last [`TRAIL`] loads
//!   ended (the fault path's runs of one stream are contiguous: each starts one chunk
//!   past the last one it claimed), or when it reached the end of the window that served
//!   it. Anything else (a scattered fault, even one inside a window; the first run of a
//!   stream) fetches nothing ahead: a random access pays no bandwidth for it (measured:
//!   random reads that a window happened to serve asked for more windows, and 64 MiB of
//!   them fetched 263 MiB ahead of which 3 MiB were used).
//! * The windows follow each other from the end of the window that served the load, else
//!   from the load's end. They are cells of a grid of `window`
//!   bytes (the first may start inside its cell), and the tier ends forward runs on the
//!   same grid, so a run lies in one window. A cell that a window already holds is not
//!   asked again (`have`), and none reaches past the tier's offset space.
//!
//! Pure: the tier gives the trail and what it holds, this says what to fetch.

/// Loads remembered for stream detection (streams interleaved at once).
pub const TRAIL: usize = 4;
/// The most windows in flight ahead of one stream (the `ahead` tier option's ceiling).
pub const MAX_DEPTH: usize = 4;

/// The ends of the last [`TRAIL`] loads (0: none). The tier keeps them in a ring of its
/// own (atomics: the fault path may run in a signal handler) and passes a copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trail(pub [u64; TRAIL]);

impl Trail {
    /// Whether a load at `off` continues one of the remembered loads.
    pub fn continues(&self, off: u64) -> bool {
        off != 0 && self.0.contains(&off)
    }
}

/// How far ahead, and what the tier holds.
#[derive(Clone, Copy, Debug)]
pub struct Ahead {
    /// Windows kept ahead of a stream (0: off).
    pub depth: usize,
    /// Bytes per window.
    pub window: u64,
    /// The tier's offset space: no window reaches past it.
    pub space: u64,
}

/// The windows `(start, len)` to fetch after a load of `[off, off+len)`: `served` is the
/// end of the window that served it (None: the servers did), `trail` the ends of earlier
/// loads, `have` whether a window already fetched or on its way holds an offset. At most
/// [`MAX_DEPTH`].
pub fn windows(
    a: Ahead,
    trail: &Trail,
    off: u64,
    len: u64,
    served: Option<u64>,
    have: impl Fn(u64) -> bool,
) -> ([(u64, u64); MAX_DEPTH], usize) {
    let Ahead {
        depth,
        window,
        space,
    } = a;
    let mut out = [(0u64, 0u64); MAX_DEPTH];
    let mut n = 0;
    // A stream: the load starts where an earlier one ended, or it reached the end of the
    // window that served it. A load anywhere else, inside a window or not, is scattered.
    if !(trail.continues(off) || served == Some(off + len)) {
        return (out, 0);
    }
    let from = served.unwrap_or(off + len);
    if depth == 0 || window == 0 || len == 0 {
        return (out, 0);
    }
    let mut start = from;
    for _ in 0..depth.min(MAX_DEPTH) {
        if start >= space {
            break;
        }
        // Windows are cells of a grid of `window` bytes (the first may start inside
        // one), so that a later load finds one whole window that holds its run.
        let end = ((start / window + 1) * window).min(space);
        if !have(start) {
            out[n] = (start, end - start);
            n += 1;
        }
        start = end;
    }
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;
    const W: u64 = 256 * K;

    fn trail(ends: &[u64]) -> Trail {
        let mut t = Trail::default();
        t.0[..ends.len()].copy_from_slice(ends);
        t
    }

    fn win(
        t: &Trail,
        off: u64,
        len: u64,
        served: Option<u64>,
        depth: usize,
        have: &[u64],
    ) -> Vec<(u64, u64)> {
        let a = Ahead {
            depth,
            window: W,
            space: 1 << 30,
        };
        let (w, n) = windows(a, t, off, len, served, |s| {
            have.iter().any(|&h| h <= s && s < h + W)
        });
        w[..n].to_vec()
    }

    #[test]
    fn the_table() {
        // (what, trail, off, len, served from a window ending at, depth, have, windows)
        type Row<'a> = (
            &'a str,
            &'a [u64],
            u64,
            u64,
            Option<u64>,
            usize,
            &'a [u64],
            &'a [(u64, u64)],
        );
        let rows: &[Row] = &[
            (
                "a first load fetches nothing",
                &[],
                0,
                64 * K,
                None,
                2,
                &[],
                &[],
            ),
            (
                "a scattered load fetches nothing",
                &[64 * K, 8 * W],
                5 * W,
                4 * K,
                None,
                2,
                &[],
                &[],
            ),
            (
                "a load where an earlier one ended starts a stream, on the grid",
                &[64 * K],
                64 * K,
                128 * K,
                None,
                2,
                &[],
                &[(192 * K, 64 * K), (W, W)],
            ),
            (
                "a load that ends the window that served it keeps it going",
                &[],
                4 * W,
                W,
                Some(5 * W),
                2,
                &[5 * W],
                &[(6 * W, W)],
            ),
            (
                "a load inside a window that continues a stream asks for what follows the window",
                &[4 * W + 4 * K],
                4 * W + 4 * K,
                4 * K,
                Some(5 * W),
                2,
                &[],
                &[(5 * W, W), (6 * W, W)],
            ),
            (
                "a scattered load inside a window asks for nothing",
                &[],
                4 * W + 8 * K,
                4 * K,
                Some(5 * W),
                2,
                &[],
                &[],
            ),
            (
                "windows already on their way are not asked again",
                &[4 * W],
                4 * W,
                W,
                None,
                2,
                &[5 * W, 6 * W],
                &[],
            ),
            (
                "nor a cell a window holds from inside it",
                &[4 * W + 8 * K],
                4 * W + 8 * K,
                4 * K,
                None,
                2,
                &[4 * W],
                &[(5 * W, W)],
            ),
            ("depth 0 is off", &[4 * W], 4 * W, W, None, 0, &[], &[]),
            (
                "depth is capped",
                &[4 * W],
                4 * W,
                W,
                None,
                9,
                &[],
                &[(5 * W, W), (6 * W, W), (7 * W, W), (8 * W, W)],
            ),
            (
                "any of the trail's streams",
                &[W, 9 * W, 3 * W, 20 * W],
                9 * W,
                W,
                None,
                1,
                &[],
                &[(10 * W, W)],
            ),
        ];
        for &(what, ends, off, len, served, depth, have, want) in rows {
            assert_eq!(
                win(&trail(ends), off, len, served, depth, have),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn no_window_reaches_past_the_space() {
        let t = trail(&[W]);
        let a = |space| Ahead {
            depth: 3,
            window: W,
            space,
        };
        let (w, n) = windows(a(2 * W + 100), &t, W, W, None, |_| false);
        assert_eq!(&w[..n], &[(2 * W, 100)]);
        let (_, n) = windows(a(2 * W), &t, W, W, None, |_| false);
        assert_eq!(n, 0);
    }

    #[test]
    fn an_empty_trail_slot_is_no_stream() {
        assert!(!Trail::default().continues(0));
    }
}
