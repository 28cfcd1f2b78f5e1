//! Replacement decisions (the default CLOCK, IMME Algorithm 2's filter).

/// What the clock hand sees of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkView {
    pub resident: bool,
    pub pinned: bool,
    pub referenced: bool,
    /// The chunk's region is LAT or SHL.
    pub protected_region: bool,
}

/// What the hand does with a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockAction {
    /// Not a candidate (absent or pinned).
    Skip,
    /// Referenced since the last pass: clear the bit, give a second chance.
    SecondChance,
    /// Evict now.
    Evict,
}

/// The CLOCK rule with Algorithm 2's filter: pinned chunks are never victims; pageable
/// chunks of LAT/SHL regions are taken only in `last_resort` passes (after every other
/// region was swept without freeing enough).
pub fn clock_decide(c: ChunkView, last_resort: bool) -> ClockAction {
    if !c.resident || c.pinned {
        return ClockAction::Skip;
    }
    if c.protected_region && !last_resort {
        return ClockAction::Skip;
    }
    if c.referenced {
        ClockAction::SecondChance
    } else {
        ClockAction::Evict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let v = |resident, pinned, referenced, protected_region| ChunkView {
            resident,
            pinned,
            referenced,
            protected_region,
        };
        use ClockAction::*;
        let cases = [
            (v(false, false, false, false), false, Skip),
            (v(true, true, false, false), true, Skip),
            (v(true, false, true, false), false, SecondChance),
            (v(true, false, false, false), false, Evict),
            (v(true, false, false, true), false, Skip),
            (v(true, false, false, true), true, Evict),
            (v(true, true, false, true), true, Skip),
        ];
        for (i, (c, lr, want)) in cases.into_iter().enumerate() {
            assert_eq!(clock_decide(c, lr), want, "case {i}");
        }
    }
}
