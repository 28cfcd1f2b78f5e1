//! Hot-page promotion on NUMA tiers: which cells move up, and which cold cells make room.
//!
//! A NUMA region's pages stay mapped, so the runtime sees no fault when they are used.
//! What it can see is writes: cells (runs of pages) are *armed* (write-protected
//! asynchronously) and the next scan tells which armed cells were written (mechanism:
//! `attune::numa_heat`). The first write to an armed page costs the application an
//! in-kernel fault (about 1 µs here), so only a bounded number of cells is armed per
//! round ([`choose_arm`]), as the kernel's NUMA balancing bounds the memory it unmaps per
//! scan period. Each cell keeps a one-byte history of the rounds it was observed in
//! (armed), newest in the top bit: the aging counter of the classic NFU/LRU
//! approximations, fed by dirty bits instead of accessed bits, and a count of rounds seen.
//!
//! * **Hot**: written in each of its last [`HOT_SCANS`] observed rounds (a burst of one
//!   round, such as initialisation, is not heat).
//! * **Cold**: observed in at least eight rounds and written in none of the last eight.
//!   Reads are not seen, so "cold" means "not written lately": only unprotected (not
//!   LAT/SHL) cells are ever demoted for room, and only to make room for a hot cell.

/// Scans in a row a cell must be written in to count as hot.
pub const HOT_SCANS: u32 = 3;
const HOT_MASK: u8 = !(0xffu8 >> HOT_SCANS);

/// A cell's history after one more scan.
pub fn age(history: u8, written: bool) -> u8 {
    (history >> 1) | ((written as u8) << 7)
}

pub fn is_hot(history: u8) -> bool {
    history & HOT_MASK == HOT_MASK
}

/// Rounds a cell must have been observed in before it can be called cold.
pub const COLD_SCANS: u8 = 8;

pub fn is_cold(history: u8, seen: u8) -> bool {
    history == 0 && seen >= COLD_SCANS
}

/// One cell as the scanner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub history: u8,
    /// Rounds the cell was observed in (saturating).
    pub seen: u8,
    /// Tier the cell's range is placed on (0 = fast).
    pub tier: usize,
    /// The cell's region is LAT or SHL (attuned mode only; temperature mode passes false).
    pub protected: bool,
    /// The cell may move: on one tier (not interleaved), not pinned.
    pub movable: bool,
    /// Its region's allocation order (lower is older).
    pub recency: u64,
    /// Its region is unprotected CAP data in attuned mode (`victim::capacity_first`): its
    /// cold cells give way before other regions' (say, CAP cells promoted while they were
    /// written, cold again).
    pub capacity: bool,
}

/// What the scanner may do in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Limits {
    /// Bytes free on the fast tier above the headroom.
    pub room: u64,
    /// Bytes the fast tier is short of its headroom (allocations may fill it to the
    /// budget): cold cells go down for these first, whatever the heat elsewhere.
    pub short: u64,
    /// Bytes free on the tier below the fast one: no demotion overfills it.
    pub room_below: u64,
    /// Bytes this round may move in all (the migration rate limit times the interval).
    pub max_bytes: u64,
    /// Bytes per cell.
    pub cell: u64,
}

/// The round's moves: indices into the cells given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    /// Cells to move to tier 0, in order.
    pub promote: Vec<usize>,
    /// Cold fast cells to move one tier down first, to restore the headroom (background
    /// demotion, as kswapd's demotion keeps a node's free pages above its watermark).
    pub restore: Vec<usize>,
    /// Cold fast cells to move one tier down next, to make room for a hot one each.
    pub demote: Vec<usize>,
    /// A hot cell stayed down, or the headroom stayed short, for want of a cold cell (not
    /// of rate): fast cells should be observed, so that cold ones can be found.
    pub starved: bool,
}

