//! A region: a range of managed virtual memory cut into equal chunks, each with one atomic
//! state word. The state word is the only synchronisation between threads that fault,
//! fetch ahead, evict or pin the same chunk; its transitions are the `claim_*`, `settle`
//! and `pin` methods here, and the loom model checks them (`crates/attune/tests/loom.rs`).

use crate::sync::shim::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use attune_policy::Flags;
use attune_sys::uffd::Delivery;

/// Where a chunk's contents are (low 4 bits of the state word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Where {
    /// Never written: reads as zero, nothing stored anywhere.
    Fresh = 0,
    /// Mapped in the region (in DRAM, counted against the budget).
    Resident = 1,
    /// Stored in the far tier named by the tier bits.
    Far = 2,
    /// Being placed by one thread; others wait.
    Fetching = 3,
    /// Being taken out by one thread; others wait.
    Evicting = 4,
}

/// The unit of content hashes (`Region::file_hash`): a tier that keeps a copy is written
/// again by these pages, whatever the chunk size.
pub const HASH_PAGE: usize = 4096;

const WHERE_MASK: u64 = 0xF;
const TIER_SHIFT: u64 = 4;
const TIER_MASK: u64 = 0xF << TIER_SHIFT;
/// In the working set: came back from a far tier soon after its eviction (see
/// `attune_policy::victim`). Counted in the engine's `active` bytes while resident.
pub const ACTIVE: u64 = 1 << 8;
/// Never evicted (LAT/SHL pinned part, or `attune_pin`).
pub const PIN: u64 = 1 << 9;
/// An eviction met pages that a fork left shared (UFFDIO_MOVE refuses them); the evictor
/// un-shares the chunk before the hand tries it again (`crate::fork::unshare_pass`).
pub const SHARED: u64 = 1 << 11;
const CREDIT_SHIFT: u64 = 10;
/// Laps of grace left to an inactive chunk (`attune_policy::victim::MAX_CREDIT`, one bit).
pub const CREDIT_MASK: u64 = 0x1 << CREDIT_SHIFT;
const HEAT_SHIFT: u64 = 16;
const HEAT_MASK: u64 = 0xFFFF << HEAT_SHIFT;
/// The tier bits of a Far chunk that no tier holds: every 8-byte word of it is the word
/// at the fill index (the high 32 bits) of the engine's dictionary
/// (`crate::paging::fill`). So every rule about Far chunks holds for it, and a tier
/// lookup of it finds none. Far tiers are numbered below it (`config::MAX_FAR_TIERS`).
pub const FILLED: usize = 15;
const FILL_SHIFT: u64 = 32;
const FILL_MASK: u64 = 0xFFFF_FFFF << FILL_SHIFT;

/// Decoded view of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State(pub u64);

impl State {
    pub fn place(self) -> Where {
        match self.0 & WHERE_MASK {
            0 => Where::Fresh,
            1 => Where::Resident,
            2 => Where::Far,
            3 => Where::Fetching,
            _ => Where::Evicting,
        }
    }
    pub fn tier(self) -> usize {
        ((self.0 & TIER_MASK) >> TIER_SHIFT) as usize
    }
    pub fn pinned(self) -> bool {
        self.0 & PIN != 0
    }
    pub fn active(self) -> bool {
        self.0 & ACTIVE != 0
    }
    pub fn credit(self) -> u8 {
        ((self.0 & CREDIT_MASK) >> CREDIT_SHIFT) as u8
    }
    /// The bits of a class and credit, for `settle` and `with_bits`.
    pub fn class_bits(active: bool, credit: u8) -> u64 {
        (if active { ACTIVE } else { 0 })
            | ((credit.min(attune_policy::victim::MAX_CREDIT) as u64) << CREDIT_SHIFT)
    }
    pub fn heat(self) -> u32 {
        ((self.0 & HEAT_MASK) >> HEAT_SHIFT) as u32
    }
    /// The dictionary index of a filled chunk's word (meaningful while its tier bits say
    /// [`FILLED`], Far or claimed from Far).
    pub fn fill_index(self) -> u32 {
        ((self.0 & FILL_MASK) >> FILL_SHIFT) as u32
    }
    /// Same flags and heat, new place (and tier).
    pub fn with(self, w: Where, tier: usize) -> State {
        State(
            (self.0 & !(WHERE_MASK | TIER_MASK))
                | w as u64
                | ((tier as u64) << TIER_SHIFT & TIER_MASK),
        )
    }
    pub fn with_bits(self, set: u64, clear: u64) -> State {
        State((self.0 | set) & !clear)
    }
    pub fn heated(self) -> State {
        let h = (self.heat() + 1).min(0xFFFF) as u64;
        State((self.0 & !HEAT_MASK) | (h << HEAT_SHIFT))
    }
}

