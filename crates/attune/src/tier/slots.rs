//! First-fit free list over a tier's offset space (regions reserve a range each).

use std::collections::BTreeMap;

/// Offset space of a tier: free ranges keyed by start.
pub struct FreeList {
    free: BTreeMap<u64, u64>,
}

const ALIGN: u64 = 2 << 20;

impl FreeList {
    pub fn new(size: u64) -> FreeList {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        FreeList { free }
    }

    /// Reserves `len` bytes (rounded to 2 MiB so any chunk size stays aligned).
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.div_ceil(ALIGN) * ALIGN;
        let (&start, &size) = self.free.iter().find(|(_, &s)| s >= len)?;
        self.free.remove(&start);
        if size > len {
            self.free.insert(start + len, size - len);
        }
        Some(start)
    }

    pub fn free(&mut self, start: u64, len: u64) {
        let len = len.div_ceil(ALIGN) * ALIGN;
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            l += nl;
        }
        self.free.insert(s, l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesce() {
        let mut f = FreeList::new(10 * ALIGN);
        let a = f.alloc(1).unwrap();
        let b = f.alloc(3 * ALIGN).unwrap();
        let c = f.alloc(ALIGN).unwrap();
        assert_eq!((a, b, c), (0, ALIGN, 4 * ALIGN));
        assert!(f.alloc(6 * ALIGN).is_none());
        f.free(b, 3 * ALIGN);
        f.free(a, 1);
        assert_eq!(f.alloc(4 * ALIGN), Some(0));
        f.free(c, ALIGN);
        f.free(0, 4 * ALIGN);
        assert_eq!(f.alloc(10 * ALIGN), Some(0));
    }
}