/// Plans one round. First the headroom: while the fast tier is short of it, cold
/// unprotected fast cells move one tier down (CAP regions' first, then the oldest
/// region's). Then hot movable cells on lower tiers move up while the fast tier has room;
/// when it has none, a cold unprotected fast cell moves down for each, in the same order. LAT/SHL cells go up first and are never
/// demoted here. Everything moved counts against `max_bytes` (a swap costs two cells), and
/// demotions stop when the tier below is full.
pub fn plan(cells: &[Cell], lim: Limits) -> Moves {
    let mut up: Vec<usize> = (0..cells.len())
        .filter(|&i| cells[i].movable && cells[i].tier > 0 && is_hot(cells[i].history))
        .collect();
    // Protected first, then the longer-written, then lower tiers first (the slower ones).
    up.sort_by_key(|&i| {
        let c = &cells[i];
        (
            !c.protected,
            std::cmp::Reverse(c.history.count_ones()),
            std::cmp::Reverse(c.tier),
            i,
        )
    });
    let mut down: Vec<usize> = (0..cells.len())
        .filter(|&i| {
            let c = &cells[i];
            c.movable && c.tier == 0 && !c.protected && is_cold(c.history, c.seen)
        })
        .collect();
    down.sort_by_key(|&i| (!cells[i].capacity, cells[i].recency, i));
    let mut down = down.into_iter();
    let (mut room, mut budget, mut below) = (lim.room, lim.max_bytes, lim.room_below);
    let mut out = Moves::default();
    let mut short = lim.short;
    while short > 0 && budget >= lim.cell && below >= lim.cell {
        let Some(v) = down.next() else {
            out.starved = true;
            break;
        };
        out.restore.push(v);
        short = short.saturating_sub(lim.cell);
        budget -= lim.cell;
        below -= lim.cell;
    }
    for i in up {
        if budget < lim.cell {
            break;
        }
        if room < lim.cell {
            if budget < 2 * lim.cell || below < lim.cell {
                break;
            }
            let Some(v) = down.next() else {
                out.starved = true;
                break;
            };
            out.demote.push(v);
            room += lim.cell;
            budget -= lim.cell;
            below -= lim.cell;
        }
        out.promote.push(i);
        room -= lim.cell;
        budget -= lim.cell;
    }
    out
}