/// What [`Region::claim_fetch`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This thread owns the chunk (it was Fresh, or Far in the tier given).
    Owned(Where, usize),
    /// Already resident.
    Resident,
}

/// What a region is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// One allocation of `allocate_TM`/`attune_alloc` at or above the small threshold.
    Dedicated,
    /// The arena of a placement class for small allocations (mimalloc inside).
    SmallArena,
}

/// Per-region counters.
#[derive(Default)]
pub struct RegionCounters {
    pub faults: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub zero_fills: AtomicU64,
    pub readahead_chunks: AtomicU64,
    /// Chunks faults asked for, and read-ahead chunks shown touched (`Counters::demand_bytes`).
    pub demand_chunks: AtomicU64,
    pub readahead_touched_chunks: AtomicU64,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub clean_skips: AtomicU64,
    pub discarded: AtomicU64,
}

impl RegionCounters {
    pub fn reset(&self) {
        for a in [
            &self.faults,
            &self.fetched_bytes,
            &self.zero_fills,
            &self.readahead_chunks,
            &self.demand_chunks,
            &self.readahead_touched_chunks,
            &self.evictions,
            &self.evicted_bytes,
            &self.clean_skips,
            &self.discarded,
        ] {
            a.store(0, Relaxed);
        }
    }
}

/// Access sampling cells, one per chunk (empty when sampling is off). A sample parks a
/// resident chunk in the far tier at `parked_at`; the fault that brings it back within the
/// window is a hit after `d` ns, a sample that waits the whole window is censored.
/// Per chunk, hits / exposure is the maximum-likelihood access rate of a Poisson process
/// observed with right-censoring (see `crate::paging::sampler`).
#[derive(Default)]
pub struct SampleCells {
    pub parked_at: Box<[AtomicU64]>,
    pub hits: Box<[AtomicU32]>,
    pub parks: Box<[AtomicU32]>,
    pub exposure_ns: Box<[AtomicU64]>,
}

