//! Write-back of only what changed: which pieces of an evicted run a tier that keeps a
//! copy (file, remote) writes again.
//!
//! An eviction moves a run of up to 2 MiB (512 pages of 4 KiB) in one move; the tier
//! already holds a copy of every page whose content hash matches the one recorded when
//! the tier last took or gave it (`crate` users: the `attune` crate's `paging::evict`).
//! Writing the whole run when one page of it changed sent 512 pages for one: a program
//! that updates a word here and there in a large table (a hash join's build side, a
//! histogram, a B-tree's leaves) wrote back everything it had read.
//!
//! The rule: the dirty pages are written, in pieces; a clean gap shorter than `gap`
//! pages ([`GAP`] by default, the `writeback_gap` option) between two dirty ones is
//! written too (one write instead of two: a write's fixed
//! cost, a system call or a fabric message, is worth several pages of copying), and at
//! most [`MAX_PIECES`] pieces are written (past that, the gaps are closed from the
//! shortest up). A run with no dirty page writes nothing.

/// Most pages in one run (2 MiB of 4 KiB pages).
pub const MAX_PAGES: usize = 512;
/// Words of a run's dirty mask.
pub const MASK_WORDS: usize = MAX_PAGES / 64;
/// The default `gap`: a clean gap of fewer pages than this between two dirty ones is
/// written with them. A `pwrite` costs about as much as copying 8 pages here, and a remote
/// store's message more (docs/design/paging.md, "Dirty pages").
pub const GAP: usize = 8;
/// Most pieces one run is written in.
pub const MAX_PIECES: usize = 16;

/// Runs of pages to write: `(first page, pages)`, in order, not touching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pieces {
    n: usize,
    at: [(usize, usize); MAX_PIECES],
}

impl Pieces {
    /// Nothing to write.
    pub const fn none() -> Pieces {
        Pieces {
            n: 0,
            at: [(0, 0); MAX_PIECES],
        }
    }
    /// The whole run of `pages`.
    pub fn whole(pages: usize) -> Pieces {
        let mut p = Pieces::none();
        if pages > 0 {
            p.at[0] = (0, pages);
            p.n = 1;
        }
        p
    }
    pub fn as_slice(&self) -> &[(usize, usize)] {
        &self.at[..self.n]
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Pages written in all.
    pub fn pages(&self) -> usize {
        self.as_slice().iter().map(|p| p.1).sum()
    }
}

/// Whether page `i` is set in `mask`.
pub fn is_set(mask: &[u64; MASK_WORDS], i: usize) -> bool {
    mask[i / 64] >> (i % 64) & 1 == 1
}

/// Sets page `i` in `mask`.
pub fn set(mask: &mut [u64; MASK_WORDS], i: usize) {
    mask[i / 64] |= 1 << (i % 64);
}

/// The pieces to write of a run of `pages` pages whose changed pages are set in `dirty`,
/// clean gaps shorter than `gap` pages written with their neighbours (`MAX_PAGES`: one
/// piece from the first changed page to the last). No allocation: it runs on the fault
/// path (a faulting thread reclaiming).
pub fn pieces(dirty: &[u64; MASK_WORDS], pages: usize, gap: usize) -> Pieces {
    let pages = pages.min(MAX_PAGES);
    // Maximal runs of dirty pages, joined across gaps shorter than GAP.
    let mut runs = [(0usize, 0usize); MAX_PAGES / 2 + 1];
    let mut n = 0usize;
    let mut i = 0;
    while i < pages {
        if !is_set(dirty, i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < pages && is_set(dirty, i) {
            i += 1;
        }
        match n.checked_sub(1).map(|k| runs[k]) {
            Some((s, l)) if start - (s + l) < gap => runs[n - 1] = (s, i - s),
            _ => {
                runs[n] = (start, i - start);
                n += 1;
            }
        }
    }
    // Too many pieces: close the shortest gaps until they fit.
    while n > MAX_PIECES {
        let k = (1..n)
            .min_by_key(|&k| runs[k].0 - (runs[k - 1].0 + runs[k - 1].1))
            .unwrap_or(1);
        runs[k - 1].1 = runs[k].0 + runs[k].1 - runs[k - 1].0;
        runs.copy_within(k + 1..n, k);
        n -= 1;
    }
    let mut p = Pieces::none();
    p.at[..n].copy_from_slice(&runs[..n]);
    p.n = n;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(pages: &[usize]) -> [u64; MASK_WORDS] {
        let mut m = [0u64; MASK_WORDS];
        for &p in pages {
            set(&mut m, p);
        }
        m
    }

    #[test]
    fn table() {
        let every_16: Vec<usize> = (0..512).step_by(16).collect();
        let every_64: Vec<usize> = (0..512).step_by(64).collect();
        let pairs_far: Vec<usize> = (0..17).map(|k| k * 30).collect();
        // (name, dirty pages, run pages, pieces)
        let rows: Vec<(&str, Vec<usize>, usize, Vec<(usize, usize)>)> = vec![
            ("all clean", vec![], 512, vec![]),
            ("one page", vec![7], 512, vec![(7, 1)]),
            ("all dirty", (0..16).collect(), 16, vec![(0, 16)]),
            ("two apart", vec![0, 100], 512, vec![(0, 1), (100, 1)]),
            // A gap of 7 clean pages is written with its neighbours; one of 8 is not.
            ("short gap", vec![0, 8], 16, vec![(0, 9)]),
            ("gap of GAP", vec![0, 9], 16, vec![(0, 1), (9, 1)]),
            ("last page", vec![511], 512, vec![(511, 1)]),
            // Pages past the run's end are not its own.
            ("past the end", vec![3, 40], 16, vec![(3, 1)]),
            // 32 dirty pages 16 apart: more than MAX_PIECES; the gaps are all as short,
            // so the first ones close (the same pages written as any other choice).
            (
                "every 16th",
                every_16,
                512,
                std::iter::once((0, 257))
                    .chain((17..32).map(|k| (k * 16, 1)))
                    .collect(),
            ),
            (
                "every 64th",
                every_64,
                512,
                (0..8).map(|k| (k * 64, 1)).collect(),
            ),
            // 17 pieces, one too many: the first shortest gap (all 29) closes.
            (
                "one piece too many",
                pairs_far,
                512,
                std::iter::once((0, 31))
                    .chain((2..17).map(|k| (k * 30, 1)))
                    .collect(),
            ),
        ];
        for (name, dirty, pages, want) in rows {
            let got = pieces(&mask(&dirty), pages, GAP);
            assert_eq!(got.as_slice(), &want[..], "{name}");
            // Every dirty page inside the run is written.
            for &d in dirty.iter().filter(|&&d| d < pages) {
                assert!(
                    got.as_slice().iter().any(|&(s, l)| d >= s && d < s + l),
                    "{name}: page {d} left out"
                );
            }
            assert!(got.as_slice().len() <= MAX_PIECES, "{name}");
        }
    }

    #[test]
    fn a_gap_as_long_as_the_run_writes_one_piece() {
        let m = mask(&[5, 100, 300]);
        assert_eq!(pieces(&m, 512, MAX_PAGES).as_slice(), &[(5, 296)]);
        assert_eq!(pieces(&m, 512, 1).as_slice().len(), 3);
        assert!(pieces(&mask(&[]), 512, MAX_PAGES).is_empty());
    }

    #[test]
    fn whole_and_none() {
        assert_eq!(Pieces::whole(512).as_slice(), &[(0, 512)]);
        assert!(Pieces::whole(0).is_empty());
        assert_eq!(Pieces::whole(3).pages(), 3);
        assert!(Pieces::none().is_empty());
    }
}