/// Which cells to arm for the next round, at most `budget` of them: far movable cells
/// written lately first (a hot set is observed every round), newest writes first; when
/// `need_cold`, the fast cells of CAP regions next (they give way first, so they are the
/// first to be known cold); then, in turn from `cursor`, the other far movable cells (to
/// discover new heat) and, when `need_cold`, the other unprotected movable fast cells.
/// Returns the cells and the cursor for the next round.
pub fn choose_arm(
    cells: &[Cell],
    budget: usize,
    need_cold: bool,
    cursor: usize,
) -> (Vec<usize>, usize) {
    let far = |c: &Cell| c.movable && c.tier > 0;
    let mut out: Vec<usize> = (0..cells.len())
        .filter(|&i| far(&cells[i]) && cells[i].history != 0)
        .collect();
    out.sort_by_key(|&i| (std::cmp::Reverse(cells[i].history), i));
    let fast = |c: &Cell| c.movable && c.tier == 0 && !c.protected;
    if need_cold {
        out.extend((0..cells.len()).filter(|&i| cells[i].capacity && fast(&cells[i])));
    }
    out.truncate(budget);
    let n = cells.len();
    if n == 0 {
        return (out, 0);
    }
    let mut chosen = vec![false; n];
    for &i in &out {
        chosen[i] = true;
    }
    let start = cursor % n;
    let mut next = start;
    for k in 0..n {
        if out.len() >= budget {
            break;
        }
        let i = (start + k) % n;
        next = (i + 1) % n;
        let c = &cells[i];
        let wanted = far(c) || (need_cold && fast(c));
        if wanted && !chosen[i] {
            out.push(i);
        }
    }
    (out, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = 64 << 10;

    fn cell(history: u8, tier: usize, protected: bool, movable: bool, recency: u64) -> Cell {
        Cell {
            history,
            seen: 8,
            tier,
            protected,
            movable,
            recency,
            capacity: false,
        }
    }

    #[test]
    fn history_ages_one_scan_at_a_time() {
        let mut h = 0u8;
        let mut hot_after = None;
        for scan in 1..=4 {
            h = age(h, true);
            if is_hot(h) && hot_after.is_none() {
                hot_after = Some(scan);
            }
        }
        assert_eq!(hot_after, Some(HOT_SCANS));
        // One scan without a write ends the heat; eight make the cell cold.
        assert!(!is_hot(age(h, false)));
        let mut c = h;
        for _ in 0..7 {
            c = age(c, false);
        }
        assert!(!is_cold(c, 255));
        assert!(is_cold(age(c, false), 255));
        // A cell seen fewer than eight times is not known to be cold.
        assert!(!is_cold(0, COLD_SCANS - 1) && is_cold(0, COLD_SCANS));
        // A one-scan burst (initialisation) is never hot.
        assert!(!is_hot(age(0, true)) && !is_hot(age(age(0, true), false)));
    }

    #[test]
    fn plans() {
        let hot = 0b1110_0000u8;
        let hotter = 0b1111_1111u8;
        struct Case {
            name: &'static str,
            cells: Vec<Cell>,
            room: u64,
            max: u64,
            want: (Vec<usize>, Vec<usize>),
        }
        let cases = [
            Case {
                name: "hot far cells move up while there is room",
                cells: vec![
                    cell(hot, 1, false, true, 1),
                    cell(hot, 1, false, true, 1),
                    cell(hot, 1, false, true, 1),
                ],
                room: 2 * C,
                max: u64::MAX,
                want: (vec![0, 1], vec![]),
            },
            Case {
                name: "not hot, pinned, interleaved or already fast: nothing",
                cells: vec![
                    cell(0b1100_0000, 1, false, true, 1),
                    cell(hot, 1, false, false, 1),
                    cell(hot, 0, false, true, 1),
                ],
                room: 8 * C,
                max: u64::MAX,
                want: (vec![], vec![]),
            },
            Case {
                name: "protected first, then the longer-written",
                cells: vec![
                    cell(hot, 1, false, true, 1),
                    cell(hotter, 1, false, true, 1),
                    cell(hot, 1, true, true, 2),
                ],
                room: 2 * C,
                max: u64::MAX,
                want: (vec![2, 1], vec![]),
            },
            Case {
                name: "no room: cold unprotected fast cells of the oldest region swap out",
                cells: vec![
                    cell(hot, 1, false, true, 3),
                    cell(0, 0, false, true, 2),
                    cell(0, 0, false, true, 1),
                    cell(0, 0, true, true, 0),
                    cell(0b0000_0001, 0, false, true, 0),
                ],
                room: 0,
                max: u64::MAX,
                want: (vec![0], vec![2]),
            },
            Case {
                name: "no room and no cold cell: nothing moves",
                cells: vec![
                    cell(hot, 1, false, true, 3),
                    cell(0, 0, true, true, 0),
                    cell(0, 0, false, false, 0),
                ],
                room: C / 2,
                max: u64::MAX,
                want: (vec![], vec![]),
            },
            Case {
                name: "the rate limit counts both halves of a swap",
                cells: vec![
                    cell(hot, 1, false, true, 3),
                    cell(hot, 1, false, true, 3),
                    cell(0, 0, false, true, 1),
                    cell(0, 0, false, true, 1),
                ],
                room: C,
                max: 2 * C,
                want: (vec![0], vec![]),
            },
            Case {
                name: "a limit below one cell moves nothing",
                cells: vec![cell(hot, 1, false, true, 1)],
                room: 4 * C,
                max: C - 1,
                want: (vec![], vec![]),
            },
        ];
        for c in cases {
            let m = plan(
                &c.cells,
                Limits {
                    room: c.room,
                    room_below: u64::MAX,
                    max_bytes: c.max,
                    cell: C,
                    ..Default::default()
                },
            );
            assert_eq!((m.promote, m.demote), c.want, "{}", c.name);
            assert!(m.restore.is_empty(), "{}", c.name);
        }
    }

    #[test]
    fn headroom_is_restored_from_cold_cells() {
        let hot = 0b1110_0000u8;
        struct Case {
            name: &'static str,
            cells: Vec<Cell>,
            short: u64,
            below: u64,
            max: u64,
            // (restore, demote, promote, starved)
            want: (Vec<usize>, Vec<usize>, Vec<usize>, bool),
        }
        let cases = [
            Case {
                name: "short by two cells: the two cold cells of the oldest region go down",
                cells: vec![
                    cell(0, 0, false, true, 2),
                    cell(0, 0, false, true, 1),
                    cell(0, 0, false, true, 1),
                    cell(0, 0, true, true, 0),
                    cell(0b0000_0001, 0, false, true, 0),
                ],
                short: 2 * C - 1,
                below: u64::MAX,
                max: u64::MAX,
                want: (vec![1, 2], vec![], vec![], false),
            },
            Case {
                name: "cold CAP cells (promoted once, cold again) go before older regions'",
                cells: vec![
                    cell(0, 0, false, true, 1),
                    Cell {
                        capacity: true,
                        ..cell(0, 0, false, true, 5)
                    },
                    cell(0, 0, false, true, 2),
                ],
                short: 2 * C,
                below: u64::MAX,
                max: u64::MAX,
                want: (vec![1, 0], vec![], vec![], false),
            },
            Case {
                name: "protected, pinned or written cells never go down: starved",
                cells: vec![
                    cell(0, 0, true, true, 0),
                    cell(0, 0, false, false, 0),
                    cell(0b1000_0000, 0, false, true, 0),
                ],
                short: C,
                below: u64::MAX,
                max: u64::MAX,
                want: (vec![], vec![], vec![], true),
            },
            Case {
                name: "the headroom goes first, then a swap for the hot cell",
                cells: vec![
                    cell(hot, 1, false, true, 3),
                    cell(0, 0, false, true, 1),
                    cell(0, 0, false, true, 2),
                ],
                short: C,
                below: u64::MAX,
                max: u64::MAX,
                want: (vec![1], vec![2], vec![0], false),
            },
            Case {
                name: "the rate limit bounds the headroom's demotions",
                cells: vec![cell(0, 0, false, true, 1), cell(0, 0, false, true, 1)],
                short: 2 * C,
                below: u64::MAX,
                max: C,
                want: (vec![0], vec![], vec![], false),
            },
            Case {
                name: "a full tier below takes nothing, neither for headroom nor for a swap",
                cells: vec![cell(hot, 1, false, true, 3), cell(0, 0, false, true, 1)],
                short: C,
                below: C - 1,
                max: u64::MAX,
                want: (vec![], vec![], vec![], false),
            },
        ];
        for c in cases {
            let m = plan(
                &c.cells,
                Limits {
                    short: c.short,
                    room_below: c.below,
                    max_bytes: c.max,
                    cell: C,
                    ..Default::default()
                },
            );
            assert_eq!(
                (m.restore, m.demote, m.promote, m.starved),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn a_hot_cell_without_a_cold_one_to_swap_starves() {
        let cells = [
            cell(0b1110_0000, 1, false, true, 1),
            cell(0, 0, false, true, 0),
        ];
        let unseen = [
            cells[0],
            Cell {
                seen: 3,
                ..cells[1]
            },
        ];
        let lim = Limits {
            room_below: u64::MAX,
            max_bytes: u64::MAX,
            cell: C,
            ..Default::default()
        };
        assert!(plan(&unseen, lim).starved && plan(&unseen, lim).promote.is_empty());
        let m = plan(&cells, lim);
        assert!(!m.starved && m.promote == vec![0] && m.demote == vec![1]);
    }

    #[test]
    fn cold_is_looked_for_in_cap_cells_first() {
        let cap = Cell {
            capacity: true,
            ..cell(0, 0, false, true, 9)
        };
        // 0 far written lately, 1 far, 2 unflagged fast, 3-4 CAP fast, 5 CAP far.
        let cells = [
            cell(0b1000_0000, 1, false, true, 1),
            cell(0, 1, false, true, 1),
            cell(0, 0, false, true, 1),
            cap,
            cap,
            Cell { tier: 1, ..cap },
        ];
        assert_eq!(choose_arm(&cells, 3, true, 0), (vec![0, 3, 4], 0));
        assert_eq!(choose_arm(&cells, 5, true, 0), (vec![0, 3, 4, 1, 2], 3));
        // Not looking for cold: CAP fast cells are not armed at all.
        assert_eq!(choose_arm(&cells, 5, false, 0), (vec![0, 1, 5], 0));
    }

    #[test]
    fn arming_keeps_the_budget_and_watches_written_cells_first() {
        let far = |h| cell(h, 1, false, true, 1);
        let fast = |p| cell(0, 0, p, true, 1);
        // 0-3 far (2 written lately, 3 longer ago), 4-5 fast (5 protected), 6 pinned.
        let cells = [
            far(0),
            far(0),
            far(0b1000_0000),
            far(0b0100_0000),
            fast(false),
            fast(true),
            cell(0b1000_0000, 1, false, false, 1),
        ];
        struct Case {
            budget: usize,
            need_cold: bool,
            cursor: usize,
            want: (Vec<usize>, usize),
        }
        let cases = [
            // Written ones first, newest first; then in turn from the cursor.
            Case {
                budget: 3,
                need_cold: false,
                cursor: 0,
                want: (vec![2, 3, 0], 1),
            },
            Case {
                budget: 2,
                need_cold: false,
                cursor: 0,
                want: (vec![2, 3], 0),
            },
            // Fast cells only when cold ones are needed, never protected or pinned ones.
            Case {
                budget: 10,
                need_cold: false,
                cursor: 0,
                want: (vec![2, 3, 0, 1], 0),
            },
            Case {
                budget: 10,
                need_cold: true,
                cursor: 0,
                want: (vec![2, 3, 0, 1, 4], 0),
            },
            // The cursor wraps round.
            Case {
                budget: 3,
                need_cold: true,
                cursor: 4,
                want: (vec![2, 3, 4], 5),
            },
            Case {
                budget: 0,
                need_cold: true,
                cursor: 4,
                want: (vec![], 4),
            },
        ];
        for (k, c) in cases.iter().enumerate() {
            assert_eq!(
                choose_arm(&cells, c.budget, c.need_cold, c.cursor),
                c.want,
                "case {k}"
            );
        }
    }
}