impl SampleCells {
    pub fn new(n: usize) -> SampleCells {
        SampleCells {
            parked_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            hits: (0..n).map(|_| AtomicU32::new(0)).collect(),
            parks: (0..n).map(|_| AtomicU32::new(0)).collect(),
            exposure_ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    pub fn enabled(&self) -> bool {
        !self.parked_at.is_empty()
    }
}

pub struct Region {
    pub id: u32,
    pub base: usize,
    pub len: usize,
    /// Bytes the application asked for (len is rounded up to chunks).
    pub requested: usize,
    pub chunk: usize,
    pub chunk_shift: u32,
    pub flags: AtomicU32,
    pub delivery: Delivery,
    pub kind: RegionKind,
    states: Box<[AtomicU64]>,
    /// Hash of the content a far tier that keeps copies holds, per 4 KiB page
    /// ([`HASH_PAGE`]; 0: none or unknown): a store writes only the pages whose hash
    /// changed (`attune_policy::writeback`).
    pub file_hash: Box<[AtomicU64]>,
    /// Offset reserved for this region in each far tier.
    pub slots: Vec<u64>,
    /// Preferred far tier for evicted chunks (index into the engine's tiers).
    pub home_tier: AtomicUsize,
    pub counters: RegionCounters,
    /// Runs of faults for read-ahead (`attune_policy::readahead::Stream`, packed), and
    /// the slot a new run takes first (a rotating counter).
    pub streams: [AtomicU64; attune_policy::readahead::STREAMS],
    pub stream_hint: AtomicUsize,
    /// When each chunk was last evicted, in the engine's evicted 4 KiB pages (wrapping):
    /// the refault distance of its next fault.
    pub evicted_at: Box<[AtomicU32]>,
    /// Clock hand position (chunk index).
    pub hand: AtomicUsize,
    /// Where the tests of active chunks go on (chunk index).
    pub test_hand: AtomicUsize,
    pub freed: AtomicBool,
    /// Set when a freed region's far-tier offsets went back to the tiers' free lists
    /// (`evict::drop_retired`, once no fetch of it is in flight).
    pub slots_returned: AtomicBool,
    /// Online flag prediction: when (ns, `os::now_ns`) the sampler decides this
    /// region's flags; 0 when it does not (flagged, decided, or prediction off).
    pub predict_due: AtomicU64,
    pub samples: SampleCells,
    /// One cell per 2 MiB span (`crate::paging::huge`), empty when the region is never
    /// put on huge pages (`attune_policy::huge::eligible`).
    pub huge: Box<[AtomicU8]>,
    /// Evictions and discards of this region the last huge-page pass saw.
    pub huge_seen: AtomicU64,
}

impl Region {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        base: usize,
        len: usize,
        requested: usize,
        chunk: usize,
        flags: Flags,
        delivery: Delivery,
        kind: RegionKind,
        slots: Vec<u64>,
        home_tier: usize,
        sampling: bool,
        huge: bool,
    ) -> Region {
        let n = len / chunk;
        Region {
            id,
            base,
            len,
            requested,
            chunk,
            chunk_shift: chunk.trailing_zeros(),
            flags: AtomicU32::new(flags.0),
            delivery,
            kind,
            states: (0..n).map(|_| AtomicU64::new(0)).collect(),
            file_hash: (0..n * (chunk / HASH_PAGE).max(1))
                .map(|_| AtomicU64::new(0))
                .collect(),
            evicted_at: (0..n).map(|_| AtomicU32::new(0)).collect(),
            slots,
            home_tier: AtomicUsize::new(home_tier),
            counters: RegionCounters::default(),
            streams: Default::default(),
            stream_hint: AtomicUsize::new(0),
            hand: AtomicUsize::new(0),
            test_hand: AtomicUsize::new(0),
            freed: AtomicBool::new(false),
            slots_returned: AtomicBool::new(false),
            predict_due: AtomicU64::new(0),
            samples: if sampling {
                SampleCells::new(n)
            } else {
                SampleCells::default()
            },
            huge: if huge {
                (0..len / attune_policy::huge::SPAN)
                    .map(|_| AtomicU8::new(0))
                    .collect()
            } else {
                Box::default()
            },
            huge_seen: AtomicU64::new(0),
        }
    }

    pub fn chunks(&self) -> usize {
        self.states.len()
    }
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.len
    }
    pub fn chunk_of(&self, addr: usize) -> usize {
        (addr - self.base) >> self.chunk_shift
    }
    pub fn chunk_addr(&self, c: usize) -> usize {
        self.base + (c << self.chunk_shift)
    }
    /// The content hashes of chunks `[c, c+n)`, one per [`HASH_PAGE`].
    pub fn page_hashes(&self, c: usize, n: usize) -> &[AtomicU64] {
        let per = (self.chunk / HASH_PAGE).max(1);
        &self.file_hash[c * per..(c + n) * per]
    }
    pub fn flags(&self) -> Flags {
        Flags(self.flags.load(Relaxed))
    }
    pub fn state(&self, c: usize) -> State {
        State(self.states[c].load(Acquire))
    }
    /// Compare-and-swap of a chunk's state word.
    pub fn cas(&self, c: usize, old: State, new: State) -> bool {
        self.states[c]
            .compare_exchange(old.0, new.0, AcqRel, Acquire)
            .is_ok()
    }

    // The chunk state machine. A thread owns a chunk from a successful claim (the word
    // moves to Fetching or Evicting) to its `settle`; others wait or pass. Every claim is a
    // compare-and-swap of the whole word, so any bit set since the claimer read it (a pin,
    // another claim) makes the claim fail; `settle` and `set_bits` keep the bits they do
    // not own, so a pin set while a chunk is owned survives the owner's settle.

    /// Claims chunk `c` to bring it into DRAM (a fault, a prefetch): Owned when it was
    /// Fresh or Far and this thread now holds it as Fetching, Resident when there is
    /// nothing to do. While another thread owns it: waits when `wait`, else None.
    pub fn claim_fetch(&self, c: usize, wait: bool) -> Option<Claim> {
        let mut spins = 0u32;
        loop {
            let s = self.state(c);
            match s.place() {
                Where::Fresh | Where::Far => {
                    if self.cas(c, s, s.with(Where::Fetching, s.tier())) {
                        return Some(Claim::Owned(s.place(), s.tier()));
                    }
                }
                Where::Resident => return Some(Claim::Resident),
                Where::Fetching | Where::Evicting => {
                    if !wait {
                        return None;
                    }
                    crate::sync::gate::backoff(&mut spins);
                }
            }
        }
    }

    /// Claims chunk `c`, seen as `s`, to move it out of DRAM (as Evicting). False when `s`
    /// is not an unpinned resident chunk or the word changed since it was read.
    pub fn claim_evict(&self, c: usize, s: State) -> bool {
        s.place() == Where::Resident && !s.pinned() && self.cas(c, s, s.with(Where::Evicting, 0))
    }

