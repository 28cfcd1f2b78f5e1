//! Filled chunks: an evicted chunk whose every 8-byte word is the same (zeros, a constant
//! an array was initialised with, a collector's cleared space) is kept as that word
//! instead of in a far tier that copies its pages (file, pool, remote). Nothing is written
//! out and nothing read back: the store only moves the pages to staging and looks at
//! them, the fault fills a buffer and places it. The chunk is Far with the tier bits
//! `region::FILLED`, and its word is an index into [`Fills`], a dictionary of the words
//! seen, because the state word has 32 bits to spare, not 64.
//!
//! This module holds the dictionary and the word tests; the eviction path looks at staged
//! runs (`evict::staged_fills`), the fault path places fills (`fault::place_fills`).
//!
//! Signal-safe: the dictionary is a fixed table of atomics, filled by probing, never
//! emptied (a program has few fill values: STREAM's 1.0, the JVM's garbage arrays filled
//! with an int each, zeros). A full table only means the next new word is stored as data.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};

/// Words the dictionary holds. 4096 of 8 bytes and a state byte: 36 KiB per process.
pub const WORDS: usize = 4096;
/// Slots a lookup tries from the word's hash before giving up.
const PROBES: usize = 32;

const EMPTY: u8 = 0;
const WRITING: u8 = 1;
const READY: u8 = 2;

pub struct Fills {
    words: Box<[AtomicU64]>,
    state: Box<[AtomicU8]>,
}

impl Default for Fills {
    fn default() -> Fills {
        Fills::new()
    }
}

impl Fills {
    pub fn new() -> Fills {
        let f = Fills {
            words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
            state: (0..WORDS).map(|_| AtomicU8::new(EMPTY)).collect(),
        };
        // Index 0 is zero, the common case (and the one placed from the zero buffer).
        f.state[0].store(READY, Release);
        f
    }

    /// The index of `word`, added if it is new; None when the table has no room for it
    /// along its probe sequence. Two threads adding the same word at once may take two
    /// slots: both are right.
    pub fn index(&self, word: u64) -> Option<u32> {
        if word == 0 {
            return Some(0);
        }
        let start = (word.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize;
        for k in 0..PROBES {
            let i = 1 + (start + k) % (WORDS - 1);
            match self.state[i].load(Acquire) {
                READY if self.words[i].load(Relaxed) == word => return Some(i as u32),
                EMPTY => {
                    if self.state[i]
                        .compare_exchange(EMPTY, WRITING, AcqRel, Acquire)
                        .is_ok()
                    {
                        self.words[i].store(word, Relaxed);
                        self.state[i].store(READY, Release);
                        return Some(i as u32);
                    }
                    // Taken meanwhile: it may be our word; look again.
                    if self.state[i].load(Acquire) == READY && self.words[i].load(Relaxed) == word {
                        return Some(i as u32);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// The word at `index` (published before any chunk state names it).
    pub fn word(&self, index: u32) -> u64 {
        self.words
            .get(index as usize)
            .map(|w| w.load(Relaxed))
            .unwrap_or(0)
    }
}

/// The word every 8 bytes of `[addr, addr+len)` hold, if they all hold the same one.
/// Stops at the first block of words that differs (data that is not a fill costs a cache
/// line or two). `addr`: a runtime-owned staged run (`attune_sys::mem::with_words`) with
/// no hole (`tier::store_staged` fills them first): inside the SIGBUS handler a fault on
/// one could not be served.
pub fn fill_word(addr: usize, len: usize) -> Option<u64> {
    attune_sys::mem::with_words(addr, len, |words| {
        let first = *words.first()?;
        // Blocks of 8 words with one test each: the loop the compiler vectorises.
        let mut blocks = words.chunks_exact(8);
        for b in &mut blocks {
            if b.iter().fold(0u64, |acc, &w| acc | (w ^ first)) != 0 {
                return None;
            }
        }
        blocks
            .remainder()
            .iter()
            .all(|&w| w == first)
            .then_some(first)
    })
}

/// Writes `word` into every 8 bytes of `[addr, addr+len)`, a bounce buffer of ours.
pub fn fill(addr: usize, len: usize, word: u64) {
    attune_sys::mem::with_words_mut(addr, len, |w| w.fill(word));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_get_stable_indices_and_zero_is_index_zero() {
        let f = Fills::new();
        assert_eq!(f.index(0), Some(0));
        let one = 1.0f64.to_bits();
        let i = f.index(one).unwrap();
        assert!(i > 0);
        assert_eq!(f.index(one), Some(i));
        assert_eq!(f.word(i), one);
        assert_eq!(f.word(0), 0);
        let j = f.index(0x0000_0007_0000_0007).unwrap();
        assert_ne!(i, j);
        assert_eq!(f.word(j), 0x0000_0007_0000_0007);
        assert_eq!(f.word(i), one);
    }

    #[test]
    fn a_full_table_refuses_new_words_and_keeps_old_ones() {
        let f = Fills::new();
        let mut taken = Vec::new();
        for w in 1..=(4 * WORDS as u64) {
            match f.index(w) {
                Some(i) => taken.push((w, i)),
                None => break,
            }
        }
        assert!(
            taken.len() >= WORDS / 2,
            "{} words before the first refusal",
            taken.len()
        );
        for &(w, i) in &taken {
            assert_eq!(f.index(w), Some(i));
            assert_eq!(f.word(i), w);
        }
    }

    #[test]
    fn concurrent_adds_agree_on_the_word_behind_each_index() {
        let f = std::sync::Arc::new(Fills::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || {
                    (1..500u64)
                        .map(|w| (w, f.index(w * 0x1_0000_0001).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in hs {
            for (w, i) in h.join().unwrap() {
                assert_eq!(f.word(i), w * 0x1_0000_0001);
            }
        }
    }

    #[test]
    fn a_fill_is_found_and_anything_else_is_not() {
        let mut page = vec![0u64; 512];
        let a = page.as_mut_ptr() as usize;
        assert_eq!(fill_word(a, 4096), Some(0));
        fill(a, 4096, 1.0f64.to_bits());
        assert_eq!(fill_word(a, 4096), Some(1.0f64.to_bits()));
        for at in [0, 7, 8, 255, 504, 511] {
            page.iter_mut().for_each(|w| *w = 42);
            page[at] = 43;
            assert_eq!(fill_word(page.as_ptr() as usize, 4096), None, "{at}");
        }
    }
}