    /// Holds chunk `c`, seen as `s` (Resident, Far or Fresh), as Fetching without moving
    /// it, so that no fetch or eviction runs while its content is dropped or a note is
    /// made (discard, the sampler); the holder settles it or puts `s` back with `cas`.
    pub fn claim_hold(&self, c: usize, s: State) -> bool {
        matches!(s.place(), Where::Resident | Where::Far | Where::Fresh)
            && self.cas(c, s, s.with(Where::Fetching, s.tier()))
    }

    /// Pins chunk `c` (never evicted from now on, wherever it is); true when this call
    /// pinned it, false when it was pinned already.
    pub fn pin(&self, c: usize) -> bool {
        !self.set_bits(c, PIN, 0).pinned()
    }

    /// Unpins chunk `c`; true when this call unpinned it.
    pub fn unpin(&self, c: usize) -> bool {
        self.set_bits(c, 0, PIN).pinned()
    }

    /// Sets and clears bits of a chunk's state; returns the state before.
    pub fn set_bits(&self, c: usize, set: u64, clear: u64) -> State {
        match self.states[c].fetch_update(AcqRel, Acquire, |w| Some((w | set) & !clear)) {
            Ok(w) | Err(w) => State(w),
        }
    }
    /// Stores a new place for a chunk this thread owns (Fetching/Evicting), keeping flags.
    pub fn settle(&self, c: usize, w: Where, tier: usize, extra: u64) {
        let _ = self.states[c].fetch_update(AcqRel, Acquire, |old| {
            Some(State(old).with(w, tier).with_bits(extra, 0).0)
        });
    }
    /// Settles chunk `c` in the far place no tier holds: every word of it is the word at
    /// `index` of the fill dictionary (`crate::paging::fill`).
    pub fn settle_filled(&self, c: usize, index: u32) {
        let _ = self.states[c].fetch_update(AcqRel, Acquire, |old| {
            let s = State(old).with(Where::Far, FILLED).0 & !FILL_MASK;
            Some(s | ((index as u64) << FILL_SHIFT))
        });
    }
    /// Stores a new place and bumps the heat counter.
    pub fn settle_heated(&self, c: usize, w: Where, tier: usize, extra: u64) {
        let _ = self.states[c].fetch_update(AcqRel, Acquire, |old| {
            Some(State(old).with(w, tier).with_bits(extra, 0).heated().0)
        });
    }
    /// Bytes of this region per place: (resident, per far tier).
    pub fn residency(&self, ntiers: usize) -> (u64, Vec<u64>) {
        let mut res = 0u64;
        let mut far = vec![0u64; ntiers];
        for c in 0..self.chunks() {
            let s = self.state(c);
            match s.place() {
                Where::Resident | Where::Evicting => res += self.chunk as u64,
                Where::Far => {
                    if let Some(f) = far.get_mut(s.tier()) {
                        *f += self.chunk as u64
                    }
                }
                _ => {}
            }
        }
        (res, far)
    }
    pub fn pinned_chunks(&self) -> usize {
        (0..self.chunks())
            .filter(|&c| self.state(c).pinned())
            .count()
    }
    /// Chunks moved into DRAM by faults and their read-ahead over those the faults show
    /// were touched (1.0 before any fault). Exact at 4 KiB chunks but for each run's
    /// last window; a larger chunk counts as touched whole (docs/design/paging.md,
    /// "Amplification").
    pub fn amplification(&self) -> f64 {
        let c = &self.counters;
        attune_policy::readahead::amplification(
            c.demand_chunks.load(Relaxed),
            c.readahead_chunks.load(Relaxed),
            c.readahead_touched_chunks.load(Relaxed),
        )
    }
    /// The heat counters (faults per chunk since allocation), for statistics.
    pub fn heat_total(&self) -> u64 {
        (0..self.chunks())
            .map(|c| self.state(c).heat() as u64)
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn state_word_round_trips() {
        let s = State(0)
            .with(Where::Far, 3)
            .with_bits(PIN | State::class_bits(true, 1), 0)
            .heated()
            .heated();
        assert_eq!(s.place(), Where::Far);
        assert_eq!(s.tier(), 3);
        assert!(s.pinned() && s.active());
        assert_eq!(s.credit(), 1);
        assert_eq!(s.heat(), 2);
        let t = s
            .with(Where::Resident, 0)
            .with_bits(State::class_bits(false, 1), ACTIVE | CREDIT_MASK);
        assert_eq!(t.place(), Where::Resident);
        assert!(t.pinned() && !t.active());
        assert_eq!(t.credit(), 0, "clear wins over set in with_bits");
        let u = s
            .with_bits(0, ACTIVE | CREDIT_MASK)
            .with_bits(State::class_bits(false, 1), 0);
        assert!(!u.active() && u.credit() == 1 && u.pinned());
        assert_eq!(u.heat(), 2);
    }
}
